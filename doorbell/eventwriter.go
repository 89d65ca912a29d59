package doorbell

import (
	"sync"
	"sync/atomic"
	"time"
)

// EventWriter writes the completion eventfds of one client's CQs (the
// CQNotifiers given it) on a goroutine of its own. An engine worker that
// completes work for an armed CQ only decides that a signal is owed
// (CQNotifier.Completed) and hands the CQ over; it never writes a
// client's eventfd itself. It is the Signaller where the kernel cannot
// signal eventfds for the daemon (KernelSignaller, preferred: no
// hand-over).
//
// Why: the completion eventfd is the client's. The daemon's descriptor is
// a duplicate of the client's and shares its open file description, so
// the client can clear O_NONBLOCK on it at any time (F_SETFL acts on the
// description); the daemon cannot get a description of its own (an
// eventfd is an anonymous inode: opening /proc/self/fd/N fails with
// ENXIO), and write(2) to an eventfd has no per-call non-blocking flag
// (pwritev2 with RWF_NOWAIT fails with EOPNOTSUPP: eventfd implements
// write, not write_iter). A client that clears O_NONBLOCK and saturates
// its counter (writes 0xfffffffffffffffe) makes the next write block
// until somebody reads the counter. On an engine worker that stopped
// every QP of the worker, and the control path waiting for that worker
// under the device lock, and so the whole daemon (kernel-notes/eventfd.md).
//
// One EventWriter serves one client (context), so such a write blocks only
// that client's events: they are added up and written when the write
// returns. Close of the notifier (CQ destroyed, client gone) never waits
// for it: it drains the counter with a read that cannot block
// (EventFD.Drain), which completes the write, from a goroutine of its own,
// and closes the descriptor after it.
//
// Cost on the hot path: Completed adds one atomic add, and for a CQ not
// already queued a compare-and-swap, a push onto a lock-free list and a
// non-blocking send on a one-slot channel; no system call and no
// allocation on the worker. The write(2) moves to the writer's goroutine;
// the hand-over is a goroutine wake-up, which costs the runtime a futex
// wake when it has an idle P (measured in BENCHMARKS.md).
type EventWriter struct {
	head    atomic.Pointer[CQNotifier] // CQs owing a signal (a stack; Run takes it whole)
	wake    chan struct{}              // one slot: the list may be non-empty
	stop    chan struct{}
	once    sync.Once
	stopped atomic.Bool
	wg      sync.WaitGroup // a running unstick

	writes  atomic.Uint64
	errors  atomic.Uint64
	unstuck atomic.Uint64
}

// EventWriterStats counts what an EventWriter did.
type EventWriterStats struct {
	Writes  uint64 // write(2) calls that signalled an eventfd
	Errors  uint64 // write(2) calls that failed (other than EAGAIN)
	Unstuck uint64 // closes that found the writer blocked in write(2) and drained the counter
}

// NewEventWriter returns a writer; Run runs it.
func NewEventWriter() *EventWriter {
	return &EventWriter{wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// Run writes the signals owed until Close, then waits for an unstick in
// progress (see CQNotifier.Close) and returns. Run it on a goroutine of
// its own: it may block in write(2) for as long as its client keeps the
// eventfd saturated with O_NONBLOCK cleared; after Close it returns once
// every notifier it was writing to is closed.
func (w *EventWriter) Run() {
	for {
		select {
		case <-w.wake:
			w.flush()
		case <-w.stop:
			w.wg.Wait()
			return
		}
	}
}

// signal implements Signaller: n owes one more signal; it goes on the
// list unless it is there already.
func (w *EventWriter) signal(n *CQNotifier) {
	n.owed.Add(1)
	if n.queued.CompareAndSwap(false, true) {
		w.enqueue(n)
	}
}

// enqueue puts n, whose queued flag the caller set, on the list and wakes
// the writer. Called by Completed (any engine worker).
func (w *EventWriter) enqueue(n *CQNotifier) {
	for {
		old := w.head.Load()
		n.next = old
		if w.head.CompareAndSwap(old, n) {
			break
		}
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// flush writes what every queued notifier owes. A notifier is taken off
// the list (queued cleared) before its owed count is read: a Completed
// after that queues it again, and nothing owed is left behind.
func (w *EventWriter) flush() {
	for n := w.head.Swap(nil); n != nil && !w.stopped.Load(); {
		next := n.next
		n.next = nil
		n.queued.Store(false)
		n.write()
		n = next
	}
}

// unstick drains n's eventfd until the writer's blocked write(2) on it
// returns, then closes the descriptor. n is closed (no new write starts).
// Called with n.mu held, while n.writing: Run is inside that write, so
// the wg.Add here comes before Run's wg.Wait.
func (w *EventWriter) unstick(n *CQNotifier) {
	w.unstuck.Add(1)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for delay := 50 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
			n.mu.Lock()
			writing := n.writing
			n.mu.Unlock()
			if !writing {
				n.comp.Close()
				return
			}
			// Lowering the counter lets the write in: a read that cannot
			// block (RWF_NOWAIT), whatever the client did to the flags.
			// A client that saturates the counter again before the writer
			// runs only keeps this loop (and its own writer) going.
			n.comp.Drain()
			time.Sleep(delay)
		}
	}()
}

// Close stops the writer: signals still owed are dropped. It does not
// wait for Run to return.
func (w *EventWriter) Close() {
	w.once.Do(func() {
		w.stopped.Store(true)
		close(w.stop)
	})
}

// Stats returns the writer's counters.
func (w *EventWriter) Stats() EventWriterStats {
	return EventWriterStats{Writes: w.writes.Load(), Errors: w.errors.Load(), Unstuck: w.unstuck.Load()}
}
