package engine

import (
	"unsafe"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Selective repeat and the adaptive retransmission timer: what an RC QP
// does differently when both ends are vrnic and agreed on it (ECE,
// abi.ECEOptions; kernel-notes/loss.md). Without an option in force none
// of this runs and the QP is the IBTA's go-back-N requester and responder,
// byte for byte.
//
// Selective repeat (abi.ECESelectiveRepeat), after IRN (SIGCOMM 2018):
//
//   - The responder keeps a request packet that arrives after a gap, up
//     to the send window beyond the expected PSN, instead of dropping it
//     and sending a NAK-sequence error. When the gap is filled it runs the
//     kept packets through the ordinary checks in PSN order (srDrain), so
//     every operation executes exactly as it would have in order.
//   - Each new gap is named once, at once, by a selective NAK: an ACK
//     packet whose AETH carries NAK code nakSelective, whose BTH PSN is
//     the first missing PSN and whose MSN field is the PSN after the last
//     missing one. It acknowledges nothing: the cumulative ACKs go on as
//     before, at the expected PSN.
//   - The requester resends exactly the named PSNs (srResend), each asking
//     for an ACK, before anything new. A lost resend or selective NAK, and
//     a loss at the tail of what was sent, are found by the retransmission
//     timer, which restarts go-back-N as before: the responder drops what
//     it already holds.
//
// The adaptive timer (abi.ECEAdaptiveRTO), after RFC 6298: the requester
// times one packet that asks for an ACK at a time (never a resent one:
// Karn), keeps the smoothed round trip and its variation, and arms the
// retransmission timer at SRTT + 4 RTTVAR (at least rtoMin, doubled at
// each timeout without progress, at most the IBTA timeout). Retries are
// still counted against the IBTA timeout: a timeout consumes one of
// retry_cnt only when a whole IBTA timeout passed since the last progress
// or the last consumed retry, so a QP gives up (RETRY_EXC_ERR) no sooner
// than with the fixed timer.

// nakSelective is the NAK code of a selective NAK: one of the codes the
// IBTA reserves (9.7.5.2.2 "NAK codes": 5-31), sent only to a peer that
// agreed to selective repeat.
const nakSelective roce.NAKCode = 0x1f

const (
	// maxSNAKs: selective NAKs a responder has queued at most; a gap
	// found with the queue full widens the newest one.
	maxSNAKs = 16
	// maxResend: PSN ranges a requester has queued to resend at most; one
	// more widens the newest.
	maxResend = 16
	// maxHeldBytes: what the packets a worker's responders keep out of
	// order may hold together (frame buffers); a packet beyond it is
	// dropped (the requester's timer resends it).
	maxHeldBytes = 16 << 20
	// maxHeldFree: spare frame buffers a worker keeps for reuse (a
	// window's worth).
	maxHeldFree = 1024
	// rtoMin, rtoInit, rtoG: the adaptive timer's least value, its value
	// before the first sample and the clock granularity term of RFC 6298
	// (ns).
	rtoMin  = 100_000
	rtoInit = 1_000_000
	rtoG    = 10_000
	// reNAKMin: a gap is named again no sooner than this after its
	// last selective NAK (ns; reNAKAfter).
	reNAKMin = 50_000
	// srInFlight: the packets a requester with selective repeat has in
	// flight at most: sent after the newest one the responder is known
	// to have (srDeliveredPSN). It is what keeps the queue in front of
	// the responder short, so that a resend waits behind few packets and
	// a gap is filled long before the send window, which bounds the
	// PSNs from the oldest unacknowledged one, runs out.
	srInFlight = 128
	// maxBackoff: doublings of the adaptive timer at most.
	maxBackoff = 16
)

// psnRange is the PSNs [start, end).
type psnRange struct{ start, end uint32 }

// heldPkt is a request packet kept out of order; p.payload is buf's.
type heldPkt struct {
	p   packet
	buf []byte
}

// srState is a QP's selective-repeat and adaptive-timer state (QP.sr).
type srState struct {
	sr, rto bool // the options in force

	// Responder: the packets kept beyond the expected PSN, ascending,
	// from held[hd]; the selective NAKs to send.
	held     []heldPkt
	hd       int
	draining bool
	snaks    []psnRange
	// headNAKAt: when the gap at the expected PSN was last named,
	// headFound when first (0: no gap); fillRTT: how long gaps take to
	// be filled after they are first named (smoothed), 0 before the
	// first.
	headNAKAt, headFound, fillRTT int64

	// Requester: the PSNs to resend; delivered, the PSN after the
	// newest one the responder is known to have.
	resend    []psnRange
	delivered uint32

	// Adaptive timer: SRTT and RTTVAR (ns; srtt 0: no sample yet); the
	// packet being timed; doublings since the last progress; when the
	// next timeout consumes a retry.
	srtt, rttvar int64
	rttOn        bool
	rttPSN       uint32
	rttAt        int64
	backoff      uint8
	budgetAt     int64
}

// setECE records the ECE options in force on an RC QP (abi.QPAttrECE).
// UC, UD and XRC QPs have none.
func (qp *QP) setECE(opts uint32) {
	opts &= abi.ECEOptions
	if qp.svc != roce.ServiceRC {
		opts = 0
	}
	if opts == 0 {
		qp.srRelease()
		qp.sr = nil
		return
	}
	if qp.sr == nil {
		qp.sr = &srState{}
	}
	qp.sr.sr, qp.sr.rto = opts&abi.ECESelectiveRepeat != 0, opts&abi.ECEAdaptiveRTO != 0
}

// ECE reports the ECE options in force on the QP.
func (qp *QP) ECE() uint32 {
	var o uint32
	if s := qp.sr; s != nil && s.sr {
		o |= abi.ECESelectiveRepeat
	}
	if s := qp.sr; s != nil && s.rto {
		o |= abi.ECEAdaptiveRTO
	}
	return o
}

// srRelease forgets what selective repeat holds and owes (RESET, ERR,
// destroy): the kept packets' buffers go back to the worker.
func (qp *QP) srRelease() {
	s := qp.sr
	if s == nil {
		return
	}
	for i := s.hd; i < len(s.held); i++ {
		qp.w.heldPut(s.held[i].buf)
		s.held[i] = heldPkt{}
	}
	s.held, s.hd = s.held[:0], 0
	s.snaks, s.resend = s.snaks[:0], s.resend[:0]
	s.rttOn, s.backoff, s.budgetAt = false, 0, 0
	s.srtt, s.rttvar, s.fillRTT, s.headNAKAt, s.headFound, s.delivered = 0, 0, 0, 0, 0, 0
}

// srShrink lets an idle QP (parkSweep) give back what selective repeat
// grew for its losses: the kept-packet list (up to a window of entries)
// and the NAK and resend queues, when they are empty.
func (qp *QP) srShrink() {
	if s := qp.sr; s != nil && s.hd == len(s.held) && len(s.snaks) == 0 && len(s.resend) == 0 {
		s.held, s.hd, s.snaks, s.resend = nil, 0, nil, nil
	}
}

// heldGet returns a spare frame buffer (Config.FrameCap) for a kept
// packet, nil when the worker's responders hold maxHeldBytes already.
func (w *worker) heldGet() []byte {
	n := w.e.cfg.FrameCap
	if w.heldBytes+n > maxHeldBytes {
		return nil
	}
	w.heldBytes += n
	w.Counters.HeldPackets.Add(1)
	if k := len(w.heldFree); k > 0 {
		b := w.heldFree[k-1]
		w.heldFree = w.heldFree[:k-1]
		return b
	}
	return make([]byte, n)
}

// heldPut gives back the buffer of a kept packet.
func (w *worker) heldPut(b []byte) {
	if b == nil {
		return
	}
	w.heldBytes -= w.e.cfg.FrameCap
	w.Counters.HeldPackets.Add(-1)
	if len(w.heldFree) < maxHeldFree && cap(b) >= w.e.cfg.FrameCap {
		w.heldFree = append(w.heldFree, b[:cap(b)])
	}
}

// heldTake returns the buffer p's payload lies in and puts a spare one in
// its place among the worker's receive buffers, so that a kept packet
// costs no copy; when p is not the frame being received (or the worker
// holds too much) it copies p's payload into a spare buffer instead. nil:
// nothing to keep it in.
func (w *worker) heldTake(p *packet) []byte {
	spare := w.heldGet()
	if spare == nil {
		return nil
	}
	if i := w.rxCur; i >= 0 && within(p.payload, w.rx[i]) {
		b := w.rx[i]
		w.rx[i] = spare[:cap(spare)]
		return b
	}
	p.payload = spare[:copy(spare, p.payload)]
	return spare
}

// within reports whether the bytes of v lie in b's array (v empty: yes).
func within(v, b []byte) bool {
	if len(v) == 0 {
		return true
	}
	b = b[:cap(b)]
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&b[0]))
	at := uintptr(unsafe.Pointer(&v[0]))
	return at >= lo && at+uintptr(len(v)) <= lo+uintptr(len(b))
}

