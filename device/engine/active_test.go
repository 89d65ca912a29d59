package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// countingSQ counts the polls of a send source.
type countingSQ struct {
	SendSource
	polls atomic.Uint64
}

func (c *countingSQ) PollSend(w *SendWork) (bool, error) {
	c.polls.Add(1)
	return c.SendSource.PollSend(w)
}

// waitActive waits until the node's workers have n QPs on their active
// lists together.
func waitActive(t *testing.T, n *node, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		var sum int64
		for i := range n.eng.Workers() {
			sum += n.eng.WorkerCounters(i).ActiveQPs.Load()
		}
		return sum == want
	}, waitFor, activeLinger/1000*1000, "active QPs")
}

// TestIdleQPsAreNotServiced: connected QPs with nothing to do leave their
// worker's active list, and traffic on another QP of the same worker
// never polls their send queues; a doorbell (Kick) puts one back, it does
// its work and leaves again.
func TestIdleQPsAreNotServiced(t *testing.T) {
	const idle = 200
	nw := newNetwork(t)
	na := newNode(t, nw, "10.0.0.1", 1, nil)
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := defaultOpts()
	o.sqDepth = 16
	var sqs []*countingSQ
	var qa []*tqp
	for i := range idle {
		a := na.newQPWith(t, uint32(0x100+i), o, func(s SendSource) SendSource {
			c := &countingSQ{SendSource: s}
			sqs = append(sqs, c)
			return c
		})
		b := nb.newQP(t, uint32(0x100+i), o)
		connect(t, a, b, o)
		qa = append(qa, a)
	}
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	// ModifyQP only queues the change: a query after it returns once
	// its worker applied everything queued before (in order). Without
	// it the count below could be 0 before the last QPs' move to RTS,
	// which puts each on the active list, was applied.
	for _, q := range []*tqp{a, b} {
		_, err := q.n.eng.Counters(q.qpn)
		require.NoError(t, err)
	}
	waitActive(t, na, 0)
	waitActive(t, nb, 0)

	before := make([]uint64, idle)
	for i, c := range sqs {
		before[i] = c.polls.Load()
	}
	src := na.buffer(4096, 0x10000, abi.AccessAll, 1)
	dst := nb.buffer(4096, 0x20000, abi.AccessAll, 2)
	const n = 500
	for i := range n {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 64))
	}
	require.True(t, a.scq.wait(n, waitFor), "completions of the traffic")
	for i, c := range sqs {
		assert.Equal(t, before[i], c.polls.Load(), "idle QP %d: its SQ was polled during another QP's traffic", i)
	}

	// A doorbell on an idle QP: it joins the list, does its WRITE, and
	// leaves once it has had nothing to do for a while.
	q := qa[idle/2]
	q.send(t, abi.SendWQE{WrID: 7, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 64))
	require.True(t, q.scq.wait(1, waitFor), "completion of the idle QP's WRITE")
	require.Equal(t, abi.WCSuccess, q.scq.all()[0].Status)
	waitActive(t, na, 0)
}

// TestSendRingParked: a QP that leaves the active list keeps its private
// send ring for ringLinger (so a QP used in turn with others does not
// allocate and clear it on every turn), and gives it back after that,
// the worker waking for it once, then sleeping without a deadline; a
// destroyed QP gives its ring back at once.
func TestSendRingParked(t *testing.T) {
	t.Run("given back", func(t *testing.T) {
		e, sleeps := sleepingEngine(t)
		require.Equal(t, time.Duration(-1), nextSleep(t, sleeps), "nothing due: a sleep without deadline")
		qp := localInvQP(t, e)
		// The worker goes to sleep with the QP parked: a deadline no
		// later than ringLinger; then, the ring given back, no deadline.
		var parkedSleep bool
		for {
			d := nextSleep(t, sleeps)
			if d < 0 {
				if parkedSleep {
					break
				}
				continue // woken by the kick or the control messages before the QP settled
			}
			assert.LessOrEqual(t, d, time.Duration(ringLinger), "a parked ring is given back within ringLinger")
			parkedSleep = true
		}
		w := &e.workers[0].Counters
		assert.Zero(t, w.RingQPs.Load(), "the idle QP's send ring was given back")
		assert.Zero(t, w.ActiveQPs.Load())
		_ = qp
	})
	t.Run("none without a WQE", func(t *testing.T) {
		// A QP made active by its MODIFY_QPs polls its SQ, finds
		// nothing, settles: it never took a ring (a linger longer than
		// the test would keep one in sight).
		e, _ := sleepingEngineWith(t, func(w *worker) { w.ringLinger = int64(time.Hour) })
		qp := rtsQP(t, e, defaultOpts())
		_, err := e.Counters(qp.qpn) // waits for the worker: the MODIFY_QPs are applied, the QP active
		require.NoError(t, err)
		w := &e.workers[0].Counters
		require.Eventually(t, func() bool { return w.ActiveQPs.Load() == 0 }, waitFor, time.Millisecond, "the QP settles")
		assert.Zero(t, w.RingQPs.Load(), "a QP that fetched no WQE holds no send ring")
	})
	t.Run("destroyed while parked", func(t *testing.T) {
		// A linger longer than the test: the ring stays parked until
		// the QP is destroyed.
		e, _ := sleepingEngineWith(t, func(w *worker) { w.ringLinger = int64(time.Hour) })
		qp := localInvQP(t, e)
		w := &e.workers[0].Counters
		require.Eventually(t, func() bool { return w.ActiveQPs.Load() == 0 }, waitFor, time.Millisecond, "the QP settles")
		require.Equal(t, int64(1), w.RingQPs.Load(), "parked with its ring")
		<-e.DestroyQP(qp.qpn)
		assert.Zero(t, w.RingQPs.Load(), "a destroyed QP holds no ring")
		assert.Zero(t, w.ActiveQPs.Load())
	})
}

