package engine

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Completer: matches responses (ACK/NAK, READ responses, atomic ACKs) to
// send WQEs, completes WQEs in order and drives retransmission, as Linux
// rxe_comp.c.
//
//	get ──► check PSN ──► ack ─────────┐
//	            │    ├──► read ────────┼──► complete in order
//	            │    ├──► atomic ──────┘
//	            │    ├──► NAK seq ──► retry (go-back-N)
//	            │    ├──► RNR NAK ──► wait RNR timer ──► retry
//	            │    └──► NAK error ──► error (QP to ERR)
//	            └──► stale: drop

//go:generate go tool stringer -type=compState -linecomment

type compState uint8

// Completer states; the line comment is the name String prints.
const (
	// compCheckPSN: is the response within the outstanding PSNs?
	compCheckPSN compState = iota // check_psn
	// compClassify: which response is it.
	compClassify // classify
	// compAck: ACK, acknowledge through its PSN.
	compAck // ack
	// compRead: READ response, place its data.
	compRead // read
	// compAtomic: atomic ACK, store the original value.
	compAtomic // atomic
	// compNAKSeq: NAK PSN sequence error.
	compNAKSeq // nak_seq
	// compRNR: RNR NAK.
	compRNR // rnr
	// compNAKErr: the other NAKs, fatal for the WQE.
	compNAKErr // nak_err
	// compDrop: stale or unexpected, drop.
	compDrop // drop
	compDone // done
)

// completer is the per-QP completer state.
type completer struct {
	psn       uint32 // oldest PSN not yet acknowledged
	retryLeft uint8  // retry_cnt left (IBTA: 7 is a count of 7)
	rnrLeft   uint8  // rnr_retry left (7: infinite)
	// inRetry: a go-back-N restart was triggered by a NAK or an implicit
	// NAK and no forward progress happened since; further NAKs of the same
	// episode do not restart again (they are answers to packets sent
	// before the restart).
	inRetry bool
	rnrWait bool   // waiting for the RNR timer
	rnrPSN  uint32 // PSN to resume from after the RNR wait
}

