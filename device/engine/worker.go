package engine

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/cc"
	"github.com/vrnic/vrnic/internal/osyield"
	"github.com/vrnic/vrnic/roce"
)

// LinkError is the newest failed call of a worker's link.
type LinkError struct {
	Op   string // "send" or "receive"
	Text string
	At   time.Time
}

// linkError counts a failed link call in n and keeps its text (a rare
// path: one allocation).
func (c *WorkerCounters) linkError(n *atomic.Uint64, op string, err error) {
	n.Add(1)
	c.lastLinkErr.Store(&LinkError{Op: op, Text: err.Error(), At: time.Now()})
}

// LastLinkError returns the newest failed link call, or nil.
func (c *WorkerCounters) LastLinkError() *LinkError { return c.lastLinkErr.Load() }

// WorkerCounters are per-worker data path counters.
type WorkerCounters struct {
	RxFrames    atomic.Uint64
	TxFrames    atomic.Uint64
	ParseErrors atomic.Uint64 // malformed frames
	ICRCErrors  atomic.Uint64 // ICRC mismatches
	UnknownQP   atomic.Uint64 // destination QPN not on this worker
	BadPeer     atomic.Uint64 // not from the QP's peer (source/destination address), wrong P_Key or service
	CQOverflows atomic.Uint64
	BuildErrors atomic.Uint64
	// CNPs sent (notification point) and received (reaction point);
	// CNPsIgnored: received with congestion control off or for a QP
	// that does not send (also in CNPsReceived). cc.go.
	CNPsSent     atomic.Uint64
	CNPsReceived atomic.Uint64
	CNPsIgnored  atomic.Uint64
	// HeldPackets: request packets the worker's responders keep out of
	// order now (selective repeat, sr.go).
	HeldPackets atomic.Int64
	// LinkSendErrors and LinkRecvErrors count the link's failed send and
	// receive calls (a call, not a frame: a failed batch is one);
	// lastLinkErr keeps the newest failure's text.
	LinkSendErrors atomic.Uint64
	LinkRecvErrors atomic.Uint64
	lastLinkErr    atomic.Pointer[LinkError]
	// rejected counts the work requests sources rejected, by cause
	// (status.go, RejectedWQEs).
	rejected [numRejectKinds]atomic.Uint64
	// CQEs counts the completions the worker's QPs wrote (the doorbell
	// poller takes them as a sign of clients about to post).
	CQEs atomic.Uint64
	// ActiveQPs is the number of QPs on the worker's active list (a
	// gauge: the QPs each pass services, active.go).
	ActiveQPs atomic.Int64
	// RingQPs is the number of the worker's QPs holding a private send
	// ring (a gauge: active QPs and those parked, active.go).
	RingQPs atomic.Int64
	// RingCacheBytes is about what the send rings the worker keeps for
	// reuse hold (a gauge, at most RingCacheBytes: memory per worker,
	// not per QP; active.go).
	RingCacheBytes atomic.Int64
	// Sleeps counts the worker's sleeps, Wakes its wake-ups: it is asleep
	// while Sleeps is ahead of Wakes.
	Sleeps atomic.Uint64
	Wakes  atomic.Uint64
}

// osYield is osyield.Yield. An idle
// worker polls with it between passes: on a machine with fewer cores than
// busy threads (clients polling their CQs, the other daemon of a pair) a
// worker that spun without it kept a client that had work off the CPU for
// the whole spin, tens of microseconds per hop of a ping-pong.
//
// It yields too while it polls through the last stretch before a near
// deadline (sleep): the kernel often wakes a thread onto the CPU of the
// thread that woke it, so the two workers of a pair can share one CPU
// while the other idles, and a requester polling toward a 65 µs ACK
// timeout without yielding kept the responder beside it off the CPU for
// its whole time slice (1 to 3 ms): every retransmission went unanswered
// and the WRITE ended in RETRY_EXC_ERR (TestNearDeadlineYields). A yield
// costs the deadline no more than the other thread's turn. A variable, so
// that a test can count the yields.
var osYield = osyield.Yield

// busyYieldEvery is how many busy passes a worker makes between two
// yields to the goroutines sharing its P.
const busyYieldEvery = 64

