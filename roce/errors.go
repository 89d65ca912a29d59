package roce

import "errors"

// Sentinel errors returned (wrapped with %w and some detail) by Parse,
// ParseUDP, Build and the pcap reader. Test with errors.Is.
var (
	// ErrTruncated: the frame ends before a header or length it announces.
	ErrTruncated = errors.New("roce: truncated frame")
	// ErrNotIP: the Ethernet frame carries neither IPv4 nor IPv6 (for
	// example ARP); the TAP link hands such frames elsewhere.
	ErrNotIP = errors.New("roce: not an IP frame")
	// ErrRoCEv1: a RoCE v1 frame (EtherType 0x8915, GRH instead of
	// IP/UDP). vrnic speaks RoCE v2 only.
	ErrRoCEv1 = errors.New("roce: RoCE v1 frame (EtherType 0x8915) not supported")
	// ErrBadIPVersion: the IP version field disagrees with the EtherType.
	ErrBadIPVersion = errors.New("roce: bad IP version")
	// ErrBadIPHeaderLen: IPv4 IHL below 5 or beyond the frame.
	ErrBadIPHeaderLen = errors.New("roce: bad IPv4 header length")
	// ErrBadIPChecksum: the IPv4 header checksum does not verify.
	ErrBadIPChecksum = errors.New("roce: bad IPv4 header checksum")
	// ErrFragment: an IPv4 fragment (MF set or non-zero offset). RoCE
	// packets are never fragmented.
	ErrFragment = errors.New("roce: IP fragment")
	// ErrBadLength: IP total/payload length and UDP length disagree with
	// each other or with the frame.
	ErrBadLength = errors.New("roce: inconsistent lengths")
	// ErrNotUDP: the IP protocol / next header is not UDP (IPv6 extension
	// headers are not supported by RoCE v2 and land here too).
	ErrNotUDP = errors.New("roce: not UDP")
	// ErrNotRoCE: the UDP destination port is not 4791.
	ErrNotRoCE = errors.New("roce: UDP destination port is not 4791")
	// ErrBadBTHVersion: BTH TVer is not 0.
	ErrBadBTHVersion = errors.New("roce: bad BTH transport header version")
	// ErrUnknownOpcode: the BTH opcode is not one vrnic knows (RC, UC, UD
	// or CNP).
	ErrUnknownOpcode = errors.New("roce: unknown opcode")
	// ErrOpcodeLength: the packet is too short for the headers its opcode
	// requires, or carries a payload its opcode forbids.
	ErrOpcodeLength = errors.New("roce: length does not match opcode")
	// ErrBadPad: BTH PadCnt is larger than the payload, or non-zero on a
	// packet that is not the last or only one of a message.
	ErrBadPad = errors.New("roce: bad pad count")
	// ErrICRC: the invariant CRC does not match.
	ErrICRC = errors.New("roce: ICRC mismatch")
	// ErrBadPath: a Path or Pseudo is unusable (address families differ,
	// missing addresses, unknown mode).
	ErrBadPath = errors.New("roce: bad path")
	// ErrNoRoom: the buffer lacks the headroom or tailroom Build needs, or
	// the payload is not allowed/too large for the opcode.
	ErrNoRoom = errors.New("roce: no room in buffer")
	// ErrBadPcap: the pcap stream is malformed.
	ErrBadPcap = errors.New("roce: bad pcap")
)
