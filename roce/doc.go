// Package roce is the RoCE v2 wire format of vrnic: header views, the
// opcode table, the invariant CRC (ICRC), frame building and parsing, PSN
// arithmetic, AETH syndromes, the RNR timer table and a pcap writer/reader.
//
// # Frame layout
//
// A RoCE v2 packet is an InfiniBand transport packet carried in UDP
// (destination port 4791) over IPv4 or IPv6:
//
//	TAP link, in-memory link (ModeEthernet), a whole Ethernet frame:
//	+----------+--------+-----------+-----+-----+------------+---------+-----+------+
//	| Ethernet | [VLAN] | IPv4/IPv6 | UDP | BTH | ext. hdrs  | payload | pad | ICRC |
//	+----------+--------+-----------+-----+-----+------------+---------+-----+------+
//	   14         4        20 / 40     8    12    0..28        0..4096   0..3   4
//
//	UDP link (ModeUDP), the UDP payload only; the kernel builds IP and UDP,
//	the link passes the peer's address and port beside the packet, and the
//	ICRC covers the Pseudo header made of them:
//	+-----+------------+---------+-----+------+
//	| BTH | ext. hdrs  | payload | pad | ICRC |
//	+-----+------------+---------+-----+------+
//
// The extension headers present (DETH, RETH, AtomicETH, AETH, AtomicAckETH,
// ImmDt, IETH, in that order) are fixed by the BTH opcode; the opcode table
// (Opcode.Info) says which, at which offsets, and whether a payload follows,
// and one table of what each header is (extCodecs, exthdr.go) drives the
// parser and the builder over it.
// The payload is padded to a multiple of 4 bytes; BTH PadCnt holds the pad
// length. All fields are big-endian except the ICRC, which is stored
// little-endian (see icrc.go).
//
// # Header views
//
// Every header is a view over the frame bytes in the style of gVisor's
// netstack: a named []byte type (BTH, RETH, IPv4, ...) with one getter and
// one setter per field, and a XFields struct with Encode to write a whole
// header. A view does no bounds checks of its own: it must be at least the
// header's length, which Parse guarantees for every view it returns and
// which a builder guarantees by slicing. Parsing and validation live in
// parse.go, building in build.go.
//
// # Memory and allocation
//
// Build writes the headers into headroom in front of a payload the caller
// has already placed in its buffer, and the pad and ICRC behind it: the
// payload is never copied. Parse fills a caller-owned Packet with views into
// the received bytes. Neither allocates.
package roce
