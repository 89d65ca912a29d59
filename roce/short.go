package roce

import (
	"encoding/binary"
	"unsafe"
)

// Short is the packet BuildShort writes: an RC SEND Only or RDMA WRITE
// Only (with its RETH) of a payload shorter than FuseMin, the commonest
// packet of a message-rate workload.
type Short struct {
	WriteOnly bool // RDMA WRITE Only with a RETH, else SEND Only
	SE        bool
	AckReq    bool
	PKey      uint16
	DestQP    uint32
	PSN       uint32
	// RETH (WriteOnly)
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// ShortHeaderLen is the length of the transport headers of s: where its
// payload starts in a ModeUDP frame.
func (s *Short) ShortHeaderLen() int {
	if s.WriteOnly {
		return BTHLen + RETHLen
	}
	return BTHLen
}

// ShortOffset returns where BuildShort over p with pt wants the payload
// of s in its buffer: after the transport headers (ShortHeaderLen) in
// ModeUDP, and in ModeEthernet after the link headers too, which pt then
// holds for p (encoded if it held another path's). A path at the address
// of the one pt was last prepared for is taken to be that path unchanged:
// change a path in place only after pt.Forget. ok is false when
// BuildShort cannot build s over p (pt nil in ModeEthernet, or a path
// Build would refuse): the caller builds the general way.
func (p *Path) ShortOffset(s *Short, pt *PseudoTx) (off int, ok bool) {
	hl := s.ShortHeaderLen()
	if p.Mode == ModeUDP {
		return hl, true
	}
	if pt == nil {
		return 0, false
	}
	t := &pt.tmpl
	if at := uintptr(unsafe.Pointer(p)); pt.at != at || !t.ok {
		// Another path than last time, by address: compared, and
		// encoded if it differs.
		if !t.ok || !t.path.same(p) {
			pt.etlen = 0
			if t.encode(p) != nil {
				pt.at = 0
				return 0, false
			}
		}
		pt.at = at
	}
	return t.n + hl, true
}

// Forget empties t: a caller that changes in place a Path it gave to
// ShortOffset with t calls it first (ShortOffset takes the path at the
// address it saw last for the one it prepared t for).
func (t *PseudoTx) Forget() { *t = PseudoTx{} }

// BuildShort is Build for a Short packet, byte for byte (a test holds the
// two equal), without Build's general layout: the n payload bytes are
// already at buf[off:], off as ShortOffset returned; it writes the link
// headers (ModeEthernet: Ethernet, IP with ID 0, UDP), the BTH (pad
// count, no FECN/BECN, TVer 0), the RETH, the pad and the ICRC (over the
// path's pseudo header in ModeUDP), and returns the frame (from buf[0]).
// ok is false, and nothing is written, when n is not shorter than
// FuseMin, buf is too short, or in ModeEthernet pt is not what
// ShortOffset last prepared for p: the caller builds the general way.
// pt, if not nil, keeps the state of the headers before the transport
// packet from packet to packet (it must not be nil in ModeEthernet).
func (p *Path) BuildShort(buf []byte, s *Short, n int, pt *PseudoTx) (frame []byte, ok bool) {
	if p.Mode != ModeUDP {
		return p.buildShortLink(buf, s, n, pt)
	}
	hl := s.ShortHeaderLen()
	pad := -n & 3
	end := hl + n + pad + ICRCLen
	if n < 0 || n >= FuseMin || end > len(buf) {
		return nil, false
	}
	b := buf[:end]
	s.put(b, n, pad)
	body := hl + n + pad
	ps := p.Pseudo()
	if pt != nil {
		putICRC(b[body:], pt.icrc(&ps, b[:body]))
	} else {
		putICRC(b[body:], icrcPseudo(&ps, b[:body]))
	}
	return b, true
}

// buildShortLink is BuildShort in ModeEthernet.
func (p *Path) buildShortLink(buf []byte, s *Short, n int, pt *PseudoTx) (frame []byte, ok bool) {
	if pt == nil || pt.at != uintptr(unsafe.Pointer(p)) || !pt.tmpl.ok {
		return nil, false
	}
	t := &pt.tmpl
	pad := -n & 3
	tlen := s.ShortHeaderLen() + n + pad + ICRCLen
	end := t.n + tlen
	if n < 0 || n >= FuseMin || end > len(buf) {
		return nil, false
	}
	b := buf[:end]
	s.put(b[t.n:], n, pad)
	copy(b, t.hdr[:t.n])
	ip := b[t.ip:end]
	t.patch(ip, tlen, 0)
	body := len(ip) - ICRCLen
	var c uint32
	if pt.etlen == tlen {
		if !pt.eok {
			pt.ec, pt.eok = crcLinkHead(ip, t.iphl, t.v6), true
		}
		c = ^crcBody(pt.ec, ip[t.iphl+UDPHeaderLen:body])
	} else {
		pt.etlen, pt.eok = tlen, false
		c = icrcIP(ip[:body], t.v6, t.iphl)
	}
	putICRC(ip[body:], c)
	if t.udpSum {
		l := frameLayout{ipStart: t.ip, iphl: t.iphl, tstart: t.n, end: end, v6: t.v6, udpSum: true}
		l.udpChecksum(b)
	}
	return b, true
}

// put writes the transport headers of s at b[0:] and clears the pad after
// the n payload bytes that follow them.
func (s *Short) put(b []byte, n, pad int) {
	be := binary.BigEndian
	op := OpRCSendOnly
	hl := BTHLen
	if s.WriteOnly {
		op, hl = OpRCWriteOnly, BTHLen+RETHLen
		r := b[BTHLen : BTHLen+RETHLen]
		be.PutUint64(r[0:], s.VA)
		be.PutUint32(r[8:], s.RKey)
		be.PutUint32(r[12:], s.DMALen)
	}
	h := b[:BTHLen]
	// opcode | SE, M 0, pad, TVer 0 | P_Key: the first word.
	w := uint32(op)<<24 | uint32(pad)<<20 | uint32(s.PKey)
	if s.SE {
		w |= uint32(bthSE) << 16
	}
	be.PutUint32(h[0:], w)
	be.PutUint32(h[bthDestQP:], s.DestQP&QPNMask) // FECN, BECN 0
	psn := s.PSN & PSNMask
	if s.AckReq {
		psn |= uint32(bthAckReq) << 24
	}
	be.PutUint32(h[bthPSN:], psn)
	clear(b[hl+n : hl+n+pad])
}

// crcLinkHead returns the raw ICRC state after the IP and UDP headers at
// the start of ip (an IP header of iphl bytes, IPv6 when v6), their
// variant fields masked: the state a transport packet's CRC starts from.
func crcLinkHead(ip []byte, iphl int, v6 bool) uint32 {
	mk := &icrcMasks[16]
	if !v6 {
		mk = &icrcMasks[iphl>>2&0xf]
	}
	var h [IPv6HeaderLen + UDPHeaderLen]byte
	k := copy(h[:], ip[:min(iphl+UDPHeaderLen, len(h))])
	for i := range k {
		h[i] |= mk[i]
	}
	return crcWords(^icrcSeed, h[:k])
}

// same is p == q, field by field (== on the struct is a call to compare
// memory).
func (p *Path) same(q *Path) bool {
	return p.Mode == q.Mode && p.SrcMAC == q.SrcMAC && p.DstMAC == q.DstMAC && p.VLAN == q.VLAN &&
		p.VLANTCI == q.VLANTCI && p.Src == q.Src && p.Dst == q.Dst && p.SrcPort == q.SrcPort &&
		p.DstPort == q.DstPort && p.TOS == q.TOS && p.TTL == q.TTL && p.FlowLabel == q.FlowLabel &&
		p.DontFragment == q.DontFragment && p.UDPChecksum == q.UDPChecksum
}
