package device

import (
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// DataPlane is the seam between the control plane (this package: the
// resources, their lifecycles, the QP state machine, the control server)
// and the data plane (package device/dataplane: the transport engine over
// the clients' rings, doorbell records, CQs and memory). It is declared
// here, where it is used, and is all the device knows of the data plane;
// the data plane reaches the device's objects only through their exported
// accessors (QP, CQ, SRQ).
//
// The device tells the data plane about every QP it creates, every
// MODIFY_QP it accepts and every QP it destroys, in that order, and about
// every CQ and SRQ it destroys (after the last QP using it), all under the
// device lock. No call waits for an engine worker: CreateQP, ModifyQP and
// DestroyQP queue the operation for the QP's worker and return. The
// worker applies its queue in order, and takes it before it handles the
// frames of a receive batch and before it services its QPs, so an
// operation is in effect for everything that happens after the command's
// reply: a frame the peer sends once the client told it of its RTR, WQEs
// the client posts after its RTS. A destroyed QP's memory stays pinned
// until the worker has removed it (DestroyQP's channel); a worker that is
// stuck (a bug: it never blocks on anything a client controls) delays
// that memory's release and nothing else.
//
// The only waits under the lock: CheckModifyQP may resolve the peer's link
// address (TAP: an ARP or ND exchange, bounded by the data plane's
// ResolveTimeout); DestroyQP of a context's last QP waits for the doorbell
// poller to finish its pass (it never blocks: it reads kick eventfds with
// RWF_NOWAIT); the dma space's grace periods (unmapping memory) wait for
// the workers' copy sections, each one WQE or packet long.
// Counters, ReleaseCQ and ReleaseSRQ wait for nothing.
//
// Nothing flows back through a call: the transport moves a QP to ERR on
// its own (an error completion, a broken ring, an overflowed CQ, a change
// it could not apply) by storing the new state into the QP's StateWord,
// one atomic store on the engine's worker, which QUERY_QP and the
// transition rules read.
type DataPlane interface {
	// CreateQP is called once the QP exists in RESET. An error fails
	// CREATE_QP (the QP is discarded).
	CreateQP(q *QP) error
	// CheckModifyQP may refuse a validated MODIFY_QP before it is applied,
	// e.g. because the peer of an RC QP going to RTR cannot be reached
	// (an error wrapping EHOSTUNREACH). a and mask are the request; q
	// still has its old attributes.
	CheckModifyQP(q *QP, cur, next QPState, mask AttrMask, a *abi.QPAttr) error
	// ModifyQP is called after a MODIFY_QP was applied to q (attributes,
	// path and state); prev is the state before. The data plane starts or
	// stops processing, flushes on ERR, resets on RESET. A change the
	// transport cannot apply moves the QP to ERR (StateWord), as a
	// transport error does.
	ModifyQP(q *QP, prev QPState, mask AttrMask)
	// DestroyQP is called before the QP's rings are unpinned. It returns
	// nil when the data plane never touched the QP's memory, or a channel
	// that delivers the QP's final counters (for the device's totals) once
	// the data plane no longer touches it: until then the device keeps what
	// the QP's worker may touch in its context (rings of QPs, CQs and
	// SRQs, doorbell records, the doorbell page).
	DestroyQP(q *QP) <-chan QPCounters
	// Counters returns the QP's live counters (QUERY_QP, vrnicctl).
	Counters(q *QP) QPCounters
	// AddAH is called when CREATE_AH validated an address handle, before
	// the client learns its handle: the data plane makes it resolvable by
	// the UD QPs of the AH's context. It may resolve the destination's link
	// address (TAP: ARP or neighbour discovery, bounded by the data
	// plane's ResolveTimeout, like CheckModifyQP); an error fails
	// CREATE_AH (an unreachable destination: an error wrapping
	// EHOSTUNREACH).
	AddAH(a *AH) error
	// RemoveAH is called when an AH is destroyed (DESTROY_AH, context
	// release): WQEs posted later that name it fail.
	RemoveAH(a *AH)
	// ReleaseCQ and ReleaseSRQ are called when a CQ or an SRQ is destroyed
	// (no QP uses it any more), before its ring is unpinned and its
	// doorbell record freed: the data plane drops what it built over it.
	ReleaseCQ(c *CQ)
	ReleaseSRQ(s *SRQ)
	// ResizeCQ (RESIZE_CQ, ABI 1.4) moves the CQ's producer to ring, of
	// count entries, pinned by the device: with no completion written
	// meanwhile, it reads the client's consumer index once, carries the
	// CQEs not yet consumed over at the same indices and writes every
	// other slot as not ready (queues.CQ.Resize). It fails (EINVAL class)
	// when they do not fit or the index is out of range, leaving the CQ
	// as it was, and returns how many were carried over. After it
	// returns the old ring is never written again.
	ResizeCQ(c *CQ, ring []byte, count uint32) (uint32, error)
	// WireCounters returns the engine's frame counters (vrnicctl info).
	WireCounters() WireCounters
	// LastLinkError returns the newest failed link call ("send: TEXT"
	// or "receive: TEXT") and when it failed; "" for none.
	LastLinkError() (string, time.Time)
	// RejectedWQEs returns the work requests the data plane rejected
	// (malformed WQEs, broken rings) by cause; nil for none.
	RejectedWQEs() map[string]uint64
	// Doorbells returns the doorbell poller's counters.
	Doorbells() admin.DoorbellCounters
}

// noDataPlane is the data plane of a device that moves no data
// (Config.DataPlane nil: tests of the control plane, devicetest): QPs go
// through every state and clients may post work, but nothing is sent and
// no completion is produced.
type noDataPlane struct{}

func (noDataPlane) CreateQP(*QP) error                                               { return nil }
func (noDataPlane) CheckModifyQP(*QP, QPState, QPState, AttrMask, *abi.QPAttr) error { return nil }
func (noDataPlane) ModifyQP(*QP, QPState, AttrMask)                                  {}
func (noDataPlane) DestroyQP(*QP) <-chan QPCounters                                  { return nil }
func (noDataPlane) Counters(*QP) QPCounters                                          { return QPCounters{} }
func (noDataPlane) AddAH(*AH) error                                                  { return nil }
func (noDataPlane) RemoveAH(*AH)                                                     {}
func (noDataPlane) ReleaseCQ(*CQ)                                                    {}
func (noDataPlane) ReleaseSRQ(*SRQ)                                                  {}
func (noDataPlane) ResizeCQ(*CQ, []byte, uint32) (uint32, error)                     { return 0, nil }
func (noDataPlane) WireCounters() WireCounters                                       { return WireCounters{} }
func (noDataPlane) LastLinkError() (string, time.Time)                               { return "", time.Time{} }
func (noDataPlane) RejectedWQEs() map[string]uint64                                  { return nil }
func (noDataPlane) Doorbells() admin.DoorbellCounters                                { return admin.DoorbellCounters{} }

var _ DataPlane = noDataPlane{}

// StateWord is a QP's state, read and written across goroutines: it is
// the one copy of the state that QUERY_QP, the operator listings and the
// transition rules read. Who writes it:
//
//	control path (MODIFY_QP, under Device.mu)      engine worker owning the QP
//	  CompareAndSwap(cur, next): a transition        TransportState(ERR),
//	  validated against cur takes effect only if     TransportError(ev): the
//	  the transport did not move the QP meanwhile    transport moved the QP to ERR
//	                                                 on its own (error completion,
//	                                                 broken ring, CQ overflow)
//
//	  RESET ──► INIT ──► RTR ──► RTS ◄──► SQD          any state ──► ERR
//	    ▲                                  (UD: RTS ◄──► SQE)
//	    └──────────── any state (MODIFY_QP) ◄────────── ERR
//
// The worker only ever stores ERR, at the moment its own copy of the
// state becomes ERR, or SQE (a UD or UC QP whose send WR failed, only
// from RTS or SQD: a compare-and-swap, so a state the control path
// stored meanwhile stays), and the engine applies every MODIFY_QP on that same
// worker: a RESET the control path applied after an error is never undone
// by a late report of it.
type StateWord struct {
	v atomic.Uint32
	q *QP // whose word it is (events); set before the data plane sees it
}

// Load returns the state.
func (w *StateWord) Load() QPState { return QPState(w.v.Load()) }

// CompareAndSwap moves the state from cur to next if it is still cur.
func (w *StateWord) CompareAndSwap(cur, next QPState) bool {
	return w.v.CompareAndSwap(uint32(cur), uint32(next))
}

// TransportState stores the state the transport moved the QP to (the
// engine's StateObserver; called on the QP's worker, never blocks): ERR
// after an error a completion reports, which raises no affiliated
// asynchronous error (QP_LAST_WQE_REACHED only, with an SRQ: events.go),
// or SQE.
func (w *StateWord) TransportState(s abi.QPState) {
	if s == StateSQE {
		_ = w.v.CompareAndSwap(uint32(StateRTS), uint32(s)) || w.v.CompareAndSwap(uint32(StateSQD), uint32(s))
		return
	}
	old := w.v.Swap(uint32(s))
	if s == StateErr && QPState(old) != StateErr && w.q != nil {
		w.q.qpEnteredError(0, false)
	}
}

// TransportError stores ERR, which the transport moved the QP to on an
// error no completion reports (the engine's StateObserver; on the QP's
// worker, never blocks), and raises ev, the affiliated asynchronous error
// that tells the client (QP_FATAL, QP_REQ_ERR or QP_ACCESS_ERR), then
// QP_LAST_WQE_REACHED with an SRQ. A QP in ERR already raises nothing: a
// MODIFY_QP to ERR stored ERR before the engine applied it, so a client's
// own move raises no event.
func (w *StateWord) TransportError(ev abi.EventType) {
	old := w.v.Swap(uint32(StateErr))
	if QPState(old) != StateErr && w.q != nil {
		w.q.qpEnteredError(ev, true)
	}
}

func (w *StateWord) store(s QPState) { w.v.Store(uint32(s)) }
