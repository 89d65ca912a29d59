package roce

import (
	"encoding/binary"
	"net/netip"
)

// IPv6 is a view of an IPv6 header (RFC 8200):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|Version| Traffic Class |           Flow Label                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|         Payload Length        |  Next Header  |   Hop Limit   |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|                  Source Address (16 bytes)                    |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|               Destination Address (16 bytes)                  |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The ICRC covers the header with Traffic Class, Flow Label and Hop Limit
// taken as all ones. IsValid is the gate.
type IPv6 []byte

const (
	ipv6VerTCFL   = 0
	ipv6PayloadLn = 4
	ipv6NextHdr   = 6
	ipv6HopLimit  = 7
	ipv6Src       = 8
	ipv6Dst       = 24

	// IPv6HeaderLen is the length of the fixed IPv6 header.
	IPv6HeaderLen = 40
)

// IsValid reports whether b holds the whole fixed header.
func (b IPv6) IsValid() bool { return len(b) >= IPv6HeaderLen }

// Version returns the Version field.
func (b IPv6) Version() uint8 { return b[ipv6VerTCFL] >> 4 }

// TrafficClass returns the Traffic Class field (DSCP and ECN).
func (b IPv6) TrafficClass() uint8 {
	return uint8(binary.BigEndian.Uint16(b[ipv6VerTCFL:]) >> 4)
}

// SetTrafficClass sets the Traffic Class field.
func (b IPv6) SetTrafficClass(v uint8) {
	w := binary.BigEndian.Uint16(b[ipv6VerTCFL:])
	binary.BigEndian.PutUint16(b[ipv6VerTCFL:], w&0xf00f|uint16(v)<<4)
}

// FlowLabel returns the 20-bit Flow Label field.
func (b IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(b[ipv6VerTCFL:]) & 0xfffff }

// SetFlowLabel sets the Flow Label field (low 20 bits of v).
func (b IPv6) SetFlowLabel(v uint32) {
	w := binary.BigEndian.Uint32(b[ipv6VerTCFL:])
	binary.BigEndian.PutUint32(b[ipv6VerTCFL:], w&^0xfffff|v&0xfffff)
}

// PayloadLength returns the Payload Length field.
func (b IPv6) PayloadLength() uint16 { return binary.BigEndian.Uint16(b[ipv6PayloadLn:]) }

// SetPayloadLength sets the Payload Length field.
func (b IPv6) SetPayloadLength(v uint16) { binary.BigEndian.PutUint16(b[ipv6PayloadLn:], v) }

// NextHeader returns the Next Header field.
func (b IPv6) NextHeader() uint8 { return b[ipv6NextHdr] }

// SetNextHeader sets the Next Header field.
func (b IPv6) SetNextHeader(v uint8) { b[ipv6NextHdr] = v }

// HopLimit returns the Hop Limit field.
func (b IPv6) HopLimit() uint8 { return b[ipv6HopLimit] }

// SetHopLimit sets the Hop Limit field.
func (b IPv6) SetHopLimit(v uint8) { b[ipv6HopLimit] = v }

// Src returns the Source Address.
func (b IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(b[ipv6Src : ipv6Src+16])) }

// Dst returns the Destination Address.
func (b IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(b[ipv6Dst : ipv6Dst+16])) }

// SetSrc sets the Source Address.
func (b IPv6) SetSrc(a [16]byte) { copy(b[ipv6Src:ipv6Src+16], a[:]) }

// SetDst sets the Destination Address.
func (b IPv6) SetDst(a [16]byte) { copy(b[ipv6Dst:ipv6Dst+16], a[:]) }

// IPv6Fields is an IPv6 header in host form.
type IPv6Fields struct {
	TrafficClass  uint8
	FlowLabel     uint32
	PayloadLength uint16
	NextHeader    uint8
	HopLimit      uint8
	Src, Dst      [16]byte
}

// Encode writes the 40-byte header from f.
func (b IPv6) Encode(f *IPv6Fields) {
	_ = b[IPv6HeaderLen-1]
	binary.BigEndian.PutUint32(b[ipv6VerTCFL:], 6<<28|uint32(f.TrafficClass)<<20|f.FlowLabel&0xfffff)
	binary.BigEndian.PutUint16(b[ipv6PayloadLn:], f.PayloadLength)
	b[ipv6NextHdr] = f.NextHeader
	b[ipv6HopLimit] = f.HopLimit
	copy(b[ipv6Src:ipv6Src+16], f.Src[:])
	copy(b[ipv6Dst:ipv6Dst+16], f.Dst[:])
}
