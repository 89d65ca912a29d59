package engine

import (
	"errors"
	"time"
)

// VerbPoint names a place where a verb-level fault may strike (package
// faults decides whether it does: VerbFaults).
type VerbPoint uint8

const (
	// VerbRNR: an RC responder is about to take a receive WQE for a
	// request; a fault answers with an RNR NAK as if none were posted.
	VerbRNR VerbPoint = iota + 1
	// VerbQPErr: a QP fetches a send WQE or receives a request; a fault
	// moves it to ERR as a catastrophic error would (QP_FATAL, flushes:
	// no completion says why), and the request, if any, is dropped as an
	// ERR QP drops it.
	VerbQPErr
	// VerbBadWQE: a send WQE was fetched; a fault treats it as malformed
	// (LOC_QP_OP_ERR, the QP to ERR; no asynchronous event, the
	// completion says why), as a WQE package queues rejects.
	VerbBadWQE
	// VerbCQOverflow: a completion is about to be written to CQ cq; a
	// fault overflows the CQ (package device/dataplane).
	VerbCQOverflow
	// VerbCQEDelay: a completion is about to be written to CQ cq; a fault
	// holds it back for the duration returned (package device/dataplane).
	VerbCQEDelay
)

// VerbFaults decides the verb-level faults. VerbFault is asked at a point
// p for the local QP qpn (and CQ handle cq at the CQ points, else 0); it
// reports whether a fault strikes and, for VerbCQEDelay, for how long. It
// is called on the engine's workers, must not block, and may be called
// concurrently.
type VerbFaults interface {
	VerbFault(p VerbPoint, qpn, cq uint32) (time.Duration, bool)
}

// verbHooks boxes the installed VerbFaults for the atomic pointer.
type verbHooks struct{ f VerbFaults }

// SetVerbFaults installs f (nil: none). Until one is installed, every
// hook of the transport costs one atomic load of a nil pointer.
func (e *Engine) SetVerbFaults(f VerbFaults) {
	if f == nil {
		e.verb.Store(nil)
		return
	}
	e.verb.Store(&verbHooks{f: f})
}

// VerbFault asks the installed VerbFaults (false when none is): for the
// data plane's CQ points.
func (e *Engine) VerbFault(p VerbPoint, qpn, cq uint32) (time.Duration, bool) {
	h := e.verb.Load()
	if h == nil {
		return 0, false
	}
	return h.f.VerbFault(p, qpn, cq)
}

// VerbFaultsOn reports whether verb faults are installed (one atomic
// load): the data plane's hot-path check.
func (e *Engine) VerbFaultsOn() bool { return e.verb.Load() != nil }

// ErrInjectedBadWQE is the source error of a send WQE a verb fault
// treated as malformed: its status is LOC_QP_OP_ERR (status.go,
// sourceOtherStatus), as for a WQE the source could not make sense of.
var ErrInjectedBadWQE = errors.New("engine: send WQE treated as malformed (verb fault bad_wqe)")

// pollSend is the requester's fetch of the next send WQE, through the
// verb faults when some are installed: qp_err moves the QP to ERR before
// the fetch (the WQE is then flushed with WR_FLUSH_ERR), bad_wqe fails
// the WQE fetched.
func (qp *QP) pollSend(w *SendWork) (bool, error) {
	h := qp.w.e.verb.Load()
	if h == nil {
		ok, err := qp.cfg.SQ.PollSend(w)
		qp.req.sqTaken = qp.req.sqTaken || ok
		return ok, err
	}
	if _, hit := h.f.VerbFault(VerbQPErr, qp.qpn, 0); hit {
		qp.enterError(evFatal)
		return false, nil
	}
	ok, err := qp.cfg.SQ.PollSend(w)
	qp.req.sqTaken = qp.req.sqTaken || ok
	if ok && err == nil {
		if _, hit := h.f.VerbFault(VerbBadWQE, qp.qpn, 0); hit {
			return true, ErrInjectedBadWQE
		}
	}
	return ok, err
}

// pollRecv is the RC responder's take of a receive WQE, through the verb
// faults when some are installed: rnr answers as if none were posted
// (the RQE stays posted for the retry).
func (qp *QP) pollRecv(r *RecvWork) (bool, error) {
	if h := qp.w.e.verb.Load(); h != nil {
		if _, hit := h.f.VerbFault(VerbRNR, qp.qpn, 0); hit {
			return false, nil
		}
	}
	return qp.recvSource().PollRecv(r)
}

// verbRequestErr is asked for every request an RC QP in RTR, RTS or SQD
// receives: a qp_err fault moves the QP to ERR and the request is
// dropped (true), as a QP in ERR drops what it receives.
func (qp *QP) verbRequestErr() bool {
	h := qp.w.e.verb.Load()
	if h == nil {
		return false
	}
	if _, hit := h.f.VerbFault(VerbQPErr, qp.qpn, 0); !hit {
		return false
	}
	qp.Counters.Rare().Dropped.Add(1)
	qp.enterError(evFatal)
	return true
}
