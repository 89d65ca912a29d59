// Package dataplane is the data plane of a vrnic device: it runs the
// transport engine (package device/engine) over what clients share with
// the daemon. DataPlane implements device.DataPlane, the seam the control
// plane (package device) declares: it gives every RC QP the engine's
// adapters over the client's shared memory (rings, doorbell records,
// CQs, memory regions: queues.go, mem.go), translates MODIFY_QP
// attributes, watches the doorbells, and resolves peers before RTR
// (resolve.go).
//
// It imports the control plane only for the objects it serves (device.QP,
// CQ, SRQ and their accessors) and the engine, dma, doorbell, queues and
// roce packages; the control plane never imports it (cmd/vrnicd wires the
// two together).
package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
	"github.com/vrnic/vrnic/roce"
)

// DataPlane is the device.DataPlane backed by the RC transport engine
// (package device/engine).
//
// # Doorbells
//
// The engine's workers poll the SQ producer indices of their active QPs
// (those with recent work, package engine's active.go) themselves in every
// loop round (SendSource), and sleep after a spell without work until
// Engine.Kick, a frame or a timer wakes them; a QP that had no work for a
// while is put back on its worker's list by Engine.Kick.
// One doorbell poller (doorbell.Poller) per data plane serves the doorbell
// pages of every context with a QP: each pass compares the SQ and RQ
// producer indices of the QPs whose records the client marked in its
// page's doorbell summary (or, for a client without one, a bounded
// number of records per pass: doorbells.go) with the values it saw last
// and kicks the owning worker of each QP whose indices moved (the worker
// puts it on its active list; no system call when the worker is awake).
// After SpinBudget passes without a moved producer index (or a CQE
// written: completions mean a client about to post) the poller stores
// kick_needed in every page,
// re-checks every record, and only then sleeps in epoll on the kick
// eventfds. So:
//
//   - While the poller spins, clients see kick_needed 0 and posting costs
//     no system call; the poller notices the new producer index within a
//     pass and kicks the worker if it was asleep.
//   - No wake-up is lost: a post racing with the poller going to sleep is
//     seen by the re-check or makes its client kick (doorbell package
//     doc), and a kick reaching a busy worker stays in its channel, so the
//     worker's next attempt to sleep returns at once.
//
// # Completion events
//
// The worker that writes a CQE decides whether an armed CQ owes its
// client an event (doorbell.CQNotifier) and never writes the client's
// eventfd itself: a client can make that write block (doorbell package
// doc). The data plane's doorbell.KernelSignaller has the kernel signal
// the eventfd (one io_submit on the worker, never blocking); where the
// kernel cannot, each context gets a doorbell.EventWriter goroutine
// (started with its first CQ with a completion channel, stopped after its
// last), so a client that makes a write block delays its own events only.
//
// # Never waiting for workers
//
// CreateQP, ModifyQP and DestroyQP queue the operation for the QP's worker
// and return (see device.DataPlane): the worker applies the queue in order,
// and before anything it receives or reads from a ring afterwards. A
// destroyed QP's final counters arrive on a channel once the worker has
// removed it; until then the device keeps the memory the worker may touch.
//
// # QP errors
//
// The engine moves a QP to ERR on its own (an error completion, a broken
// ring, a completion refused by an overflowed CQ) and stores ERR into the
// device's state word of the QP (device.StateWord, the engine's
// StateObserver) on the worker, in the same step: QUERY_QP and the
// transition rules see the state the transport is in, with no goroutine
// or lock in between. The state word raises the affiliated asynchronous
// error the engine names when no completion reports the error (QP_FATAL,
// QP_REQ_ERR, QP_ACCESS_ERR: engine/status.go, errEvent), and none after
// an error completion. A change the engine refuses, or an RTR whose peer
// cannot be resolved, moves the engine's QP to ERR the same way, with
// QP_FATAL.
//
// # Scope
//
// RC, UC and UD QPs get a data path. QP1, the daemon's own GSI QP that
// carries the communication manager's MADs, runs on the same engine over
// daemon memory (qp1.go).
// The address handles of a context are an engine.AHTable the context's
// UD QPs share (ah.go).
type DataPlane struct {
	cfg    Config
	eng    *engine.Engine
	space  *dma.Space
	log    *slog.Logger
	poller *doorbell.Poller

	mu sync.Mutex // guards pages, cqs, srqs, writers; taken under the device lock
	// pages are the served pages (doorbells.go); a QP is found in its
	// page's table by its doorbell record index (qpLocked): no table by
	// QPN.
	pages   map[*doorbell.Page]*pageWatch
	cqs     map[*device.CQ]*cqSink
	srqs    map[*device.SRQ]*recvSource
	writers map[*doorbell.Page]*ctxWriter
	ahs     map[device.Owner]*ahTable    // per context: its AHs and UD QPs
	watch   atomic.Pointer[[]*pageWatch] // immutable list of pages for the poller

	// Poller-private (doorbells.go): the CQEs written at the last pass;
	// the hot and cold pages, the served list they were made from, the
	// next cold page to read; whether the last pass read every page
	// before a sleep; the pass's legacy budget and counts.
	lastCQEs  uint64
	hot, cold []*pageWatch
	tiered    *[]*pageWatch
	coldNext  int
	slept     bool
	budget    int
	passReads uint64
	passPages uint64
	// recordReads and pageReads count the QP records and the pages the
	// poller read (for tests: a pass reads only what clients marked, in
	// the pages they used lately).
	recordReads atomic.Uint64
	pageReads   atomic.Uint64

	// accs are per engine worker: the memory accessor the worker's QPs
	// share (an idle QP holds none). WQEs need no decoding space: the
	// queues decode them straight into the engine's entries.
	accs []*dma.Accessor
	// qpIDs numbers the QPs for their memory views (qpMemory.qp).
	qpIDs atomic.Uint64

	// ksig raises completion eventfds from the kernel (nil: the kernel
	// cannot, or Config.EventWriters; then each context's ctxWriter does).
	ksig *doorbell.KernelSignaller

	writerWG sync.WaitGroup // the writers' Run goroutines

	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
	closed  bool
}