// spinNanos is how long an idle worker keeps polling before it sleeps.
const spinNanos = 50_000

// txPoll is how long a worker holding frames its link did not take
// (backpressure: a full buffer pool, receive queue or socket buffer) sleeps
// at most before it offers them again: a link has no "writable" signal.
const txPoll = 50 * time.Microsecond

// ctlOp is a control operation handed to the owning worker.
type ctlOp uint8

const (
	ctlCreate ctlOp = iota
	ctlModify
	ctlDestroy
	ctlQuery
	// ctlBarrier does nothing: its applied channel says the worker has
	// passed it (Engine.RemoveXRCSRQ).
	ctlBarrier
	// ctlLatency copies the worker's completion-latency histograms into
	// lat (Engine.CompletionLatency).
	ctlLatency
)

// ctlMsg is a control operation queued for a worker. Nobody waits for a
// worker to take one except Counters (reply): the control path posts and
// goes on (see Engine.CreateQP).
type ctlMsg struct {
	op      ctlOp
	qpn     uint32
	qp      *QP // ctlCreate: built by the caller
	attr    QPAttr
	reply   chan ctlReply // ctlQuery
	applied chan struct{} // ctlDestroy: closed once applied
	lat     *Latencies    // ctlLatency
}

type ctlReply struct {
	err error
	qp  *QP
}

// worker runs the QPs steered to it: one goroutine (not locked to a
// thread: see the package doc); it alone touches its QPs, timers and
// buffers.
type worker struct {
	id   int
	e    *Engine
	link Link
	arm  func() // the link's ArmReady, or nil
	qps  map[uint32]*QP
	// lastRx is the QP the last received frame was for (nil: none), a
	// cache in front of qps; a destroyed QP is never left in it.
	lastRx *QP
	// active are the QPs with work, serviced every pass (active.go).
	active []*QP
	timers timerHeap
	clk    clock
	// Sleeping (sleep.go): the runtime's timer and the timerfd alarm
	// (nil without one), both set for the same instant; sleepHook, when
	// set (tests), is told the wait before each sleep (-1: none).
	sleepTimer *time.Timer
	alarm      *alarm
	sleepHook  func(time.Duration)
	now        int64
	window     uint32

	// Control messages, and a one-slot wake channel for a sleeping
	// worker.
	ctl     postQueue[*ctlMsg]
	ctlWake chan struct{}
	kick    chan struct{}

	// Doorbells: the QPNs Engine.Kick queued.
	kicks postQueue[uint32]

	// parked are the QPs off the active list that still hold their
	// send rings, the next due to give one back at parkedDue; rings are
	// private send rings kept for reuse, by shape, ringBytes about what
	// they hold (active.go).
	parked     []*QP
	parkedDue  int64
	ringLinger int64 // ringLinger (tests change it before the worker starts)
	rings      map[sqShape][][]swqe
	ringBytes  int

	// Frames and, beside them, their peers (ModeUDP): rxFrom[i] sent
	// rx[i], tx[i] goes to txTo[i].
	rx     [][]byte
	rxFrom []netip.AddrPort
	rxUsed int // slots RecvBatch filled last time (to restore to full length)
	tx     [][]byte
	txTo   []netip.AddrPort
	txN    int
	busy   bool
	// txUnrel[i], if set, is the UD or UC QP whose request tx[i] is, and
	// txPSN[i] its PSN: flush reports it sent (QP.sentThrough) once the
	// link took it.
	txUnrel []*QP
	txPSN   []uint32

	// udp: the links carry UDP payloads (roce.ModeUDP), received on
	// local (Config.Local).
	udp   bool
	local netip.AddrPort
	// ccp: the congestion-control parameters (Config.CC); nil: off.
	// linkPace, when set (cc.Params.LinkRate), limits what the worker's
	// QPs send together; linkTimer wakes the worker when it may again.
	ccp       *cc.Params
	linkPace  *cc.Pacer
	linkTimer timer
	// ccs holds the CC state of the worker's QPs that have one
	// (QP.ccHas): those that met congestion.
	ccs map[*QP]*qpCC

	// scratch, reused for every packet and completion
	pkt roce.Packet
	// psrx is the local half of the pseudo header of every received
	// datagram (ModeUDP: the address and port the link receives on), and
	// the last one's state.
	psrx roce.PseudoRx
	in   packet
	out  packet
	hdrs roce.Headers
	// framer builds a packet whose payload is copied in (txBegin).
	framer roce.Framer
	short  roce.Short // txShort's packet
	sink   frameSink  // txShort's payload
	// ptx is txShort's header states (the pseudo header's over the UDP
	// link, the link headers' over Ethernet), a QP's at ptx[QPN%len]: the
	// engine.QP struct has no room for its own.
	ptx [64]roce.PseudoTx
	// cnpPath is the path a CNP is built with (txCNP).
	cnpPath roce.Path
	cqe     abi.CQE
	grh     [roce.GRHLen]byte // of a UD receive
	// flushRQE is where flushRecv takes each posted RQE of a QP in ERR
	// (room for abi.MaxSGE SGEs): one per worker, not per QP.
	flushRQE RecvWork
	// probe is where the requester polls the SQ of a QP without a send
	// ring (active.go: a ring is taken only for a WQE).
	probe SendWork

	// held: buffers of request packets responders keep out of order
	// (sr.go); heldBytes is what they hold, heldFree the spare ones.
	heldBytes int
	heldFree  [][]byte
	// rxCur is the index in rx of the frame input is handling (-1 when
	// it handles none of them): a responder that keeps the packet takes
	// that buffer and puts a spare one in its place (sr.go).
	rxCur int

	Counters WorkerCounters
	// lat: completion latency by opcode (latency.go), the worker's alone.
	lat Latencies
}

