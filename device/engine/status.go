package engine

import (
	"errors"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/queues"
	"github.com/vrnic/vrnic/roce"
)

// Completion statuses and NAK codes: the one place that says which status
// a work request completes with, which NAK code a responder answers
// with, and which asynchronous event (if any) a move to ERR raises
// (errEvent), for each cause of failure the engine can meet. The requester, the
// responder and the completer look their statuses up here; none of them
// picks an error status of its own, except for causes with a single
// obvious answer that name it at the one place they happen (a malformed
// response: BAD_RESP_ERR; retries exhausted: RETRY_EXC_ERR and
// RNR_RETRY_EXC_ERR; a payload that does not fit the frame: LOC_LEN_ERR; a
// QP in ERR: WR_FLUSH_ERR), and the responder's protocol checks, which
// name their NAK code where the IBTA rule is quoted (opcode sequence and
// packet length: Invalid Request; an operation the QP's access flags
// forbid: Remote Access Error).
//
// The statuses are those of IBTA vol. 1, 11.6.2 "Completion Return
// Status" (enum ibv_wc_status numbers them, abi.WCStatus copies it); for
// example "Local Length Error - Generated for a Work Request posted to the
// local Send Queue when the sum of the Data Segment lengths exceeds the
// message length for the channel adapter port. Generated for a Work Request
// posted to the local Receive Queue when the sum of the Data Segment
// lengths is too small to receive a valid incoming message". The NAK codes
// are those of the AETH syndrome (IBTA vol. 1, 9.7.5.2.2, table 43;
// roce.NAKCode).
//
// Causes, and where they come from:
//
//   - A Memory error, by class (the sentinels of iface.go: ErrMemProtection,
//     ErrMemLength, ErrMemBounds; package device/dataplane classifies the dma errors
//     into them), and by where it happened: the requester's own buffers
//     (memTable.local), a remote range named by an R_Key at the responder
//     (memTable.remoteNAK) or the responder's receive WQE (memTable.recv
//     and memTable.recvNAK).
//   - A NAK the completer receives: nakTable, NAK code to the status of
//     the WQE it names (IBTA 9.7.5.2.2: invalid request, remote access
//     error, remote operational error and invalid RD request are fatal for
//     the WQE, and 11.6.2 names the matching remote statuses).
//   - A bad work request a SendSource or RecvSource consumed: sourceStatus.
//     The sources of package device/dataplane are views of the client's rings
//     (package queues) and pass the errors of package queues unchanged: a
//     *queues.WQEError, whose Reason says why the WQE was rejected
//     (reasonTable), or an error wrapping queues.ErrIndex when the client
//     wrote an impossible producer index and the ring is broken
//     (LOC_QP_OP_ERR). The engine imports package queues for these two
//     types rather than asking every source to translate them into engine
//     causes: the classification of a rejected WQE then lives here, next to
//     every other status decision, and package queues keeps no opinion on
//     completion statuses (queues must not import the engine: the
//     dependencies run device -> engine -> queues -> abi). Any other source
//     error completes with LOC_QP_OP_ERR.
//
// Every lookup is an array index or an errors.Is / errors.AsType walk of
// preallocated errors: nothing allocates (TestStatusNoAlloc).

// memClass is the class of a Memory error.
type memClass uint8

const (
	// memProtection: unknown, invalidated or foreign key, or a missing
	// access right (ErrMemProtection; also anything unclassified, so
	// that an unexpected error fails closed).
	memProtection memClass = iota
	// memLength: the SGE list is shorter than the message (ErrMemLength).
	memLength
	// memBounds: the range leaves the MR, or a misaligned atomic
	// (ErrMemBounds).
	memBounds
	memClasses
)

// classOf returns the class of a Memory error.
func classOf(err error) memClass {
	switch {
	case errors.Is(err, ErrMemLength):
		return memLength
	case errors.Is(err, ErrMemBounds):
		return memBounds
	}
	return memProtection
}

// memRow is what one class of memory error completes with, by where it
// happened.
type memRow struct {
	// local: the requester's own buffers (Gather of a SEND or WRITE
	// payload, Scatter of a READ response or an atomic's original value,
	// LOCAL_INV): the status of the send WQE.
	local abi.WCStatus
	// remoteNAK: a range named by an R_Key at the responder (RDMA WRITE,
	// READ, atomic): the NAK code. IBTA 9.7.5.2.2: an R_Key violation
	// (bad key, access right, range outside the region) is a Remote
	// Access Error. No receive WQE is involved.
	remoteNAK roce.NAKCode
	// recv, recvNAK: the buffers of the receive WQE a SEND lands in: the
	// responder's own receive completion, and the NAK code. A message
	// longer than the receive buffers is the requester's fault: NAK
	// Invalid Request, the receive completes with LOC_LEN_ERR (11.6.2
	// above). Buffers the responder cannot write are its own fault: NAK
	// Remote Operational Error, the receive completes with LOC_PROT_ERR.
	recv    abi.WCStatus
	recvNAK roce.NAKCode
}