// Config configures a DataPlane.
type Config struct {
	// Engine is the transport engine over the device's links; the data
	// plane starts it (Start) and closes it (Close).
	Engine *engine.Engine
	// Space is the device's dma space (the same as device.Config.Space).
	Space *dma.Space
	// SpinBudget is the number of empty doorbell passes before the poller
	// sleeps. Default 512.
	SpinBudget int
	// SpinFor keeps the poller polling this long after the last pass that
	// saw traffic (doorbell.PollerConfig.SpinFor). Default DefaultSpinFor;
	// negative: none.
	SpinFor time.Duration
	// Logger gets lifecycle messages. Default slog.Default().
	Logger *slog.Logger
	// Resolve, when set, makes sure the link can reach the peer address
	// of an RC QP (a TAP link resolves the peer's MAC address with ARP or
	// neighbour discovery) before the QP goes from INIT to RTR; see
	// CheckModifyQP. nil: every peer is reachable (UDP, in-memory links).
	Resolve func(ctx context.Context, peer netip.Addr) error
	// ResolveTimeout bounds one Resolve call. Default 3s.
	ResolveTimeout time.Duration
	// EventWriters makes completion events go through a writer goroutine
	// per context (doorbell.EventWriter) even where the kernel can signal
	// the eventfds for the engine workers (doorbell.KernelSignaller, the
	// default): for tests of that path.
	EventWriters bool
}

// ctxWriter is the completion event writer of one context (doorbell
// page) and the number of its CQ sinks with a completion channel.
type ctxWriter struct {
	w     *doorbell.EventWriter
	sinks int
}

