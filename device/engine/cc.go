package engine

import (
	"net/netip"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/cc"
	"github.com/vrnic/vrnic/roce"
)

// Congestion control (RoCE v2 annex A17.9, DCQCN): the engine's hooks
// into package cc, which holds the algorithms. With Config.CC nil (the
// default) none of this runs: every hook sits behind one nil check.
//
//   - Notification point: a received RC, UC or XRC packet carrying data
//     and marked Congestion Experienced (the IP ECN field on the TAP link;
//     the BTH FECN bit, which the UDP link sets from the datagram's IP ECN
//     field: link/udp_ecn.go) makes the QP send a CNP to its peer QP, at
//     most one per cc.Params.MinTimeBetweenCNPs (ccCE, txCNP).
//   - Reaction point: a CNP for a QP (checked as any packet: from the
//     QP's peer, default partition, ICRC) cuts its rate (cc.RP); it is
//     not an ACK and never reaches the completer (inputCNP).
//   - Pacing: a QP whose rate is below the line rate asks its token
//     bucket (cc.Pacer) before each request or READ response packet
//     (reqSend, sendResponse) and waits on a timer
//     of its worker when the bucket is empty (ccHold). With
//     cc.Params.LinkRate, the worker's own bucket (linkPace) limits what
//     all its QPs send together, as a port's speed does. With congestion
//     control off, the requester tests one pointer per packet.
//   - Timers: the rate-increase timer and the pacing wake-up are timers
//     of the worker's heap (timerCCRate, timerCCPace), as the ACK and RNR
//     timers are.
//
// A QP's CC state is made the first time it sees CE or a CNP, and kept in
// its worker's ccs map, not in the QP: an idle QP holds two flag bytes
// (QP.ccHas, QP.ccPaced) in what was padding. A QP that never meets
// congestion allocates nothing; RESET, ERR and destroy drop the state.

// ECN field values (RFC 3168).
const (
	ecnMask = 0x3
	ecnECT0 = 0x2
	ecnCE   = 0x3
)

// qpCC is a QP's congestion-control state.
type qpCC struct {
	rp        cc.RP
	pace      cc.Pacer
	np        cc.NP
	rateTimer timer
	paceTimer timer
}

// ccState returns the QP's CC state, made on first use.
func (qp *QP) ccState() *qpCC {
	w := qp.w
	if qp.ccHas {
		return w.ccs[qp]
	}
	c := &qpCC{}
	c.rp.Init(w.ccp)
	c.rateTimer = timer{idx: -1, kind: timerCCRate, qp: qp}
	c.paceTimer = timer{idx: -1, kind: timerCCPace, qp: qp}
	if w.ccs == nil {
		w.ccs = make(map[*QP]*qpCC)
	}
	w.ccs[qp] = c
	qp.ccHas = true
	return c
}

// ccStop stops the QP's CC timers and drops its state (RESET, ERR,
// destroy): a QP that comes back starts unlimited.
func (qp *QP) ccStop() {
	if !qp.ccHas {
		return
	}
	w := qp.w
	c := w.ccs[qp]
	w.timers.stop(&c.rateTimer)
	w.timers.stop(&c.paceTimer)
	delete(w.ccs, qp)
	qp.ccHas, qp.ccPaced = false, false
	if r := qp.Counters.rare.Load(); r != nil {
		r.ccRate.Store(0)
	}
}

// ceMarked reports whether pkt arrived marked Congestion Experienced: the
// BTH FECN bit (set by the UDP link from the IP header, or by a fault
// rule) or, on the TAP link, the IP header's ECN field.
func ceMarked(pkt *roce.Packet) bool {
	switch {
	case pkt.BTH.FECN():
		return true
	case pkt.IPv4 != nil:
		return pkt.IPv4.TOS()&ecnMask == ecnCE
	case pkt.IPv6 != nil:
		return pkt.IPv6.TrafficClass()&ecnMask == ecnCE
	}
	return false
}

// ccCE is the notification point: pkt, for qp, arrived CE-marked. Only
// packets that carry data count (an ACK marked on its way back says
// nothing of the data path's congestion).
func (w *worker) ccCE(qp *QP, pkt *roce.Packet) {
	if pkt.Info.Flags&roce.OpAck != 0 {
		return
	}
	qp.Counters.Rare().CEReceived.Add(1)
	if !qp.ccState().np.Allow(w.now, w.ccp) {
		return
	}
	w.txCNP(qp)
}