// compRx handles one response packet.
func (qp *QP) compRx(p *packet) {
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQD {
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	st := compCheckPSN
	if h := traceHook.Load(); h != nil {
		(*h)(qp, "rx %v psn %d syn %v comp.psn %d req.psn %d", p.opcode, p.psn, p.syndrome, qp.comp.psn, qp.req.psn)
	}
	if qp.sr != nil && qp.sr.sr && p.opcode == roce.OpRCAck && p.syndrome.Kind() == roce.SyndromeACK {
		// Selective repeat: the MSN field says what the responder has,
		// beyond a gap too; an ACK of nothing new (the PSN before the
		// gap) carries only that.
		qp.srDelivered(p.msn)
		if roce.PSNDiff(p.psn, qp.comp.psn) < 0 {
			qp.w.busy = true
			return
		}
	}
	for st != compDone {
		if h := traceHook.Load(); h != nil {
			(*h)(qp, "  comp state %v", st)
		}
		switch st {
		case compCheckPSN:
			st = qp.compCheckPSN(p)
		case compClassify:
			st = qp.compClassify(p)
		case compAck:
			qp.ackThrough(p.psn)
			st = compDone
		case compRead:
			st = qp.compRead(p)
		case compAtomic:
			st = qp.compAtomic(p)
		case compNAKSeq:
			st = qp.compNAKSeq(p)
		case compRNR:
			st = qp.compRNR(p)
		case compNAKErr:
			st = qp.compNAKErr(p)
		case compDrop:
			qp.Counters.Rare().Dropped.Add(1)
			st = compDone
		}
	}
	qp.w.busy = true
}

// compCheckPSN: a response must name a PSN that is outstanding, in
// [comp.psn, req.psn). Older ones are duplicates (IBTA 9.7.5.1.5
// "Duplicate responses": silently dropped); newer ones are bogus.
func (qp *QP) compCheckPSN(p *packet) compState {
	if roce.PSNDiff(p.psn, qp.req.psn) >= 0 {
		return compDrop
	}
	if roce.PSNDiff(p.psn, qp.comp.psn) < 0 {
		// An ACK of an older PSN can still carry a NAK meaning for
		// comp.psn-1; nothing to do for any of them.
		return compDrop
	}
	return compClassify
}

func (qp *QP) compClassify(p *packet) compState {
	info := p.opcode.Info()
	switch {
	case info.Is(roce.OpRead | roce.OpResponse):
		return compRead
	case p.opcode == roce.OpRCAtomicAck:
		return compAtomic
	case p.opcode == roce.OpRCAck:
		switch p.syndrome.Kind() {
		case roce.SyndromeACK:
			return compAck
		case roce.SyndromeRNRNAK:
			return compRNR
		case roce.SyndromeNAK:
			if p.syndrome.NAK() == roce.NAKPSNSequenceError {
				return compNAKSeq
			}
			if p.syndrome.NAK() == nakSelective {
				if qp.sr != nil && qp.sr.sr {
					return qp.compSNAK(p)
				}
				return qp.compStraySNAK()
			}
			return compNAKErr
		}
	}
	return compDrop
}

// progress records forward progress: the retry counters restart when a
// response makes progress (as Linux rxe's reset_retry_counters), and so
// does the ACK timer (IBTA 9.7.6.1.3 "Detecting lost acknowledge messages
// and timeouts", C9-140). The timer restarts here, when the response is
// processed, not later in the worker's round: the worker runs due timers
// right after its receive batch, and an ACK timer that expired while the
// response waited in that batch would otherwise count a timeout (and
// restart the whole window) although the response just made progress.
func (qp *QP) progress(psn uint32) {
	if roce.PSNDiff(psn, qp.comp.psn) > 0 {
		qp.comp.psn = psn
		qp.comp.retryLeft = qp.attr.RetryCnt
		qp.comp.rnrLeft = qp.attr.RNRRetry
		qp.comp.inRetry = false
		if qp.sr != nil {
			qp.srProgress(psn)
		}
		if qp.retryTimer.armed() {
			qp.armRetry()
		}
	}
}

// ackThrough acknowledges every PSN up to and including psn: WQEs whose
// last PSN is covered are done. It returns false when it hit a READ or
// atomic whose responses are missing. A response acknowledges every
// request with an earlier PSN (IBTA 9.7.5.1.2 "Coalesced acknowledge
// messages"), so one with a later PSN while a READ's or an atomic's
// responses are missing means those were lost: an implied NAK, and the
// requester retries from the first missing one.
func (qp *QP) ackThrough(psn uint32) bool {
	// The progress the WQEs make is recorded once, through the newest
	// (progress of an older PSN first changes nothing the later one does
	// not: the retry counters, the timer and the RTT sample come out the
	// same).
	var adv uint32
	advanced := false
	for i := qp.head; i != qp.tail; i++ {
		e := &qp.sq[i&qp.sqMask]
		if e.info == nil { // local operation
			if e.state != wqeDone {
				break
			}
			continue
		}
		if e.state == wqePosted || e.state == wqeDone && e.status != abi.WCSuccess {
			break
		}
		if roce.PSNDiff(e.first, psn) > 0 {
			break
		}
		if e.isReadAtomic() {
			if e.state == wqeDone {
				continue
			}
			if roce.PSNDiff(psn, roce.PSNAdd(e.first, e.rcvd)) < 0 {
				break // covers only responses already placed
			}
			if advanced {
				advanced = false
				qp.progress(adv)
			}
			qp.implicitNAK(e)
			return false
		}
		if roce.PSNDiff(e.last, psn) <= 0 {
			if e.state != wqeDone {
				e.state = wqeDone
				adv, advanced = roce.PSNAdd(e.last, 1), true
			}
			continue
		}
		adv, advanced = roce.PSNAdd(psn, 1), true
		break
	}
	if advanced {
		qp.progress(adv)
	}
	return true
}

// implicitNAK restarts from the first missing response of READ/atomic e.
func (qp *QP) implicitNAK(e *swqe) {
	qp.progress(roce.PSNAdd(e.first, e.rcvd))
	if qp.comp.inRetry {
		return
	}
	qp.startRetry(false)
}

// findWQE returns the outstanding WQE whose PSN range holds psn, after
// acknowledging everything before it (a READ response or atomic ACK
// implies the ACK of every earlier request). nil when an earlier READ or
// atomic is still missing responses (an implicit NAK was started) or psn
// belongs to no WQE.
func (qp *QP) findWQE(psn uint32) *swqe {
	if !qp.ackThrough(roce.PSNAdd(psn, roce.PSNMask)) { // psn-1
		return nil
	}
	for i := qp.head; i != qp.tail; i++ {
		e := &qp.sq[i&qp.sqMask]
		if e.info == nil || e.state == wqeDone {
			continue
		}
		if e.state == wqePosted {
			return nil
		}
		if roce.PSNDiff(psn, e.first) >= 0 && roce.PSNDiff(psn, e.last) <= 0 {
			return e
		}
		return nil
	}
	return nil
}

// compRead places one READ response packet (IBTA 9.7.5.1.3).
func (qp *QP) compRead(p *packet) compState {
	e := qp.findWQE(p.psn)
	if e == nil {
		return compDone
	}
	if e.isPlacement() {
		return qp.compPlacement(e, p)
	}
	if e.Opcode != abi.WRRDMARead {
		qp.failWQE(e, abi.WCBadRespErr)
		return compDone
	}
	exp := roce.PSNAdd(e.first, e.rcvd)
	if d := roce.PSNDiff(p.psn, exp); d != 0 {
		if d > 0 {
			// Responses between exp and psn were lost.
			qp.implicitNAK(e)
		}
		return compDone
	}
	info := p.opcode.Info()
	lastPkt := e.rcvd+1 == e.npkts
	off := uint64(e.rcvd) * uint64(qp.mtu)
	wantLen := min(uint64(qp.mtu), e.length-off)
	// A READ resumed after a retry is answered as a new request (FIRST
	// or ONLY at the resume PSN), so the position is checked as "last or
	// not" against the data still expected, not against the original
	// request.
	endsMsg := info.Is(roce.OpLast) || info.Is(roce.OpOnly)
	if endsMsg != lastPkt || uint64(len(p.payload)) != wantLen {
		// IBTA 9.7.5.1.3: a response of the wrong kind or length is a
		// bad response, fatal for the WQE.
		qp.failWQE(e, abi.WCBadRespErr)
		return compDone
	}
	if len(p.payload) > 0 {
		if err := qp.cfg.Mem.Scatter(e.SGEs, off, p.payload); err != nil {
			qp.failWQE(e, localMemStatus(err))
			return compDone
		}
	}
	e.rcvd++
	qp.progress(roce.PSNAdd(p.psn, 1))
	if lastPkt {
		qp.finishReadAtomic(e)
	}
	return compDone
}

// compPlacement completes an ATOMIC WRITE or FLUSH: the responder answers
// either with one zero-length RDMA READ RESPONSE Only at the request's
// PSN (IBTA 1.5 Memory Placement Extensions; Linux rxe's
// send_read_response_ack); any other response is a bad response.
func (qp *QP) compPlacement(e *swqe, p *packet) compState {
	if p.psn != e.first || p.opcode != roce.OpRCReadResponseOnly || len(p.payload) != 0 {
		qp.failWQE(e, abi.WCBadRespErr)
		return compDone
	}
	e.rcvd = 1
	qp.progress(roce.PSNAdd(p.psn, 1))
	qp.finishReadAtomic(e)
	return compDone
}

// compAtomic stores the original value of an atomic (IBTA 9.7.5.1.4).
func (qp *QP) compAtomic(p *packet) compState {
	e := qp.findWQE(p.psn)
	if e == nil {
		return compDone
	}
	if e.Opcode != abi.WRAtomicCmpAndSwp && e.Opcode != abi.WRAtomicFetchAdd || p.psn != e.first {
		qp.failWQE(e, abi.WCBadRespErr)
		return compDone
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], p.orig)
	e.result = p.orig
	if err := qp.cfg.Mem.Scatter(e.SGEs, 0, b[:]); err != nil {
		qp.failWQE(e, localMemStatus(err))
		return compDone
	}
	e.rcvd = 1
	qp.progress(roce.PSNAdd(p.psn, 1))
	qp.finishReadAtomic(e)
	return compDone
}