// dpQP is the data plane's state of one QP.
//
// The fields are ordered so that the struct has no padding (an idle QP
// holds it: BENCHMARKS.md, "Idle QPs").
type dpQP struct {
	qpn   uint32
	owner device.Owner // its context's (UD: the AH table it holds)
	// dbIndex is the QP's doorbell record (its slot in the page's
	// pageWatch).
	dbIndex uint32
	// Poller-private: the producer indices seen by the last pass.
	lastSQ, lastRQ uint32
	ud             bool
	page           *doorbell.Page
	rec            doorbell.QPRecord
	mem            *qpMemory
	sq             *sqSource
	rq             *recvSource // own RQ or the shared SRQ source
	srq            *doorbell.SRQRecord
	ctrs           *engine.QPCounters
	sinks          [2]qpSink         // send, receive
	state          *device.StateWord // the device's state word of the QP
}

// DefaultSpinFor is how long the doorbell poller keeps polling after the
// last doorbell or completion unless Config.SpinFor says otherwise. Long
// enough for a client that posts once per round trip (send_lat, a queue
// kept full) to find it awake; short enough that a client posting a
// batch every millisecond or so does not keep a core spinning for it. With
// 1 ms, the poller of a daemon whose client posted 64 WRITEs per
// completion round never slept: it held a whole CPU of two, the other
// daemon and the client crowded on the other, and the 8-byte TAP benchmark
// ran at 0.27-0.33 of raw TAP in those runs (0.94-1.05 with 200 µs).
const DefaultSpinFor = 200 * time.Microsecond

// New creates a data plane; pass it as device.Config.DataPlane of exactly
// one device, then Start it.
func New(cfg Config) (*DataPlane, error) {
	if cfg.Engine == nil || cfg.Space == nil {
		return nil, errors.New("dataplane: an engine and a dma space are required")
	}
	if cfg.SpinBudget <= 0 {
		cfg.SpinBudget = 512
	}
	if cfg.SpinFor == 0 {
		cfg.SpinFor = DefaultSpinFor
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 3 * time.Second
	}
	dp := &DataPlane{
		cfg: cfg, eng: cfg.Engine, space: cfg.Space, log: cfg.Logger,
		pages: map[*doorbell.Page]*pageWatch{},
		cqs:   map[*device.CQ]*cqSink{}, srqs: map[*device.SRQ]*recvSource{},
		writers: map[*doorbell.Page]*ctxWriter{},
		ahs:     map[device.Owner]*ahTable{},
	}
	dp.watch.Store(&[]*pageWatch{})
	for range dp.eng.Workers() {
		dp.accs = append(dp.accs, dp.space.NewAccessor())
	}
	p, err := doorbell.NewPoller(doorbell.PollerConfig{Poll: dp.pollDoorbells, Recheck: dp.recheckDoorbells,
		SpinBudget: cfg.SpinBudget, SpinFor: max(cfg.SpinFor, 0)})
	if err != nil {
		return nil, err
	}
	dp.poller = p
	if !cfg.EventWriters {
		// One AIO context per worker: workers signal without waiting for
		// each other.
		if dp.ksig, err = doorbell.NewKernelSignaller(dp.eng.Workers()); err != nil {
			dp.log.Info("completion events: a writer goroutine per context", "reason", err)
			dp.ksig = nil
		}
	}
	return dp, nil
}

// Start starts the engine and the doorbell poller.
func (dp *DataPlane) Start() {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.started || dp.closed {
		return
	}
	dp.started = true
	ctx, cancel := context.WithCancel(context.Background())
	dp.cancel = cancel
	dp.eng.Start()
	dp.wg.Add(1)
	go func() {
		defer dp.wg.Done()
		// Not locked to an OS thread: an empty pass yields (Gosched),
		// which on a locked thread is a hand-off of the P to another
		// thread and two futex calls per pass, the largest CPU cost of a
		// daemon under small-message load.
		if err := dp.poller.Run(ctx); err != nil {
			dp.log.Error("doorbell poller stopped", "err", err)
		}
	}()
	dp.log.Info("data plane started", "workers", dp.eng.Workers())
}