// txCNP queues a CNP to qp's peer QP (IBTA RoCE v2 annex A17.9.2: BTH
// opcode 0x81, destination QP the QP that sent the marked packet, BECN
// set, P_Key of the marked packet's, PSN, SE, M, pad and A zero, 16
// reserved bytes, ICRC). Not ECN-capable on the TAP link (a CNP must not
// itself be marked); on the UDP link the socket marks every datagram.
func (w *worker) txCNP(qp *QP) {
	buf := w.txBuf()
	if buf == nil {
		return // the link is full; the next marked packet asks again
	}
	w.cnpPath = qp.path
	w.cnpPath.TOS &^= ecnMask
	h := &w.hdrs
	*h = roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpCNP, PKey: pkeyDefault, DestQP: qp.attr.DestQPN, BECN: true}}
	if err := w.cnpPath.Begin(&w.framer, buf, w.cnpPath.Headroom(roce.OpCNP), 0, h); err != nil {
		w.Counters.BuildErrors.Add(1)
		return
	}
	frame, err := w.framer.Finish()
	if err != nil || len(frame) == 0 || &frame[0] != &buf[0] {
		w.Counters.BuildErrors.Add(1)
		return
	}
	w.tx[w.txN] = buf[:len(frame)]
	w.txTo[w.txN] = peerOf(&qp.path)
	w.txUnrel[w.txN] = nil
	w.txN++
	w.busy = true
	qp.Counters.Rare().CNPsSent.Add(1)
	w.Counters.CNPsSent.Add(1)
}

// inputCNP handles a CNP for qp from src to dst: the reaction point. A
// CNP that does not come from the QP's peer is dropped as any such
// packet (BadPeer); with congestion control off, or for a QP that does
// not send (not RTS or SQD), it is counted and ignored. It never touches
// the QP's PSNs, ACK state or timers other than its own.
func (w *worker) inputCNP(qp *QP, pkt *roce.Packet, src, dst netip.Addr) {
	if qp.svc == roce.ServiceUD || pkt.BTH.PKey() != pkeyDefault ||
		src.Unmap() != qp.path.Dst.Unmap() || dst.Unmap() != qp.attr.LocalAddr.Unmap() {
		w.Counters.BadPeer.Add(1)
		return
	}
	w.Counters.CNPsReceived.Add(1)
	qp.Counters.Rare().CNPsReceived.Add(1)
	if w.ccp == nil || !qp.sends() {
		w.Counters.CNPsIgnored.Add(1)
		return
	}
	c := qp.ccState()
	w.timers.set(&c.rateTimer, c.rp.OnCNP(w.now))
	qp.ccRate(c)
}

// sends reports whether the QP's requester may send (RTS, SQD).
func (qp *QP) sends() bool { return qp.state == abi.QPSRTS || qp.state == abi.QPSSQD }

// ccRate applies the reaction point's rate of c, the QP's state, to its
// pacer and counters.
func (qp *QP) ccRate(c *qpCC) {
	w := qp.w
	qp.ccPaced = c.rp.Active()
	r := qp.Counters.Rare()
	if !qp.ccPaced {
		c.pace.SetRate(0, 0, w.now)
		w.timers.stop(&c.rateTimer)
		w.timers.stop(&c.paceTimer)
		r.ccRate.Store(0)
		w.activate(qp) // a QP waiting for its bucket sends again
		return
	}
	rate := c.rp.Rate()
	c.pace.SetRate(rate, w.ccp.PaceBurst, w.now)
	r.ccRate.Store(rate)
}

// onCCRateTimer is the rate-increase timer's expiry.
func (qp *QP) onCCRateTimer() {
	if !qp.ccHas {
		return
	}
	w := qp.w
	c := w.ccs[qp]
	if next := c.rp.OnTimer(w.now); next != 0 {
		w.timers.set(&c.rateTimer, next)
	}
	qp.ccRate(c)
}

// onCCPaceTimer: the QP's bucket holds tokens again.
func (qp *QP) onCCPaceTimer() { qp.w.activate(qp) }

// ccHold reports whether a pacer holds the QP's next packet back now
// (its own, while limited, or the worker's link limiter), and if so arms
// the wake-up for when it may go.
func (qp *QP) ccHold() bool {
	w := qp.w
	if qp.ccPaced {
		if c := w.ccs[qp]; !c.pace.Ready(w.now) {
			if !c.paceTimer.armed() {
				w.timers.set(&c.paceTimer, c.pace.ReadyAt(w.now))
			}
			return true
		}
	}
	if l := w.linkPace; l != nil && !l.Ready(w.now) {
		if !w.linkTimer.armed() {
			w.timers.set(&w.linkTimer, l.ReadyAt(w.now))
		}
		return true
	}
	return false
}

// ccAckReq reports whether a packet of about n bytes should ask for an
// ACK because a pacer will hold the QP's next one: the responder ACKs only
// what asks (AckReq), and a paced QP may pause longer than its ACK
// timeout in the middle of a message; without an ACK for what it sent
// before the pause, the timeout would fire and go-back-N resend it.
func (qp *QP) ccAckReq(n int) bool {
	if qp.ccPaced && qp.w.ccs[qp].pace.Holds(n) {
		return true
	}
	l := qp.w.linkPace
	return l != nil && l.Holds(n)
}

// ccSent charges n bytes the QP just queued to its bucket and byte
// counter, and to the worker's link limiter.
func (qp *QP) ccSent(n int) {
	if l := qp.w.linkPace; l != nil {
		l.Spend(n)
	}
	if !qp.ccPaced {
		return
	}
	c := qp.w.ccs[qp]
	c.pace.Spend(n)
	if c.rp.OnSent(uint64(n)) {
		qp.ccRate(c)
	}
}
