package roce

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// IPv4 is a view of an IPv4 header (RFC 791):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version|  IHL  |Type of Service|          Total Length         |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Identification        |Flags|      Fragment Offset    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|  Time to Live |    Protocol   |         Header Checksum       |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                       Source Address                          |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Destination Address                        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                    Options (IHL > 5)                          |
//
// The ICRC covers the header with TOS, TTL and Header Checksum taken as
// all ones. IsValid is the gate for the fixed 20 bytes.
type IPv4 []byte

const (
	ipv4VerIHL   = 0
	ipv4TOS      = 1
	ipv4TotalLen = 2
	ipv4ID       = 4
	ipv4FlagsOff = 6
	ipv4TTL      = 8
	ipv4Protocol = 9
	ipv4Checksum = 10
	ipv4Src      = 12
	ipv4Dst      = 16

	// IPv4HeaderLen is the length of an IPv4 header without options.
	IPv4HeaderLen = 20

	// IPv4FlagDF is the Don't Fragment bit of the flags/offset word.
	IPv4FlagDF = 0x4000
	// IPv4FlagMF is the More Fragments bit of the flags/offset word.
	IPv4FlagMF = 0x2000
	// ipv4OffsetMask masks the fragment offset.
	ipv4OffsetMask = 0x1fff

	// ProtocolUDP is the IP protocol number of UDP.
	ProtocolUDP = 17
)

// IsValid reports whether b holds at least the fixed IPv4 header.
func (b IPv4) IsValid() bool { return len(b) >= IPv4HeaderLen }

// Version returns the Version field.
func (b IPv4) Version() uint8 { return b[ipv4VerIHL] >> 4 }

// HeaderLen returns IHL in bytes (IHL * 4).
func (b IPv4) HeaderLen() int { return int(b[ipv4VerIHL]&0xf) * 4 }

// TOS returns the Type of Service byte (DSCP and ECN).
func (b IPv4) TOS() uint8 { return b[ipv4TOS] }

// SetTOS sets the Type of Service byte.
func (b IPv4) SetTOS(v uint8) { b[ipv4TOS] = v }

// TotalLength returns the Total Length field.
func (b IPv4) TotalLength() uint16 { return binary.BigEndian.Uint16(b[ipv4TotalLen:]) }

// SetTotalLength sets the Total Length field.
func (b IPv4) SetTotalLength(v uint16) { binary.BigEndian.PutUint16(b[ipv4TotalLen:], v) }

// ID returns the Identification field.
func (b IPv4) ID() uint16 { return binary.BigEndian.Uint16(b[ipv4ID:]) }

// SetID sets the Identification field.
func (b IPv4) SetID(v uint16) { binary.BigEndian.PutUint16(b[ipv4ID:], v) }

// FlagsFragment returns the Flags and Fragment Offset word.
func (b IPv4) FlagsFragment() uint16 { return binary.BigEndian.Uint16(b[ipv4FlagsOff:]) }

// SetFlagsFragment sets the Flags and Fragment Offset word.
func (b IPv4) SetFlagsFragment(v uint16) { binary.BigEndian.PutUint16(b[ipv4FlagsOff:], v) }

// IsFragment reports whether MF is set or the Fragment Offset is non-zero.
func (b IPv4) IsFragment() bool {
	return b.FlagsFragment()&(IPv4FlagMF|ipv4OffsetMask) != 0
}

// TTL returns the Time to Live field.
func (b IPv4) TTL() uint8 { return b[ipv4TTL] }

// SetTTL sets the Time to Live field.
func (b IPv4) SetTTL(v uint8) { b[ipv4TTL] = v }

// Protocol returns the Protocol field.
func (b IPv4) Protocol() uint8 { return b[ipv4Protocol] }

// SetProtocol sets the Protocol field.
func (b IPv4) SetProtocol(v uint8) { b[ipv4Protocol] = v }

// Checksum returns the Header Checksum field.
func (b IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(b[ipv4Checksum:]) }

// SetChecksum sets the Header Checksum field.
func (b IPv4) SetChecksum(v uint16) { binary.BigEndian.PutUint16(b[ipv4Checksum:], v) }

// Src returns the Source Address.
func (b IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Src : ipv4Src+4])) }

// Dst returns the Destination Address.
func (b IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(b[ipv4Dst : ipv4Dst+4])) }

// SetSrc sets the Source Address.
func (b IPv4) SetSrc(a [4]byte) { copy(b[ipv4Src:ipv4Src+4], a[:]) }

// SetDst sets the Destination Address.
func (b IPv4) SetDst(a [4]byte) { copy(b[ipv4Dst:ipv4Dst+4], a[:]) }

// SetVersionIHL sets Version to 4 and IHL to hl/4 (hl a multiple of 4,
// 20..60).
func (b IPv4) SetVersionIHL(hl int) { b[ipv4VerIHL] = 4<<4 | uint8(hl/4)&0xf }

// CalculateChecksum returns the header checksum of the HeaderLen() bytes
// with the checksum field taken as zero. b must hold HeaderLen() bytes.
func (b IPv4) CalculateChecksum() uint16 {
	hl := b.HeaderLen()
	if hl == IPv4HeaderLen {
		return ^ipv4Sum(b)
	}
	s := checksumAdd(0, b[:ipv4Checksum])
	s = checksumAdd(s, b[ipv4Checksum+2:hl])
	return ^checksumFold(s)
}

// IPv4Fields is an IPv4 header without options in host form.
type IPv4Fields struct {
	TOS         uint8
	TotalLength uint16
	ID          uint16
	// FlagsFragment is the flags and fragment offset word (IPv4FlagDF...).
	FlagsFragment uint16
	TTL           uint8
	Protocol      uint8
	Src, Dst      [4]byte
}

// Encode writes a 20-byte header from f with a correct header checksum.
func (b IPv4) Encode(f *IPv4Fields) {
	_ = b[IPv4HeaderLen-1]
	b[ipv4VerIHL] = 0x45
	b[ipv4TOS] = f.TOS
	binary.BigEndian.PutUint16(b[ipv4TotalLen:], f.TotalLength)
	binary.BigEndian.PutUint16(b[ipv4ID:], f.ID)
	binary.BigEndian.PutUint16(b[ipv4FlagsOff:], f.FlagsFragment)
	b[ipv4TTL] = f.TTL
	b[ipv4Protocol] = f.Protocol
	copy(b[ipv4Src:ipv4Src+4], f.Src[:])
	copy(b[ipv4Dst:ipv4Dst+4], f.Dst[:])
	binary.BigEndian.PutUint16(b[ipv4Checksum:], ^ipv4Sum(b))
}

// ipv4Sum returns the folded one's complement sum (RFC 1071) of the 20
// bytes of an IPv4 header without options, its checksum field taken as
// zero: four 32-bit words and one 16-bit word loaded in native order, as
// checksumAdd does, in a handful of instructions.
func ipv4Sum(b []byte) uint16 {
	_ = b[IPv4HeaderLen-1]
	le := binary.LittleEndian
	s := uint64(le.Uint32(b[0:])) + uint64(le.Uint32(b[4:])) + uint64(le.Uint16(b[8:])) +
		uint64(le.Uint32(b[12:])) + uint64(le.Uint32(b[16:]))
	return bits.ReverseBytes16(checksumFold(s))
}