func newWorker(e *Engine, id int, l Link) *worker {
	w := &worker{
		id: id, e: e, link: l,
		qps:     make(map[uint32]*QP),
		clk:     e.clk,
		window:  uint32(e.cfg.Window),
		rxCur:   -1,
		ctlWake: make(chan struct{}, 1),
		kick:    make(chan struct{}, 1),
		rx:      make([][]byte, e.cfg.Batch),
		rxFrom:  make([]netip.AddrPort, e.cfg.Batch),
		tx:      make([][]byte, e.cfg.Batch),
		txTo:    make([]netip.AddrPort, e.cfg.Batch),
		txUnrel: make([]*QP, e.cfg.Batch),
		txPSN:   make([]uint32, e.cfg.Batch),
		udp:     e.cfg.Mode == roce.ModeUDP,
		local:   e.cfg.Local,
		ccp:     e.cfg.CC,
		psrx:    roce.NewPseudoRx(e.cfg.Local),

		ringLinger: ringLinger,
	}
	w.linkTimer = timer{idx: -1, kind: timerLinkPace}
	if p := e.cfg.CC; p != nil && p.LinkRate != 0 {
		w.linkPace = &cc.Pacer{}
		w.linkPace.SetRate(p.LinkRate/uint64(len(e.cfg.Links)), p.PaceBurst, 0)
	}
	w.flushRQE.SGEs = make([]abi.SGE, 0, abi.MaxSGE)
	w.probe.SGEs, w.probe.Inline = make([]abi.SGE, 0, abi.MaxSGE), make([]byte, 0, abi.MaxInline)
	if a, ok := l.(ReadyArmer); ok {
		w.arm = a.ArmReady
	}
	for i := range w.rx {
		w.rx[i] = make([]byte, e.cfg.FrameCap)
		w.tx[i] = make([]byte, e.cfg.FrameCap)
	}
	return w
}

// txBuf returns the next free transmit buffer (full capacity), flushing
// the batch when it is full; nil when the link accepts nothing more now.
func (w *worker) txBuf() []byte {
	if w.txN == len(w.tx) {
		w.flush()
		if w.txN == len(w.tx) {
			return nil
		}
	}
	b := w.tx[w.txN]
	return b[:cap(b)]
}