// memTable: memory class -> statuses and NAK codes.
var memTable = [memClasses]memRow{
	memProtection: {local: abi.WCLocProtErr, remoteNAK: roce.NAKRemoteAccessError, recv: abi.WCLocProtErr, recvNAK: roce.NAKRemoteOperationalErr},
	memLength:     {local: abi.WCLocLenErr, remoteNAK: roce.NAKInvalidRequest, recv: abi.WCLocLenErr, recvNAK: roce.NAKInvalidRequest},
	memBounds:     {local: abi.WCLocProtErr, remoteNAK: roce.NAKRemoteAccessError, recv: abi.WCLocProtErr, recvNAK: roce.NAKRemoteOperationalErr},
}

// localMemStatus is the status of a send WQE whose own buffers failed.
func localMemStatus(err error) abi.WCStatus { return memTable[classOf(err)].local }

// remoteMemNAK is the NAK code for a failed access to an R_Key range.
func remoteMemNAK(err error) roce.NAKCode { return memTable[classOf(err)].remoteNAK }

// recvMemStatus is the receive completion status and the NAK code when
// the payload of a SEND cannot be placed in the receive WQE's buffers.
func recvMemStatus(err error) (abi.WCStatus, roce.NAKCode) {
	r := &memTable[classOf(err)]
	return r.recv, r.recvNAK
}

// SEND with Invalidate whose R_Key the responder cannot invalidate: the
// request is invalid (NAK Invalid Request), the receive it consumed
// completes with a protection error.
const (
	invalidateRecvStatus = abi.WCLocProtErr
	invalidateNAK        = roce.NAKInvalidRequest
)

// nakTable: NAK code received -> status of the WQE it names (IBTA 9.7.5.2.2
// table 43 and 11.6.2). The PSN sequence error is not fatal (the completer
// retries; it never looks here). A reserved code is treated as a remote
// operational error, as Linux rxe does.
var nakTable = [...]abi.WCStatus{
	roce.NAKPSNSequenceError:     abi.WCRemOpErr,
	roce.NAKInvalidRequest:       abi.WCRemInvReqErr,
	roce.NAKRemoteAccessError:    abi.WCRemAccessErr,
	roce.NAKRemoteOperationalErr: abi.WCRemOpErr,
	roce.NAKInvalidRDRequest:     abi.WCRemInvRdReqErr,
}

// nakStatus is the status of a WQE the responder NAKed with code c.
func nakStatus(c roce.NAKCode) abi.WCStatus {
	if int(c) < len(nakTable) {
		return nakTable[c]
	}
	return abi.WCRemOpErr
}

// reasonTable: why package queues rejected a WQE -> its status. A WQE
// whose lengths the device cannot honour (more SGEs than the queue was
// created with, inline data longer than its max_inline, an atomic without
// exactly one 8-byte buffer, a message longer than the largest message)
// completes with LOC_LEN_ERR (11.6.2: "the sum of the Data Segment lengths
// exceeds the message length"); any other malformed WQE (unknown opcode or
// flag, reserved field set, inline data where none can go) is an
// inconsistent request, LOC_QP_OP_ERR. Every Reason is listed: a Reason
// missing here, or ReasonNone in an error, completes with LOC_QP_OP_ERR,
// never with SUCCESS.
var reasonTable = [...]abi.WCStatus{
	queues.ReasonNone:          abi.WCLocQPOpErr,
	queues.ReasonOpcode:        abi.WCLocQPOpErr,
	queues.ReasonFlags:         abi.WCLocQPOpErr,
	queues.ReasonReserved:      abi.WCLocQPOpErr,
	queues.ReasonTooManySGE:    abi.WCLocLenErr,
	queues.ReasonInlineTooLong: abi.WCLocLenErr,
	queues.ReasonInlineWithSGE: abi.WCLocQPOpErr,
	queues.ReasonInlineOpcode:  abi.WCLocQPOpErr,
	queues.ReasonAtomicSGE:     abi.WCLocLenErr,
	queues.ReasonLength:        abi.WCLocLenErr,
}

// reasonStatus is the status of a WQE rejected for r.
func reasonStatus(r queues.Reason) abi.WCStatus {
	if int(r) < len(reasonTable) && reasonTable[r] != abi.WCSuccess {
		return reasonTable[r]
	}
	return abi.WCLocQPOpErr
}

