package device

import (
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
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
// device lock: a call is bounded in time and never calls back into Device.
//
// Which calls wait for an engine worker under the device lock, and their
// bounds: CreateQP, ModifyQP and DestroyQP hand the operation to the QP's
// worker and wait for it, at most the engine's CallTimeout (default 3 s;
// no wait at all while that worker is known to be behind, so a teardown of
// many QPs on a stuck worker costs one timeout). CheckModifyQP may resolve
// the peer's link address (bounded by the data plane's ResolveTimeout).
// DestroyQP of a context's last QP also waits for the doorbell poller to
// finish its pass (it never blocks: it reads kick eventfds with
// RWF_NOWAIT), and the dma space's grace periods (unmapping memory) wait
// for the workers' copy sections, each one WQE or packet long.
// The waits stay under the lock because a command's effects on the
// device's tables and on the engine must be seen in one order by every
// other command; they are bounded because a worker never blocks on
// anything a client controls (completion eventfds are written by a
// goroutine per context, package doorbell's EventWriter), so a worker
// takes control operations between two batches, microseconds apart.
// Counters, ReleaseCQ and ReleaseSRQ do not wait for a worker.
//
// Nothing flows back through a call: the transport moves a QP to ERR on
// its own (an error completion, a broken ring, an overflowed CQ) by
// storing the new state into the QP's StateWord, one atomic store on the
// engine's worker, which QUERY_QP and the transition rules read.
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
	// stops processing, flushes on ERR, resets on RESET. An error (one
	// wrapping ETIMEDOUT: the QP's worker did not take the change in
	// time) fails the command; the data plane has then moved the QP to
	// ERR (StateWord), as after a transport error.
	ModifyQP(q *QP, prev QPState, mask AttrMask) error
	// DestroyQP is called before the QP's rings are unpinned. It returns
	// the QP's final counters (for the device's totals) and nil when the
	// data plane no longer touches the QP's memory. If the QP's worker did
	// not take the removal in time, it returns a channel closed once the
	// worker did: until then the device keeps what the worker may touch
	// in the QP's context (rings of QPs, CQs and SRQs, doorbell records,
	// the doorbell page) and the counters may miss the last moments.
	DestroyQP(q *QP) (QPCounters, <-chan struct{})
	// Counters returns the QP's live counters (QUERY_QP, vrnicctl).
	Counters(q *QP) QPCounters
	// ReleaseCQ and ReleaseSRQ are called when a CQ or an SRQ is destroyed
	// (no QP uses it any more), before its ring is unpinned and its
	// doorbell record freed: the data plane drops what it built over it.
	ReleaseCQ(c *CQ)
	ReleaseSRQ(s *SRQ)
}

// noDataPlane is the data plane of a device that moves no data
// (Config.DataPlane nil: tests of the control plane, devicetest): QPs go
// through every state and clients may post work, but nothing is sent and
// no completion is produced.
type noDataPlane struct{}

func (noDataPlane) CreateQP(*QP) error                                               { return nil }
func (noDataPlane) CheckModifyQP(*QP, QPState, QPState, AttrMask, *abi.QPAttr) error { return nil }
func (noDataPlane) ModifyQP(*QP, QPState, AttrMask) error                            { return nil }
func (noDataPlane) DestroyQP(*QP) (QPCounters, <-chan struct{})                      { return QPCounters{}, nil }
func (noDataPlane) Counters(*QP) QPCounters                                          { return QPCounters{} }
func (noDataPlane) ReleaseCQ(*CQ)                                                    {}
func (noDataPlane) ReleaseSRQ(*SRQ)                                                  {}

var _ DataPlane = noDataPlane{}

// StateWord is a QP's state, read and written across goroutines: it is
// the one copy of the state that QUERY_QP, the operator listings and the
// transition rules read. Who writes it:
//
//	control path (MODIFY_QP, under Device.mu)      engine worker owning the QP
//	  CompareAndSwap(cur, next): a transition        TransportState(ERR): the
//	  validated against cur takes effect only if     transport moved the QP to ERR
//	  the transport did not move the QP meanwhile    on its own (error completion,
//	                                                 broken ring, CQ overflow)
//
//	  RESET ──► INIT ──► RTR ──► RTS ◄──► SQD          any state ──► ERR
//	    ▲                                  (UD: RTS ◄──► SQE)
//	    └──────────── any state (MODIFY_QP) ◄────────── ERR
//
// The worker only ever stores ERR, at the moment its own copy of the
// state becomes ERR, and the engine applies every MODIFY_QP on that same
// worker: a RESET the control path applied after an error is never undone
// by a late report of it.
type StateWord struct{ v atomic.Uint32 }

// Load returns the state.
func (w *StateWord) Load() QPState { return QPState(w.v.Load()) }

// CompareAndSwap moves the state from cur to next if it is still cur.
func (w *StateWord) CompareAndSwap(cur, next QPState) bool {
	return w.v.CompareAndSwap(uint32(cur), uint32(next))
}

// TransportState stores the state the transport moved the QP to (the
// engine's StateObserver; called on the QP's worker, never blocks).
func (w *StateWord) TransportState(s abi.QPState) { w.v.Store(uint32(s)) }

func (w *StateWord) store(s QPState) { w.v.Store(uint32(s)) }
