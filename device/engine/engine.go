package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Sentinel errors of the control operations.
var (
	ErrInvalid = errors.New("engine: invalid argument")
	ErrExists  = errors.New("engine: QP number in use")
	ErrNoQP    = errors.New("engine: no such QP")
	ErrClosed  = errors.New("engine: closed")
	// ErrTimeout: the QP's worker did not take the operation within
	// Config.CallTimeout. It wraps ETIMEDOUT (the errno the control path
	// reports). What it means for the operation is said per method.
	ErrTimeout = fmt.Errorf("engine: the QP's worker did not answer in time: %w", unix.ETIMEDOUT)
)

// Config configures an Engine.
type Config struct {
	// Links: one per worker (worker i reads and writes Links[i]); the
	// number of workers is len(Links).
	Links []Link
	// Mode is the framing of the links: roce.ModeEthernet, whole Ethernet
	// frames (the TAP link, the in-memory link), or roce.ModeUDP, UDP
	// payloads with the peer's address and port beside each (the UDP
	// link, the in-memory link in ModeUDP).
	Mode roce.Mode
	// Local is the links' address and port in ModeUDP (required there,
	// ignored in ModeEthernet; port 0 means 4791): the source of every
	// datagram sent and the destination of every one received, so the
	// source address and port of the pseudo header the ICRC of every sent
	// packet covers, and the destination of every received one's.
	// Datagrams go to the QP's destination GID, port 4791.
	Local netip.AddrPort
	// MAC is the device's MAC address, the source of Ethernet frames
	// (ModeEthernet). The destination MAC is PathFixup's to write.
	MAC [6]byte
	// FrameCap is the size of every frame buffer; it must equal the
	// link's. Default DefaultFrameCap.
	FrameCap int
	// Batch is the number of frames per receive or send batch. Default 32:
	// 64 gave no gain and, with the link pools, a working set of frame
	// buffers beyond the L2 cache (BENCHMARKS.md, engine section).
	Batch int
	// Window is the most PSNs a QP has unacknowledged. Default 512.
	Window int
	// Logger gets lifecycle messages only. Default slog.Default().
	Logger *slog.Logger
	// PathFixup, when set, adjusts every QP's path after the engine built
	// it from the QP attributes (when the address vector is set): the TAP
	// link writes the MAC addresses (its own and the peer's, from its
	// neighbour cache) here.
	PathFixup func(*roce.Path)
	// CallTimeout bounds how long a control operation (CreateQP,
	// ModifyQP, DestroyQP, Counters) waits for the QP's worker to take
	// it. Default DefaultCallTimeout. A worker takes control operations
	// between batches and never blocks on anything a client controls, so
	// the bound is only reached by a worker that is stuck (a bug) or
	// starved of CPU for that long. Once a call to a worker timed out,
	// later calls to it do not wait at all until it has taken its queue
	// again: a context teardown of many QPs on a stuck worker costs one
	// timeout, not one per QP.
	CallTimeout time.Duration
}

// DefaultCallTimeout is the default Config.CallTimeout.
const DefaultCallTimeout = 3 * time.Second

// DefaultFrameCap fits a 4096-byte payload with any headers.
const DefaultFrameCap = 4096 + roce.MaxHeadroom + roce.MaxTailroom

// Engine is the RC transport of one device: N workers, each owning the QPs
// roce.SteerQueue assigns to it.
type Engine struct {
	cfg     Config
	clk     clock
	workers []*worker
	stop    chan struct{}
	exited  chan struct{} // closed by Close once no worker runs
	wg      sync.WaitGroup
	mu      sync.Mutex // guards closed
	closed  bool
	log     *slog.Logger
}

// New creates an engine; Start runs it.
func New(cfg Config) (*Engine, error) {
	if len(cfg.Links) == 0 {
		return nil, fmt.Errorf("%w: at least one link (worker) is required", ErrInvalid)
	}
	switch cfg.Mode {
	case roce.ModeEthernet:
	case roce.ModeUDP:
		a := cfg.Local.Addr()
		if !a.IsValid() || a.IsUnspecified() {
			return nil, fmt.Errorf("%w: ModeUDP needs the links' local address, not %v", ErrInvalid, cfg.Local)
		}
		if cfg.Local.Port() == 0 {
			cfg.Local = netip.AddrPortFrom(a, roce.UDPPort)
		}
	default:
		return nil, fmt.Errorf("%w: link mode %v", ErrInvalid, cfg.Mode)
	}
	if cfg.FrameCap == 0 {
		cfg.FrameCap = DefaultFrameCap
	}
	if cfg.FrameCap < 256+roce.MaxHeadroom+roce.MaxTailroom {
		return nil, fmt.Errorf("%w: frame capacity %d too small", ErrInvalid, cfg.FrameCap)
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 32
	}
	if cfg.Window <= 0 {
		cfg.Window = 512
	}
	if cfg.Window >= 1<<22 {
		return nil, fmt.Errorf("%w: window %d", ErrInvalid, cfg.Window)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	e := &Engine{cfg: cfg, clk: newClock(), stop: make(chan struct{}), exited: make(chan struct{}), log: cfg.Logger}
	for i, l := range cfg.Links {
		if l == nil {
			return nil, fmt.Errorf("%w: link %d is nil", ErrInvalid, i)
		}
		e.workers = append(e.workers, newWorker(e, i, l))
	}
	return e, nil
}

// Start starts the workers.
func (e *Engine) Start() {
	for _, w := range e.workers {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			w.run(e.stop)
		}()
	}
	e.log.Info("engine started", "workers", len(e.workers))
}

