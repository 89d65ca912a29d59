package doorbell

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Signaller raises the completion eventfds of CQNotifiers without ever
// blocking on them: a KernelSignaller (from the caller's thread, through
// the kernel) or an EventWriter (on a goroutine per client). The methods
// are the package's own.
type Signaller interface {
	// signal raises n's completion eventfd (n.comp is set). Called by
	// CompletedAt, serialised per notifier; must not block on anything
	// the client controls.
	signal(n *CQNotifier)
}

// KernelSignaller raises completion eventfds with the kernel's own
// eventfd_signal, which never blocks, instead of write(2), which blocks
// on a saturated counter when the client cleared O_NONBLOCK on the open
// file description it shares with the daemon.
//
// The kernel signals an eventfd for a process on a few occasions; the one
// used here is Linux AIO: an iocb with IOCB_FLAG_RESFD names an eventfd
// that aio_complete signals when the request completes. Each signal is one
// io_submit(2) of an IOCB_CMD_POLL request for POLLIN on a daemon-private
// eventfd whose counter is 1 and never read: the poll is satisfied at
// once, so the request completes inside io_submit, which signals the
// client's eventfd (eventfd_signal: add 1 under the eventfd's spinlock,
// saturating, and wake its waiters) and returns. One system call per
// signal, as the write it replaces; no allocation; the daemon's thread
// never sleeps, whatever the client did to its descriptor's flags or
// counter. The completion lands in the AIO context's ring, which the
// daemon empties in place (it moves the ring's head to its tail, as
// libaio does) while it still holds the context.
//
// Several AIO contexts serve concurrent callers (engine workers): a
// caller takes the first free one (TryLock), so workers do not queue
// behind each other's system calls.
type KernelSignaller struct {
	ready int // private eventfd, counter 1: always readable
	ctxs  []aioContext
	next  atomic.Uint32

	signals atomic.Uint64
	errors  atomic.Uint64
}

// aioContext is one AIO context and the iocb its holder submits.
type aioContext struct {
	mu   sync.Mutex
	id   uintptr  // aio_context_t: the address of the ring the kernel mapped
	ring *aioRing // that ring's header
	cb   iocb
	cbs  [1]*iocb // io_submit's array of iocb pointers: &cb
	_    [64]byte // keep the contexts' locks off each other's cache lines
}

// ErrNoKernelSignal: the kernel cannot signal eventfds through AIO here
// (no AIO, IOCB_CMD_POLL or IOCB_FLAG_RESFD, or io_setup refused: e.g.
// fs.aio-max-nr reached, or a seccomp policy); use an EventWriter.
var ErrNoKernelSignal = errors.New("doorbell: eventfd signalling through AIO unavailable")

// aioRingEvents is the number of completions each context's ring holds
// (it is emptied after every submission: one is enough, a few are cheap).
const aioRingEvents = 8

// NewKernelSignaller sets up contexts AIO contexts (at least 1; one per
// engine worker lets every worker signal without waiting for another) and
// checks, on an eventfd of its own, that a signal arrives. An error wraps
// ErrNoKernelSignal.
func NewKernelSignaller(contexts int) (*KernelSignaller, error) {
	contexts = max(contexts, 1)
	ready, err := unix.Eventfd(1, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("%w: eventfd: %w", ErrNoKernelSignal, err)
	}
	k := &KernelSignaller{ready: ready, ctxs: make([]aioContext, contexts)}
	for i := range k.ctxs {
		c := &k.ctxs[i]
		if c.id, err = ioSetup(aioRingEvents); err != nil {
			k.Close()
			return nil, fmt.Errorf("%w: io_setup: %w", ErrNoKernelSignal, err)
		}
		c.ring = ringAt(c.id)
		if c.ring.magic != aioRingMagic || c.ring.headerLength != aioRingHeader {
			k.Close()
			return nil, fmt.Errorf("%w: unexpected AIO ring layout (magic %#x, header %d bytes)", ErrNoKernelSignal, c.ring.magic, c.ring.headerLength)
		}
		c.cb = iocb{opcode: iocbCmdPoll, fildes: uint32(ready), buf: unix.POLLIN, flags: iocbFlagResfd}
		c.cbs[0] = &c.cb
	}
	// Self-test: every context signals an eventfd of ours once.
	probe, err := NewEventFD()
	if err != nil {
		k.Close()
		return nil, err
	}
	defer probe.Close()
	for i := range k.ctxs {
		if err := k.ctxs[i].raise(probe.Fd()); err != nil {
			k.Close()
			return nil, fmt.Errorf("%w: io_submit: %w", ErrNoKernelSignal, err)
		}
	}
	if n, err := probe.Drain(); err != nil || n != uint64(len(k.ctxs)) {
		k.Close()
		return nil, fmt.Errorf("%w: a test signal did not arrive (count %d, %v)", ErrNoKernelSignal, n, err)
	}
	return k, nil
}

// raise submits the poll request with the eventfd fd to signal and
// empties the ring. The caller holds c.mu.
func (c *aioContext) raise(fd int) error {
	c.cb.resfd = uint32(fd)
	err := ioSubmit(c.id, &c.cbs[0])
	// The request completed inside io_submit (the polled eventfd is
	// always readable): consume its event, and anything else there.
	atomic.StoreUint32(&c.ring.head, atomic.LoadUint32(&c.ring.tail))
	return err
}

// signal implements Signaller: one io_submit on the first free context.
func (k *KernelSignaller) signal(n *CQNotifier) {
	if err := k.Raise(n.comp.Fd()); err != nil {
		k.errors.Add(1)
		return
	}
	k.signals.Add(1)
}

// Raise adds 1 to the counter of the eventfd fd (which must stay open
// during the call) through the kernel: it never blocks on the eventfd.
func (k *KernelSignaller) Raise(fd int) error {
	n := len(k.ctxs)
	start := int(k.next.Add(1) % uint32(n))
	for i := range n {
		c := &k.ctxs[(start+i)%n]
		if c.mu.TryLock() {
			err := c.raise(fd)
			c.mu.Unlock()
			return err
		}
	}
	c := &k.ctxs[start] // every context busy: wait for one (a system call's time)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raise(fd)
}

// KernelSignallerStats counts what a KernelSignaller did.
type KernelSignallerStats struct {
	Signals uint64 // eventfds signalled
	Errors  uint64 // io_submit failures (the signal was lost)
}

// Stats returns the counters.
func (k *KernelSignaller) Stats() KernelSignallerStats {
	return KernelSignallerStats{Signals: k.signals.Load(), Errors: k.errors.Load()}
}

// Close destroys the AIO contexts; no signal may be in progress.
func (k *KernelSignaller) Close() error {
	var errs []error
	for i := range k.ctxs {
		if c := &k.ctxs[i]; c.id != 0 {
			errs = append(errs, ioDestroy(c.id))
			c.id, c.ring = 0, nil
		}
	}
	if k.ready >= 0 {
		errs = append(errs, unix.Close(k.ready))
		k.ready = -1
	}
	return errors.Join(errs...)
}
