package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/roce"
)

// DataPlane is the device's Engine backed by the RC transport engine
// (package device/engine): it gives every RC QP the engine's adapters over
// the client's shared memory (rings, doorbell records, memory regions),
// translates MODIFY_QP attributes, watches the doorbells, and reports the
// QP errors the engine produces back to the control path.
//
// # Doorbells
//
// The engine's workers poll the SQ and RQ producer indices of their QPs
// themselves in every loop round (SendSource/RecvSource), and sleep after
// a spell without work until Engine.Kick, a frame or a timer wakes them.
// One doorbell poller (doorbell.Poller) per data plane serves the doorbell
// pages of every context with a QP: each pass compares the SQ, RQ and SRQ
// producer indices of every QP with the values it saw last and kicks the
// owning worker of each QP whose indices moved (a non-blocking send on a
// one-slot channel: no system call when the worker is awake). After
// SpinBudget empty passes the poller stores kick_needed in every page,
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
// # Errors reported by the engine
//
// An RC error completion (any status but SUCCESS) means the engine moved
// the QP to ERR; a completion refused by an overflowed CQ means it must go
// there. The QP's completion sink notes it (one atomic store) and wakes the
// data plane's error goroutine, which moves the device's QP to ERR under
// the device lock (and the engine's, for the overflow), unless the QP was
// reset since (generation check), so QUERY_QP and the transition rules see
// the state the transport is in.
//
// # Scope
//
// RC QPs get a data path. UD QPs are accepted by the device and move
// through their states, but the engine carries no UD traffic yet.
type DataPlane struct {
	cfg    DataPlaneConfig
	eng    *engine.Engine
	space  *dma.Space
	log    *slog.Logger
	dev    *Device // set by New (the device this data plane serves)
	poller *doorbell.Poller

	mu    sync.Mutex // guards qps, pages, cqs, srqs; taken under Device.mu
	qps   map[uint32]*dpQP
	pages map[*doorbell.Page]int // QPs per served page
	cqs   map[*CQ]*cqSink
	srqs  map[*SRQ]*recvSource
	watch atomic.Pointer[[]*dpQP] // immutable snapshot for the poller

	errWake chan struct{}
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
	closed  bool
}

// DataPlaneConfig configures a DataPlane.
type DataPlaneConfig struct {
	// Engine is the transport engine over the device's links; the data
	// plane starts it (Start) and closes it (Close).
	Engine *engine.Engine
	// Space is the device's dma space (the same as Config.Space).
	Space *dma.Space
	// SpinBudget is the number of empty doorbell passes before the poller
	// sleeps. Default 512.
	SpinBudget int
	// Logger gets lifecycle messages. Default slog.Default().
	Logger *slog.Logger
	// Resolve, when set, makes sure the link can reach the peer address
	// of an RC QP (a TAP link resolves the peer's MAC address with ARP or
	// neighbour discovery) before the QP goes from INIT to RTR; see
	// CheckModifyQP. nil: every peer is reachable (UDP, in-memory links).
	Resolve func(ctx context.Context, peer netip.Addr) error
	// ResolveTimeout bounds one Resolve call. Default 3s.
	ResolveTimeout time.Duration
}

// dpQP is the data plane's state of one RC QP.
type dpQP struct {
	qpn   uint32
	dq    *QP // the device's QP (fields read under Device.mu only)
	page  *doorbell.Page
	rec   doorbell.QPRecord
	mem   *qpMemory
	sq    *sqSource
	rq    *recvSource // own RQ or the shared SRQ source
	srq   *doorbell.SRQRecord
	ctrs  *engine.QPCounters
	sinks [2]qpSink // send, receive

	// gen counts RESETs; errReq is gen+1 of the last error noted by a
	// completion sink (0: none). Written by the owning worker (errReq)
	// and the control path (gen).
	gen    atomic.Uint64
	errReq atomic.Uint64
	wake   chan struct{} // the data plane's errWake

	// Poller-private: the producer indices seen by the last pass.
	lastSQ, lastRQ, lastSRQ uint32
	// Error goroutine-private: the last errReq handled.
	errDone uint64
}