// flush hands the queued frames to the link; what it does not accept stays
// queued, in order.
func (w *worker) flush() {
	if w.txN == 0 {
		return
	}
	n, err := w.link.SendBatch(w.tx[:w.txN], w.txTo[:w.txN])
	if err != nil {
		w.Counters.linkError(&w.Counters.LinkSendErrors, "send", err)
	}
	if n <= 0 {
		return
	}
	w.Counters.TxFrames.Add(uint64(n))
	for i := range n {
		if qp := w.txUnrel[i]; qp != nil {
			w.txUnrel[i] = nil
			qp.sentThrough(w.txPSN[i])
		}
	}
	for i := 0; i < w.txN-n; i++ {
		w.tx[i], w.tx[n+i] = w.tx[n+i], w.tx[i]
		w.txTo[i] = w.txTo[n+i]
		w.txUnrel[i], w.txPSN[i] = w.txUnrel[n+i], w.txPSN[n+i]
	}
	w.txN -= n
	w.busy = true
}

// forgetTx drops qp from the queued frames' reports (RESET, destroy):
// the frames still go out, nothing is completed for them.
func (w *worker) forgetTx(qp *QP) {
	for i := range w.txN {
		if w.txUnrel[i] == qp {
			w.txUnrel[i] = nil
		}
	}
}

// receive reads one batch of frames and runs them through the machines.
func (w *worker) receive() {
	for i := range w.rxUsed {
		w.rx[i] = w.rx[i][:cap(w.rx[i])]
	}
	n, err := w.link.RecvBatch(w.rx, w.rxFrom)
	w.rxUsed = max(n, 0)
	if err != nil {
		w.Counters.linkError(&w.Counters.LinkRecvErrors, "receive", err)
	}
	if n <= 0 {
		return
	}
	w.busy = true
	w.Counters.RxFrames.Add(uint64(n))
	// A control operation posted before these frames were sent (a MODIFY_QP
	// to RTR the peer learned of before it sent them) applies first.
	w.drainCtl()
	for i := range n {
		w.rxCur = i
		w.input(w.rx[i], w.rxFrom[i])
	}
	w.rxCur = -1
}

// input parses one frame (ICRC verified) from its source from (ModeUDP;
// an Ethernet frame names its own) and dispatches it.
func (w *worker) input(frame []byte, from netip.AddrPort) {
	pkt := &w.pkt
	var err error
	if w.udp {
		// The pseudo header of the datagram: from the address beside
		// it to the link's.
		err = w.psrx.ParseUDP(frame, from, pkt)
	} else {
		err = roce.Parse(frame, pkt)
	}
	if err != nil {
		if errors.Is(err, roce.ErrICRC) {
			w.Counters.ICRCErrors.Add(1)
		} else {
			w.Counters.ParseErrors.Add(1)
		}
		return
	}
	qpn := pkt.BTH.DestQP()
	qp := w.lastRx
	if qp == nil || qp.qpn != qpn {
		// Frames come in runs for one QP: one map lookup per run.
		qp = w.qps[qpn]
		w.lastRx = qp
	}
	if qp == nil {
		w.Counters.UnknownQP.Add(1)
		return
	}
	if qp.svc == roce.ServiceUD { // answered in place: nothing to service
		w.inputUD(qp, pkt, len(frame), from)
		return
	}
	if pkt.Info.Service == roce.ServiceCNP {
		src, dst := w.rxAddrs(qp, pkt, from)
		w.inputCNP(qp, pkt, src, dst) // not an ACK: never the completer's
		return
	}
	if pkt.Info.Service != qp.svc || pkt.BTH.PKey() != pkeyDefault || !w.fromPeer(qp, pkt, from) {
		w.Counters.BadPeer.Add(1)
		return
	}
	w.in.fill(pkt)
	if qp.svc == roce.ServiceXRC && !qp.xrcRx(&w.in, pkt) {
		qp.Counters.Rare().Dropped.Add(1)
		return
	}
	qp.Counters.PacketsReceived.Add(1)
	w.activate(qp)
	if w.ccp != nil && ceMarked(pkt) {
		w.ccCE(qp, pkt)
	}
	switch {
	case qp.unrel:
		qp.ucRx(&w.in)
	case pkt.Info.Is(roce.OpRequest):
		qp.respRx(&w.in)
	case pkt.Info.Is(roce.OpResponse):
		qp.compRx(&w.in)
	default:
		qp.Counters.Rare().Dropped.Add(1)
	}
}

