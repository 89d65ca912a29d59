package tap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Wire formats of the frames the NIC's ARP and ND code reads and writes.
//
//	Ethernet:  dst(6) src(6) [0x8100 TCI(2)] type(2)
//	ARP (RFC 826, Ethernet/IPv4, 28 bytes):
//	  htype(2)=1 ptype(2)=0x0800 hlen(1)=6 plen(1)=4 op(2)
//	  sha(6) spa(4) tha(6) tpa(4)
//	IPv6 (RFC 8200, 40 bytes): ver/tc/flow(4) plen(2) next(1) hop(1) src(16) dst(16)
//	NS/NA (RFC 4861 4.3/4.4): type(1) code(1) csum(2) flags/reserved(4)
//	  target(16) options: type(1) len(1, units of 8 bytes) value...
//	  option 1 source link-layer address, 2 target link-layer address.

const (
	ethHLen       = 14
	vlanHLen      = 4
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	etherTypeVLAN = 0x8100
	etherTypeIPv6 = 0x86DD
	arpLen        = 28
	ipv6HLen      = 40
	ndLen         = 24
	ndOptLLLen    = 8
	protoICMPv6   = 58
	icmpNS        = 135
	icmpNA        = 136
	ndHopLimit    = 255
	ndOptSourceLL = 1
	ndOptTargetLL = 2
	naFlagRouter  = 0x80000000
	naFlagSolicit = 0x40000000
	naFlagOverr   = 0x20000000
)

// ErrMalformed reports a frame that cannot be parsed as what it claims.
var ErrMalformed = errors.New("tap: malformed frame")

// MAC is an Ethernet address.
type MAC [6]byte