// Close stops the goroutines and the engine. Close the device first: its
// contexts are then released and every QP destroyed through the data
// plane.
func (dp *DataPlane) Close() error {
	dp.mu.Lock()
	if dp.closed {
		dp.mu.Unlock()
		return nil
	}
	dp.closed = true
	started := dp.started
	dp.mu.Unlock()
	if started {
		dp.cancel()
		dp.wg.Wait()
	}
	err := dp.eng.Close()
	if !started && errors.Is(err, engine.ErrClosed) {
		err = nil
	}
	dp.poller.Close()
	dp.mu.Lock()
	for c, s := range dp.cqs {
		dp.releaseSinkLocked(s)
		delete(dp.cqs, c)
	}
	for page, cw := range dp.writers { // none left once every sink is released
		cw.w.Close()
		delete(dp.writers, page)
	}
	dp.mu.Unlock()
	// A writer still blocked in write(2) ends once its notifier's close
	// has drained the counter; a client racing to saturate it again can
	// keep it there, and shutdown does not wait for that.
	if !waitTimeout(&dp.writerWG, writerWait) {
		dp.log.Warn("completion event writers still blocked on client eventfds; not waiting for them")
	}
	if dp.ksig != nil {
		dp.ksig.Close() // the engine is stopped: no signal in progress
	}
	for _, a := range dp.accs {
		a.Close() // the engine is stopped: no section in progress
	}
	return err
}

// KernelSignals reports whether completion eventfds are signalled by the
// kernel for the engine workers (doorbell.KernelSignaller) rather than by
// a writer goroutine per context.
func (dp *DataPlane) KernelSignals() bool { return dp.ksig != nil }

// writerWait bounds how long Close waits for the completion event
// writers.
const writerWait = 5 * time.Second

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Engine returns the transport engine (for its worker counters).
func (dp *DataPlane) Engine() *engine.Engine { return dp.eng }

// PollerStats returns the doorbell poller's counters.
func (dp *DataPlane) PollerStats() doorbell.PollerStats { return dp.poller.Stats() }

// Doorbells implements device.DataPlane: the poller's counters.
func (dp *DataPlane) Doorbells() admin.DoorbellCounters {
	st := dp.poller.Stats()
	return admin.DoorbellCounters{Passes: st.Passes, Sleeps: st.Sleeps, Rechecks: st.Rechecks, Kicks: st.Kicks}
}

var _ device.DataPlane = (*DataPlane)(nil)

