package engine

import (
	"encoding/binary"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Responder: executes incoming requests and answers them (IBTA 9.7.4,
// 9.7.5), as Linux rxe_resp.c. Requests are handled in PSN order as they
// arrive (respRx); answers are produced by respOutput when the worker has
// transmit room, READ responses and atomic ACKs first (in PSN order), then
// the coalesced ACK or the pending NAK, which carries a later PSN.
//
//	check PSN ──► op sequence ──► op allowed ──► resources ──► length ──► rkey ──► execute ──► ack
//	    │ dup ──► duplicate (re-ACK, replay atomic, re-execute READ)
//	    └ OOS ──► one NAK-sequence error per gap

//go:generate go tool stringer -type=respState -linecomment

type respState uint8

// Responder states; the line comment is the name String prints.
const (
	respCheckPSN       respState = iota // check_psn
	respDuplicate                       // duplicate
	respCheckXRC                        // check_xrc
	respCheckOpSeq                      // check_op_seq
	respCheckOpAllowed                  // check_op_allowed
	respCheckResource                   // check_resource
	respCheckLength                     // check_length
	respCheckRKey                       // check_rkey
	respExecute                         // execute
	respDone                            // done
)

// resKind says what a responder resource holds.
type resKind uint8

const (
	resFree resKind = iota
	resRead
	resAtomic
	// resPlacement: an executed ATOMIC WRITE or FLUSH, answered with a
	// zero-length RDMA READ RESPONSE Only (IBTA 1.5 Memory Placement
	// Extensions); a duplicate gets the response again and is not
	// executed again (Linux rxe: atomic_write_reply and process_flush
	// return at once on a replay, oA19-14 and oA19-15 for FLUSH), so an
	// ATOMIC WRITE retransmitted after a later write to its word cannot
	// undo that write.
	resPlacement
)

// rdRes is one of the max_dest_rd_atomic responder resources: a READ being
// (or already) answered, or an executed atomic and its result, kept for
// replay when the request is retransmitted (IBTA 9.7.5.1.4: atomics are
// executed once; duplicates are answered from the result).
type rdRes struct {
	kind        resKind
	active      bool   // responses still to send
	first, last uint32 // PSN range of the request
	cur         uint32 // next response PSN to send
	req         uint32 // PSN of the request being answered (a re-executed READ starts later than first)
	va          uint64 // READ: remote address of cur
	rkey        uint32
	left        uint32 // READ: bytes still to send
	orig        uint64 // atomic: original value
	mem         Memory // READ: where it reads (the QP's, or an XRC SRQ's PD)
}

// responder is the per-QP responder state.
type responder struct {
	epsn    uint32 // expected PSN
	msn     uint32 // message sequence number (24 bits)
	nakSent bool   // a NAK-sequence error for epsn is out
	resN    uint8  // max_dest_rd_atomic: the slots res has or will have

	// message in progress
	inSend, inWrite bool
	ucDrop          bool     // UC: the message in progress lost packets; wait for FIRST/ONLY
	rqeValid        bool     // rqe holds an RQE
	rqe             RecvWork // the RQE of the SEND / WRITE-with-imm in progress
	rqeTaken        int64    // when rqe was taken (worker.now; latency.go)
	// xsrq is the XRC SRQ the request in progress names (target QPs;
	// respCheckXRC), nil otherwise.
	xsrq  *XRCSRQ
	off   uint64 // bytes placed of the message in progress
	wVA   uint64 // RDMA WRITE in progress
	wRKey uint32
	wLen  uint32

	ackPending bool
	nakPending bool
	nakFatal   bool     // move to ERR once the NAK is out
	nakEv      errEvent // with nakFatal: the event of the move (status.go)
	nak        roce.Syndrome
	resNext    uint8 // slot of res the next READ/atomic takes (the oldest)
	nakPSN     uint32

	// res is allocated (resN slots) by the first READ or atomic request
	// the QP answers (slot): a QP that never serves one holds none.
	res []rdRes
}

func (r *responder) setResources(n int) {
	if int(r.resN) != n {
		r.resN = uint8(n)
		r.res = nil
		r.resNext = 0
	}
}

// slot returns the resource the next READ or atomic request takes,
// allocating the QP's resources the first time (once per QP, not per
// request).
func (r *responder) slot() *rdRes {
	if r.res == nil {
		r.res = make([]rdRes, r.resN)
	}
	return &r.res[r.resNext]
}

// keep stores res in the next responder resource for a request of n
// packets (READ, atomic, ATOMIC WRITE, FLUSH: answered again from it when
// it comes again) and moves past the request: ePSN by n, the MSN by one.
func (r *responder) keep(res rdRes, n uint32) {
	*r.slot() = res
	r.resNext = uint8((int(r.resNext) + 1) % len(r.res))
	r.epsn = roce.PSNAdd(r.epsn, n)
	r.msn = roce.PSNAdd(r.msn, 1)
}

func (r *responder) clear(epsn uint32) {
	r.epsn, r.msn, r.nakSent = epsn, 0, false
	r.inSend, r.inWrite, r.rqeValid, r.off, r.ucDrop = false, false, false, 0, false
	r.ackPending, r.nakPending, r.nakFatal, r.nakEv = false, false, false, evNone
	r.xsrq = nil
	clear(r.res)
	r.resNext = 0
}

// respRx handles one request packet.
func (qp *QP) respRx(p *packet) {
	switch qp.state {
	case abi.QPSRTR, abi.QPSRTS, abi.QPSSQD:
	default:
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	if qp.resp.nakPending && qp.resp.nakFatal {
		// A class C/D error was decided (IBTA 9.9.3.1.2): the QP is
		// bound for ERR and executes nothing more, though the NAK may
		// wait for a transmit buffer. Without this a retransmission of
		// the failed request would take the next receive WQE.
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	if qp.verbRequestErr() {
		return
	}
	if h := traceHook.Load(); h != nil {
		(*h)(qp, "B rx %v psn %d epsn %d nakSent %v ack %v", p.opcode, p.psn, qp.resp.epsn, qp.resp.nakSent, p.ackReq)
	}
	if !qp.respWriteOnly(p) {
		qp.respSteps(p)
	}
	if s := qp.sr; s != nil && s.hd < len(s.held) && !s.draining {
		qp.srDrain()
	}
	qp.w.busy = true
}

// respSteps runs request p through the responder's steps.
func (qp *QP) respSteps(p *packet) {
	// The checks in their order, each leading to the next or ending the
	// packet: a new request goes through them without a dispatch; the
	// loop takes any other course (a duplicate).
	st := qp.respCheckPSN(p)
	if st == respCheckXRC {
		st = qp.respCheckXRC(p)
	}
	if st == respCheckOpSeq {
		st = qp.respCheckOpSeq(p)
	}
	if st == respCheckOpAllowed {
		st = qp.respCheckOpAllowed(p)
	}
	if st == respCheckResource {
		st = qp.respCheckResource(p)
	}
	if st == respCheckLength {
		st = qp.respCheckLength(p)
	}
	if st == respCheckRKey {
		st = qp.respCheckRKey(p)
	}
	if st == respExecute {
		st = qp.respExecute(p)
	}
	for st != respDone {
		switch st {
		case respCheckPSN:
			st = qp.respCheckPSN(p)
		case respDuplicate:
			st = qp.respDuplicate(p)
		case respCheckXRC:
			st = qp.respCheckXRC(p)
		case respCheckOpSeq:
			st = qp.respCheckOpSeq(p)
		case respCheckOpAllowed:
			st = qp.respCheckOpAllowed(p)
		case respCheckResource:
			st = qp.respCheckResource(p)
		case respCheckLength:
			st = qp.respCheckLength(p)
		case respCheckRKey:
			st = qp.respCheckRKey(p)
		case respExecute:
			st = qp.respExecute(p)
		}
	}
}

// respWriteOnly runs the commonest request, an RC RDMA WRITE Only at the
// expected PSN with no message in progress, on a QP that permits it, of a
// length the checks accept, in one step: what respCheckPSN through
// respExecute do with it (R_Key check, placement, the next PSN and MSN,
// the ACK owed), their failures answered as they answer them. false: p
// is not such a request, and nothing was done.
func (qp *QP) respWriteOnly(p *packet) bool {
	r := &qp.resp
	n := uint32(len(p.payload))
	if p.opcode != roce.OpRCWriteOnly || p.psn != r.epsn || r.inSend || r.inWrite ||
		qp.cfg.Type == abi.QPTXRCRecv || qp.attr.AccessFlags&abi.AccessRemoteWrite == 0 ||
		n > qp.mtu || n != p.dmaLen {
		return false
	}
	r.nakSent = false
	mem := qp.respMem()
	if n > 0 { // a zero-length WRITE names no memory (respCheckRKey)
		if err := mem.CheckRemote(p.rkey, p.va, uint64(n), abi.AccessRemoteWrite); err != nil {
			qp.fatalNAK(remoteMemNAK(err), p)
			return true
		}
	}
	r.wVA, r.wRKey, r.wLen, r.off = p.va, p.rkey, p.dmaLen, 0
	if n > 0 {
		if err := mem.WriteRemote(p.rkey, p.va, p.payload); err != nil {
			qp.fatalNAK(remoteMemNAK(err), p)
			return true
		}
	}
	r.msn = roce.PSNAdd(r.msn, 1)
	r.epsn = roce.PSNAdd(r.epsn, 1)
	if p.ackReq {
		r.ackPending = true
	}
	return true
}

// queueNAK records a NAK to send at psn. A fatal NAK (the QP goes to ERR
// after it, raising ev) is never replaced.
func (qp *QP) queueNAK(s roce.Syndrome, psn uint32, fatal bool, ev errEvent) {
	r := &qp.resp
	if r.nakPending && r.nakFatal {
		return
	}
	r.nak, r.nakPSN, r.nakPending, r.nakFatal, r.nakEv = s, psn, true, fatal, ev
	r.ackPending = false
	if fatal {
		qp.Counters.Rare().countErrNAK(s.NAK(), true)
	}
}

// fatalNAK answers p with NAK code c and moves the QP to ERR once the NAK
// has been sent (IBTA 9.9.3.1.2: responder class C and D errors).
//
// When the message in progress holds a receive WQE (a SEND past the
// packet that took it, or the last packet of a SEND or an RDMA WRITE with
// immediate, which took one before its length or R_Key was checked), the
// error relates to that WQE (C9-222.1.1): it completes with the error,
// REM_INV_REQ_ERR for an invalid request and REM_ACCESS_ERR for a remote
// access error, and no event is raised, as Linux rxe completes it
// (rxe_resp.c: do_class_ac_error, then do_complete with the WQE it took
// in check_resource). Otherwise no receive completion can report the
// error: the client hears of it through QP_REQ_ERR or QP_ACCESS_ERR
// (status.go, classCEvent).
func (qp *QP) fatalNAK(c roce.NAKCode, p *packet) respState {
	r := &qp.resp
	if !r.rqeValid {
		return qp.fatalNAKAfter(c, p, classCEvent(c))
	}
	return qp.failRQE(classCRecvStatus(c), c, p)
}

// failRQE completes the receive WQE the message holds with status st and
// answers p with the fatal NAK c, raising no event: the completion says
// why.
func (qp *QP) failRQE(st abi.WCStatus, c roce.NAKCode, p *packet) respState {
	r := &qp.resp
	r.rqeValid = false
	qp.completeRecv(&r.rqe, st, abi.WCRecv, 0, 0, 0, false)
	return qp.fatalNAKAfter(c, p, evNone)
}

// fatalNAKAfter is fatalNAK for an error a receive completion was written
// for (class A, or a class C error of a SEND in its receive WQE's
// buffers): ev is evNone, as that completion reports it, unless the
// receive queue itself failed (sourceEvent).
func (qp *QP) fatalNAKAfter(c roce.NAKCode, p *packet, ev errEvent) respState {
	qp.queueNAK(roce.NAKSyndrome(c), p.psn, true, ev)
	qp.Counters.Rare().Dropped.Add(1)
	return respDone
}

// respCheckPSN: IBTA 9.7.5.1.1: a request with the expected PSN is new;
// an earlier one is a duplicate; a later one means packets were lost and
// is answered with a single NAK-PSN sequence error until the expected PSN
// arrives: one NAK per sequence error, and no other NAK before a request
// with the expected PSN.
func (qp *QP) respCheckPSN(p *packet) respState {
	r := &qp.resp
	d := roce.PSNDiff(p.psn, r.epsn)
	switch {
	case d < 0:
		return respDuplicate
	case d > 0:
		if qp.sr != nil && qp.sr.sr {
			qp.srHold(p, d)
			return respDone
		}
		if !r.nakSent {
			r.nakSent = true
			qp.Counters.Rare().SeqNAKsSent.Add(1)
			qp.queueNAK(roce.NAKSyndrome(roce.NAKPSNSequenceError), r.epsn, false, evNone)
		}
		qp.Counters.Rare().Dropped.Add(1)
		return respDone
	}
	r.nakSent = false
	return respCheckXRC
}

// respDuplicate: IBTA 9.7.5.1.2 / 9.7.5.1.3: duplicate SEND and WRITE
// packets are not executed again but acknowledged; a duplicate READ is
// executed again from the PSN and address it carries; a duplicate atomic is
// answered from the saved result, never executed twice.
func (qp *QP) respDuplicate(p *packet) respState {
	r := &qp.resp
	qp.Counters.Rare().Duplicates.Add(1)
	info := p.opcode.Info()
	switch {
	case info.Is(roce.OpRead):
		for i := range r.res {
			s := &r.res[i]
			if s.kind != resRead || roce.PSNDiff(p.psn, s.first) < 0 || roce.PSNDiff(p.psn, s.last) > 0 {
				continue
			}
			if roce.PSNAdd(p.psn, readPackets(p.dmaLen, qp.mtu)-1) != s.last {
				break // not a tail of the original request
			}
			s.cur, s.req, s.va, s.rkey, s.left, s.active = p.psn, p.psn, p.va, p.rkey, p.dmaLen, true
			return respDone
		}
		qp.Counters.Rare().Dropped.Add(1)
	case info.Is(roce.OpAtomic), info.Is(roce.OpAtomicWrite), info.Is(roce.OpFlush):
		kind := resAtomic
		if !info.Is(roce.OpAtomic) {
			kind = resPlacement
		}
		for i := range r.res {
			s := &r.res[i]
			if s.kind == kind && s.first == p.psn {
				s.cur, s.req, s.active = s.first, s.first, true
				return respDone
			}
		}
		// Class D (the resource was reused): drop, as rxe does.
		qp.Counters.Rare().Dropped.Add(1)
	default:
		r.ackPending = true
	}
	return respDone
}

// readPackets is the number of response packets (and PSNs) of a READ of n
// bytes: at least one.
func readPackets(n, mtu uint32) uint32 {
	if n == 0 {
		return 1
	}
	return (n + mtu - 1) / mtu
}

// respCheckOpSeq: IBTA 9.7.5.1.1: the opcode must continue the
// message in progress (MIDDLE/LAST of the same operation) or start a new
// one (FIRST/ONLY); anything else is an invalid request.
func (qp *QP) respCheckOpSeq(p *packet) respState {
	r := &qp.resp
	info := p.opcode.Info()
	cont := info.Is(roce.OpMiddle) || info.Is(roce.OpLast)
	switch {
	case r.inSend:
		if !cont || !info.Is(roce.OpSend) {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
	case r.inWrite:
		if !cont || !info.Is(roce.OpWrite) {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
	default:
		if cont {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
	}
	return respCheckOpAllowed
}

// respCheckOpAllowed: the QP must allow the remote operation (its access
// flags, set with ModifyQP; IBTA 10.2.4); otherwise a remote access error.
func (qp *QP) respCheckOpAllowed(p *packet) respState {
	info := p.opcode.Info()
	need := uint32(0)
	switch {
	case info.Is(roce.OpWrite):
		need = abi.AccessRemoteWrite
	case info.Is(roce.OpRead):
		need = abi.AccessRemoteRead
	case info.Is(roce.OpAtomic):
		need = abi.AccessRemoteAtomic
	case info.Is(roce.OpAtomicWrite):
		// As Linux rxe (check_qp_attr_access): ATOMIC WRITE needs
		// remote write, FLUSH the rights of its placement types.
		need = abi.AccessRemoteWrite
	case info.Is(roce.OpFlush):
		need = flushAccess(p.plt)
	}
	if qp.attr.AccessFlags&need != need {
		return qp.fatalNAK(roce.NAKRemoteAccessError, p)
	}
	return respCheckResource
}

// respCheckResource takes the receive WQE a SEND or RDMA WRITE with
// immediate consumes, or a responder resource for READ/atomic. Without an
// RQE the answer is an RNR NAK (IBTA 9.7.5.2.8) and the packet is not
// executed; the requester resends it after the RNR timer.
func (qp *QP) respCheckResource(p *packet) respState {
	r := &qp.resp
	info := p.opcode.Info()
	switch {
	case info.Is(roce.OpRecvWQE) && !r.rqeValid && (info.Is(roce.OpSend) || info.Is(roce.OpLast) || info.Is(roce.OpOnly)):
		r.rqe.SGEs = r.rqe.SGEs[:0]
		ok, err := qp.pollRecv(&r.rqe)
		if err != nil {
			// A broken RQ/SRQ ring or a malformed receive WQE: the
			// consumed RQE (wr_id 0 for a broken ring) completes in
			// error on this side, the requester gets its NAK, and the
			// QP goes to ERR once the NAK is out, which flushes the
			// rest.
			qp.completeRecv(&r.rqe, qp.w.rejectedSource(err), abi.WCRecv, 0, 0, 0, false)
			return qp.fatalNAKAfter(recvSourceNAK, p, sourceEvent(err))
		}
		if !ok {
			qp.Counters.Rare().RNRNAKsSent.Add(1)
			// The rest of the message now arrives out of sequence;
			// the RNR NAK is the one NAK of this gap.
			r.nakSent = true
			qp.queueNAK(roce.RNRNAKSyndrome(roce.RNRTimer(qp.attr.MinRNRTimer)), p.psn, false, evNone)
			return respDone
		}
		r.rqeValid, r.rqeTaken = true, qp.w.now
	case info.Is(roce.OpRead) || info.Is(roce.OpAtomic):
		// The oldest resource is reused. It can still be sending
		// responses to a re-executed duplicate READ the requester no
		// longer needs: a requester only sends a new READ/atomic when it
		// has a free max_rd_atomic credit, i.e. when it received every
		// response of an older one, so the oldest is finished business.
	}
	return respCheckLength
}

// respCheckLength: IBTA C9-92 (the responder's length checks, as Linux
// rxe's check_length cites them): FIRST and MIDDLE packets carry exactly
// one path MTU, LAST and ONLY at most one; an RDMA WRITE's packets add up
// to the DMA length of its RETH.
func (qp *QP) respCheckLength(p *packet) respState {
	r := &qp.resp
	info := p.opcode.Info()
	n := uint32(len(p.payload))
	switch {
	case info.Is(roce.OpFirst) || info.Is(roce.OpMiddle):
		if n != qp.mtu {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
	case n > qp.mtu:
		return qp.fatalNAK(roce.NAKInvalidRequest, p)
	}
	if info.Is(roce.OpWrite) {
		total := uint64(r.off) + uint64(n)
		switch {
		case info.Is(roce.OpOnly) && n != p.dmaLen,
			info.Is(roce.OpFirst) && uint64(p.dmaLen) <= uint64(qp.mtu),
			!info.Is(roce.OpFirst) && !info.Is(roce.OpOnly) && total > uint64(r.wLen),
			info.Is(roce.OpLast) && total != uint64(r.wLen):
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
	}
	if info.Is(roce.OpRead) && uint64(p.dmaLen) > abi.MaxMsgBytes {
		return qp.fatalNAK(roce.NAKInvalidRequest, p)
	}
	// ATOMIC WRITE: exactly 8 bytes, as its RETH says. FLUSH: a placement
	// type the IBTA defines (at least one; reserved bits ignored), a
	// selectivity level of 0 or 1, and (IBA C9-94, as rxe checks every
	// RETH) a DMA length of at most 2^31.
	switch {
	case info.Is(roce.OpAtomicWrite) && (n != 8 || p.dmaLen != 8),
		info.Is(roce.OpFlush) && (p.plt&roce.FlushPlacementTypes == 0 || p.sel > roce.FlushRegion ||
			uint64(p.dmaLen) > abi.MaxMsgBytes):
		return qp.fatalNAK(roce.NAKInvalidRequest, p)
	}
	return respCheckRKey
}

// respCheckRKey validates the remote range once, at the start of an RDMA
// WRITE, READ or atomic (IBTA C9-88, as Linux rxe's check_rkey cites it:
// a zero-length RDMA READ or WRITE need not carry a valid address or R_Key,
// so it is not checked). Misaligned atomics are invalid requests.
func (qp *QP) respCheckRKey(p *packet) respState {
	info := p.opcode.Info()
	mem := qp.respMem()
	var err error
	switch {
	case info.Is(roce.OpWrite) && (info.Is(roce.OpFirst) || info.Is(roce.OpOnly)):
		if p.dmaLen > 0 {
			err = mem.CheckRemote(p.rkey, p.va, uint64(p.dmaLen), abi.AccessRemoteWrite)
		}
	case info.Is(roce.OpRead):
		if p.dmaLen > 0 {
			err = mem.CheckRemote(p.rkey, p.va, uint64(p.dmaLen), abi.AccessRemoteRead)
		}
	case info.Is(roce.OpAtomic):
		if p.va&7 != 0 {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
		err = mem.CheckRemote(p.rkey, p.va, 8, abi.AccessRemoteAtomic)
	case info.Is(roce.OpAtomicWrite):
		// A misaligned ATOMIC WRITE is an invalid request (Linux rxe:
		// RESPST_ERR_MISALIGNED_ATOMIC, NAK invalid request), as for the
		// other atomics.
		if p.va&7 != 0 {
			return qp.fatalNAK(roce.NAKInvalidRequest, p)
		}
		err = mem.CheckRemote(p.rkey, p.va, 8, abi.AccessRemoteWrite)
	}
	if err != nil {
		return qp.fatalNAK(remoteMemNAK(err), p)
	}
	return respExecute
}

// respExecute places data, consumes RQEs, executes atomics and sets up
// READ responses.
func (qp *QP) respExecute(p *packet) respState {
	r := &qp.resp
	info := p.opcode.Info()
	mem := qp.respMem()
	switch {
	case info.Is(roce.OpSend):
		if len(p.payload) > 0 {
			if err := mem.Scatter(r.rqe.SGEs, r.off, p.payload); err != nil {
				// The receive buffer is too small or not writable
				// (memTable: the receive status and the NAK).
				st, c := recvMemStatus(err)
				return qp.failRQE(st, c, p)
			}
		}
		r.off += uint64(len(p.payload))
		r.inSend = true
		if info.Is(roce.OpLast) || info.Is(roce.OpOnly) {
			var flags abi.WCFlags
			var immInv uint32
			switch {
			case info.Is(roce.OpImm):
				flags, immInv = abi.WCWithImm, p.imm
			case info.Is(roce.OpInvalidate):
				if err := mem.Invalidate(p.invRKey); err != nil {
					return qp.failRQE(invalidateRecvStatus, invalidateNAK, p)
				}
				flags, immInv = abi.WCWithInv, p.invRKey
			}
			r.rqeValid = false
			qp.completeRecv(&r.rqe, abi.WCSuccess, abi.WCRecv, uint32(r.off), flags, immInv, p.se)
			r.inSend, r.off = false, 0
			r.msn = roce.PSNAdd(r.msn, 1)
		}
	case info.Is(roce.OpWrite):
		if info.Is(roce.OpFirst) || info.Is(roce.OpOnly) {
			r.wVA, r.wRKey, r.wLen, r.off = p.va, p.rkey, p.dmaLen, 0
		}
		if len(p.payload) > 0 {
			if err := mem.WriteRemote(r.wRKey, r.wVA+r.off, p.payload); err != nil {
				return qp.fatalNAK(remoteMemNAK(err), p)
			}
		}
		r.off += uint64(len(p.payload))
		r.inWrite = true
		if info.Is(roce.OpLast) || info.Is(roce.OpOnly) {
			if info.Is(roce.OpImm) {
				r.rqeValid = false
				qp.completeRecv(&r.rqe, abi.WCSuccess, abi.WCRecvRDMAWithImm, r.wLen, abi.WCWithImm, p.imm, p.se)
			}
			r.inWrite, r.off = false, 0
			r.msn = roce.PSNAdd(r.msn, 1)
		}
	case info.Is(roce.OpRead):
		np := readPackets(p.dmaLen, qp.mtu)
		r.keep(rdRes{kind: resRead, active: true, first: p.psn, last: roce.PSNAdd(p.psn, np-1),
			cur: p.psn, req: p.psn, va: p.va, rkey: p.rkey, left: p.dmaLen, mem: mem}, np)
		return respDone
	case info.Is(roce.OpAtomic):
		// AtomicETH: Swap (or Add) Data, Compare Data (IBTA 9.3.3.4).
		cas := p.opcode == roce.OpRCCompareSwap
		arg, swap := p.swapAdd, uint64(0)
		if cas {
			arg, swap = p.compare, p.swapAdd
		}
		orig, err := mem.Atomic(p.rkey, p.va, cas, arg, swap)
		if err != nil {
			return qp.fatalNAK(remoteMemNAK(err), p)
		}
		r.keep(rdRes{kind: resAtomic, active: true, first: p.psn, last: p.psn, cur: p.psn, orig: orig}, 1)
		return respDone
	case info.Is(roce.OpAtomicWrite), info.Is(roce.OpFlush):
		var err error
		if info.Is(roce.OpAtomicWrite) {
			// One atomic store of the 8 payload bytes as they arrived
			// (rxe: smp_store_release of the payload word). Everything
			// before it in PSN order is already placed.
			err = mem.AtomicWrite(p.rkey, p.va, binary.LittleEndian.Uint64(p.payload))
		} else {
			// The MR's rights (rxe's check_rkey for FLUSH: the whole
			// MR with selectivity "memory region", else the range),
			// then placement: see dma.Accessor.Flush.
			err = mem.Flush(p.rkey, p.va, uint64(p.dmaLen), p.sel == roce.FlushRegion, flushAccess(p.plt))
		}
		if err != nil {
			return qp.fatalNAK(remoteMemNAK(err), p)
		}
		r.keep(rdRes{kind: resPlacement, active: true, first: p.psn, last: p.psn, cur: p.psn, req: p.psn}, 1)
		return respDone
	}
	r.epsn = roce.PSNAdd(r.epsn, 1)
	if p.ackReq {
		r.ackPending = true
	}
	return respDone
}

// flushAccess is the access a FLUSH of placement type plt needs, on the
// QP and on the MR (IBV_ACCESS_FLUSH_GLOBAL, IBV_ACCESS_FLUSH_PERSISTENT).
func flushAccess(plt uint8) uint32 {
	var a uint32
	if plt&roce.FlushGlobal != 0 {
		a |= abi.AccessFlushGlobal
	}
	if plt&roce.FlushPersistent != 0 {
		a |= abi.AccessFlushPersistent
	}
	return a
}

// oldestActive returns the oldest resource with responses to send.
func (r *responder) oldestActive() *rdRes {
	n := len(r.res)
	for i := range n {
		s := &r.res[(int(r.resNext)+i)%n]
		if s.active {
			return s
		}
	}
	return nil
}

// respOutput sends what the responder owes: READ responses and atomic
// ACKs in PSN order, then the pending NAK or coalesced ACK (whose PSN is
// later than all of them). It returns false when the transmit batch filled
// up with work left.
func (qp *QP) respOutput() bool {
	r := &qp.resp
	for {
		if s := r.oldestActive(); s != nil {
			if !qp.sendResponse(s) {
				return false
			}
			continue
		}
		if !r.nakPending && !r.ackPending {
			if qp.sr != nil && len(qp.sr.snaks) > 0 {
				return qp.srOutput() // after the ACK or NAK (an RNR NAK first)
			}
			return true
		}
		buf := qp.w.txBuf()
		if buf == nil {
			return false
		}
		o := &qp.w.out
		*o = packet{opcode: roce.OpRCAck, psn: roce.PSNAdd(r.epsn, roce.PSNMask), msn: r.msn,
			syndrome: roce.ACKSyndrome(roce.CreditsInvalid)}
		if qp.sr != nil && qp.sr.sr {
			o.msn = qp.srReceived() // selective repeat: sr.go
		}
		if r.nakPending {
			o.syndrome, o.psn = r.nak, r.nakPSN
		}
		qp.w.txQueue(qp, buf, o)
		if h := traceHook.Load(); h != nil {
			(*h)(qp, "B tx ack %v psn %d", o.syndrome, o.psn)
		}
		fatal, ev := r.nakPending && r.nakFatal, r.nakEv
		r.ackPending, r.nakPending, r.nakFatal, r.nakEv = false, false, false, evNone
		if fatal {
			qp.enterError(ev)
			return true
		}
	}
}

// sendResponse sends the next packet of resource s.
func (qp *QP) sendResponse(s *rdRes) bool {
	r := &qp.resp
	buf := qp.w.txBuf()
	if buf == nil {
		return false
	}
	o := &qp.w.out
	*o = packet{psn: s.cur, msn: r.msn, syndrome: roce.ACKSyndrome(roce.CreditsInvalid)}
	if s.kind == resAtomic {
		o.opcode, o.orig = roce.OpRCAtomicAck, s.orig
		qp.w.txQueue(qp, buf, o)
		s.active = false
		return true
	}
	if qp.w.ccp != nil && qp.ccHold() {
		return false // congestion control: a pacer's timer resumes it
	}
	// IBTA 9.7.5.1.3: READ responses are path-MTU sized (the last may be
	// shorter); FIRST, LAST and ONLY carry an AETH.
	n := min(s.left, qp.mtu)
	idx := uint32(roce.PSNDiff(s.cur, s.req))
	np := uint32(roce.PSNDiff(s.last, s.req)) + 1
	switch {
	case np == 1:
		o.opcode = roce.OpRCReadResponseOnly
	case idx == 0:
		o.opcode = roce.OpRCReadResponseFirst
	case idx+1 == np:
		o.opcode = roce.OpRCReadResponseLast
	default:
		o.opcode = roce.OpRCReadResponseMiddle
	}
	hr := qp.path.Headroom(o.opcode)
	if hr+int(n)+roce.MaxTailroom > len(buf) {
		return false
	}
	// The payload goes from the MR into the frame in one pass that
	// computes the ICRC too, as the requester's does.
	// A zero-length READ touches no memory (its R_Key is not checked).
	if qp.w.txBegin(qp, buf, o, hr, int(n)) {
		if n > 0 {
			if err := s.mem.ReadRemoteTo(s.rkey, s.va, int(n), &qp.w.framer); err != nil {
				s.active = false
				c := remoteMemNAK(err)
				qp.queueNAK(roce.NAKSyndrome(c), s.cur, true, classCEvent(c))
				return true
			}
		}
		if qp.w.txFinish(qp, buf, o.psn) && qp.w.ccp != nil {
			qp.ccSent(len(qp.w.tx[qp.w.txN-1]))
		}
	}
	s.va += uint64(n)
	s.left -= n
	s.cur = roce.PSNAdd(s.cur, 1)
	if roce.PSNDiff(s.cur, s.last) > 0 {
		s.active = false
	}
	return true
}