func (qp *QP) finishReadAtomic(e *swqe) {
	e.state = wqeDone
	if e.rdAtom {
		e.rdAtom = false
		qp.req.rdAtomic--
	}
}

// compNAKSeq: IBTA 9.7.5.2.2 (NAK codes): a NAK-PSN sequence error
// acknowledges every PSN before it, and the requester retransmits from
// that PSN.
func (qp *QP) compNAKSeq(p *packet) compState {
	qp.Counters.Rare().SeqNAKsReceived.Add(1)
	if qp.comp.rnrWait {
		// Answers packets sent before the RNR NAK; the RNR timer
		// decides when to resend.
		return compDone
	}
	if !qp.ackThrough(roce.PSNAdd(p.psn, roce.PSNMask)) {
		return compDone
	}
	if qp.comp.inRetry {
		return compDone
	}
	qp.startRetry(false)
	return compDone
}

// compRNR: IBTA 9.7.5.2.8: an RNR NAK acknowledges the PSNs before it;
// the requester waits at least the advertised RNR timer, then resends from
// the NAKed PSN, at most rnr_retry times (7: forever).
func (qp *QP) compRNR(p *packet) compState {
	qp.Counters.Rare().RNRNAKsReceived.Add(1)
	if !qp.ackThrough(roce.PSNAdd(p.psn, roce.PSNMask)) {
		return compDone
	}
	if qp.attr.RNRRetry != 7 {
		if qp.comp.rnrLeft == 0 {
			if e := qp.findWQE(p.psn); e != nil {
				qp.failWQE(e, abi.WCRNRRetryExcErr)
			}
			return compDone
		}
		qp.comp.rnrLeft--
	}
	qp.comp.rnrWait = true
	qp.comp.rnrPSN = p.psn
	qp.w.timers.stop(&qp.retryTimer)
	qp.w.timers.set(&qp.rnrTimer, qp.w.now+int64(p.syndrome.Timer().Duration()))
	return compDone
}