var broadcastMAC = MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// String formats m as aa:bb:cc:dd:ee:ff.
func (m MAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// ethHeader is a parsed Ethernet header with at most one 802.1Q tag.
type ethHeader struct {
	dst, src  MAC
	vlan      bool
	tci       uint16
	etherType uint16
	hlen      int // offset of the payload
}

func parseEth(f []byte) (ethHeader, error) {
	var h ethHeader
	if len(f) < ethHLen {
		return h, fmt.Errorf("%w: %d-byte Ethernet frame", ErrMalformed, len(f))
	}
	copy(h.dst[:], f[0:6])
	copy(h.src[:], f[6:12])
	h.etherType = binary.BigEndian.Uint16(f[12:])
	h.hlen = ethHLen
	if h.etherType == etherTypeVLAN {
		if len(f) < ethHLen+vlanHLen {
			return h, fmt.Errorf("%w: truncated 802.1Q tag", ErrMalformed)
		}
		h.vlan = true
		h.tci = binary.BigEndian.Uint16(f[14:])
		h.etherType = binary.BigEndian.Uint16(f[16:])
		h.hlen = ethHLen + vlanHLen
	}
	return h, nil
}

func appendEth(b []byte, h ethHeader) []byte {
	b = append(b, h.dst[:]...)
	b = append(b, h.src[:]...)
	if h.vlan {
		b = binary.BigEndian.AppendUint16(b, etherTypeVLAN)
		b = binary.BigEndian.AppendUint16(b, h.tci)
	}
	return binary.BigEndian.AppendUint16(b, h.etherType)
}

// arpPacket is an Ethernet/IPv4 ARP request (op 1) or reply (op 2).
type arpPacket struct {
	op       uint16
	sha, tha MAC
	spa, tpa netip.Addr
}

func parseARP(b []byte) (arpPacket, error) {
	var p arpPacket
	if len(b) < arpLen {
		return p, fmt.Errorf("%w: %d-byte ARP packet", ErrMalformed, len(b))
	}
	if binary.BigEndian.Uint16(b[0:]) != 1 || binary.BigEndian.Uint16(b[2:]) != etherTypeIPv4 || b[4] != 6 || b[5] != 4 {
		return p, fmt.Errorf("%w: ARP not Ethernet/IPv4", ErrMalformed)
	}
	p.op = binary.BigEndian.Uint16(b[6:])
	if p.op != 1 && p.op != 2 {
		return p, fmt.Errorf("%w: ARP op %d", ErrMalformed, p.op)
	}
	copy(p.sha[:], b[8:14])
	p.spa = netip.AddrFrom4([4]byte(b[14:18]))
	copy(p.tha[:], b[18:24])
	p.tpa = netip.AddrFrom4([4]byte(b[24:28]))
	return p, nil
}

func appendARP(b []byte, p arpPacket) []byte {
	b = append(b, 0, 1, 0x08, 0x00, 6, 4)
	b = binary.BigEndian.AppendUint16(b, p.op)
	b = append(b, p.sha[:]...)
	spa := p.spa.As4()
	b = append(b, spa[:]...)
	b = append(b, p.tha[:]...)
	tpa := p.tpa.As4()
	return append(b, tpa[:]...)
}

// ndMessage is a neighbour solicitation or advertisement with its IPv6
// addresses and link-layer address option.
type ndMessage struct {
	typ      uint8
	src, dst netip.Addr
	flags    uint32 // NA R/S/O bits
	target   netip.Addr
	ll       MAC // source (NS) or target (NA) link-layer address
	hasLL    bool
}

// parseND parses an IPv6 packet holding an NS or NA, checking what
// RFC 4861 7.1.1/7.1.2 require: hop limit 255, code 0, valid checksum,
// length, options with non-zero length inside the packet.
func parseND(b []byte) (ndMessage, error) {
	var m ndMessage
	if len(b) < ipv6HLen || b[0]>>4 != 6 {
		return m, fmt.Errorf("%w: not an IPv6 packet", ErrMalformed)
	}
	plen := int(binary.BigEndian.Uint16(b[4:]))
	if b[6] != protoICMPv6 {
		return m, fmt.Errorf("%w: next header %d", ErrMalformed, b[6])
	}
	if ipv6HLen+plen > len(b) || plen < ndLen {
		return m, fmt.Errorf("%w: ND payload length %d in %d bytes", ErrMalformed, plen, len(b))
	}
	if b[7] != ndHopLimit {
		return m, fmt.Errorf("%w: ND hop limit %d", ErrMalformed, b[7])
	}
	m.src = netip.AddrFrom16([16]byte(b[8:24]))
	m.dst = netip.AddrFrom16([16]byte(b[24:40]))
	icmp := b[ipv6HLen : ipv6HLen+plen]
	m.typ = icmp[0]
	if (m.typ != icmpNS && m.typ != icmpNA) || icmp[1] != 0 {
		return m, fmt.Errorf("%w: ICMPv6 type %d code %d", ErrMalformed, icmp[0], icmp[1])
	}
	if icmpv6Checksum(m.src, m.dst, icmp) != 0 {
		return m, fmt.Errorf("%w: ICMPv6 checksum", ErrMalformed)
	}
	m.flags = binary.BigEndian.Uint32(icmp[4:])
	m.target = netip.AddrFrom16([16]byte(icmp[8:24]))
	if m.target.IsMulticast() {
		return m, fmt.Errorf("%w: multicast ND target", ErrMalformed)
	}
	want := uint8(ndOptSourceLL)
	if m.typ == icmpNA {
		want = ndOptTargetLL
	}
	for opts := icmp[ndLen:]; len(opts) > 0; {
		if len(opts) < 2 || opts[1] == 0 || int(opts[1])*8 > len(opts) {
			return m, fmt.Errorf("%w: ND option", ErrMalformed)
		}
		n := int(opts[1]) * 8
		if opts[0] == want && n == ndOptLLLen {
			copy(m.ll[:], opts[2:8])
			m.hasLL = true
		}
		opts = opts[n:]
	}
	return m, nil
}

// appendND appends an IPv6 packet holding m, with a link-layer option
// when m.hasLL, and its checksum.
func appendND(b []byte, m ndMessage) []byte {
	plen := ndLen
	if m.hasLL {
		plen += ndOptLLLen
	}
	b = append(b, 0x60, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(plen))
	b = append(b, protoICMPv6, ndHopLimit)
	src, dst, target := m.src.As16(), m.dst.As16(), m.target.As16()
	b = append(b, src[:]...)
	b = append(b, dst[:]...)
	start := len(b)
	b = append(b, m.typ, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, m.flags)
	b = append(b, target[:]...)
	if m.hasLL {
		opt := uint8(ndOptSourceLL)
		if m.typ == icmpNA {
			opt = ndOptTargetLL
		}
		b = append(b, opt, 1)
		b = append(b, m.ll[:]...)
	}
	binary.BigEndian.PutUint16(b[start+2:], icmpv6Checksum(m.src, m.dst, b[start:]))
	return b
}

// icmpv6Checksum returns the Internet checksum of an ICMPv6 message with
// its pseudo-header (RFC 8200 8.1); over a message holding a correct
// checksum it returns 0.
func icmpv6Checksum(src, dst netip.Addr, msg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for len(b) >= 2 {
			sum += uint32(binary.BigEndian.Uint16(b))
			b = b[2:]
		}
		if len(b) == 1 {
			sum += uint32(b[0]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	sum += uint32(len(msg)>>16) + uint32(len(msg)&0xffff) + protoICMPv6
	add(msg)
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// solicitedNode returns the solicited-node multicast address of a
// (RFC 4291 2.7.1) and its Ethernet multicast address (RFC 2464 7).
func solicitedNode(a netip.Addr) (netip.Addr, MAC) {
	b := a.As16()
	g := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 0x01, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
	return g, MAC{0x33, 0x33, 0xff, b[13], b[14], b[15]}
}

// IsNeighborFrame tells whether a received frame is ARP or ICMPv6 (to be
// given to Neighbors.HandleFrame rather than the transport). It reads only
// the Ethernet header and the IPv6 next header and never allocates.
func IsNeighborFrame(frame []byte) bool {
	h, err := parseEth(frame)
	if err != nil {
		return false
	}
	switch h.etherType {
	case etherTypeARP:
		return true
	case etherTypeIPv6:
		return len(frame) >= h.hlen+ipv6HLen && frame[h.hlen+6] == protoICMPv6
	}
	return false
}