// noteError records that the QP is (or must go) in ERR and wakes the
// error goroutine. Called by the owning worker; no allocation, no lock.
func (q *dpQP) noteError() {
	r := q.gen.Load() + 1
	if q.errReq.Load() == r {
		return
	}
	q.errReq.Store(r)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// NewDataPlane creates a data plane; pass it as Config.Engine of exactly
// one device, then Start it.
func NewDataPlane(cfg DataPlaneConfig) (*DataPlane, error) {
	if cfg.Engine == nil || cfg.Space == nil {
		return nil, errors.New("device: DataPlane needs an engine and a dma space")
	}
	if cfg.SpinBudget <= 0 {
		cfg.SpinBudget = 512
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ResolveTimeout <= 0 {
		cfg.ResolveTimeout = 3 * time.Second
	}
	dp := &DataPlane{
		cfg: cfg, eng: cfg.Engine, space: cfg.Space, log: cfg.Logger,
		qps: map[uint32]*dpQP{}, pages: map[*doorbell.Page]int{},
		cqs: map[*CQ]*cqSink{}, srqs: map[*SRQ]*recvSource{},
		errWake: make(chan struct{}, 1),
	}
	dp.watch.Store(&[]*dpQP{})
	p, err := doorbell.NewPoller(doorbell.PollerConfig{Poll: dp.pollDoorbells, SpinBudget: cfg.SpinBudget})
	if err != nil {
		return nil, err
	}
	dp.poller = p
	return dp, nil
}

// Start starts the engine, the doorbell poller and the error goroutine.
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
	dp.wg.Add(2)
	go func() {
		defer dp.wg.Done()
		// Not locked to an OS thread: an empty pass yields (Gosched),
		// which on a locked thread is a hand-off of the P to another
		// thread and two futex calls per pass, the largest CPU cost of a
		// daemon under small-message load (BENCHMARKS.md).
		if err := dp.poller.Run(ctx); err != nil {
			dp.log.Error("doorbell poller stopped", "err", err)
		}
	}()
	go func() {
		defer dp.wg.Done()
		dp.errorLoop(ctx)
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
		s.close()
		delete(dp.cqs, c)
	}
	dp.mu.Unlock()
	return err
}

// Engine returns the transport engine (for its worker counters).
func (dp *DataPlane) Engine() *engine.Engine { return dp.eng }

// PollerStats returns the doorbell poller's counters.
func (dp *DataPlane) PollerStats() doorbell.PollerStats { return dp.poller.Stats() }

var (
	_ Engine        = (*DataPlane)(nil)
	_ ModifyChecker = (*DataPlane)(nil)
)

// CreateQP implements Engine: it builds the adapters of an RC QP and
// creates it on the engine (RESET).
func (dp *DataPlane) CreateQP(q *QP) error {
	if q.typ != QPTypeRC {
		return nil // UD: no data path yet (see the type's doc)
	}
	page, ok := q.Doorbells().(*doorbell.Page)
	if !ok {
		return fmt.Errorf("device: data plane needs doorbell pages of package doorbell, got %T", q.Doorbells())
	}
	rec, err := page.QP(q.dbIndex)
	if err != nil {
		return err
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.closed {
		return errors.New("device: data plane closed")
	}
	x := &dpQP{qpn: q.qpn, dq: q, page: page, rec: rec, wake: dp.errWake}
	sqRing, _ := q.SQ()
	if x.sq, err = newSQSource(sqRing, q.cap, rec); err != nil {
		return err
	}
	maxRecvSGE := q.cap.MaxRecvSGE
	if s := q.srq; s != nil {
		maxRecvSGE = s.maxSGE
		if x.rq, err = dp.srqSourceLocked(s, page); err != nil {
			return err
		}
		r, _ := page.SRQ(s.dbIndex)
		x.srq = &r
	} else {
		rqRing, _ := q.RQ()
		if x.rq, err = newRQSource(rqRing, q.cap.MaxRecvWR, q.cap.MaxRecvSGE, rec); err != nil {
			return err
		}
	}
	scq, err := dp.cqSinkLocked(q.sendCQ, page)
	if err != nil {
		return err
	}
	rcq, err := dp.cqSinkLocked(q.recvCQ, page)
	if err != nil {
		return err
	}
	x.sinks = [2]qpSink{{qp: x, cq: scq}, {qp: x, cq: rcq, recv: true}}
	x.mem = &qpMemory{acc: dp.space.NewAccessor(), pd: dma.PD{Owner: q.ctx.owner, Handle: q.pd.handle}, mem: dp.space}
	err = dp.eng.CreateQP(engine.QPConfig{
		QPN: q.qpn, SQ: x.sq, RQ: x.rq, SendCQ: &x.sinks[0], RecvCQ: &x.sinks[1], Mem: x.mem,
		SQDepth: int(q.cap.MaxSendWR), MaxSendSGE: int(q.cap.MaxSendSGE), MaxRecvSGE: int(maxRecvSGE),
		MaxInline: int(q.cap.MaxInlineData), SigAll: q.sigAll,
	})
	if err == nil {
		x.ctrs, err = dp.eng.Counters(q.qpn)
		if err != nil {
			_ = dp.eng.DestroyQP(q.qpn)
		}
	}
	if err != nil {
		x.mem.acc.Close()
		return err
	}
	dp.qps[q.qpn] = x
	dp.publishWatchLocked()
	if dp.pages[page]++; dp.pages[page] == 1 {
		if err := dp.poller.Add(page); err != nil {
			dp.log.Error("doorbell poller: add page", "err", err)
		}
	}
	return nil
}

func (dp *DataPlane) cqSinkLocked(c *CQ, page *doorbell.Page) (*cqSink, error) {
	if s := dp.cqs[c]; s != nil {
		return s, nil
	}
	rec, err := page.CQ(c.dbIndex)
	if err != nil {
		return nil, err
	}
	var comp *doorbell.EventFD
	if c.eventfd >= 0 {
		// The CQ owns its eventfd; the notifier owns a duplicate.
		fd, err := unix.FcntlInt(uintptr(c.eventfd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("device: dup completion eventfd: %w", err)
		}
		if comp, err = doorbell.EventFDFrom(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	ring, count := c.Ring()
	s, err := newCQSink(ring, count, rec, comp)
	if err != nil {
		if comp != nil {
			comp.Close()
		}
		return nil, err
	}
	dp.cqs[c] = s
	return s, nil
}

func (dp *DataPlane) srqSourceLocked(s *SRQ, page *doorbell.Page) (*recvSource, error) {
	if r := dp.srqs[s]; r != nil {
		return r, nil
	}
	rec, err := page.SRQ(s.dbIndex)
	if err != nil {
		return nil, err
	}
	ring, slots, _ := s.Ring()
	r, err := newSRQSource(ring, slots, s.maxSGE, rec)
	if err != nil {
		return nil, err
	}
	dp.srqs[s] = r
	return r, nil
}

// releaseCQ is called by the device when a CQ is destroyed (no QP uses
// it any more): its sink and completion eventfd duplicate go.
func (dp *DataPlane) releaseCQ(c *CQ) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if s := dp.cqs[c]; s != nil {
		s.close()
		delete(dp.cqs, c)
	}
}

// releaseSRQ is called by the device when an SRQ is destroyed.
func (dp *DataPlane) releaseSRQ(s *SRQ) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	delete(dp.srqs, s)
}

func (dp *DataPlane) publishWatchLocked() {
	l := make([]*dpQP, 0, len(dp.qps))
	for _, x := range dp.qps {
		l = append(l, x)
	}
	dp.watch.Store(&l)
}

// ModifyQP implements Engine: it hands the attributes of mask, as the
// device stored them, to the engine.
func (dp *DataPlane) ModifyQP(q *QP, prev QPState, mask AttrMask) {
	dp.mu.Lock()
	x := dp.qps[q.qpn]
	dp.mu.Unlock()
	if x == nil {
		return
	}
	if mask&AttrState != 0 && q.state == StateReset {
		// Discard what was posted before the RESET (see dataplane_queues.go).
		x.gen.Add(1)
		x.sq.reset.request(x.rec.SQPI.Load())
		if x.srq == nil {
			x.rq.reset.request(x.rec.RQPI.Load())
		}
		dp.modifyEngine(x, engine.QPAttr{Mask: abi.QPAttrState, State: abi.QPSReset})
		return
	}
	a := &q.attr
	ea := engine.QPAttr{
		Mask:            uint32(mask),
		State:           q.state,
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
	}
	if mask&AttrAV != 0 {
		ea.LocalAddr, ea.RemoteAddr = dp.avAddrs(&a.AHAttr)
	}
	if prev == StateInit && q.state == StateRTR {
		if err := dp.resolvePeer(q.qpn, &a.AHAttr); err != nil {
			// Normally CheckModifyQP refused the change already; this is
			// the last line: the engine never gets an RTR QP it cannot
			// address, the QP goes to ERR (its WRs complete flushed).
			dp.log.Error("QP to RTR with an unreachable peer; moving the QP to ERR", "qpn", q.qpn, "err", err)
			x.noteError()
			return
		}
	}
	dp.modifyEngine(x, ea)
}

// avAddrs maps an address vector to the QP's addresses: the source GID
// (the device's GID table entry sgid_index) and the destination GID, as
// IPv4 when they are IPv4-mapped (RoCE v2 GIDs).
func (dp *DataPlane) avAddrs(av *abi.AHAttr) (local, remote netip.Addr) {
	gids := dp.dev.cfg.Link.GIDs
	if int(av.SGIDIndex) < len(gids) {
		local = netip.AddrFrom16(gids[av.SGIDIndex]).Unmap()
	}
	return local, netip.AddrFrom16(av.DGID).Unmap()
}

func (dp *DataPlane) modifyEngine(x *dpQP, a engine.QPAttr) {
	if err := dp.eng.ModifyQP(x.qpn, a); err != nil {
		if errors.Is(err, engine.ErrClosed) {
			return
		}
		// The device accepted the change but the transport cannot apply
		// it (an address vector it cannot use, for instance): the QP goes
		// to ERR, as for any transport error.
		dp.log.Warn("engine refused a QP change; moving the QP to ERR", "qpn", x.qpn, "err", err)
		x.noteError()
	}
}

// DestroyQP implements Engine. When it returns the engine no longer
// touches the QP's rings or memory.
func (dp *DataPlane) DestroyQP(q *QP) {
	dp.mu.Lock()
	x := dp.qps[q.qpn]
	if x == nil {
		dp.mu.Unlock()
		return
	}
	delete(dp.qps, q.qpn)
	dp.publishWatchLocked()
	lastOfPage := false
	if dp.pages[x.page]--; dp.pages[x.page] == 0 {
		delete(dp.pages, x.page)
		lastOfPage = true
	}
	dp.mu.Unlock()
	if err := dp.eng.DestroyQP(q.qpn); err != nil && !errors.Is(err, engine.ErrClosed) {
		dp.log.Warn("engine: destroy QP", "qpn", q.qpn, "err", err)
	}
	x.mem.acc.Close()
	if lastOfPage {
		// Remove waits until the poller no longer reads the page, which
		// the device unmaps when the context closes.
		if err := dp.poller.Remove(x.page); err != nil {
			dp.log.Warn("doorbell poller: remove page", "err", err)
		}
	}
}

// Counters implements Engine.
func (dp *DataPlane) Counters(q *QP) QPCounters {
	return countersOf(dp.engineCounters(q.qpn))
}

// pollDoorbells is the doorbell poller's pass (see the type's doc). It
// runs on the poller's goroutine only and allocates nothing.
func (dp *DataPlane) pollDoorbells() bool {
	found := false
	for _, x := range *dp.watch.Load() {
		sq, rq := x.rec.SQPI.Load(), x.rec.RQPI.Load()
		var srq uint32
		if x.srq != nil {
			srq = x.srq.PI.Load()
		}
		if sq != x.lastSQ || rq != x.lastRQ || srq != x.lastSRQ {
			x.lastSQ, x.lastRQ, x.lastSRQ = sq, rq, srq
			dp.eng.Kick(x.qpn)
			found = true
		}
	}
	if !found {
		runtime.Gosched() // let the workers and clients run on busy cores
	}
	return found
}

// errorLoop moves QPs whose completions reported an error to ERR in the
// device (and in the engine, which already is there unless the CQ
// overflowed).
func (dp *DataPlane) errorLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-dp.errWake:
		}
		for _, x := range *dp.watch.Load() {
			r := x.errReq.Load()
			if r == 0 || r == x.errDone {
				continue
			}
			x.errDone = r
			dp.dev.qpAsyncError(x.qpn, func(q *QP) bool {
				if q != x.dq || x.gen.Load()+1 != r || q.state == StateErr || q.state == StateReset {
					return false
				}
				dp.modifyEngine(x, engine.QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr})
				return true
			})
		}
	}
}

// qpAsyncError moves QP qpn to ERR for the data plane if cond, evaluated
// under the device lock, holds (the QP may have been reset or destroyed
// since the error was noted). Like QPTransportError, it must not be called
// from inside an Engine callback.
func (d *Device) qpAsyncError(qpn uint32, cond func(*QP) bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	q, ok := d.qps[qpn]
	if !ok || !cond(q) {
		return false
	}
	q.state = StateErr
	q.attr.QPState = StateErr
	q.attr.CurQPState = StateErr
	return true
}