// rxAddrs returns the source and destination addresses of pkt, a frame
// for qp from from (ModeUDP: the address beside it), for the peer check.
//
// DESIGN 5: RC packets are accepted only from the QP's peer (source
// = its destination GID, destination = its source GID), in the
// default partition. In ModeUDP the peer's port is known too: a
// daemon sends from the port it is reached on (its socket's), so a
// datagram for the QP comes from the port the QP sends to; another
// process on the peer host cannot pose as the peer daemon: from another
// port the source is returned invalid, which no QP's peer is.
func (w *worker) rxAddrs(qp *QP, pkt *roce.Packet, from netip.AddrPort) (src, dst netip.Addr) {
	if !w.udp {
		return pkt.Src(), pkt.Dst()
	}
	src, dst = from.Addr(), w.local.Addr()
	if from.Port() != peerOf(&qp.path).Port() {
		src = netip.Addr{}
	}
	return src, dst
}

// fromPeer reports whether pkt, a frame for qp from from, comes from the
// QP's peer to the QP's address (rxAddrs). A frame from exactly where the
// last one that passed came from passes with one comparison; any other
// is checked in full, and remembered if it passes.
//
// Where a frame came from, as QP.rxPeer keeps it (the key): in ModeUDP an
// IPv4 source address and port, with bit 48 set; in ModeEthernet, over
// IPv4, the source and destination addresses of its IP header. 0 for an
// IPv6 source, checked in full every time (a frame from 0.0.0.0 to
// 0.0.0.0 never passes the check).
func (w *worker) fromPeer(qp *QP, pkt *roce.Packet, from netip.AddrPort) bool {
	var key uint64
	if w.udp {
		a := from.Addr().As16() // IPv4 as IPv4-mapped: ::ffff:a.b.c.d
		if lo := binary.BigEndian.Uint64(a[8:]); binary.BigEndian.Uint64(a[:8]) == 0 && lo>>32 == 0xffff {
			key = 1<<48 | (lo&0xffffffff)<<16 | uint64(from.Port())
		}
	} else if h := pkt.IPv4; len(h) >= roce.IPv4HeaderLen {
		key = binary.BigEndian.Uint64(h[12:20]) // source, destination
	}
	if key != 0 && key == qp.rxPeer {
		return true
	}
	src, dst := w.rxAddrs(qp, pkt, from)
	if src.Unmap() != qp.path.Dst.Unmap() || dst.Unmap() != qp.attr.LocalAddr.Unmap() {
		return false
	}
	qp.rxPeer = key
	return true
}

// service runs the QP's output machines.
func (w *worker) service(qp *QP) {
	switch qp.state {
	case abi.QPSErr:
		qp.respOutput() // a fatal NAK may still be owed
		if qp.head != qp.tail || qp.resp.rqeValid {
			w.busy = true
		}
		qp.flush()
		return
	case abi.QPSSQE:
		if qp.head != qp.tail {
			w.busy = true
		}
		qp.flushSend()
		return
	}
	if qp.unrel {
		// Nothing to answer, no timers: send, complete what the link
		// took (sentThrough may have marked WQEs done after the last
		// service).
		qp.reqStep()
		if qp.state != abi.QPSErr && qp.state != abi.QPSSQE {
			qp.advanceHead()
		}
		return
	}
	if !qp.respOutput() {
		return
	}
	qp.reqStep()
	if qp.state == abi.QPSErr {
		return
	}
	qp.advanceHead()
	progressed := qp.comp.psn != qp.lastCompPSN
	qp.lastCompPSN = qp.comp.psn
	qp.updateRetryTimer(progressed)
}

// fire runs due timers.
func (w *worker) fire() {
	for {
		t := w.timers.pop(w.now)
		if t == nil {
			return
		}
		w.busy = true
		switch t.kind {
		case timerRetry:
			t.qp.onRetryTimer()
		case timerRNR:
			t.qp.onRNRTimer()
		case timerCCRate:
			t.qp.onCCRateTimer()
		case timerCCPace:
			t.qp.onCCPaceTimer()
		case timerLinkPace:
			// Nothing more: the pass that follows services the active
			// QPs, the held ones among them (busy, above).
		}
	}
}

// drainCtl applies the queued control messages, in order.
func (w *worker) drainCtl() {
	q := w.ctl.take()
	if q == nil {
		return
	}
	for _, m := range q {
		w.apply(m)
	}
	w.ctl.recycle(q)
}

