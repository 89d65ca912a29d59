package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/cc"
	"github.com/vrnic/vrnic/roce"
)

// Sentinel errors of the control operations.
var (
	ErrInvalid = errors.New("engine: invalid argument")
	ErrExists  = errors.New("engine: QP number in use")
	ErrNoQP    = errors.New("engine: no such QP")
	ErrClosed  = errors.New("engine: closed")
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
	// over the in-memory link 64 gave no gain and, with the link pools, a
	// working set of frame buffers beyond the L2 cache (BENCHMARKS.md,
	// engine section); BenchmarkWrite8B, which waits for each 64 WRITEs'
	// completion, lost 25-50 % with 64 (the receiver no longer starts on
	// the first half while the second is built). Between two daemons
	// over the UDP link 64 moved more (vrnicd sets it there).
	Batch int
	// Window is the most PSNs a QP has unacknowledged. Default 512.
	Window int
	// Logger gets lifecycle messages only. Default slog.Default().
	Logger *slog.Logger
	// PathFixup, when set, adjusts every QP's path after the engine built
	// it from the QP attributes (when the address vector is set): the TAP
	// link writes the MAC addresses (its own and the peer's, from its
	// neighbour cache) here. It must leave Dst as it is: the QP keeps no
	// other copy of its destination address (it checks received frames
	// against it).
	PathFixup func(*roce.Path)
	// CC, when set, turns on RoCE v2 congestion control with these
	// parameters (validated by New): ECT(0) on the QPs' packets (the TAP
	// link; the UDP link marks at its sockets), a CNP for every
	// CE-marked packet (rate-limited per QP), DCQCN and pacing on the
	// CNPs received (cc.go). Nil: off; CNPs received are counted and
	// ignored.
	CC *cc.Params
}

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
	xrc     XRCTable      // the XRC SRQs target QPs resolve (xrc.go)
	wg      sync.WaitGroup
	mu      sync.Mutex // guards closed
	closed  bool
	log     *slog.Logger
	verb    atomic.Pointer[verbHooks] // verb-level faults; nil: none (verbfaults.go)
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
	if cfg.CC != nil {
		if err := cfg.CC.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
		}
		p := *cfg.CC // the engine's own copy: the QPs point into it
		cfg.CC = &p
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
		for _, m := range w.ctl.drop() {
			if m.applied != nil {
				close(m.applied)
			}
		}
	}
	close(e.exited)
	e.log.Info("engine stopped")
	return nil
}

// CC returns the congestion-control parameters, nil when off.
func (e *Engine) CC() *cc.Params { return e.cfg.CC }

// Workers returns the number of workers.
func (e *Engine) Workers() int { return len(e.workers) }

// Owner returns the index of the worker that owns qpn (roce.SteerQueue):
// the data plane keeps per-worker state for the QP's sources there.
func (e *Engine) Owner(qpn uint32) int { return e.owner(qpn).id }

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
	w.ctl.push(m)
	select {
	case w.ctlWake <- struct{}{}:
	default:
	}
	return true
}

// CreateQP builds a QP (state RESET) and queues it for its owning worker;
// it returns the QP's live counters (atomics, safe to read from any
// goroutine). It never waits for the worker: the QP exists for every
// control operation queued after it (the queue is in order) and for every
// frame and doorbell the worker reads after this returns (a worker takes
// its queue before it handles what it received and before it services its
// QPs). An error: the configuration is invalid (ErrInvalid) or the engine
// is closed; nothing was queued.
func (e *Engine) CreateQP(cfg QPConfig) (*QPCounters, error) {
	w := e.owner(cfg.QPN)
	qp, err := newQP(cfg, w)
	if err != nil {
		return nil, err
	}
	if !e.post(w, &ctlMsg{op: ctlCreate, qp: qp}) {
		return nil, ErrClosed
	}
	return &qp.Counters, nil
}

// ModifyQP queues attributes for the QP's worker, which applies them in
// order with the QP's other control operations and before it handles any
// frame or doorbell it reads after this returns; it never waits. What can
// be checked without the QP's state is checked here (ErrInvalid: nothing
// queued); a change the worker then cannot apply (a move out of ERR other
// than to RESET, which the device's state rules never ask for) moves the
// QP to ERR, as a transport error does.
func (e *Engine) ModifyQP(qpn uint32, a QPAttr) error {
	if err := a.check(); err != nil {
		return err
	}
	if !e.post(e.owner(qpn), &ctlMsg{op: ctlModify, qpn: qpn & roce.QPNMask, attr: a}) {
		return ErrClosed
	}
	return nil
}

// DestroyQP queues the removal of a QP and returns at once; applied is
// closed once the worker removed it (or the engine closed): from then on
// nothing more is completed for the QP and the worker no longer touches
// its sources, sinks or memory, so keep everything it may touch until
// then. Its counters are final then too.
func (e *Engine) DestroyQP(qpn uint32) (applied <-chan struct{}) {
	done := make(chan struct{})
	if !e.post(e.owner(qpn), &ctlMsg{op: ctlDestroy, qpn: qpn & roce.QPNMask, applied: done}) {
		return e.exited // no worker runs once Close has waited for them
	}
	return done
}

// Counters returns the live counters of a QP (atomics, safe to read from
// any goroutine while the QP exists).
// It asks the QP's worker and waits for its answer: for tests and tools,
// not for the control path (which keeps the pointer CreateQP returned).
func (e *Engine) Counters(qpn uint32) (*QPCounters, error) {
	qp, err := e.query(qpn)
	if err != nil {
		return nil, err
	}
	return &qp.Counters, nil
}

// query asks the QP's worker for the QP and waits for its answer.
func (e *Engine) query(qpn uint32) (*QP, error) {
	m := &ctlMsg{op: ctlQuery, qpn: qpn & roce.QPNMask, reply: make(chan ctlReply, 1)}
	if !e.post(e.owner(qpn), m) {
		return nil, ErrClosed
	}
	select {
	case r := <-m.reply:
		return r.qp, r.err
	case <-e.stop:
		return nil, ErrClosed
	}
}

// WorkerCounters returns worker i's counters.
func (e *Engine) WorkerCounters(i int) *WorkerCounters { return &e.workers[i].Counters }

// Kick tells the owner of qpn that WQEs were posted on it (the
// doorbell): the worker puts the QP on its active list at the top of its
// next pass and services it (active.go), and wakes if it sleeps. It
// never blocks, and allocates only while the worker's queue grows.
func (e *Engine) Kick(qpn uint32) {
	w := e.owner(qpn)
	w.kicks.push(qpn & roce.QPNMask)
	select {
	case w.kick <- struct{}{}:
	default:
	}
}
