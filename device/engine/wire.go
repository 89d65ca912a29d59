package engine

import (
	"net/netip"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// packet is a packet as the step machines see it: the header fields, in
// host form. A received packet (fill) has them copied out of the roce
// views and payload is a view into the receive buffer (valid until the
// worker's next receive); for a packet to send (txQueue, txBegin) the
// machines set the fields and put the payload through the worker's
// framer (payload unused).
type packet struct {
	opcode   roce.Opcode
	psn      uint32
	ackReq   bool
	se       bool
	va       uint64 // RETH or AtomicETH
	rkey     uint32
	dmaLen   uint32
	swapAdd  uint64
	compare  uint64
	syndrome roce.Syndrome
	msn      uint32
	orig     uint64
	imm      uint32
	invRKey  uint32 // IETH
	plt, sel uint8  // FETH: placement type, selectivity level
	destQP   uint32 // UD: the BTH destination QP (the WQE's remote QPN)
	qkey     uint32 // DETH
	srcQP    uint32 // DETH
	srqn     uint32 // XRCETH: the XRC SRQ (XRC requests)
	payload  []byte
}

func (p *packet) fill(pkt *roce.Packet) {
	b := pkt.BTH
	// Cleared in place, then set: a literal with fields set is built on
	// the stack and copied.
	*p = packet{}
	p.opcode, p.psn, p.ackReq, p.se, p.payload = b.Opcode(), b.PSN(), b.AckReq(), b.SE(), pkt.Payload
	if pkt.RETH != nil {
		p.va, p.rkey, p.dmaLen = pkt.RETH.VA(), pkt.RETH.RKey(), pkt.RETH.DMALength()
	}
	if pkt.FETH != nil {
		p.plt, p.sel = pkt.FETH.PlacementType(), pkt.FETH.SelectivityLevel()
	}
	if pkt.AtomicETH != nil {
		a := pkt.AtomicETH
		p.va, p.rkey, p.swapAdd, p.compare = a.VA(), a.RKey(), a.SwapAdd(), a.Compare()
	}
	if pkt.AETH != nil {
		p.syndrome, p.msn = pkt.AETH.Syndrome(), pkt.AETH.MSN()
	}
	if pkt.AtomicAckETH != nil {
		p.orig = pkt.AtomicAckETH.OrigRemoteData()
	}
	if pkt.ImmDt != nil {
		p.imm = pkt.ImmDt.Imm()
	}
	if pkt.IETH != nil {
		p.invRKey = pkt.IETH.RKey()
	}
	if pkt.DETH != nil {
		p.qkey, p.srcQP = pkt.DETH.QKey(), pkt.DETH.SrcQP()
	}
}

// pkeyDefault is the only P_Key vrnic uses (the default partition).
const pkeyDefault = abi.PKeyDefault

// setPath builds the QP's path (the address vector in roce terms) to
// remote, and its peer, the address beside every frame it sends.
//
// In ModeUDP the path's source address and port are the link's: that is
// where the kernel sends from, so they are what the receiver puts in the
// pseudo header it checks the ICRC with. (A QP whose source GID is not
// the link's address receives nothing: see worker.input.) The
// destination port is 4791.
func (qp *QP) setPath(remote netip.Addr) {
	qp.path = roce.Path{
		Src:     qp.attr.LocalAddr,
		Dst:     remote,
		SrcPort: roce.UDPSrcPort(qp.qpn),
		TTL:     64,
		// DF as Linux rxe sets it: RoCE v2 packets are never fragmented.
		DontFragment: true,
	}
	qp.path.Mode, qp.path.SrcMAC = qp.w.e.cfg.Mode, qp.w.e.cfg.MAC
	if qp.w.ccp != nil {
		// ECN-capable (ECT(0)): a congested queue marks instead of
		// dropping, and the peer answers the mark with a CNP (cc.go).
		// The ICRC does not cover the field.
		qp.path.TOS |= ecnECT0
	}
	pathPeer(&qp.path, &qp.w.e.cfg)
	qp.w.ptx[qp.qpn%uint32(len(qp.w.ptx))].Forget()
}

// useAH makes a's path the QP's (UD: every WQE names its AH), with the
// QP's own UDP source port (ModeEthernet), as rxe picks it for a UD QP.
func (qp *QP) useAH(a *AH) {
	if qp.ah == a {
		return
	}
	qp.ah = a
	qp.w.ptx[qp.qpn%uint32(len(qp.w.ptx))].Forget()
	qp.path = a.path
	if qp.path.Mode != roce.ModeUDP {
		qp.path.SrcPort = roce.UDPSrcPort(qp.qpn)
	}
}

// txQueue builds o, a packet without payload, in buf (a buffer txBuf
// returned) and queues the frame; false if it could not be built. A
// request of a UD or UC QP is reported to the QP once the link took it
// (flush, sentThrough). Packets with a payload go through txBegin, a Put
// of the payload into w.framer, and txFinish.
func (w *worker) txQueue(qp *QP, buf []byte, o *packet) bool {
	return w.txBegin(qp, buf, o, qp.path.Headroom(o.opcode), 0) && w.txFinish(qp, buf, o.psn)
}

// txBegin starts a packet o in buf whose payload of n bytes, after hr
// bytes of headroom (qp.path.Headroom), the caller then puts through
// w.framer (Put: the payload copied into the frame and the ICRC computed
// in one pass) before txFinish queues it. False if the headers could not
// be built (counted as txQueue counts it).
//
// The headers are set in w.hdrs here rather than by a helper: this runs
// for every packet, and a call less shows in the instructions per
// message.
func (w *worker) txBegin(qp *QP, buf []byte, o *packet, hr, n int) bool {
	h := &w.hdrs
	op := o.opcode
	if qp.svc == roce.ServiceXRC {
		// The step machines speak RC; the wire, XRC (xrc.go).
		op += roce.XRCOpcodeOffset
		hr = qp.path.Headroom(op)
	}
	*h = roce.Headers{BTH: roce.BTHFields{
		Opcode: op, SE: o.se, PKey: pkeyDefault, DestQP: qp.attr.DestQPN, AckReq: o.ackReq, PSN: o.psn,
	}}
	info := op.Info()
	if info.Has(roce.HdrXRCETH) {
		h.XRCSRQN = o.srqn
	}
	if info.Has(roce.HdrDETH) {
		h.BTH.DestQP = o.destQP
		h.DETH = roce.DETHFields{QKey: o.qkey, SrcQP: qp.qpn}
	}
	if info.Has(roce.HdrRETH) {
		h.RETH = roce.RETHFields{VA: o.va, RKey: o.rkey, DMALength: o.dmaLen}
	}
	if info.Has(roce.HdrFETH) {
		h.FETH = roce.FETHFields{PlacementType: o.plt, SelectivityLevel: o.sel}
	}
	if info.Has(roce.HdrAtomicETH) {
		h.AtomicETH = roce.AtomicETHFields{VA: o.va, RKey: o.rkey, SwapAdd: o.swapAdd, Compare: o.compare}
	}
	if info.Has(roce.HdrAETH) {
		h.AETH = roce.AETHFields{Syndrome: o.syndrome, MSN: o.msn}
	}
	h.AtomicAckETH.OrigRemoteData = o.orig
	h.Imm, h.InvRKey = o.imm, o.invRKey
	if err := qp.path.Begin(&w.framer, buf, hr, n, h); err != nil {
		w.Counters.BuildErrors.Add(1)
		return false
	}
	return true
}

// txFinish completes the packet txBegin started (pad, ICRC) and queues
// it as txQueue does.
func (w *worker) txFinish(qp *QP, buf []byte, psn uint32) bool {
	frame, err := w.framer.Finish()
	if err != nil || len(frame) == 0 || &frame[0] != &buf[0] {
		// A bug, not a wire condition: count it; the packet is lost and
		// the retry machinery reports it if it matters.
		w.Counters.BuildErrors.Add(1)
		return false
	}
	return w.txQueued(qp, buf, frame, psn)
}

// txQueued queues frame, built at the start of buf, for qp's peer.
func (w *worker) txQueued(qp *QP, buf, frame []byte, psn uint32) bool {
	w.tx[w.txN] = buf[:len(frame)]
	w.txTo[w.txN] = peerOf(&qp.path)
	w.txUnrel[w.txN] = nil
	if qp.unrel {
		w.txUnrel[w.txN], w.txPSN[w.txN] = qp, psn
	}
	w.txN++
	w.busy = true
	qp.Counters.PacketsSent.Add(1)
	return true
}

// shortOK reports whether o, a data packet of n payload bytes of qp, is
// a roce.Short the worker builds with txShort: an RC SEND Only or RDMA
// WRITE Only shorter than roce.FuseMin, without congestion control
// (which marks what it sends).
func (w *worker) shortOK(qp *QP, o *packet, n int) bool {
	return qp.svc == roce.ServiceRC && w.ccp == nil && n < roce.FuseMin &&
		(o.opcode == roce.OpRCWriteOnly || o.opcode == roce.OpRCSendOnly)
}

// frameSink takes a payload into a frame as Memory.GatherTo hands it
// over: a plain copy, for the packets txShort builds (their ICRC is
// computed over the frame afterwards).
type frameSink struct {
	b   []byte
	n   int
	err bool
}

func (s *frameSink) Put(p []byte) {
	if len(p) > len(s.b)-s.n {
		s.err = true
		return
	}
	s.n += copy(s.b[s.n:], p)
}

// txShort builds and queues o (shortOK) in buf, its payload the n bytes
// of e's message at poff, with roce.Path.BuildShort instead of the
// general txBegin, Framer and txFinish: the same bytes, built with a
// fraction of the work. An error is GatherTo's (the WQE fails); false
// without one, as txFinish.
func (w *worker) txShort(qp *QP, e *swqe, buf []byte, o *packet, poff uint64, n int) (bool, error) {
	s := &w.short
	*s = roce.Short{WriteOnly: o.opcode == roce.OpRCWriteOnly, SE: o.se, AckReq: o.ackReq, PKey: pkeyDefault,
		DestQP: qp.attr.DestQPN, PSN: o.psn, VA: o.va, RKey: o.rkey, DMALen: o.dmaLen}
	pt := &w.ptx[qp.qpn%uint32(len(w.ptx))]
	off, ok := qp.path.ShortOffset(s, pt)
	if !ok || off+n+3+roce.ICRCLen > len(buf) {
		w.Counters.BuildErrors.Add(1)
		return false, nil
	}
	if e.Flags&abi.SendInline != 0 {
		copy(buf[off:off+n], e.Inline[poff:poff+uint64(n)])
	} else {
		sk := &w.sink
		*sk = frameSink{b: buf[off : off+n]}
		if err := qp.cfg.Mem.GatherTo(e.SGEs, poff, n, sk); err != nil {
			return false, err
		}
		if sk.err || sk.n != n {
			w.Counters.BuildErrors.Add(1)
			return false, nil
		}
	}
	frame, ok := qp.path.BuildShort(buf, s, n, pt)
	if !ok {
		w.Counters.BuildErrors.Add(1)
		return false, nil
	}
	return w.txQueued(qp, buf, frame, o.psn), nil
}

// txRepeat queues a copy of the frame txQueue queued last, if the batch
// has room for it without a flush (a flush may hand the frame's buffer to
// the link). The copy is the only one the data path makes of a frame; it
// happens only for redundant retries.
func (w *worker) txRepeat(qp *QP) {
	if w.txN == 0 || w.txN == len(w.tx) {
		return
	}
	f := w.tx[w.txN-1]
	b := w.tx[w.txN]
	b = b[:cap(b)]
	w.tx[w.txN] = b[:copy(b, f)]
	w.txTo[w.txN] = w.txTo[w.txN-1]
	w.txUnrel[w.txN] = nil
	w.txN++
	qp.Counters.PacketsSent.Add(1)
}
