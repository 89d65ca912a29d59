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

// TestProgressRestartsAckTimer: a response that makes progress restarts the
// ACK timer at once (IBTA 9.7.6.1.3). The worker runs due timers right after
// its receive batch; when the timer expired while the response waited in
// that batch, the old code counted a timeout (retry_cnt) and restarted the
// whole window although the response had just made progress.
func TestProgressRestartsAckTimer(t *testing.T) {
	e, err := New(Config{Links: []Link{&nullLink{ready: make(chan struct{}, 1)}}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	w := e.workers[0] // not started: the test is the worker
	qp, err := newQP(QPConfig{QPN: 1, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16), RecvCQ: newFakeCQ(16),
		Mem: newFakeMem(), SQDepth: 16}, w)
	require.NoError(t, err)
	const code = 10
	timeout := ackTimeout(code)
	qp.state = abi.QPSRTS
	qp.attr.Timeout, qp.attr.RetryCnt, qp.comp.retryLeft = code, 7, 7
	qp.comp.psn, qp.req.psn = 100, 110 // PSNs 100..109 outstanding

	w.now = 0
	qp.armRetry()
	require.True(t, qp.retryTimer.armed())

	// One round: the receive batch holds an ACK through PSN 104, and the
	// timer is due by now.
	w.now = timeout + 1
	qp.progress(105)
	w.fire()
	assert.Zero(t, qp.Counters.Rare().Timeouts.Load(), "progress in the same round: no timeout")
	assert.Equal(t, uint8(7), qp.comp.retryLeft)
	require.True(t, qp.retryTimer.armed())
	assert.Equal(t, w.now+timeout, qp.retryTimer.when, "restarted at the progress")

	// Without progress the timer still expires.
	w.now += timeout
	w.fire()
	assert.Equal(t, uint64(1), qp.Counters.Rare().Timeouts.Load())
	assert.Equal(t, uint8(6), qp.comp.retryLeft)
}

// stallLink refuses every frame while blocked (backpressure).
type stallLink struct {
	Link
	blocked atomic.Bool
	refused atomic.Uint64
}

func (l *stallLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if l.blocked.Load() {
		l.refused.Add(1)
		return 0, nil
	}
	return l.Link.SendBatch(frames, peers)
}

// TestBackpressureDoesNotWaitForTimer: frames the link did not take are
// offered again within txPoll even when the worker's next timer (the ACK
// timeout) is far away. The old loop slept until that timer, so a burst
// refused once waited a whole ACK timeout, which then counted against
// retry_cnt for frames that had never left.
func TestBackpressureDoesNotWaitForTimer(t *testing.T) {
	nw := newNetwork(t)
	pa, err := nw.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	stall := &stallLink{Link: pa[0]}
	stall.blocked.Store(true)
	ea, err := New(Config{Links: []Link{stall}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	ea.Start()
	t.Cleanup(func() { _ = ea.Close() })
	na := &node{eng: ea, mem: newFakeMem(), addr: netip.MustParseAddr("10.0.0.1"), ports: pa}
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := defaultOpts()
	o.timeout = 22 // 17 s: far beyond the wait below
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)

	src := na.buffer(2000, 0x1000, abi.AccessAll, 1)
	dst := nb.buffer(2000, 0x1000, abi.AccessAll, 2)
	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 2000))
	// Let the worker find the link full and go to sleep with the frames.
	deadline := time.Now().Add(waitFor)
	for stall.refused.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	require.NotZero(t, stall.refused.Load(), "the worker offered the frames")
	sleeps := ea.WorkerCounters(0).Sleeps.Load()
	for ea.WorkerCounters(0).Sleeps.Load() == sleeps && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	require.Greater(t, ea.WorkerCounters(0).Sleeps.Load(), sleeps, "the worker slept with frames queued")
	stall.blocked.Store(false) // no wake-up: the worker must poll

	require.True(t, a.scq.wait(1, 5*time.Second), "the WRITE completes long before the 17 s ACK timeout")
	wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
	assert.Equal(t, sum(src.b), sum(dst.b))
	ca, err := ea.Counters(a.qpn)
	require.NoError(t, err)
	assert.Zero(t, ca.Rare().Timeouts.Load(), "no ACK timeout for frames held back by the link")
}

// TestAckTimeout: the local ACK timeout of a timeout code is 4.096 us *
// 2^code (IBTA 9.7.6.1.3), code 0 meaning none (no timer).
func TestAckTimeout(t *testing.T) {
	assert.Zero(t, ackTimeout(0))
	for code := uint8(1); code < 32; code++ {
		want := time.Duration(4096 * float64(uint64(1)<<code))
		assert.Equal(t, int64(want), ackTimeout(code), "code %d", code)
	}
	assert.Equal(t, 67108864*time.Nanosecond, time.Duration(ackTimeout(14)), "14: 67.1 ms")
	assert.Equal(t, ackTimeout(31), ackTimeout(31+32), "5 bits")
}
