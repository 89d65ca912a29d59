package roce

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// The invariant CRC (IBTA vol. 1, Annex A17.3.3 for RoCE v2): CRC-32 with
// the IEEE 802.3 polynomial, computed as if the packet were preceded by 8
// bytes of 0xFF (the place of the InfiniBand LRH), over
//
//	IP header | UDP header | BTH | extension headers | payload | pad
//
// with the fields that routers may change taken as all ones:
//
//	IPv4: Type of Service, Time to Live, Header Checksum
//	IPv6: Traffic Class, Flow Label, Hop Limit
//	UDP:  Checksum
//	BTH:  byte 4 (FECN, BECN, Resv6a)
//
// The result is the usual (inverted) CRC-32 value, stored in the last four
// bytes of the packet least significant byte first: Linux rxe stores the
// CPU-order value and every RoCE v2 NIC agrees (checked against real
// captures in the tests).
//
// Speed: the state after the 8 0xFF bytes is computed once (icrcSeed).
// Per packet, the masked IP and UDP headers (or the pseudo header) and the
// BTH, at most 80 bytes, are copied to a stack buffer and run through a
// slicing-by-8 loop; the rest of the packet, in place, goes to
// crc32.Update with the IEEE table, which uses the carry-less multiply
// (PCLMULQDQ) implementation on amd64.

// icrcSeed is the CRC-32 of 8 bytes of 0xFF.
var icrcSeed = crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// icrcScratchLen bounds the stack buffer: IPv4 with options (60) + UDP
// (8) + BTH (12) = 80, rounded up to 16, plus room.
const icrcScratchLen = 96

// maskIPv4 sets the ICRC-variant fields of the IPv4 header h to ones.
func maskIPv4(h []byte) {
	h[ipv4TOS] = 0xff
	h[ipv4TTL] = 0xff
	h[ipv4Checksum] = 0xff
	h[ipv4Checksum+1] = 0xff
}

// maskIPv6 sets the ICRC-variant fields of the IPv6 header h to ones.
func maskIPv6(h []byte) {
	h[0] |= 0x0f
	h[1] = 0xff
	h[2] = 0xff
	h[3] = 0xff
	h[ipv6HopLimit] = 0xff
}

// icrcFinish returns the ICRC given s[:n], the already masked IP and UDP
// headers (n <= 68), and body, the transport packet from the BTH to the
// end of the pad (len(body) >= BTHLen). The masked prefix and BTH go
// through slicing-by-8 in Go on the stack copy (hash/crc32 would move the
// copy to the heap: it calls its implementation through a function
// value); the rest, in place, through hash/crc32.
func icrcFinish(s *[icrcScratchLen]byte, n int, body []byte) uint32 {
	copy(s[n:n+BTHLen], body[:BTHLen])
	// UDP checksum and BTH byte 4 are variant.
	s[n-2] = 0xff
	s[n-1] = 0xff
	s[n+bthFB] = 0xff
	crc := crcSlicing8(icrcSeed, s[:n+BTHLen])
	return crc32.Update(crc, crc32.IEEETable, body[BTHLen:])
}

// crcTab8 are the slicing-by-8 tables of the IEEE polynomial.
var crcTab8 = func() (t [8][256]uint32) {
	t[0] = *crc32.MakeTable(crc32.IEEE)
	for i := 1; i < 8; i++ {
		for j := range 256 {
			c := t[i-1][j]
			t[i][j] = c>>8 ^ t[0][c&0xff]
		}
	}
	return t
}()

// crcSlicing8 continues the finished CRC-32 (IEEE) crc over p, like
// crc32.Update, without letting p escape.
func crcSlicing8(crc uint32, p []byte) uint32 {
	t := &crcTab8
	crc = ^crc
	for len(p) >= 8 {
		crc ^= binary.LittleEndian.Uint32(p)
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xff] ^ t[6][crc>>8&0xff] ^ t[7][crc&0xff]
		p = p[8:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// icrcIP returns the ICRC of pkt, an IP packet (IPv4 when v6 is false,
// with header length iphl) holding UDP and a transport packet through the
// pad, without the ICRC itself. The caller has checked the lengths.
func icrcIP(pkt []byte, v6 bool, iphl int) uint32 {
	var s [icrcScratchLen]byte
	n := iphl + UDPHeaderLen
	copy(s[:n], pkt[:n])
	if v6 {
		maskIPv6(s[:])
	} else {
		maskIPv4(s[:])
	}
	return icrcFinish(&s, n, pkt[n:])
}

// Pseudo is the pseudo IP and UDP header over which the UDP link
// (ModeUDP) computes the ICRC, since the kernel, not vrnic, writes the real
// ones. Both ends must use the same values; with the addresses and ports
// of the socket pair that is automatic (the sender uses local, peer; the
// receiver peer, local as reported by recvmsg). A link may instead fix
// the addresses to the zero value to survive NAT: the kernel's UDP
// checksum still covers the real ones.
//
// The header is built with these fixed values:
//
//	IPv4 (when neither address is IPv6): version 4, IHL 5, TOS masked,
//	     Total Length = 28 + transport length, Identification 0,
//	     Flags/Fragment 0x4000 (DF), TTL masked, Protocol 17, Checksum
//	     masked, Src, Dst (0.0.0.0 when invalid);
//	IPv6 (when either address is IPv6): version 6, Traffic Class and Flow
//	     Label masked, Payload Length = 8 + transport length, Next Header
//	     17, Hop Limit masked, Src, Dst (:: when invalid);
//	UDP: SrcPort, DstPort (4791 when 0), Length = 8 + transport length,
//	     Checksum masked.
//
// The transport length runs from the BTH through the ICRC. IPv4-mapped
// IPv6 addresses count as IPv4.
type Pseudo struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// pseudoHeader writes the masked pseudo header of ps for a transport
// packet of tlen bytes (BTH..ICRC) into s and returns its length.
func (ps *Pseudo) header(s *[icrcScratchLen]byte, tlen int) int {
	src, dst := ps.Src.Unmap(), ps.Dst.Unmap()
	dport := ps.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	var n int
	if src.Is6() || dst.Is6() {
		h := IPv6(s[:IPv6HeaderLen])
		h.Encode(&IPv6Fields{PayloadLength: uint16(UDPHeaderLen + tlen), NextHeader: ProtocolUDP,
			Src: addr16(src), Dst: addr16(dst)})
		maskIPv6(h)
		n = IPv6HeaderLen
	} else {
		h := IPv4(s[:IPv4HeaderLen])
		h.Encode(&IPv4Fields{TotalLength: uint16(IPv4HeaderLen + UDPHeaderLen + tlen), FlagsFragment: IPv4FlagDF,
			Protocol: ProtocolUDP, Src: addr4(src), Dst: addr4(dst)})
		maskIPv4(h)
		n = IPv4HeaderLen
	}
	u := UDP(s[n : n+UDPHeaderLen])
	u.Encode(&UDPFields{SrcPort: ps.SrcPort, DstPort: dport, Length: uint16(UDPHeaderLen + tlen), Checksum: 0xffff})
	return n + UDPHeaderLen
}

// icrcPseudo returns the ICRC of body (BTH..pad) under pseudo header ps;
// tlen is len(body)+ICRCLen.
func icrcPseudo(ps *Pseudo, body []byte) uint32 {
	var s [icrcScratchLen]byte
	n := ps.header(&s, len(body)+ICRCLen)
	return icrcFinish(&s, n, body)
}

// putICRC stores crc little-endian at b[0:4].
func putICRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// getICRC loads the little-endian ICRC at b[0:4].
func getICRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