// srHold keeps request p, d PSNs beyond the expected one, and names the
// gap before it if it is a new one (respCheckPSN, selective repeat).
func (qp *QP) srHold(p *packet, d int32) {
	s, r := qp.sr, &qp.resp
	if d >= int32(qp.w.window) || len(p.payload) > qp.w.e.cfg.FrameCap {
		// Beyond anything the requester may have sent: bogus.
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	held := s.held[s.hd:]
	// Packets arrive in order but for the losses: the place is nearly
	// always the end.
	i := len(held)
	for i > 0 && roce.PSNDiff(held[i-1].p.psn, p.psn) > 0 {
		i--
	}
	if len(held) > 0 && !r.nakSent && qp.w.now-s.headNAKAt > s.reNAKAfter() {
		// The gap at the expected PSN outlived its NAK by far more than
		// gaps take to fill: the resend (or the NAK) was lost. Name it
		// again rather than wait for the requester's timer.
		qp.srQueueSNAK(psnRange{r.epsn, held[0].p.psn})
	}
	if i > 0 && held[i-1].p.psn == p.psn {
		qp.Counters.Rare().Duplicates.Add(1)
		return
	}
	next := r.epsn // the PSN after the last one received
	if len(held) > 0 {
		next = qp.srAfter(&held[len(held)-1].p)
	}
	h := heldPkt{p: *p}
	if h.buf = qp.w.heldTake(&h.p); h.buf == nil {
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	// After an RNR NAK (nakSent) the requester resends everything from
	// the NAKed PSN when its RNR timer ends: no gap to name.
	if i == len(held) && !r.nakSent && roce.PSNDiff(p.psn, next) > 0 {
		qp.srQueueSNAK(psnRange{next, p.psn})
	}
	if p.ackReq {
		// Tell the requester what arrived (srReceived): it keeps
		// sending while the gap is filled.
		r.ackPending = true
	}
	if s.hd > 0 && len(s.held) == cap(s.held) {
		// Slide the live entries to the front before the slice grows.
		n := copy(s.held, s.held[s.hd:])
		clear(s.held[n:])
		s.held, s.hd = s.held[:n], 0
	}
	s.held = append(s.held, heldPkt{})
	at := s.hd + i
	copy(s.held[at+1:], s.held[at:])
	s.held[at] = h
}

// reNAKAfter is how long a gap at the expected PSN may stay after its
// selective NAK before it is named again: twice the usual time to fill
// one, at least reNAKMin.
func (s *srState) reNAKAfter() int64 {
	return max(2*s.fillRTT, reNAKMin)
}

// srAfter is the PSN after request p: a READ request uses a PSN for each
// response packet.
func (qp *QP) srAfter(p *packet) uint32 {
	if p.opcode.Info().Is(roce.OpRead) {
		return roce.PSNAdd(p.psn, readPackets(p.dmaLen, qp.mtu))
	}
	return roce.PSNAdd(p.psn, 1)
}

// srReceived is the PSN after the newest request the responder has, in
// order or kept: what its ACKs carry in the AETH's MSN field with
// selective repeat (the MSN means nothing to a requester).
func (qp *QP) srReceived() uint32 {
	if s := qp.sr; s.hd < len(s.held) {
		return qp.srAfter(&s.held[len(s.held)-1].p)
	}
	return qp.resp.epsn
}

// srDelivered records that the responder has the requests before psn
// (an ACK's MSN field, srReceived; a selective NAK's end).
func (qp *QP) srDelivered(psn uint32) {
	psn &= roce.PSNMask
	if d := qp.srDeliveredPSN(); roce.PSNDiff(psn, d) > 0 && roce.PSNDiff(psn, qp.req.psn) <= 0 {
		qp.sr.delivered = psn
	}
}

// srDeliveredPSN is the PSN after the newest request the responder is
// known to have: at least the oldest one not acknowledged.
func (qp *QP) srDeliveredPSN() uint32 {
	s := qp.sr
	if roce.PSNDiff(s.delivered, qp.comp.psn) < 0 || roce.PSNDiff(s.delivered, qp.req.psn) > 0 {
		s.delivered = qp.comp.psn
	}
	return s.delivered
}

// srQueueSNAK queues a selective NAK for g.
func (qp *QP) srQueueSNAK(g psnRange) {
	s := qp.sr
	if g.start == qp.resp.epsn {
		s.headNAKAt = qp.w.now
		if s.headFound == 0 {
			s.headFound = qp.w.now
		}
	}
	qp.Counters.Rare().SeqNAKsSent.Add(1)
	if len(s.snaks) == maxSNAKs {
		s.snaks[len(s.snaks)-1].end = g.end
		return
	}
	s.snaks = append(s.snaks, g)
}

// srDrain runs the kept packets that the expected PSN has reached through
// the responder, in PSN order, after a request filled a gap (respRx).
func (qp *QP) srDrain() {
	s := qp.sr
	if roce.PSNDiff(s.held[s.hd].p.psn, qp.resp.epsn) > 0 {
		return // the gap is still there
	}
	if s.headFound != 0 {
		if d := qp.w.now - s.headFound; s.fillRTT == 0 {
			s.fillRTT = d
		} else {
			s.fillRTT += (d - s.fillRTT) / 8
		}
	}
	s.draining = true
	for s.hd < len(s.held) {
		h := s.held[s.hd]
		d := roce.PSNDiff(h.p.psn, qp.resp.epsn)
		if d > 0 {
			break
		}
		s.held[s.hd] = heldPkt{}
		s.hd++
		if d == 0 {
			qp.respRx(&h.p)
		} else {
			qp.Counters.Rare().Duplicates.Add(1)
		}
		qp.w.heldPut(h.buf)
		if qp.sr == nil {
			break // the QP was reset under the packet (it cannot be; be safe)
		}
	}
	s.headFound = 0
	if s.hd == len(s.held) {
		s.held, s.hd = s.held[:0], 0
	} else {
		// The next gap is at the expected PSN now. It was named when
		// found, and is timed from here.
		s.headNAKAt, s.headFound = qp.w.now, qp.w.now
	}
	s.draining = false
}

// srOutput sends the queued selective NAKs (respOutput); false when the
// transmit batch filled up first.
func (qp *QP) srOutput() bool {
	s := qp.sr
	for len(s.snaks) > 0 {
		buf := qp.w.txBuf()
		if buf == nil {
			return false
		}
		g := s.snaks[0]
		o := &qp.w.out
		*o = packet{opcode: roce.OpRCAck, psn: g.start, msn: g.end, syndrome: roce.NAKSyndrome(nakSelective)}
		qp.w.txQueue(qp, buf, o)
		if h := traceHook.Load(); h != nil {
			(*h)(qp, "B tx snak [%d, %d)", g.start, g.end)
		}
		s.snaks = s.snaks[:copy(s.snaks, s.snaks[1:])]
	}
	return true
}

// compSNAK: a selective NAK names PSNs [psn, msn) the responder lacks;
// the requester resends them before anything new (reqStep, srResend).
func (qp *QP) compSNAK(p *packet) compState {
	qp.Counters.Rare().SeqNAKsReceived.Add(1)
	g := psnRange{p.psn, p.msn & roce.PSNMask}
	if roce.PSNDiff(g.end, g.start) <= 0 || roce.PSNDiff(g.end, qp.req.psn) > 0 {
		return compDrop // names what was never sent
	}
	if qp.comp.rnrWait {
		return compDone // the RNR wait's go-back-N resends it
	}
	if roce.PSNDiff(g.start, qp.comp.psn) < 0 {
		g.start = qp.comp.psn
	}
	if roce.PSNDiff(g.end, g.start) <= 0 {
		return compDone
	}
	s := qp.sr
	qp.srDelivered(roce.PSNAdd(g.end, 1))
	s.rttOn = false // Karn: no sample across a resend
	switch n := len(s.resend); {
	case n > 0 && roce.PSNDiff(g.start, s.resend[n-1].end) <= 0 && roce.PSNDiff(g.end, s.resend[n-1].end) > 0:
		s.resend[n-1].end = g.end
	case n == maxResend:
		s.resend[n-1].end = g.end
	default:
		s.resend = append(s.resend, g)
	}
	qp.Counters.Rare().Retransmits.Add(1)
	// The responder is alive and taking packets: the retransmission
	// timer starts again (not the retry count, which only progress
	// restores).
	if qp.retryTimer.armed() {
		qp.armRetry()
	}
	return compDone
}

// compStraySNAK: a selective NAK to a QP without selective repeat (the
// peer was told it is on, this end was not: VRNIC_ECE on one side only).
// It acknowledges nothing; go-back-N from the oldest PSN not acknowledged
// covers the gap it names, at most once per episode as for a NAK-sequence
// error, so the QP goes on rather than taking an unknown NAK for an error.
func (qp *QP) compStraySNAK() compState {
	qp.Counters.Rare().SeqNAKsReceived.Add(1)
	if qp.comp.rnrWait || qp.comp.inRetry {
		return compDone
	}
	qp.startRetry(false)
	return compDone
}

// srResend sends the PSNs selective NAKs named (reqStep); false when it
// could not finish (the transmit batch is full, congestion control holds
// the QP, or a WQE failed).
func (qp *QP) srResend() bool {
	s := qp.sr
	for len(s.resend) > 0 {
		g := &s.resend[0]
		if roce.PSNDiff(g.start, qp.comp.psn) < 0 {
			g.start = qp.comp.psn
		}
		var e *swqe
		if roce.PSNDiff(g.start, g.end) < 0 {
			e = qp.srFind(g.start)
		}
		if e == nil {
			s.resend = s.resend[:copy(s.resend, s.resend[1:])]
			continue
		}
		psn, next := g.start, roce.PSNAdd(g.start, 1)
		if e.isReadAtomic() {
			// One request asks again for all of it (a READ from the
			// first response still missing).
			psn, next = e.first, roce.PSNAdd(e.last, 1)
			if e.Opcode == abi.WRRDMARead {
				psn = roce.PSNAdd(e.first, e.rcvd)
			}
		}
		if qp.w.ccp != nil && qp.ccHold() {
			return false
		}
		if _, ok := qp.sendPacket(e, psn, true); !ok {
			return false
		}
		g.start = next
	}
	if !qp.retryTimer.armed() {
		qp.armRetry()
	}
	return true
}

// srFind returns the WQE that sent psn and still waits for its answer,
// nil if none does (acknowledged since, or not sent yet: the requester
// sends it in turn).
func (qp *QP) srFind(psn uint32) *swqe {
	for i := qp.head; i != qp.next+1 && i != qp.tail; i++ {
		e := &qp.sq[i&qp.sqMask]
		if e.info == nil {
			continue
		}
		if e.state == wqePosted || roce.PSNDiff(psn, e.first) < 0 {
			return nil
		}
		if roce.PSNDiff(psn, e.last) > 0 {
			continue
		}
		if e.state == wqeDone || e.state == wqeSending && roce.PSNDiff(psn, e.sendPSN) >= 0 {
			return nil
		}
		return e
	}
	return nil
}

// srSent starts timing o (adaptive timer) when nothing is timed and o is
// neither a resend nor a go-back-N repeat.
func (qp *QP) srSent(o *packet, resend bool) {
	s := qp.sr
	if !s.rto || s.rttOn || resend || !o.ackReq || roce.PSNDiff(o.psn, qp.req.ackAllUntil) < 0 {
		return
	}
	s.rttOn, s.rttPSN, s.rttAt = true, o.psn, qp.w.now
}

// srProgress: the responder acknowledged PSNs before psn (progress): a
// round trip sample if the timed packet is among them (RFC 6298 2.2,
// 2.3), and the timer's backoff and retry budget start again.
func (qp *QP) srProgress(psn uint32) {
	s := qp.sr
	if !s.rto {
		return
	}
	s.backoff = 0
	s.budgetAt = qp.w.now + ackTimeout(qp.attr.Timeout)
	if !s.rttOn || roce.PSNDiff(psn, s.rttPSN) <= 0 {
		return
	}
	s.rttOn = false
	r := max(qp.w.now-s.rttAt, 1)
	if s.srtt == 0 {
		s.srtt, s.rttvar = r, r/2
		return
	}
	dev := s.srtt - r
	if dev < 0 {
		dev = -dev
	}
	s.rttvar += (dev - s.rttvar) / 4
	s.srtt += (r - s.srtt) / 8
}

// srTimeout returns the retransmission timeout of a QP with the adaptive
// timer, ibta being the IBTA ACK timeout it never exceeds.
func (qp *QP) srTimeout(ibta int64) int64 {
	s := qp.sr
	rto := int64(rtoInit)
	if s.srtt > 0 {
		rto = max(s.srtt+max(rtoG, 4*s.rttvar), rtoMin)
	}
	for range s.backoff {
		if rto >= ibta {
			break
		}
		rto *= 2
	}
	return min(rto, ibta)
}

// srOnTimeout handles a retransmission timeout of a QP with the adaptive
// timer; true if it was one a retry is not counted for (go-back-N restarted
// here), false to count it (startRetry(true)).
func (qp *QP) srOnTimeout() bool {
	s := qp.sr
	s.rttOn = false
	if s.budgetAt == 0 {
		s.budgetAt = qp.w.now + ackTimeout(qp.attr.Timeout)
	}
	if s.backoff < maxBackoff {
		s.backoff++
	}
	if qp.w.now >= s.budgetAt {
		s.budgetAt = qp.w.now + ackTimeout(qp.attr.Timeout)
		return false
	}
	qp.req.dup = false
	qp.comp.inRetry = false
	if h := traceHook.Load(); h != nil {
		(*h)(qp, "retry rto from %d srtt %d rttvar %d", qp.comp.psn, s.srtt, s.rttvar)
	}
	if s.sr {
		qp.srProbe()
	} else {
		qp.rewind(qp.comp.psn)
	}
	qp.armRetry()
	return true
}

// srProbe is what a retransmission timeout resends with selective repeat:
// the oldest packet not acknowledged and the newest one sent, not
// everything since (go-back-N). The first fills the gap the responder
// waits at, if that is what was lost; the second, if it was lost too,
// shows the responder the gap before it (a loss at the tail, with nothing
// after it to show it), which it then names; the responder names a gap
// again when a packet it already holds arrives long after the gap's NAK.
func (qp *QP) srProbe() {
	s := qp.sr
	qp.Counters.Rare().Retransmits.Add(1)
	s.rttOn = false
	last := roce.PSNAdd(qp.req.psn, roce.PSNMask)
	if qp.next != qp.tail {
		if e := &qp.sq[qp.next&qp.sqMask]; e.state == wqeSending {
			last = roce.PSNAdd(e.sendPSN, roce.PSNMask)
		}
	}
	s.resend = append(s.resend[:0], psnRange{qp.comp.psn, roce.PSNAdd(qp.comp.psn, 1)})
	if roce.PSNDiff(last, qp.comp.psn) > 0 {
		s.resend = append(s.resend, psnRange{last, roce.PSNAdd(last, 1)})
	}
	qp.w.busy = true
}
