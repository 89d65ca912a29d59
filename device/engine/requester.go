package engine

import (
	"encoding/binary"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Requester: turns SQ WQEs into request packets (IBTA 9.7.1-9.7.4), as
// Linux rxe_req.c. One call of reqStep runs the machine until it has
// nothing to send, is blocked (fence, credits, window, RNR wait) or the
// worker's transmit batch is full.
//
//	fetch ──► local ──► fence ──► credits ──► window ──► send ──┐
//	  ▲                                                          │
//	  └──────────────── next WQE (message fully sent) ◄─────────┘

//go:generate go tool stringer -type=reqState -linecomment

type reqState uint8

// Requester states; the line comment is the name String prints.
const (
	// reqFetch makes sure the WQE at next exists.
	reqFetch reqState = iota // fetch
	// reqLocal executes local operations (LOCAL_INV, BIND_MW).
	reqLocal // local
	// reqFence: FENCE waits for prior READ/atomic WRs.
	reqFence // fence
	// reqCredits: max_rd_atomic credits for READ/atomic.
	reqCredits // credits
	// reqWindow: the send window (unacknowledged PSNs).
	reqWindow // window
	// reqSend builds and queues one packet.
	reqSend // send
	// reqExit: nothing more this round.
	reqExit // exit
)

// requester is the per-QP requester state.
type requester struct {
	psn      uint32 // next PSN to assign to a new message
	rdAtomic int32  // READ/atomic WQEs holding a max_rd_atomic credit
	sinceAck uint32 // packets sent since the last AckReq
	// ackAllUntil: after a go-back-N restart every retransmitted packet
	// (PSNs before this one) asks for an ACK, so that one surviving
	// packet is enough to learn what the responder has.
	ackAllUntil uint32
	// dupPSN, when dup is set, is a packet to put on the wire twice: the
	// first one of a restart after an ACK timeout when few retries are
	// left (see redundantRetries).
	dupPSN uint32
	dup    bool
	// sqTaken: WQEs were taken from the send queue since its consumer
	// index was last published (QP.publishSQ).
	sqTaken bool
}

// redundantRetries: when an ACK timeout leaves fewer than this many
// retries, the first packet of the go-back-N restart is sent twice. After
// a timeout nothing else is in flight to provoke a NAK, so each retry is
// one round trip that must survive the link both ways; under heavy loss
// (the 30 % fault suite: about 0.55 per attempt) seven of them in a row
// fail often enough to exhaust retry_cnt on the last packets of a burst.
// A duplicate is harmless to the responder (it acknowledges a duplicate
// SEND or WRITE again, executes a duplicate READ again, replays an
// atomic's result; nothing is applied twice), and only a path that keeps
// losing packets pays the extra frame.
const redundantRetries = 5

// ackReqEvery: the requester asks for an ACK at least every this many
// packets inside a long message (IBTA 9.7.5.1.2 leaves the rate to the
// requester; rxe uses its window size).
const ackReqEvery = 32

// reqStep runs the requester of qp.
func (qp *QP) reqStep() {
	if qp.state != abi.QPSRTS || qp.comp.rnrWait {
		return
	}
	if qp.sr != nil && len(qp.sr.resend) > 0 && !qp.srResend() {
		return
	}
	st := reqFetch
	for st != reqExit {
		switch st {
		case reqFetch:
			st = qp.reqFetch()
		case reqLocal:
			st = qp.reqLocal()
		case reqFence:
			st = qp.reqFence()
		case reqCredits:
			st = qp.reqCredits()
		case reqWindow:
			st = qp.reqWindow()
		case reqSend:
			st = qp.reqSend()
		}
	}
}

// reqFetch skips WQEs that need nothing more and fetches a new WQE from
// the SQ when the requester has caught up with what it holds.
func (qp *QP) reqFetch() reqState {
	for qp.next != qp.tail {
		e := &qp.sq[qp.next&qp.sqMask]
		if e.state == wqePosted || e.state == wqeSending {
			return reqLocal
		}
		qp.next++
	}
	if qp.tail-qp.head >= uint32(qp.cfg.SQDepth) {
		return reqExit // private ring full: wait for completions
	}
	var e *swqe
	var ok bool
	var err error
	if qp.sq == nil {
		// No send ring (the QP was idle): poll into the worker's probe
		// entry and take a ring only for a WQE, so that a QP active
		// for anything else (a MODIFY_QP, frames for its responder)
		// holds none.
		p := &qp.w.probe
		p.SGEs, p.Inline = p.SGEs[:0], p.Inline[:0]
		if ok, err = qp.pollSend(p); !ok && err == nil {
			return reqExit
		}
		qp.ensureSQ()
		e = &qp.sq[qp.tail&qp.sqMask]
		sges, inl := e.SGEs[:0], e.Inline[:0]
		e.SendWork = *p
		e.SGEs, e.Inline = append(sges, p.SGEs...), append(inl, p.Inline...)
	} else {
		e = &qp.sq[qp.tail&qp.sqMask]
		e.SGEs, e.Inline = e.SGEs[:0], e.Inline[:0]
		if ok, err = qp.pollSend(&e.SendWork); !ok && err == nil {
			return reqExit
		}
	}
	qp.tail++
	e.state, e.status, e.rcvd, e.rdAtom, e.result, e.used = wqePosted, abi.WCSuccess, 0, false, 0, true
	e.taken = qp.w.now
	if err != nil {
		// A WQE the source rejected (package queues: too many SGEs,
		// unknown opcode, ...) or a broken ring: status from the table.
		qp.failSource(e, err)
		return reqExit
	}
	if st := qp.prepareWQE(e); st != abi.WCSuccess {
		qp.failWQE(e, st)
		return reqExit
	}
	return reqLocal
}

// prepareWQE computes what the engine needs of a fetched WQE: its message
// length, the opcode family of its first packet and the PSNs it uses. It
// checks nothing the SendSource guarantees (SendSource: package queues
// rejects unknown opcodes and flags, inline data with an opcode that
// carries none or longer than max_inline, more SGEs than max_send_sge, a
// message longer than abi.MaxMsgBytes, an atomic without exactly one
// 8-byte SGE); it fails an opcode the QP's service does not carry
// (unsupportedOpStatus) and a UD WQE whose address handle or length does
// not fit (prepareUD).
func (qp *QP) prepareWQE(e *swqe) abi.WCStatus {
	var n uint64
	if e.Flags&abi.SendInline != 0 {
		n = uint64(len(e.Inline))
	} else {
		for _, s := range e.SGEs {
			n += uint64(s.Length)
		}
	}
	e.length = n
	e.info = nil
	e.npkts = 1
	if qp.unrel && !unreliableOp(qp.svc, e.Opcode) {
		return unsupportedOpStatus
	}
	switch e.Opcode {
	case abi.WRSend, abi.WRSendWithImm, abi.WRSendWithInv:
		e.info = roce.OpRCSendFirst.Info()
		if qp.svc == roce.ServiceUD {
			return qp.prepareUD(e)
		}
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		e.info = roce.OpRCWriteFirst.Info()
	case abi.WRRDMARead:
		e.info = roce.OpRCReadRequest.Info()
	case abi.WRAtomicCmpAndSwp, abi.WRAtomicFetchAdd:
		e.length = 8
		e.info = roce.OpRCCompareSwap.Info()
		return abi.WCSuccess
	case abi.WRLocalInv, abi.WRBindMW:
		e.npkts = 0
		return abi.WCSuccess
	case abi.WRAtomicWrite:
		// The 8 bytes travel in the WQE (CompareAdd), not in an SGE.
		e.length = 8
		e.info = roce.OpRCAtomicWrite.Info()
		return abi.WCSuccess
	case abi.WRFlush:
		// Swap holds the FETH: a placement type the IBTA defines (at
		// least one) and a selectivity level; CompareAdd the length, which
		// the RETH's 32-bit DMA Length carries.
		plt, sel := uint8(e.Swap&0xf), uint8(e.Swap>>4&3)
		if e.Swap>>6 != 0 || plt == 0 || plt&^roce.FlushPlacementTypes != 0 || sel > roce.FlushRegion {
			return abi.WCLocQPOpErr
		}
		if e.CompareAdd > abi.MaxMsgBytes {
			return abi.WCLocLenErr
		}
		e.length = e.CompareAdd
		e.info = roce.OpRCFlush.Info()
		return abi.WCSuccess
	default:
		return unsupportedOpStatus
	}
	if n > uint64(qp.mtu) {
		e.npkts = uint32((n + uint64(qp.mtu) - 1) / uint64(qp.mtu))
	}
	return abi.WCSuccess
}

// failWQE records a local error on e and moves the QP to ERR; the flush
// completes e with its status and everything else with WR_FLUSH_ERR.
// A UD or UC QP goes to SQE instead (IBTA 10.3.1): its receive side
// goes on.
func (qp *QP) failWQE(e *swqe, st abi.WCStatus) {
	e.status, e.state = st, wqeDone
	if qp.unrel {
		qp.enterSQE()
		return
	}
	qp.enterError(evNone) // e's completion says why
}

// failSource fails e, which the SendSource consumed with error err: a
// rejected WQE as failWQE does; a broken ring (no WR stands for e) moves
// the QP to ERR with QP_FATAL, whatever its type (sourceEvent).
func (qp *QP) failSource(e *swqe, err error) {
	st := qp.w.rejectedSource(err)
	ev := sourceEvent(err)
	if ev == evNone {
		qp.failWQE(e, st)
		return
	}
	e.status, e.state = st, wqeDone
	qp.enterError(ev)
}

// reqLocal executes LOCAL_INV and BIND_MW when the requester reaches
// them: in order with the WRs before them, as rxe_do_local_ops does. A
// refused bind completes with MW_BIND_ERR and the QP goes to ERR (IBTA
// 10.6.7.2.3: a bind error is a completion error).
func (qp *QP) reqLocal() reqState {
	e := &qp.sq[qp.next&qp.sqMask]
	if e.Opcode != abi.WRLocalInv && e.Opcode != abi.WRBindMW {
		return reqFence
	}
	if e.Flags&abi.SendFence != 0 && qp.req.rdAtomic > 0 {
		return reqExit
	}
	if e.Opcode == abi.WRBindMW {
		b, ok := abi.BindMWOf(&e.SendWQE)
		if !ok || qp.cfg.Mem.BindMW(b) != nil {
			qp.failWQE(e, abi.WCMWBindErr)
			return reqExit
		}
	} else if err := qp.cfg.Mem.Invalidate(e.InvalidateRKey); err != nil {
		qp.failWQE(e, localMemStatus(err))
		return reqExit
	}
	e.state = wqeDone
	qp.next++
	qp.w.busy = true
	return reqFetch
}

// reqFence: IBTA 10.8.3.3 "Fence indicator": a WR with the fence attribute
// is not started until all prior RDMA READ and atomic WRs on the SQ have
// completed.
func (qp *QP) reqFence() reqState {
	e := &qp.sq[qp.next&qp.sqMask]
	if e.state == wqePosted && e.Flags&abi.SendFence != 0 && qp.req.rdAtomic > 0 {
		return reqExit
	}
	return reqCredits
}

// reqCredits: at most max_rd_atomic READ/atomic requests outstanding: the
// requester must not exceed the responder's resources (its
// max_dest_rd_atomic) it was told about at connection time.
func (qp *QP) reqCredits() reqState {
	e := &qp.sq[qp.next&qp.sqMask]
	if e.state == wqePosted && e.isReadAtomic() {
		if qp.req.rdAtomic >= int32(qp.attr.MaxRdAtomic) {
			return reqExit
		}
	}
	return reqWindow
}

// reqWindow limits the PSNs in flight to the engine's send window and
// assigns PSNs when a message starts.
func (qp *QP) reqWindow() reqState {
	e := &qp.sq[qp.next&qp.sqMask]
	psn := e.sendPSN
	if e.state == wqePosted {
		psn = qp.req.psn
	}
	if roce.PSNDiff(psn, qp.comp.psn) >= int32(qp.w.window) {
		return reqExit
	}
	if qp.sr != nil && qp.sr.sr && roce.PSNDiff(psn, qp.srDeliveredPSN()) >= srInFlight {
		return reqExit // selective repeat: the packets in flight (sr.go)
	}
	if e.state == wqePosted {
		e.first = qp.req.psn
		e.last = roce.PSNAdd(e.first, e.npkts-1)
		e.sendPSN = e.first
		e.state = wqeSending
		qp.req.psn = roce.PSNAdd(e.last, 1)
		if e.isReadAtomic() {
			e.rdAtom = true
			qp.req.rdAtomic++
		}
	}
	return reqSend
}

// reqSend builds the packet at e.sendPSN.
func (qp *QP) reqSend() reqState {
	if qp.w.ccp != nil && qp.ccHold() {
		return reqExit // congestion control: a pacer's timer resumes it
	}
	e := &qp.sq[qp.next&qp.sqMask]
	last, ok := qp.sendPacket(e, e.sendPSN, false)
	if !ok {
		return reqExit
	}
	if last {
		e.sendPSN = roce.PSNAdd(e.last, 1)
		e.state = wqePending
		qp.next++
	} else {
		e.sendPSN = roce.PSNAdd(e.sendPSN, 1)
	}
	if !qp.unrel && !qp.retryTimer.armed() {
		qp.armRetry()
	}
	return reqFetch
}

// sendPacket builds and queues the packet of e at psn: the next one of the
// requester (reqSend) or, with resend, one a selective NAK named (sr.go),
// which always asks for an ACK. It reports whether psn is e's last packet
// (for a READ request: always), and false in ok when nothing was queued:
// the transmit batch is full, or e failed (its status says why).
func (qp *QP) sendPacket(e *swqe, psn uint32, resend bool) (last, ok bool) {
	buf := qp.w.txBuf()
	if buf == nil {
		return false, false
	}
	idx := uint32(roce.PSNDiff(psn, e.first))
	last = idx+1 == e.npkts
	o := &qp.w.out
	*o = packet{psn: psn, srqn: e.RemoteQPN & roce.QPNMask}
	var n, hr int   // payload length, headroom
	var poff uint64 // message offset of the payload
	switch e.Opcode {
	case abi.WRRDMARead:
		off := uint64(idx) * uint64(qp.mtu)
		o.opcode = roce.OpRCReadRequest
		o.va, o.rkey, o.dmaLen = e.RemoteAddr+off, e.RKey, uint32(e.length-off)
		o.ackReq = true
		last = true
	case abi.WRAtomicCmpAndSwp, abi.WRAtomicFetchAdd:
		o.opcode = roce.OpRCCompareSwap
		o.swapAdd, o.compare = e.Swap, e.CompareAdd
		if e.Opcode == abi.WRAtomicFetchAdd {
			o.opcode = roce.OpRCFetchAdd
			o.swapAdd, o.compare = e.CompareAdd, 0
		}
		o.va, o.rkey = e.RemoteAddr, e.RKey
		o.ackReq = true
	case abi.WRFlush:
		o.opcode = roce.OpRCFlush
		o.va, o.rkey, o.dmaLen = e.RemoteAddr, e.RKey, uint32(e.length)
		o.plt, o.sel = uint8(e.Swap&0xf), uint8(e.Swap>>4&3)
		o.ackReq = true
	case abi.WRAtomicWrite:
		o.opcode = roce.OpRCAtomicWrite
		o.va, o.rkey, o.dmaLen = e.RemoteAddr, e.RKey, 8
		o.ackReq = true
		n = 8
		hr = qp.path.Headroom(o.opcode)
	default:
		o.opcode = dataOpcode(e, idx)
		if qp.unrel {
			qp.unreliableHeaders(e, o)
		}
		poff = uint64(idx) * uint64(qp.mtu)
		n = int(min(uint64(qp.mtu), e.length-poff))
		// The exact headroom only when the largest might not fit or
		// congestion control counts it: the short packets (txShort)
		// need none.
		if qp.w.ccp != nil || roce.MaxHeadroom+n+roce.MaxTailroom > len(buf) {
			if hr = qp.path.Headroom(o.opcode); hr+n+roce.MaxTailroom > len(buf) {
				qp.failWQE(e, abi.WCLocLenErr)
				return false, false
			}
		}
		info := o.opcode.Info()
		if info.Has(roce.HdrRETH) {
			o.va, o.rkey, o.dmaLen = e.RemoteAddr, e.RKey, uint32(e.length)
		}
		o.imm, o.invRKey = e.ImmData, e.InvalidateRKey
		o.se = last && e.Flags&abi.SendSolicited != 0 && e.Opcode != abi.WRRDMAWrite
		qp.req.sinceAck++
		o.ackReq = !qp.unrel && (resend || last || qp.req.sinceAck >= ackReqEvery || roce.PSNDiff(psn, qp.req.ackAllUntil) < 0 ||
			roce.PSNDiff(roce.PSNAdd(psn, 1), qp.comp.psn) >= int32(qp.w.window) ||
			qp.sr != nil && qp.sr.sr && roce.PSNDiff(roce.PSNAdd(psn, 1), qp.srDeliveredPSN()) >= srInFlight ||
			qp.w.ccp != nil && qp.ccAckReq(hr+n))
	}
	if o.ackReq {
		qp.req.sinceAck = 0
	}
	var queued bool
	switch {
	case o.opcode.Info().Flags&roce.OpPayload == 0:
		queued = qp.w.txQueue(qp, buf, o)
	case qp.w.shortOK(qp, o, n):
		var err error
		if queued, err = qp.w.txShort(qp, e, buf, o, poff, n); err != nil {
			qp.failWQE(e, localMemStatus(err))
			return false, false
		}
	default:
		if hr == 0 {
			hr = qp.path.Headroom(o.opcode)
		}
		if queued = qp.w.txBegin(qp, buf, o, hr, n); !queued {
			break
		}
		// The payload goes from the client's memory (or the WQE's inline
		// data) into the frame in one pass that computes the ICRC too.
		if e.Opcode == abi.WRAtomicWrite {
			// The WQE's 8 bytes, in the order they lie in the WQE.
			var v [8]byte
			binary.LittleEndian.PutUint64(v[:], e.CompareAdd)
			qp.w.framer.Put(v[:])
		} else if e.Flags&abi.SendInline != 0 {
			qp.w.framer.Put(e.Inline[poff : poff+uint64(n)])
		} else if err := qp.cfg.Mem.GatherTo(e.SGEs, poff, n, &qp.w.framer); err != nil {
			qp.failWQE(e, localMemStatus(err))
			return false, false
		}
		queued = qp.w.txFinish(qp, buf, o.psn)
	}
	if !queued && qp.unrel {
		// Nothing would ever report the packet sent.
		qp.failWQE(e, abi.WCLocQPOpErr)
		return false, false
	}
	if queued && qp.w.ccp != nil {
		qp.ccSent(len(qp.w.tx[qp.w.txN-1]))
	}
	if qp.sr != nil && queued {
		qp.srSent(o, resend)
	}
	if qp.req.dup && o.psn == qp.req.dupPSN {
		qp.req.dup = false
		qp.w.txRepeat(qp)
	}
	if h := traceHook.Load(); h != nil {
		if resend {
			(*h)(qp, "resend %v psn %d", o.opcode, o.psn)
		} else {
			(*h)(qp, "send %v psn %d", o.opcode, o.psn)
		}
	}
	return last, true
}

// dataOpcode picks the SEND or RDMA WRITE opcode of packet idx of e.
func dataOpcode(e *swqe, idx uint32) roce.Opcode {
	only := e.npkts == 1
	first := idx == 0
	last := idx+1 == e.npkts
	switch e.Opcode {
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		imm := e.Opcode == abi.WRRDMAWriteWithImm
		switch {
		case only && imm:
			return roce.OpRCWriteOnlyImm
		case only:
			return roce.OpRCWriteOnly
		case first:
			return roce.OpRCWriteFirst
		case last && imm:
			return roce.OpRCWriteLastImm
		case last:
			return roce.OpRCWriteLast
		}
		return roce.OpRCWriteMiddle
	}
	switch {
	case only && e.Opcode == abi.WRSendWithImm:
		return roce.OpRCSendOnlyImm
	case only && e.Opcode == abi.WRSendWithInv:
		return roce.OpRCSendOnlyInv
	case only:
		return roce.OpRCSendOnly
	case first:
		return roce.OpRCSendFirst
	case last && e.Opcode == abi.WRSendWithImm:
		return roce.OpRCSendLastImm
	case last && e.Opcode == abi.WRSendWithInv:
		return roce.OpRCSendLastInv
	case last:
		return roce.OpRCSendLast
	}
	return roce.OpRCSendMiddle
}