// unsupportedOpStatus: a send WQE with an opcode the engine does not
// execute (the SendSource lets through only those it does): a QP
// consistency error, as ibv_poll_cq(3) describes LOC_QP_OP_ERR for "an
// opcode which isn't supported by the transport type of the QP".
const unsupportedOpStatus = abi.WCLocQPOpErr

// Statuses of the other source errors: a broken ring (queues.ErrIndex),
// and anything else a source reports (a source bug), which has no better
// name than a QP consistency error.
const (
	ringStatus        = abi.WCLocQPOpErr
	sourceOtherStatus = abi.WCLocQPOpErr
)

// Rejected work requests are counted per worker by cause: the Reasons of
// package queues, a broken ring, anything else.
const (
	rejectRing  = int(queues.ReasonLength) + 1 + iota // queues.ErrIndex
	rejectOther                                       // any other source error
	numRejectKinds
)

// rejectNames names the causes as the operator reads them.
var rejectNames = [numRejectKinds]string{
	queues.ReasonNone:          "unspecified",
	queues.ReasonOpcode:        "unknown_opcode",
	queues.ReasonFlags:         "unknown_flags",
	queues.ReasonReserved:      "reserved_field",
	queues.ReasonTooManySGE:    "too_many_sge",
	queues.ReasonInlineTooLong: "inline_too_long",
	queues.ReasonInlineWithSGE: "inline_with_sge",
	queues.ReasonInlineOpcode:  "inline_opcode",
	queues.ReasonAtomicSGE:     "atomic_sge",
	queues.ReasonLength:        "message_too_long",
	rejectRing:                 "ring_index",
	rejectOther:                "other",
}

// rejectKind is the counter index of a source error.
func rejectKind(err error) int {
	if we, ok := errors.AsType[*queues.WQEError](err); ok && int(we.Reason) < rejectRing {
		return int(we.Reason)
	}
	if errors.Is(err, queues.ErrIndex) {
		return rejectRing
	}
	return rejectOther
}

// RejectedWQEs returns the work requests the worker's QPs rejected
// (malformed WQEs, broken rings), by cause name; causes never seen are
// left out.
func (c *WorkerCounters) RejectedWQEs() map[string]uint64 {
	var out map[string]uint64
	for i := range c.rejected {
		if n := c.rejected[i].Load(); n > 0 {
			if out == nil {
				out = map[string]uint64{}
			}
			out[rejectNames[i]] = n
		}
	}
	return out
}

// rejectedSource counts a work request a source consumed with error err
// and returns its status.
func (w *worker) rejectedSource(err error) abi.WCStatus {
	w.Counters.rejected[rejectKind(err)].Add(1)
	return sourceStatus(err)
}

// sourceStatus is the status of the work request a SendSource or
// RecvSource consumed with error err (see the top of this file).
func sourceStatus(err error) abi.WCStatus {
	if we, ok := errors.AsType[*queues.WQEError](err); ok {
		return reasonStatus(we.Reason)
	}
	if errors.Is(err, queues.ErrIndex) {
		return ringStatus
	}
	return sourceOtherStatus
}

// recvSourceNAK: a responder whose RecvSource fails (a broken RQ or SRQ
// ring, a malformed receive WQE) cannot execute the request through no
// fault of the requester: NAK Remote Operational Error, and the receive
// completes with sourceStatus (the responder's class A error, as Linux
// rxe handles a malformed receive WQE).
const recvSourceNAK = roce.NAKRemoteOperationalErr

// UD send WQEs whose address handle cannot be used (IBTA 11.4.1.1: the
// address handle of a UD send must be valid and of the QP's protection
// domain). An unknown handle is a malformed WR; an AH of another PD is a
// protection error, as an L_Key of another PD is. A UD message longer
// than the port's MTU is a local length error (11.6.2: "the sum of the
// Data Segment lengths exceeds the message length for the channel adapter
// port"). A UD or UC QP whose send WR completes in error goes to SQE, not
// ERR (qp.go, enterSQE).
const (
	unknownAHStatus = abi.WCLocQPOpErr
	foreignAHStatus = abi.WCLocProtErr
	udLengthStatus  = abi.WCLocLenErr
)

// unreliableRecvStatus is the status of a UD or UC receive WQE whose
// buffers could not take the message, and whether the QP goes to ERR.
// As Linux rxe (rxe_resp.c, RESPST_ERR_LENGTH for UD and UC without an
// SRQ): buffers too small for the message complete the RQE with
// LOC_LEN_ERR and the QP goes on (no NAK tells the sender; the next
// message uses the next RQE); buffers the QP cannot write are a broken
// receive WQE, LOC_PROT_ERR, and the QP goes to ERR (rxe's class D1E).
func unreliableRecvStatus(err error) (abi.WCStatus, bool) {
	st, _ := recvMemStatus(err)
	return st, classOf(err) != memLength
}