// CreateQP implements device.DataPlane: it builds the adapters of a QP
// and creates it on the engine (RESET).
func (dp *DataPlane) CreateQP(q *device.QP) error {
	page := q.Doorbells()
	rec, err := page.QP(q.DBIndex())
	if err != nil {
		return err
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.closed {
		return errors.New("dataplane: closed")
	}
	qpn, cp := q.QPN(), q.Cap()
	sqRing, _ := q.SQ()
	x := &dpQP{qpn: qpn, page: page, rec: rec, state: q.StateWord(), owner: q.Owner(), ud: q.Type() == abi.QPTUD}
	owner := dp.eng.Owner(qpn)
	if x.sq, err = newSQSource(sqRing, cp, rec); err != nil {
		return err
	}
	maxRecvSGE := cp.MaxRecvSGE
	if s := q.SRQ(); s != nil {
		maxRecvSGE = s.MaxSGE()
		if x.rq, err = dp.srqSourceLocked(s, page); err != nil {
			return err
		}
		r, _ := page.SRQ(s.DBIndex())
		x.srq = &r
	} else if t := q.Type(); t != abi.QPTXRCSend && t != abi.QPTXRCRecv {
		rqRing, _ := q.RQ()
		if x.rq, err = newRQSource(rqRing, cp.MaxRecvWR, cp.MaxRecvSGE, rec); err != nil {
			return err
		}
	}
	scq, err := dp.cqSinkLocked(q.SendCQ(), page)
	if err != nil {
		return err
	}
	rcq, err := dp.cqSinkLocked(q.RecvCQ(), page)
	if err != nil {
		return err
	}
	x.sinks = [2]qpSink{{cq: scq}, {cq: rcq, recv: true}}
	x.mem = &qpMemory{acc: dp.accs[owner], pd: dma.PD{Owner: q.Owner(), Handle: q.PDHandle()}, mem: dp.space,
		qp: dma.QPID(dp.qpIDs.Add(1))}
	// Queued for the QP's worker; an error (invalid limits, a closed
	// engine) fails CREATE_QP.
	ecfg := engine.QPConfig{
		QPN: qpn, SQ: x.sq, RQ: x.rq, SendCQ: &x.sinks[0], RecvCQ: &x.sinks[1], Mem: x.mem,
		SQDepth: int32(cp.MaxSendWR), MaxSendSGE: int32(cp.MaxSendSGE), MaxRecvSGE: int32(maxRecvSGE),
		MaxInline: int32(cp.MaxInlineData), SigAll: q.SigAll(), State: q.StateWord(),
		Type: q.Type(), PD: q.PDHandle(), XRCD: q.XRCD(),
	}
	if x.rq == nil {
		ecfg.RQ = nil // XRC: the engine takes its receives from the SRQs
	}
	if x.ud {
		ecfg.AHs = dp.ahTableLocked(x.owner).ref()
		ecfg.PortMTU = roce.MTU(q.PortMTU())
	}
	x.ctrs, err = dp.eng.CreateQP(ecfg)
	if err != nil {
		if x.ud {
			dp.unrefAHTableLocked(x.owner)
		}
		return err
	}
	dp.addQPLocked(x, q.DBIndex())
	return nil
}

func (dp *DataPlane) cqSinkLocked(c *device.CQ, page *doorbell.Page) (*cqSink, error) {
	if s := dp.cqs[c]; s != nil {
		return s, nil
	}
	rec, err := page.CQ(c.DBIndex())
	if err != nil {
		return nil, err
	}
	var comp *doorbell.EventFD
	if efd := c.EventFd(); efd >= 0 {
		// The CQ owns its eventfd; the notifier owns a duplicate.
		fd, err := unix.FcntlInt(uintptr(efd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("dataplane: dup completion eventfd: %w", err)
		}
		if comp, err = doorbell.EventFDFrom(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	var sig doorbell.Signaller
	withWriter := comp != nil && dp.ksig == nil
	switch {
	case withWriter:
		sig = dp.writerLocked(page)
	case comp != nil:
		sig = dp.ksig
	}
	ring, count := c.Ring()
	s, err := newCQSink(ring, count, c.Timestamps(), rec, comp, sig)
	if err != nil {
		if comp != nil {
			comp.Close()
		}
		if withWriter {
			dp.unrefWriterLocked(page)
		}
		return nil, err
	}
	if withWriter {
		s.page = page
	}
	s.overflowed = c.Overflowed
	s.verb.eng, s.verb.handle = dp.eng, c.Handle()
	dp.cqs[c] = s
	return s, nil
}

// writerLocked returns the completion event writer of page's context,
// starting it for the context's first CQ with a completion channel, and
// counts one more sink on it. One writer per context: a client that makes
// its eventfd block delays only its own events (doorbell.EventWriter).
func (dp *DataPlane) writerLocked(page *doorbell.Page) *doorbell.EventWriter {
	cw := dp.writers[page]
	if cw == nil {
		cw = &ctxWriter{w: doorbell.NewEventWriter()}
		dp.writers[page] = cw
		dp.writerWG.Add(1)
		go func() {
			defer dp.writerWG.Done()
			cw.w.Run()
		}()
	}
	cw.sinks++
	return cw.w
}

// unrefWriterLocked drops one sink from page's writer and stops the
// writer after its last.
func (dp *DataPlane) unrefWriterLocked(page *doorbell.Page) {
	cw := dp.writers[page]
	if cw == nil {
		return
	}
	if cw.sinks--; cw.sinks == 0 {
		cw.w.Close()
		delete(dp.writers, page)
	}
}

// releaseSinkLocked closes s's completion eventfd (never blocking: a
// write blocked on it is unstuck by its notifier) and drops s from its
// context's writer.
func (dp *DataPlane) releaseSinkLocked(s *cqSink) {
	if s.closed {
		return
	}
	s.closed = true
	s.close()
	if s.page != nil {
		dp.unrefWriterLocked(s.page)
	}
}

func (dp *DataPlane) srqSourceLocked(s *device.SRQ, page *doorbell.Page) (*recvSource, error) {
	if r := dp.srqs[s]; r != nil {
		return r, nil
	}
	rec, err := page.SRQ(s.DBIndex())
	if err != nil {
		return nil, err
	}
	ring, slots, _ := s.Ring()
	r, err := newSRQSource(ring, slots, s.MaxSGE(), rec)
	if err != nil {
		return nil, err
	}
	r.srq = s
	dp.srqs[s] = r
	return r, nil
}

// ReleaseCQ implements device.DataPlane: the CQ's sink and completion
// eventfd duplicate go.
func (dp *DataPlane) ReleaseCQ(c *device.CQ) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if s := dp.cqs[c]; s != nil {
		dp.releaseSinkLocked(s)
		delete(dp.cqs, c)
	}
}

// ResizeCQ implements device.DataPlane: under the sink's lock, so no
// completion is written while the ring changes hands, the producer moves
// to the new ring (queues.CQ.Resize). A CQ that no QP used yet has no
// sink: nothing was written, and the new ring is laid out from index 0.
func (dp *DataPlane) ResizeCQ(c *device.CQ, ring []byte, count uint32) (uint32, error) {
	dp.mu.Lock()
	s := dp.cqs[c]
	dp.mu.Unlock()
	if s == nil {
		return 0, queues.InitCQRing(ring, count, 0)
	}
	dp.settleCQ(s)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cq.Resize(ring, count)
}

// settleCQ lets the workers run what was posted to the send queues that
// complete into s before a resize counts its entries: a send posted
// before ibv_resize_cq is a completion on the CQ by then, as with a NIC
// that executes a datagram send at once (a UD send completes when it
// leaves). Each QP is kicked, then four barriers in a row bound a full
// worker pass after the kick was taken (worker.run: a barrier is applied
// at one of a pass's two control drains, kicks are taken between them and
// the QPs served after the second). Bounded: a stuck engine gets a second
// per barrier.
func (dp *DataPlane) settleCQ(s *cqSink) {
	var qpns []uint32
	dp.mu.Lock()
	for _, pw := range dp.pages {
		for i := range pw.qps {
			if x := pw.qps[i].Load(); x != nil && x.sinks[0].cq == s {
				qpns = append(qpns, x.qpn)
			}
		}
	}
	dp.mu.Unlock()
	if len(qpns) == 0 {
		return
	}
	for _, q := range qpns {
		dp.eng.Kick(q)
	}
	for range 4 {
		select {
		case <-dp.eng.Barrier():
		case <-time.After(time.Second):
			return
		}
	}
}

// ReleaseSRQ implements device.DataPlane.
func (dp *DataPlane) ReleaseSRQ(s *device.SRQ) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	delete(dp.srqs, s)
}

// ModifyQP implements device.DataPlane: it queues the attributes of mask,
// as the device stored them, for the QP's worker.
func (dp *DataPlane) ModifyQP(q *device.QP, prev device.QPState, mask device.AttrMask) {
	dp.mu.Lock()
	x := dp.qpLocked(q)
	dp.mu.Unlock()
	if x == nil {
		return
	}
	state := q.State()
	if mask&device.AttrState != 0 && state == device.StateReset {
		// Discard what was posted before the RESET (see queues.go).
		x.sq.reset.request(x.rec.SQPI.Load())
		if x.srq == nil && x.rq != nil {
			x.rq.reset.request(x.rec.RQPI.Load())
		}
		// RESET clears the QP's ECE options (the device did: q.ECE()).
		dp.modifyEngine(x, engine.QPAttr{Mask: abi.QPAttrState | abi.QPAttrECE, State: abi.QPSReset})
		return
	}
	if mask&device.AttrState != 0 {
		// A queue accepts work requests only from the state that allows
		// them (IBTA 10.3.1, 11.4.1.1: posting to the RQ in RESET, or to
		// the SQ before RTS, is an immediate error). The library refuses
		// such posts; entries another writer of the ring published anyway
		// are discarded when the queue starts to take work, so they never
		// run.
		if prev == device.StateReset {
			x.sq.reset.request(x.rec.SQPI.Load())
			if x.srq == nil && x.rq != nil {
				x.rq.reset.request(x.rec.RQPI.Load())
			}
		} else if state == device.StateRTS && (prev == device.StateInit || prev == device.StateRTR) {
			x.sq.reset.request(x.rec.SQPI.Load())
		}
	}
	a := q.Attr()
	ea := engineAttr(q, &a, state, mask)
	if prev == device.StateInit && state == device.StateRTR && !x.ud {
		if err := dp.resolvePeer(x.qpn, &a.AHAttr); err != nil {
			// Normally CheckModifyQP refused the change already; this is
			// the last line: the engine never gets an RTR QP it cannot
			// address, the QP goes to ERR (its WRs complete flushed).
			dp.log.Error("QP to RTR with an unreachable peer; moving the QP to ERR", "qpn", x.qpn, "err", err)
			dp.toError(x)
			return
		}
	}
	dp.modifyEngine(x, ea)
}

// engineAttr is the engine's view of a MODIFY_QP the device applied to q:
// the attributes of mask as q now holds them (a: q.Attr()), its ECE
// options included.
func engineAttr(q *device.QP, a *abi.QPAttr, state device.QPState, mask device.AttrMask) engine.QPAttr {
	ea := engine.QPAttr{
		Mask:            uint32(mask),
		State:           state,
		PathMTU:         roce.MTU(a.PathMTU),
		DestQPN:         a.DestQPNum,
		RQPSN:           a.RQPSN,
		SQPSN:           a.SQPSN,
		AccessFlags:     a.QPAccessFlags,
		Timeout:         a.Timeout,
		RetryCnt:        a.RetryCnt,
		RNRRetry:        a.RNRRetry,
		MinRNRTimer:     a.MinRNRTimer,
		MaxRdAtomic:     a.MaxRdAtomic,
		MaxDestRdAtomic: a.MaxDestRdAtomic,
		QKey:            a.QKey,
		ECE:             q.ECE(), // with abi.QPAttrECE (device.AttrECE) in mask
	}
	if mask&device.AttrAV != 0 {
		ea.LocalAddr, ea.RemoteAddr = q.Path()
	}
	return ea
}

// modifyEngine queues a for the engine; a change the engine refuses (an
// address vector it cannot use, for instance) moves the QP to ERR, as any
// transport error does.
func (dp *DataPlane) modifyEngine(x *dpQP, a engine.QPAttr) {
	err := dp.eng.ModifyQP(x.qpn, a)
	if err == nil || errors.Is(err, engine.ErrClosed) {
		return
	}
	dp.log.Warn("engine refused a QP change; moving the QP to ERR", "qpn", x.qpn, "err", err)
	dp.toError(x)
}

// toError moves the engine's QP to ERR; the engine stores ERR into the
// device's state word of the QP when its worker applies it.
func (dp *DataPlane) toError(x *dpQP) {
	if err := dp.eng.ModifyQP(x.qpn, engine.QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr}); err != nil &&
		!errors.Is(err, engine.ErrClosed) {
		dp.log.Error("engine: QP to ERR", "qpn", x.qpn, "err", err)
	}
}

// DestroyQP implements device.DataPlane. It queues the QP's removal for
// its worker and returns a channel that delivers the QP's final counters
// once the worker removed it (or the engine closed): from then on nothing
// touches the QP's rings or memory (its worker's memory accessor keeps MR
// memory the worker is using mapped until then, dma.Accessor).
func (dp *DataPlane) DestroyQP(q *device.QP) <-chan device.QPCounters {
	dp.mu.Lock()
	x := dp.qpLocked(q)
	if x == nil {
		dp.mu.Unlock()
		return nil
	}
	if x.ud {
		// The engine's QP keeps the table it was given; a later AH of
		// the context goes into a new one only if no QP holds this.
		dp.unrefAHTableLocked(x.owner)
	}
	lastOfPage := dp.removeQPLocked(x)
	dp.mu.Unlock()
	applied := dp.eng.DestroyQP(x.qpn)
	if lastOfPage {
		// Remove waits until the poller no longer reads the page (one
		// pass, which never blocks), which the device unmaps when the
		// context closes. Done here, in order with the Add of a QP
		// created on the page later.
		if err := dp.poller.Remove(x.page); err != nil {
			dp.log.Warn("doorbell poller: remove page", "err", err)
		}
	}
	final := make(chan device.QPCounters, 1)
	go func() {
		<-applied
		final <- countersOf(x.ctrs)
	}()
	return final
}

// WireCounters implements device.DataPlane: the workers' counters summed.
func (dp *DataPlane) WireCounters() device.WireCounters {
	var c device.WireCounters
	for i := range dp.eng.Workers() {
		w := dp.eng.WorkerCounters(i)
		c.RxFrames += w.RxFrames.Load()
		c.TxFrames += w.TxFrames.Load()
		c.ParseErrors += w.ParseErrors.Load()
		c.ICRCErrors += w.ICRCErrors.Load()
		c.UnknownQP += w.UnknownQP.Load()
		c.BadPeer += w.BadPeer.Load()
		c.CQOverflows += w.CQOverflows.Load()
		c.BuildErrors += w.BuildErrors.Load()
		c.LinkSendErrors += w.LinkSendErrors.Load()
		c.LinkRecvErrors += w.LinkRecvErrors.Load()
		c.CNPsSent += w.CNPsSent.Load()
		c.CNPsReceived += w.CNPsReceived.Load()
		c.CNPsIgnored += w.CNPsIgnored.Load()
		c.HeldPackets += uint64(max(w.HeldPackets.Load(), 0))
	}
	return c
}

// RejectedWQEs implements device.DataPlane: the workers' counts summed.
func (dp *DataPlane) RejectedWQEs() map[string]uint64 {
	var out map[string]uint64
	for i := range dp.eng.Workers() {
		for k, n := range dp.eng.WorkerCounters(i).RejectedWQEs() {
			if out == nil {
				out = map[string]uint64{}
			}
			out[k] += n
		}
	}
	return out
}

// LastLinkError implements device.DataPlane: the newest failed link call
// of any worker.
func (dp *DataPlane) LastLinkError() (string, time.Time) {
	var last *engine.LinkError
	for i := range dp.eng.Workers() {
		if e := dp.eng.WorkerCounters(i).LastLinkError(); e != nil && (last == nil || e.At.After(last.At)) {
			last = e
		}
	}
	if last == nil {
		return "", time.Time{}
	}
	return last.Op + ": " + last.Text, last.At
}

// CCRate returns the QP's rate in b/s while congestion control limits
// it, 0 otherwise (the device's operator listing asks for it).
func (dp *DataPlane) CCRate(q *device.QP) uint64 {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if x := dp.qpLocked(q); x != nil && x.ctrs != nil {
		return x.ctrs.CCRate()
	}
	return 0
}

// CongestionControl returns the engine's congestion control, "dcqcn" or
// "off", and its parameters.
func (dp *DataPlane) CongestionControl() (mode, params string) {
	if p := dp.eng.CC(); p != nil {
		return "dcqcn", p.String()
	}
	return "off", ""
}

// Counters implements device.DataPlane.
func (dp *DataPlane) Counters(q *device.QP) device.QPCounters {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if x := dp.qpLocked(q); x != nil {
		return countersOf(x.ctrs)
	}
	return device.QPCounters{}
}