// compNAKErr: invalid request, remote access and remote operational
// errors (IBTA 9.7.5.2.3-9.7.5.2.5) complete the WQE in error and move the
// QP to ERR.
func (qp *QP) compNAKErr(p *packet) compState {
	qp.Counters.Rare().countErrNAK(p.syndrome.NAK(), false)
	if !qp.ackThrough(roce.PSNAdd(p.psn, roce.PSNMask)) {
		return compDone
	}
	e := qp.findWQE(p.psn)
	if e == nil {
		return compDrop
	}
	qp.failWQE(e, nakStatus(p.syndrome.NAK()))
	return compDone
}

// advanceHead completes done WQEs at the head of the SQ, in order.
func (qp *QP) advanceHead() {
	for qp.head != qp.next {
		e := &qp.sq[qp.head&qp.sqMask]
		if e.state != wqeDone || e.status != abi.WCSuccess {
			return
		}
		qp.completeSend(e)
		qp.head++
	}
	// A WQE the requester has not finished can still be done (all
	// responses received while next points at a later one): nothing to do.
}

// outstanding reports whether PSNs are sent and not yet acknowledged.
func (qp *QP) outstanding() bool {
	return roce.PSNDiff(qp.req.psn, qp.comp.psn) > 0
}

func (qp *QP) armRetry() {
	if d := ackTimeout(qp.attr.Timeout); d > 0 {
		if qp.sr != nil && qp.sr.rto {
			d = qp.srTimeout(d)
		}
		qp.w.timers.set(&qp.retryTimer, qp.w.now+d)
	}
}

// updateRetryTimer keeps the ACK timer running exactly while something is
// outstanding (IBTA 9.7.6.1.3: the timer restarts on forward progress).
func (qp *QP) updateRetryTimer(progressed bool) {
	if qp.comp.rnrWait || qp.state != abi.QPSRTS && qp.state != abi.QPSSQD {
		return
	}
	if !qp.outstanding() {
		qp.w.timers.stop(&qp.retryTimer)
		return
	}
	if progressed || !qp.retryTimer.armed() {
		qp.armRetry()
	}
}

