package roce

import "encoding/binary"

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

// BuildShort is Build for a Short packet in ModeUDP, byte for byte (a test
// holds the two equal), without Build's general layout: the n payload
// bytes are already at buf[s.ShortHeaderLen():]; it writes the BTH (pad
// count, no FECN/BECN, TVer 0), the RETH, the pad and the ICRC over the
// path's pseudo header, and returns the frame (from buf[0]). ok is false,
// and nothing is written, when the path is not ModeUDP, n is not shorter
// than FuseMin or buf is too short: the caller builds the general way.
// pt, if not nil, is the path's PseudoTx (the pseudo header's state kept
// from packet to packet).
func (p *Path) BuildShort(buf []byte, s *Short, n int, pt *PseudoTx) (frame []byte, ok bool) {
	hl := s.ShortHeaderLen()
	pad := -n & 3
	end := hl + n + pad + ICRCLen
	if p.Mode != ModeUDP || n < 0 || n >= FuseMin || end > len(buf) {
		return nil, false
	}
	b := buf[:end]
	op := OpRCSendOnly
	if s.WriteOnly {
		op = OpRCWriteOnly
		binary.BigEndian.PutUint64(b[BTHLen:], s.VA)
		binary.BigEndian.PutUint32(b[BTHLen+8:], s.RKey)
		binary.BigEndian.PutUint32(b[BTHLen+12:], s.DMALen)
	}
	b[bthOpcode] = uint8(op)
	b[bthFlags] = boolBit(s.SE, bthSE) | uint8(pad<<bthPadShift)&bthPadMask
	binary.BigEndian.PutUint16(b[bthPKey:], s.PKey)
	binary.BigEndian.PutUint32(b[bthDestQP:], s.DestQP&QPNMask) // FECN, BECN 0
	binary.BigEndian.PutUint32(b[bthPSN:], s.PSN&PSNMask)
	b[bthAck] = boolBit(s.AckReq, bthAckReq)
	body := hl + n + pad
	clear(b[hl+n : body])
	ps := p.Pseudo()
	if pt != nil {
		putICRC(b[body:], pt.icrc(&ps, b[:body]))
	} else {
		putICRC(b[body:], icrcPseudo(&ps, b[:body]))
	}
	return b, true
}
