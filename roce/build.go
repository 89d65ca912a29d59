package roce

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Mode says what a link carries and therefore which headers vrnic writes
// and parses.
type Mode uint8

// Link modes.
const (
	// ModeEthernet: whole Ethernet frames (TAP link): Ethernet [+802.1Q],
	// IPv4 or IPv6, UDP, BTH... ICRC.
	ModeEthernet Mode = iota
	// ModeUDP: the UDP payload only (UDP link): BTH... ICRC; the kernel
	// writes IP and UDP and the ICRC covers a Pseudo header instead.
	ModeUDP
)

func (m Mode) String() string {
	switch m {
	case ModeEthernet:
		return "ethernet"
	case ModeUDP:
		return "udp"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Headroom and tailroom a buffer needs around the payload for Build.
const (
	// MaxTransportHeaderLen is the longest BTH plus extension headers of
	// any opcode (an XRC atomic: BTH + XRCETH + AtomicETH = 44).
	MaxTransportHeaderLen = BTHLen + XRCETHLen + AtomicETHLen
	// MaxHeadroom is enough headroom for any opcode in any mode:
	// Ethernet + 802.1Q + IPv6 + UDP + MaxTransportHeaderLen.
	MaxHeadroom = EthernetHeaderLen + VLANTagLen + IPv6HeaderLen + UDPHeaderLen + MaxTransportHeaderLen
	// MaxTailroom is enough room after the payload for pad and ICRC.
	MaxTailroom = 3 + ICRCLen
)

// Path holds what stays the same for every packet a QP sends to one
// destination (the address vector): link mode, MAC and IP addresses,
// ports and IP header fields. Build reads it and never modifies it.
type Path struct {
	Mode Mode

	// SrcMAC, DstMAC, VLAN and VLANTCI (PCP, DEI, VID) make the Ethernet
	// header (ModeEthernet only).
	SrcMAC, DstMAC [6]byte
	VLAN           bool
	VLANTCI        uint16

	// Src and Dst are the IP addresses, both IPv4 (or IPv4-mapped IPv6,
	// as in RoCE v2 GIDs) or both IPv6. In ModeUDP they only feed the
	// ICRC's Pseudo header (see Pseudo).
	Src, Dst netip.Addr
	// SrcPort is the UDP source port, normally UDPSrcPort(own QPN).
	SrcPort uint16
	// DstPort is the UDP destination port; 0 means 4791.
	DstPort uint16

	// TOS is the IPv4 Type of Service or IPv6 Traffic Class (DSCP, ECN).
	TOS uint8
	// TTL is the IPv4 Time to Live or IPv6 Hop Limit.
	TTL uint8
	// FlowLabel is the IPv6 flow label (low 20 bits).
	FlowLabel uint32
	// DontFragment sets the IPv4 DF flag.
	DontFragment bool
	// UDPChecksum asks for a UDP checksum over IPv4 (otherwise 0, as
	// RoCE v2 allows). Over IPv6 the checksum is always computed.
	UDPChecksum bool
}

// IPv6 reports whether the path uses IPv6 (either address is a native
// IPv6 address).
func (p *Path) IPv6() bool { return p.Src.Unmap().Is6() || p.Dst.Unmap().Is6() }

// Pseudo returns the pseudo header of the path for ModeUDP.
func (p *Path) Pseudo() Pseudo {
	return Pseudo{Src: p.Src, Dst: p.Dst, SrcPort: p.SrcPort, DstPort: p.DstPort}
}

// LinkHeaderLen returns the bytes Build writes before the BTH: Ethernet,
// VLAN, IP and UDP in ModeEthernet, 0 in ModeUDP.
func (p *Path) LinkHeaderLen() int {
	if p.Mode == ModeUDP {
		return 0
	}
	return linkHeaderLen(p.VLAN, p.IPv6())
}

// linkHeaderLen is LinkHeaderLen in ModeEthernet.
func linkHeaderLen(vlan, v6 bool) int {
	n := EthernetHeaderLen + UDPHeaderLen + IPv4HeaderLen
	if vlan {
		n += VLANTagLen
	}
	if v6 {
		n += IPv6HeaderLen - IPv4HeaderLen
	}
	return n
}

// Headroom returns the bytes Build needs in front of the payload for op.
func (p *Path) Headroom(op Opcode) int { return p.LinkHeaderLen() + op.HeaderLen() }

// Validate checks that the path can be used by Build.
func (p *Path) Validate() error {
	switch p.Mode {
	case ModeEthernet:
		if !p.Src.IsValid() || !p.Dst.IsValid() {
			return fmt.Errorf("%w: source and destination IP addresses are required", ErrBadPath)
		}
		if p.Src.Unmap().Is4() != p.Dst.Unmap().Is4() {
			return fmt.Errorf("%w: source %v and destination %v differ in family", ErrBadPath, p.Src, p.Dst)
		}
	case ModeUDP:
	default:
		return fmt.Errorf("%w: unknown mode %d", ErrBadPath, p.Mode)
	}
	return nil
}

// Headers are the per-packet header fields Build writes. Only the
// extension headers the opcode carries are used; the others are ignored.
type Headers struct {
	// BTH; PadCount is ignored (Build computes it from the payload
	// length) and TVer should be 0.
	BTH          BTHFields
	DETH         DETHFields
	FETH         FETHFields
	RETH         RETHFields
	AtomicETH    AtomicETHFields
	AETH         AETHFields
	AtomicAckETH AtomicAckETHFields
	// Imm is the ImmDt value (OpImm opcodes).
	Imm uint32
	// InvRKey is the IETH R_Key (OpInvalidate opcodes).
	InvRKey uint32
	// XRCSRQN is the XRCETH's XRC SRQ number (XRC requests).
	XRCSRQN uint32
	// IPID is the IPv4 Identification (ModeEthernet over IPv4).
	IPID uint16
}

// Build writes a packet around the payload buf[off:off+n], which the
// caller has already placed there: the headers of p and h in the headroom
// buf[off-p.Headroom(op):off], then the pad (zeros, to a multiple of 4)
// and the ICRC after the payload. It fills every length field, the pad
// count, the IPv4 header checksum, the UDP checksum (over IPv6, or over
// IPv4 when p.UDPChecksum) and the ICRC, and returns the packet, a
// sub-slice of buf: an Ethernet frame in ModeEthernet, the UDP payload in
// ModeUDP. The payload is not copied or changed. Build does not allocate.
//
// Errors: ErrUnknownOpcode, ErrOpcodeLength (payload on an opcode without
// one, or not a multiple of 4 on a FIRST or MIDDLE packet), ErrNoRoom
// (headroom or tailroom short, or too long for the IP length fields),
// ErrBadPath.
func (p *Path) Build(buf []byte, off, n int, h *Headers) ([]byte, error) {
	var l frameLayout
	if err := p.headers(buf, off, n, h, &l, nil); err != nil {
		return nil, err
	}
	if p.Mode == ModeUDP {
		ps := p.Pseudo()
		return l.seal(buf, &ps, nil), nil
	}
	return l.seal(buf, nil, nil), nil
}

// seal stores the ICRC of the packet laid out in buf, over the pseudo
// header ps in ModeUDP (ps not nil) or its IP header otherwise, and its
// UDP checksum if it needs one, and returns the packet (in ModeUDP start
// is tstart: the UDP payload). pt, if not nil, keeps ps's state for the
// next packet.
func (l *frameLayout) seal(buf []byte, ps *Pseudo, pt *PseudoTx) []byte {
	p := l.off + l.n
	icrc := buf[p+l.pad : l.end]
	if pt != nil {
		putICRC(icrc, pt.icrc(ps, buf[l.tstart:p+l.pad]))
	} else if ps != nil {
		putICRC(icrc, icrcPseudo(ps, buf[l.tstart:p+l.pad]))
	} else {
		putICRC(icrc, icrcIP(buf[l.ipStart:p+l.pad], l.v6, l.iphl))
	}
	l.udpChecksum(buf)
	return buf[l.start:l.end]
}

// frameLayout is where headers writes a packet's parts in buf: the
// frame buf[start:end], the IP header at ipStart (iphl bytes; v6 or
// IPv4), the transport headers at tstart, the payload at off (n bytes),
// then pad and ICRC. udpSum: the UDP checksum must be computed (IPv6,
// or Path.UDPChecksum).
type frameLayout struct {
	start, ipStart, iphl, tstart, off, n, pad, end int
	v6, udpSum                                     bool
}

// udpChecksum stores the UDP checksum of the built packet in buf, if the
// layout needs one.
func (l *frameLayout) udpChecksum(buf []byte) {
	if !l.udpSum {
		return
	}
	u := UDP(buf[l.ipStart+l.iphl : l.tstart])
	dgram := buf[l.ipStart+l.iphl : l.end]
	if l.v6 {
		ip := IPv6(buf[l.ipStart:])
		u.SetChecksum(UDPChecksum(ip[ipv6Src:ipv6Src+16], ip[ipv6Dst:ipv6Dst+16], dgram))
	} else {
		ip := IPv4(buf[l.ipStart:])
		u.SetChecksum(UDPChecksum(ip[ipv4Src:ipv4Src+4], ip[ipv4Dst:ipv4Dst+4], dgram))
	}
}

// headers is Build without the ICRC and the UDP checksum: it checks the
// arguments, writes every header and the pad (not the payload) and fills
// l.
//
// With tp (a Framer's), a path equal to the one tp holds gets its link
// headers (Ethernet, IP, UDP) copied from tp and patched (lengths, IPv4
// ID and checksum) instead of encoded; any other path is encoded and
// becomes tp's.
func (p *Path) headers(buf []byte, off, n int, h *Headers, l *frameLayout, tp *linkTemplate) error {
	op := h.BTH.Opcode
	info := op.Info()
	if !info.Valid() {
		return fmt.Errorf("%w: 0x%02x", ErrUnknownOpcode, uint8(op))
	}
	if n < 0 || off < 0 || (n > 0 && info.Flags&OpPayload == 0) {
		return fmt.Errorf("%w: %v with %d payload bytes", ErrOpcodeLength, op, n)
	}
	pad := -n & 3
	if pad != 0 && info.Flags&(OpFirst|OpMiddle) != 0 {
		// Only the last packet of a message may be padded (IBTA 9.2.1.3);
		// the others carry exactly the path MTU.
		return fmt.Errorf("%w: %v with %d payload bytes, not a multiple of 4", ErrOpcodeLength, op, n)
	}
	end := off + n + pad + ICRCLen
	if end > len(buf) || end < off {
		return fmt.Errorf("%w: need %d bytes after offset %d, have %d", ErrNoRoom, n+pad+ICRCLen, off, len(buf)-off)
	}
	tstart := off - info.HeaderLen
	link := 0
	var local linkTemplate
	if p.Mode != ModeUDP {
		// The template's path: its headers are copied and patched (and
		// cost no look at the addresses); any other path is encoded
		// first.
		if tp == nil {
			tp = &local
		}
		if !tp.ok || !tp.path.same(p) {
			if err := tp.encode(p); err != nil {
				return err
			}
		}
		link = tp.n
	}
	start := tstart - link
	if start < 0 {
		return fmt.Errorf("%w: need %d bytes of headroom, have %d", ErrNoRoom, link+info.HeaderLen, off)
	}
	if end-start-EthernetHeaderLen > 0xffff-IPv6HeaderLen {
		return fmt.Errorf("%w: packet of %d bytes is too long", ErrNoRoom, end-start)
	}
	*l = frameLayout{start: start, tstart: tstart, off: off, n: n, pad: pad, end: end}

	// Transport headers.
	t := buf[tstart:off]
	bth := BTH(t[:BTHLen])
	bth.Encode(&h.BTH)
	bth.SetPadCount(pad)
	for m := info.Headers; m != 0; m &= m - 1 {
		x := m.first()
		extCodecs[x].encode(info.ext(t, x), h)
	}
	clear(buf[off+n : off+n+pad])
	if p.Mode != ModeUDP {
		tp.apply(buf, l, h.IPID)
	}
	return nil
}

// linkTemplate is the link headers (Ethernet, IP, UDP) of the last path
// a Framer, or a PseudoTx for the short packets, encoded, for the next
// packets on the same path (a QP sends many in a row): copied and
// patched, they cost a fraction of encoding.
type linkTemplate struct {
	ok     bool
	path   Path
	hdr    [EthernetHeaderLen + VLANTagLen + IPv6HeaderLen + UDPHeaderLen]byte
	n      int // bytes of hdr in use
	ip     int // offset of the IP header in hdr
	iphl   int // its length
	v6     bool
	udpSum bool   // the UDP checksum is computed (IPv6, or Path.UDPChecksum)
	sum    uint64 // IPv4: header sum without total length, ID and checksum
}

// encode makes p's link headers the template (lengths and IPv4 ID 0,
// patched by apply), or returns ErrBadPath (t then holds none).
func (t *linkTemplate) encode(p *Path) error {
	t.ok = false
	switch p.Mode {
	case ModeEthernet:
	case ModeUDP:
		return fmt.Errorf("%w: no link headers in %v", ErrBadPath, p.Mode)
	default:
		return fmt.Errorf("%w: unknown mode %d", ErrBadPath, p.Mode)
	}
	v6 := p.IPv6()
	ef := EthernetFields{Dst: p.DstMAC, Src: p.SrcMAC, VLAN: p.VLAN, TCI: p.VLANTCI, Type: EtherTypeIPv4}
	if v6 {
		ef.Type = EtherTypeIPv6
	}
	Ethernet(t.hdr[:]).Encode(&ef)
	ip := t.hdr[ef.Len():]
	iphl := IPv4HeaderLen
	if v6 {
		if !p.Src.Unmap().Is6() || !p.Dst.Unmap().Is6() {
			return fmt.Errorf("%w: source %v and destination %v are not both IPv6", ErrBadPath, p.Src, p.Dst)
		}
		iphl = IPv6HeaderLen
		IPv6(ip).Encode(&IPv6Fields{
			TrafficClass: p.TOS, FlowLabel: p.FlowLabel, NextHeader: ProtocolUDP, HopLimit: p.TTL,
			Src: addr16(p.Src), Dst: addr16(p.Dst),
		})
	} else {
		src, dst := p.Src.Unmap(), p.Dst.Unmap()
		if !src.Is4() || !dst.Is4() {
			return fmt.Errorf("%w: source %v and destination %v are not both IPv4", ErrBadPath, p.Src, p.Dst)
		}
		var ff uint16
		if p.DontFragment {
			ff = IPv4FlagDF
		}
		IPv4(ip).Encode(&IPv4Fields{
			TOS: p.TOS, FlagsFragment: ff, TTL: p.TTL, Protocol: ProtocolUDP, Src: src.As4(), Dst: dst.As4(),
		})
		// The header's sum without the two fields that change per packet
		// (total length and ID, both 0 here).
		t.sum = uint64(ipv4Sum(ip))
	}
	dport := p.DstPort
	if dport == 0 {
		dport = UDPPort
	}
	UDP(ip[iphl:]).Encode(&UDPFields{SrcPort: p.SrcPort, DstPort: dport})
	t.path, t.v6, t.ip, t.iphl = *p, v6, ef.Len(), iphl
	t.n = ef.Len() + iphl + UDPHeaderLen
	t.udpSum = v6 || p.UDPChecksum
	t.ok = true
	return nil
}

// apply writes the template's link headers in front of the transport
// headers of layout l (whose link part headers has not filled in),
// patching the lengths, and for IPv4 the ID and the checksum.
func (t *linkTemplate) apply(buf []byte, l *frameLayout, id uint16) {
	copy(buf[l.start:l.tstart], t.hdr[:t.n])
	l.ipStart, l.v6, l.iphl, l.udpSum = l.start+t.ip, t.v6, t.iphl, t.udpSum
	t.patch(buf[l.ipStart:l.tstart], l.end-l.tstart, id)
}

// patch sets the lengths of the IP and UDP headers ip (a copy of the
// template's) for a transport packet of tlen bytes (BTH through ICRC),
// and for IPv4 the ID and the header checksum.
func (t *linkTemplate) patch(ip []byte, tlen int, id uint16) {
	be := binary.BigEndian
	udpLen := tlen + UDPHeaderLen
	if t.v6 {
		be.PutUint16(ip[ipv6PayloadLn:], uint16(udpLen))
	} else {
		tl := uint16(IPv4HeaderLen + udpLen)
		be.PutUint16(ip[ipv4TotalLen:], tl)
		be.PutUint16(ip[ipv4ID:], id)
		be.PutUint16(ip[ipv4Checksum:], ^checksumFold(t.sum+uint64(tl)+uint64(id)))
	}
	be.PutUint16(ip[t.iphl+udpLength:], uint16(udpLen))
}

// Framer builds a packet around a payload copied in piece by piece,
// computing the ICRC as each byte is stored: the payload is read once,
// from where it lies (client memory), and the frame written once, with
// no second pass over it. Path.Begin writes the headers and starts the
// ICRC, Put copies the payload in order, Finish adds pad and ICRC. The
// packet is byte for byte the one Build makes around the same payload.
// A Framer is reused from packet to packet; it does not allocate.
//
// A payload shorter than FuseMin is copied plainly and the ICRC computed
// over the whole packet in Finish, as Build does: below that the fused
// pass's fixed costs (the headers' CRC on its own, a reduction per piece)
// outweigh the second read of a few bytes still in the L1 cache.
type Framer struct {
	buf  []byte
	l    frameLayout
	pos  int    // payload bytes placed
	crc  uint32 // fused: raw ICRC state after the headers and payload[:pos]
	err  bool   // Put was given more than the payload
	fuse bool   // the ICRC is computed as the payload is put
	udp  bool   // ModeUDP: the ICRC covers ps
	ps   Pseudo
	pt   PseudoTx // the pseudo header state of the last packet
	tmpl linkTemplate
}

// FuseMin is the shortest payload a Framer copies and checksums in one
// pass.
const FuseMin = 1024

// Begin starts a packet in buf whose payload of n bytes goes to
// buf[off:off+n] through f.Put: it writes the headers as Build does and
// starts the ICRC over them. Errors as Build's; after one, f holds no
// packet (Finish fails).
func (p *Path) Begin(f *Framer, buf []byte, off, n int, h *Headers) error {
	f.buf, f.pos, f.err = nil, 0, false
	l := &f.l
	if err := p.headers(buf, off, n, h, l, &f.tmpl); err != nil {
		return err
	}
	f.fuse, f.udp = n >= FuseMin, p.Mode == ModeUDP
	if f.udp {
		f.ps = p.Pseudo()
	}
	switch {
	case !f.fuse:
	case f.udp:
		f.crc = f.pt.crc(&f.ps, buf[l.tstart:off], l.end-l.tstart)
	default:
		mk := &icrcMasks[16]
		if !l.v6 {
			mk = &icrcMasks[l.iphl>>2&0xf]
		}
		m := (l.iphl + UDPHeaderLen + bthFB + 1 + 7) &^ 7
		f.crc = crcHead(^icrcSeed, buf[l.ipStart:off], mk, m)
	}
	f.buf = buf
	return nil
}

// Put copies src to the next len(src) bytes of the payload, adding them
// to the ICRC as they are stored: src is read once and only read (it may
// be memory another process writes meanwhile; the ICRC covers the bytes
// as stored in the frame). More bytes than the payload has left are not
// copied, and Finish then fails.
func (f *Framer) Put(src []byte) {
	if f.buf == nil || len(src) > f.l.n-f.pos {
		f.err = true
		return
	}
	at := f.l.off + f.pos
	if f.fuse {
		f.crc = crcCopy(f.crc, f.buf[at:at+len(src)], src)
	} else {
		copy(f.buf[at:], src)
	}
	f.pos += len(src)
}

// Finish completes the packet once Put has placed the whole payload:
// pad, ICRC and UDP checksum (when the path needs one). It returns the
// packet, as Build does. The Framer is then empty.
func (f *Framer) Finish() ([]byte, error) {
	buf, l := f.buf, &f.l
	f.buf = nil
	if buf == nil || f.err || f.pos != l.n {
		return nil, fmt.Errorf("%w: payload of %d bytes given %d", ErrOpcodeLength, l.n, f.pos)
	}
	switch {
	case f.fuse:
		p := l.off + l.n
		putICRC(buf[p+l.pad:l.end], ^crcTail(f.crc, buf[p:p+l.pad]))
		l.udpChecksum(buf) // none in ModeUDP, where start is tstart
		return buf[l.start:l.end], nil
	case f.udp:
		return l.seal(buf, &f.ps, &f.pt), nil
	default:
		return l.seal(buf, nil, nil), nil
	}
}