// Close stops the workers and waits for them. QPs are abandoned without
// completions (as a device reset); removals still queued count as done
// (their DestroyQP channels are closed: no worker runs any more).
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	e.closed = true
	e.mu.Unlock()
	close(e.stop)
	e.wg.Wait()
	for _, w := range e.workers {
		w.ctlMu.Lock()
		for _, m := range w.ctlQ {
			if m.applied != nil {
				close(m.applied)
			}
		}
		w.ctlQ = nil
		w.ctlMu.Unlock()
	}
	close(e.exited)
	e.log.Info("engine stopped")
	return nil
}

// Workers returns the number of workers.
func (e *Engine) Workers() int { return len(e.workers) }

func (e *Engine) owner(qpn uint32) *worker {
	return e.workers[roce.SteerQueue(qpn&roce.QPNMask, len(e.workers))]
}

// post queues m for worker w; false if the engine is closed. The queue
// is unbounded, so posting never waits for the worker.
func (e *Engine) post(w *worker, m *ctlMsg) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	w.ctlMu.Lock()
	w.ctlQ = append(w.ctlQ, m)
	w.ctlN.Store(int32(len(w.ctlQ)))
	w.ctlMu.Unlock()
	select {
	case w.ctlWake <- struct{}{}:
	default:
	}
	return true
}

// call hands m to worker w and waits for its reply, at most
// Config.CallTimeout (no wait at all while w is known to be behind, see
// Config.CallTimeout). On timeout a message the worker has not taken yet
// is abandoned (the worker skips it: the operation did not happen) and
// call returns ErrTimeout; a message it has taken is being applied, and
// call waits for its reply (applying never blocks). A message with an
// applied channel (DestroyQP) is never abandoned: it stays queued and the
// channel tells when it was applied.
func (e *Engine) call(w *worker, m *ctlMsg) (ctlReply, error) {
	m.reply = make(chan ctlReply, 1)
	if !e.post(w, m) {
		return ctlReply{}, ErrClosed
	}
	var timeout <-chan time.Time
	if !w.behind.Load() {
		t := time.NewTimer(e.cfg.CallTimeout)
		defer t.Stop()
		timeout = t.C
	} else {
		closed := make(chan time.Time)
		close(closed)
		timeout = closed
	}
	select {
	case r := <-m.reply:
		return r, r.err
	case <-e.stop:
		return ctlReply{}, ErrClosed
	case <-timeout:
	}
	select { // it may have answered just now
	case r := <-m.reply:
		return r, r.err
	default:
	}
	w.behind.Store(true)
	if m.applied != nil || m.state.CompareAndSwap(msgQueued, msgAbandoned) {
		return ctlReply{}, ErrTimeout
	}
	select { // taken: being applied now
	case r := <-m.reply:
		return r, r.err
	case <-e.stop:
		return ctlReply{}, ErrClosed
	}
}

// CreateQP creates a QP (state RESET) on its owning worker and returns
// its live counters (atomics, safe to read from any goroutine while the
// QP exists). ErrTimeout: the QP was not created (and will not be).
func (e *Engine) CreateQP(cfg QPConfig) (*QPCounters, error) {
	r, err := e.call(e.owner(cfg.QPN), &ctlMsg{op: ctlCreate, cfg: cfg})
	if err != nil {
		return nil, err
	}
	return &r.qp.Counters, nil
}

// ModifyQP applies attributes (applied between the owner's batches).
// ErrTimeout: the change was not applied (and will not be).
func (e *Engine) ModifyQP(qpn uint32, a QPAttr) error {
	_, err := e.call(e.owner(qpn), &ctlMsg{op: ctlModify, qpn: qpn & roce.QPNMask, attr: a})
	return err
}

// QueueError moves a QP to ERR (flushing its work requests) whenever its
// worker next takes control messages, after every operation queued
// before; it does not wait. For a caller that gave up on a ModifyQP
// (ErrTimeout) and must not leave the QP running in its old state.
func (e *Engine) QueueError(qpn uint32) {
	e.post(e.owner(qpn), &ctlMsg{op: ctlModify, qpn: qpn & roce.QPNMask, must: true,
		attr: QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr}})
}

// DestroyQP removes a QP; nothing more is completed for it, and its
// worker no longer touches its sources, sinks or memory once the removal
// is applied. applied is closed then. With a nil error, applied is
// already closed. With ErrTimeout the removal stays queued (it is never
// abandoned) and applied is closed when the worker gets to it, or when the
// engine closes: keep everything the QP's worker may touch until then.
func (e *Engine) DestroyQP(qpn uint32) (applied <-chan struct{}, err error) {
	done := make(chan struct{})
	_, err = e.call(e.owner(qpn), &ctlMsg{op: ctlDestroy, qpn: qpn & roce.QPNMask, applied: done})
	if errors.Is(err, ErrClosed) {
		return e.exited, err // no worker runs once Close has waited for them
	}
	return done, err
}

// Counters returns the live counters of a QP (atomics, safe to read from
// any goroutine while the QP exists).
func (e *Engine) Counters(qpn uint32) (*QPCounters, error) {
	r, err := e.call(e.owner(qpn), &ctlMsg{op: ctlQuery, qpn: qpn & roce.QPNMask})
	if err != nil {
		return nil, err
	}
	return &r.qp.Counters, nil
}

// WorkerCounters returns worker i's counters.
func (e *Engine) WorkerCounters(i int) *WorkerCounters { return &e.workers[i].Counters }

// Kick tells the owner of qpn that WQEs were posted (the doorbell): it
// wakes the worker if it sleeps. It never blocks and never allocates.
func (e *Engine) Kick(qpn uint32) {
	w := e.owner(qpn)
	select {
	case w.kick <- struct{}{}:
	default:
	}
}