// errEvent is how a QP's client learns why the engine moved the QP to ERR
// (qp.go, enterError): through a completion, or through an affiliated
// asynchronous error (IBTA 11.6.3.1; the StateObserver raises it).
//
// The IBTA reports an error in a completion whenever it can be tied to a
// WR: C9-222.1.1 for the responder ("If the error can be related to a
// particular WQE on a given receive queue, the QP shall be placed into the
// error state and the error shall be reported to the responder's client
// as a Completion error"), and the requester's errors all complete its
// WQE. Linux does the same: rxe moves a QP to ERR after an error
// completion (rxe_comp.c COMPST_ERROR, rxe_resp.c RESPST_ERROR through
// rxe_qp_error) without an event, and mlx5 raises IB_EVENT_QP_FATAL only
// when the device reports a WQ_CATAS_ERROR (mlx5_ib_qp_event), not with an
// error CQE. Raising QP_FATAL after an error completion would tell clients
// a catastrophe happened where the verbs say none did (UCX, for one, logs
// every QP_FATAL as an error).
//
// An event is raised only for what no completion reports:
//
//   - evFatal, QP_FATAL, "Local Work Queue Catastrophic Error": a
//     completion the CQ refused (C9-218 and C11-37: the QPs that complete
//     into an overrun CQ go to ERR with an affiliated asynchronous error,
//     the CQ gets CQ_ERR); a broken ring (an impossible producer index, or
//     any other source failure that is not one rejected WQE: the queue
//     itself cannot be read, whatever completion is written for it); a
//     change the engine could not apply; an injected qp_err fault.
//   - evReqErr, QP_REQ_ERR ("Invalid Request Local Work Queue Error") and
//     evAccessErr, QP_ACCESS_ERR ("Local Access Violation Work Queue
//     Error"): an RC responder's class C error (NAK Invalid Request or
//     Remote Access Error) on a request no receive completion reports
//     (RDMA WRITE, READ, atomic: C9-222.1.1's "cannot be related to a
//     particular WQE"). Linux rxe raises IB_EVENT_QP_ACCESS_ERR for the
//     R_Key violations of such requests (rxe_resp.c,
//     RESPST_ERR_RKEY_VIOLATION_EVENT), mlx5 both from the device's
//     WQ_ACCESS_ERROR and WQ_INVAL_REQ_ERROR.
//
// evNone: an error completion reports the error (or the WQE that failed is
// flushed behind one), and no event is raised.
type errEvent uint8

const (
	evNone errEvent = iota
	evFatal
	evReqErr
	evAccessErr
)

// errEventTypes: errEvent -> the event the StateObserver raises.
var errEventTypes = [...]abi.EventType{
	evFatal:     abi.EventQPFatal,
	evReqErr:    abi.EventQPReqErr,
	evAccessErr: abi.EventQPAccessErr,
}

// classCEvent is the event of an RC responder's fatal NAK with code c on
// a request no receive completion reports. A code other than the two of
// class C (none is sent so today) is catastrophic.
func classCEvent(c roce.NAKCode) errEvent {
	switch c {
	case roce.NAKInvalidRequest:
		return evReqErr
	case roce.NAKRemoteAccessError:
		return evAccessErr
	}
	return evFatal
}

// classCRecvStatus is the status of the receive WQE a message held when
// the responder's class C error with NAK code c ended it (fatalNAK), as
// Linux rxe's (RESPST_ERR_RKEY_VIOLATION: IB_WC_REM_ACCESS_ERR; the
// invalid requests, RESPST_ERR_LENGTH and the opcode sequence errors:
// IB_WC_REM_INV_REQ_ERR).
func classCRecvStatus(c roce.NAKCode) abi.WCStatus {
	if c == roce.NAKRemoteAccessError {
		return abi.WCRemAccessErr
	}
	return abi.WCRemInvReqErr
}

// sourceEvent is the event of a source error err after the WQE it
// consumed completed with sourceStatus(err): none for a rejected WQE
// (*queues.WQEError, or one a bad_wqe fault treats as malformed), whose
// completion carries its own wr_id and status; QP_FATAL for a broken ring
// or any other failure of the source, which no WR stands for.
func sourceEvent(err error) errEvent {
	if _, ok := errors.AsType[*queues.WQEError](err); ok || errors.Is(err, ErrInjectedBadWQE) {
		return evNone
	}
	return evFatal
}