// localInvQP makes an RC QP in RTS on e (its peer absent) and runs one
// LOCAL_INV through it: the QP becomes active and fetches the WQE into
// its send ring, and the WQE completes without the peer.
func localInvQP(t *testing.T, e *Engine) *tqp {
	qp := rtsQP(t, e, defaultOpts())
	mr := qp.n.buffer(64, 0x1000, abi.AccessAll, 1)
	qp.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRLocalInv, Flags: abi.SendSignaled, InvalidateRKey: mr.key})
	require.True(t, qp.scq.wait(1, waitFor))
	require.Equal(t, abi.WCSuccess, qp.scq.all()[0].Status)
	return qp
}

// rtsQP makes RC QP 0x11 (depth 16, one SGE) on e and brings it to RTS
// with options o, connected to a peer that does not exist (10.0.0.2,
// QP 0x22): what it sends goes nowhere.
func rtsQP(t *testing.T, e *Engine, o qpOpts) *tqp {
	qp := &tqp{n: &node{eng: e, mem: newFakeMem(), addr: netip.MustParseAddr("10.0.0.1")}, qpn: 0x11,
		sq: newFakeSQ(16), rq: newFakeRQ(16), scq: newFakeCQ(16), rcq: newFakeCQ(16)}
	_, err := e.CreateQP(QPConfig{QPN: qp.qpn, SQ: qp.sq, RQ: qp.rq, SendCQ: qp.scq, RecvCQ: qp.rcq, Mem: qp.n.mem, SQDepth: 16,
		MaxSendSGE: 1, MaxRecvSGE: 1})
	require.NoError(t, err)
	peer := &tqp{n: &node{addr: netip.MustParseAddr("10.0.0.2")}, qpn: 0x22}
	bringUp(t, qp, peer, o, abi.QPSRTS)
	return qp
}

// TestParkSweepSpaced: QPs parked in turn, each due at a time of its own,
// are swept at most every ringLinger/sweepSpacing, not once per QP; none
// gives its ring back before ringLinger, and each within
// ringLinger/sweepSpacing after it.
func TestParkSweepSpaced(t *testing.T) {
	const n, gap = 1000, int64(10 * time.Microsecond)
	w := &worker{ringLinger: ringLinger}
	qps := make([]*QP, n)
	for i := range qps {
		qps[i] = &QP{activeIdx: -1, parkedIdx: -1, lastActive: int64(i) * gap}
		w.park(qps[i])
	}
	released := make([]int64, n)
	sweeps := 0
	for w.now = 0; len(w.parked) > 0; w.now += int64(time.Microsecond) {
		require.Less(t, w.now, 3*int64(ringLinger), "rings still parked")
		if w.now < w.parkedDue {
			continue
		}
		w.parkSweep()
		sweeps++
		for i, qp := range qps {
			if qp.parkedIdx < 0 && released[i] == 0 {
				released[i] = w.now
			}
		}
	}
	for i, qp := range qps {
		due := qp.lastActive + ringLinger
		assert.GreaterOrEqual(t, released[i], due, "QP %d's ring given back before ringLinger", i)
		assert.LessOrEqual(t, released[i], due+ringLinger/sweepSpacing, "QP %d's ring given back late", i)
	}
	// The QPs' due times span n×gap (10 ms): about 8 sweeps, not 1,000.
	assert.LessOrEqual(t, sweeps, int(int64(n)*gap/(ringLinger/sweepSpacing))+2, "sweeps")
	t.Logf("%d sweeps for %d QPs parked %v apart", sweeps, n, time.Duration(gap))
}

// TestReleaseSQClearsUsedSlots: a send ring given back has every slot
// that held a WQE cleared (no pointer left to what it named, nothing for
// the next QP to inherit), whether the slots used wrap round the ring or
// cover it more than once, and keeps its SGE and inline storage.
func TestReleaseSQClearsUsedSlots(t *testing.T) {
	info := roce.OpRCWriteFirst.Info()
	for _, tc := range []struct {
		name      string
		from, end uint32 // tail when the ring was taken, tail at release
	}{
		{"one", 3, 4},
		{"wrapping", 13, 18},
		{"the whole ring, more than once", 5, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &worker{}
			qp := &QP{w: w, cfg: QPConfig{SQDepth: 8, MaxSendSGE: 2, MaxInline: 16}, sqMask: 7}
			qp.sq = newSQRing(qp.sqShape())
			ring := qp.sq
			for i := tc.from; i != tc.end; i++ {
				e := &qp.sq[i&qp.sqMask]
				e.SGEs = append(e.SGEs[:0], abi.SGE{Addr: 1, Length: 2, LKey: 3})
				e.Inline = append(e.Inline[:0], 9)
				e.WrID, e.length, e.info, e.ah, e.state, e.used = uint64(i), 8, info, &AH{}, wqeDone, true
			}
			qp.head, qp.next, qp.tail = tc.end, tc.end, tc.end
			w.releaseSQ(qp)
			require.Nil(t, qp.sq, "given back")
			require.Len(t, w.rings[qp.sqShape()], 1, "kept for reuse")
			for i := range ring {
				e := &ring[i]
				assert.Empty(t, e.SGEs, "slot %d", i)
				assert.Equal(t, 2, cap(e.SGEs), "slot %d keeps its SGE storage", i)
				assert.Equal(t, 16, cap(e.Inline), "slot %d keeps its inline storage", i)
				c := *e
				c.SGEs, c.Inline = nil, nil
				assert.Equal(t, swqe{}, c, "slot %d cleared", i)
			}
		})
	}
}