// onRetryTimer: local ACK timeout (IBTA 9.7.6.1.3). retry_cnt counts the
// retries; 7 is a count of 7 (IBTA: the 3-bit Retry Count), unlike Linux
// rxe which treats 7 as infinite.
func (qp *QP) onRetryTimer() {
	qp.w.activate(qp)
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQD || !qp.outstanding() || qp.comp.rnrWait {
		return
	}
	qp.Counters.Rare().Timeouts.Add(1)
	if qp.sr != nil && qp.sr.rto && qp.srOnTimeout() {
		return
	}
	qp.startRetry(true)
}

// startRetry restarts transmission at comp.psn (go-back-N, IBTA 9.7.6.1.3
// and 9.7.5.2.2).
//
// Retry accounting: retry_cnt bounds consecutive local ACK timeouts
// without forward progress (the meaning libibverbs documents for
// RETRY_EXC_ERR: "the remote side didn't send any Ack or Nack"); when none
// is left the oldest unfinished WQE completes with RETRY_EXC_ERR. A
// restart caused by a NAK-PSN sequence error or an implicit NAK (a response
// that skips PSNs) proves the responder alive and does not consume a
// retry, but at most one such restart happens between two timeouts or
// progress (inRetry), as in Linux rxe, so NAKs answering packets sent
// before the restart do not restart it again and a responder that only
// NAKs still ends in RETRY_EXC_ERR through the timeouts.
func (qp *QP) startRetry(timeout bool) {
	if timeout {
		if qp.comp.retryLeft == 0 {
			for i := qp.head; i != qp.tail; i++ {
				e := &qp.sq[i&qp.sqMask]
				if e.state != wqeDone {
					qp.failWQE(e, abi.WCRetryExcErr)
					return
				}
			}
			qp.enterError(evFatal) // no WQE left to complete with the error
			return
		}
		qp.comp.retryLeft--
	}
	qp.req.dup = timeout && qp.comp.retryLeft < redundantRetries
	qp.req.dupPSN = qp.comp.psn
	qp.comp.inRetry = !timeout
	if h := traceHook.Load(); h != nil {
		(*h)(qp, "retry timeout=%v from %d left %d", timeout, qp.comp.psn, qp.comp.retryLeft)
	}
	if timeout && qp.sr != nil && qp.sr.sr {
		qp.srProbe()
	} else {
		qp.rewind(qp.comp.psn)
	}
	qp.armRetry()
}

// onRNRTimer ends an RNR wait: resend from the NAKed PSN.
func (qp *QP) onRNRTimer() {
	qp.w.activate(qp)
	if !qp.comp.rnrWait {
		return
	}
	qp.comp.rnrWait = false
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQD {
		return
	}
	qp.rewind(qp.comp.rnrPSN)
	qp.armRetry()
}

// rewind points the requester back at psn: the WQE holding it resumes
// there, every later assigned WQE from its first PSN.
func (qp *QP) rewind(psn uint32) {
	qp.Counters.Rare().Retransmits.Add(1)
	k := qp.tail
	for i := qp.head; i != qp.tail; i++ {
		e := &qp.sq[i&qp.sqMask]
		if e.info == nil || e.state == wqeDone {
			continue
		}
		if e.state == wqePosted {
			break
		}
		if k == qp.tail {
			if roce.PSNDiff(e.last, psn) < 0 {
				continue
			}
			k = i
			e.sendPSN = e.first
			if roce.PSNDiff(psn, e.first) > 0 {
				e.sendPSN = psn
			}
			if e.Opcode == abi.WRRDMARead {
				e.sendPSN = roce.PSNAdd(e.first, e.rcvd)
			}
		} else {
			e.sendPSN = e.first
		}
		e.state = wqeSending
	}
	if k != qp.tail {
		qp.next = k
	}
	qp.req.sinceAck = 0
	qp.req.ackAllUntil = qp.req.psn
	if qp.sr != nil {
		// Go-back-N resends all of it; nothing is timed across it.
		qp.sr.resend, qp.sr.rttOn = qp.sr.resend[:0], false
	}
	qp.w.busy = true
}

// traceFunc receives a line per transport event.
type traceFunc func(qp *QP, format string, args ...any)

// traceHook, when set by a test, receives a line per requester, responder
// and completer event. Unset (nil) in production: one atomic load per
// event.
var traceHook atomic.Pointer[traceFunc]
