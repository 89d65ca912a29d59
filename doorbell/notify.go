package doorbell

import (
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// CQNotifier implements CQ arming (vrnic_abi.h, struct vrnic_db_cq): the
// client writes the arm word (bit 0 armed, bit 1 solicited only, bits 8..31
// a sequence one greater than its last); after writing a CQE the daemon
// calls Completed, which decides whether the completion eventfd is owed a
// signal: once per arm sequence, for the first matching CQE the client has
// not consumed yet. The signal is raised by the notifier's Signaller,
// which never blocks on the client's eventfd: a KernelSignaller (the
// kernel signals it, from the caller's thread, one system call) or the
// client's EventWriter (a write(2) on a goroutine of the client's own);
// never by a write(2) on the caller (an engine worker): see
// KernelSignaller and EventWriter for why.
//
// Ordering: the daemon stores the CQE's owner word, then loads the arm
// word, then the client's consumer index (cq_ci). A client consumes CQEs
// (stores cq_ci), then stores the arm word, then polls the CQ once more
// before sleeping. All of these are sequentially consistent, so:
//
//   - either the daemon sees the arm, or the client's last poll sees the
//     CQE: no completion event is lost;
//   - if the daemon sees an arm written after the client consumed this
//     CQE, it also sees that cq_ci and does not spend the arm on it. (A CQE
//     the client already consumed must not use up the arm meant for the
//     next one, or the client would sleep past that one.)
//
// Through an EventWriter, the signal follows the decision as one atomic
// add and, unless the CQ is already queued, a push onto the writer's list
// and a non-blocking channel send; the writer adds every signal owed since
// its last write with one write(2), so a client that re-arms faster than
// the writer runs reads the same total as if each had been written at
// once.
//
// The last notified sequence is kept in private memory; arm_sn_done is only
// written for the client's information. A hostile client can only suppress
// or multiply its own events.
type CQNotifier struct {
	arm       *atomic.Uint32
	ci        *atomic.Uint32 // client's cq_ci
	pi        *atomic.Uint32 // daemon's published cq_pi
	armSNDone *atomic.Uint32
	done      uint32 // last sequence notified (private to Completed's caller)
	notified  atomic.Uint64

	// Signalling (nil comp: no completion channel).
	comp   *EventFD
	sig    Signaller
	w      *EventWriter  // sig, when it is an EventWriter; else nil
	owed   atomic.Uint64 // EventWriter: signals decided and not written yet
	queued atomic.Bool   // on w's list (or about to be)
	next   *CQNotifier   // link in w's list while queued

	// EventWriter: between the writer's goroutine and Close (not the hot
	// path).
	mu      sync.Mutex
	writing bool // the writer is inside write(2) on comp
	closed  bool // Close was called: comp is closed, or unstick closes it
}

// NewCQNotifier returns the notifier of the CQ whose record is rec. comp
// is the client's completion eventfd and sig what raises it (a
// KernelSignaller, or the client's EventWriter); both nil if the CQ has
// no completion channel, both set otherwise. The notifier owns comp.
func NewCQNotifier(rec CQRecord, comp *EventFD, sig Signaller) *CQNotifier {
	if (comp == nil) != (sig == nil) {
		panic("doorbell: NewCQNotifier needs both a completion eventfd and a signaller, or neither")
	}
	n := &CQNotifier{arm: rec.Arm, ci: rec.CI, pi: rec.PI, armSNDone: rec.ArmSNDone, comp: comp, sig: sig}
	n.w, _ = sig.(*EventWriter)
	return n
}

// Completed is CompletedAt for the last published CQE (cq_pi - 1): call it
// after queues.CQ.Publish.
func (n *CQNotifier) Completed(solicited bool) bool {
	return n.CompletedAt(n.pi.Load()-1, solicited)
}

// CompletedAt is called after the CQE of free-running index was written.
// solicited is true for a CQE of a solicited event or with an error status
// (those also satisfy a solicited-only arm). It reports whether the CQ's
// completion eventfd was signalled (or, through an EventWriter, handed to
// the writer). It never blocks on anything the client controls and
// allocates nothing; it makes one system call (io_submit) when it signals
// through a KernelSignaller, none through an EventWriter. Calls for one
// CQ, and Close, must be serialised by the caller.
func (n *CQNotifier) CompletedAt(index uint32, solicited bool) bool {
	w := n.arm.Load()
	if w&abi.CQArmArmed == 0 {
		return false
	}
	sn := abi.ArmSN(w)
	if sn == n.done {
		return false
	}
	if w&abi.CQArmSolicited != 0 && !solicited {
		return false
	}
	if int32(index-n.ci.Load()) < 0 {
		return false // the client consumed this CQE before arming
	}
	n.done = sn
	n.armSNDone.Store(sn)
	n.notified.Add(1)
	if n.comp == nil {
		return false
	}
	n.sig.signal(n)
	return true
}

// Notified is the number of arm sequences consumed.
func (n *CQNotifier) Notified() uint64 { return n.notified.Load() }

// write is the writer's side: it writes what is owed, unless the
// notifier was closed. The write blocks only if the client cleared
// O_NONBLOCK on the eventfd and saturated its counter; then only this
// client's writer waits, until the client reads its counter or Close
// unsticks it.
func (n *CQNotifier) write() {
	v := n.owed.Swap(0)
	if v == 0 {
		return
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	n.writing = true
	n.mu.Unlock()
	err := n.comp.Add(v)
	n.mu.Lock()
	n.writing = false // a Close meanwhile left comp to unstick, which closes it now
	n.mu.Unlock()
	if err != nil {
		n.w.errors.Add(1)
	} else {
		n.w.writes.Add(1)
	}
}

// Close closes the completion eventfd. It never blocks: if an
// EventWriter is inside a write(2) on it (a client that cleared
// O_NONBLOCK and saturated the counter), Close leaves the descriptor to a
// goroutine that drains the counter (a read with RWF_NOWAIT, which cannot
// block), which lets the write complete, and closes the descriptor after
// it. No signal is raised after Close returns.
func (n *CQNotifier) Close() error {
	if n.comp == nil {
		return nil
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	if !n.writing {
		n.mu.Unlock()
		return n.comp.Close()
	}
	n.w.unstick(n)
	n.mu.Unlock()
	return nil
}