func (w *worker) apply(m *ctlMsg) {
	var r ctlReply
	switch m.op {
	case ctlCreate:
		qp := m.qp
		if w.qps[qp.qpn] != nil {
			// The device hands out each QPN once; a duplicate is its bug.
			w.e.log.Error("engine: a QP was created twice; the second is ignored", "qpn", qp.qpn)
			break
		}
		w.qps[qp.qpn] = qp
	case ctlModify:
		qp := w.qps[m.qpn]
		if qp == nil {
			r.err = ErrNoQP
			break
		}
		if err := qp.modify(&m.attr); err != nil {
			w.e.log.Warn("engine: a QP change could not be applied; moving the QP to ERR", "qpn", qp.qpn, "err", err)
			qp.enterError(evFatal)
		}
		w.activate(qp)
	case ctlDestroy:
		qp := w.qps[m.qpn]
		if qp == nil {
			r.err = ErrNoQP
			break
		}
		w.timers.stop(&qp.retryTimer)
		w.timers.stop(&qp.rnrTimer)
		qp.ccStop()
		if qp.unrel {
			// Datagrams posted before the destroy go out, as on Linux
			// rxe, whose ibv_post_send runs the requester in the
			// caller's system call: the packet has left when it
			// returns. A peer may be waiting for one (libfabric's
			// ofi_rxd acknowledges its peer's last message and then
			// closes its endpoint). Nothing is completed for them.
			qp.reqStep()
		}
		w.forgetTx(qp)
		qp.srRelease()
		w.drop(qp)
		delete(w.qps, m.qpn)
		if w.lastRx == qp {
			w.lastRx = nil
		}
	case ctlBarrier:
	case ctlLatency:
		*m.lat = w.lat
	case ctlQuery:
		r.qp = w.qps[m.qpn]
		if r.qp == nil {
			r.err = ErrNoQP
		}
	}
	w.busy = true
	if m.applied != nil {
		close(m.applied)
	}
	if m.reply != nil {
		m.reply <- r // buffered: never blocks
	}
}

// pass is one pass of the worker loop: control operations, doorbells, one
// receive batch, due timers, the active QPs' output, one send batch. It
// reports whether it found work.
func (w *worker) pass() bool {
	w.busy = false
	w.drainCtl()
	w.now = w.clk.now()
	w.drainKicks()
	w.receive()
	w.fire()
	// Likewise for work posted after a control operation was (the
	// doorbell of a QP just moved to RTS).
	w.drainCtl()
	w.serviceActive()
	w.flush()
	if len(w.parked) > 0 && w.now >= w.parkedDue {
		w.parkSweep()
	}
	return w.busy
}

// run is the worker loop: control operations between batches, receive,
// timers, output; busy-poll while there is work, then sleep until a kick,
// a frame, a control message or the next timer.
func (w *worker) run(stop <-chan struct{}) {
	w.sleepTimer = time.NewTimer(time.Hour)
	w.sleepTimer.Stop()
	if w.alarm = newAlarm(w.clk); w.alarm != nil {
		go w.alarm.run()
		defer w.alarm.close()
	}
	lastWork := w.clk.now()
	busyPasses := 0
	for {
		select {
		case <-stop:
			return
		default:
		}
		if w.pass() {
			lastWork = w.now
			// A busy worker still lets the goroutines that share its P
			// run now and then: the doorbell poller (which clears
			// kick_needed once a kick woke it: until then every post of
			// every client of the page costs a system call), the control
			// path, a link's waiter. Without it they wait for the
			// runtime to preempt the worker, 10 to 20 ms.
			if busyPasses++; busyPasses%busyYieldEvery == 0 {
				runtime.Gosched()
			}
			continue
		}
		// Poll a little longer before sleeping (a sleep and wake-up cost
		// a futex round trip each), yielding between passes so that the
		// goroutines feeding this worker (doorbell poller, link waiters,
		// clients in the same process) run on this P meanwhile.
		if w.now-lastWork < spinNanos {
			runtime.Gosched()
			osYield()
			continue
		}
		w.settleAll()
		if !w.sleep(stop) {
			return
		}
	}
}
