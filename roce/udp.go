package roce

import "encoding/binary"

// UDP is a view of a UDP header (RFC 768):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|          Source Port          |       Destination Port        |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//	|            Length             |           Checksum            |
//	+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//
// The ICRC covers the header with Checksum taken as all ones.
type UDP []byte

const (
	udpSrcPort  = 0
	udpDstPort  = 2
	udpLength   = 4
	udpChecksum = 6

	// UDPHeaderLen is the length of a UDP header.
	UDPHeaderLen = 8
	// UDPPort is the RoCE v2 UDP destination port (IANA).
	UDPPort = 4791
)

// IsValid reports whether b holds a whole header.
func (b UDP) IsValid() bool { return len(b) >= UDPHeaderLen }

// SrcPort returns the Source Port field.
func (b UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(b[udpSrcPort:]) }

// SetSrcPort sets the Source Port field.
func (b UDP) SetSrcPort(v uint16) { binary.BigEndian.PutUint16(b[udpSrcPort:], v) }

// DstPort returns the Destination Port field.
func (b UDP) DstPort() uint16 { return binary.BigEndian.Uint16(b[udpDstPort:]) }

// SetDstPort sets the Destination Port field.
func (b UDP) SetDstPort(v uint16) { binary.BigEndian.PutUint16(b[udpDstPort:], v) }

// Length returns the Length field (header and data).
func (b UDP) Length() uint16 { return binary.BigEndian.Uint16(b[udpLength:]) }

// SetLength sets the Length field.
func (b UDP) SetLength(v uint16) { binary.BigEndian.PutUint16(b[udpLength:], v) }

// Checksum returns the Checksum field.
func (b UDP) Checksum() uint16 { return binary.BigEndian.Uint16(b[udpChecksum:]) }

// SetChecksum sets the Checksum field.
func (b UDP) SetChecksum(v uint16) { binary.BigEndian.PutUint16(b[udpChecksum:], v) }

// UDPFields is a UDP header in host form.
type UDPFields struct {
	SrcPort, DstPort uint16
	Length           uint16
	Checksum         uint16
}

// Encode writes the 8-byte header from f.
func (b UDP) Encode(f *UDPFields) {
	_ = b[UDPHeaderLen-1]
	binary.BigEndian.PutUint16(b[udpSrcPort:], f.SrcPort)
	binary.BigEndian.PutUint16(b[udpDstPort:], f.DstPort)
	binary.BigEndian.PutUint16(b[udpLength:], f.Length)
	binary.BigEndian.PutUint16(b[udpChecksum:], f.Checksum)
}

// UDPChecksum returns the UDP checksum of dgram (UDP header and data, with
// the checksum field taken as zero) over the IPv4 or IPv6 pseudo header
// made of src, dst (4 or 16 bytes each) and len(dgram). A result of 0 is
// returned as 0xffff, as RFC 768 requires.
func UDPChecksum(src, dst []byte, dgram []byte) uint16 {
	s := checksumAdd(0, src)
	s = checksumAdd(s, dst)
	s += ProtocolUDP + uint64(len(dgram))
	s = checksumAdd(s, dgram[:udpChecksum])
	s = checksumAdd(s, dgram[udpChecksum+2:])
	c := ^checksumFold(s)
	if c == 0 {
		c = 0xffff
	}
	return c
}
