package engine

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// srPair is an RC pair whose requester (a) loses the frames drop picks (by
// the count of frames it sent before), with the ECE options ece on both
// QPs, one worker each. The IBTA timeout is a second: no timer fires in
// these tests unless the protocol needs one.
func srPair(t *testing.T, mode roce.Mode, ece uint32, drop func(int64) bool) (*tqp, *tqp) {
	return srPair2(t, mode, ece, ece, drop)
}

// srPair2 is srPair with a's options eceA and b's eceB.
func srPair2(t *testing.T, mode roce.Mode, eceA, eceB uint32, drop func(int64) bool) (*tqp, *tqp) {
	nw := newNetworkMode(t, mode, 4096, 1024)
	na := newNodeWrap(t, nw, "10.0.0.1", 1, nil, func(l Link) Link { return &dropLink{Link: l, drop: drop} })
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	oa, ob := defaultOpts(), defaultOpts()
	oa.timeout, oa.ece = 18, eceA
	ob.timeout, ob.ece = 18, eceB
	a, b := na.newQP(t, 0x11, oa), nb.newQP(t, 0x22, ob)
	bringUp(t, a, b, oa, abi.QPSRTS)
	bringUp(t, b, a, ob, abi.QPSRTS)
	return a, b
}

// TestSelectiveRepeatOneSided: ECE options in force on one end only (a
// misconfiguration: VRNIC_ECE set on one host) still move the data. A
// requester without selective repeat takes a selective NAK for go-back-N;
// a responder without it sends go-back-N's NAK, which a requester with it
// understands.
func TestSelectiveRepeatOneSided(t *testing.T) {
	lost := map[int64]bool{5: true, 20: true, 40: true}
	for _, tc := range []struct {
		name       string
		eceA, eceB uint32
	}{{"requester", abi.ECEOptions, 0}, {"responder", 0, abi.ECEOptions}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := srPair2(t, roce.ModeUDP, tc.eceA, tc.eceB, func(i int64) bool { return lost[i] })
			srWrite(t, a, b, 64<<10)
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			assert.NotZero(t, ca.Rare().SeqNAKsReceived.Load(), "the gaps were NAKed")
		})
	}
}

// srWrite sends one RDMA WRITE of size bytes from a to b and checks the
// data and the completion.
func srWrite(t *testing.T, a, b *tqp, size int) {
	t.Helper()
	src := a.n.buffer(size, 0x10000000, abi.AccessAll, 1)
	dst := b.n.buffer(size, 0x20000000, abi.AccessAll, 2)
	a.send(t, abi.SendWQE{WrID: 7, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, size))
	require.True(t, a.scq.wait(1, waitFor), "WRITE completion")
	c := a.scq.all()[0]
	require.Equal(t, abi.WCSuccess, c.Status)
	require.True(t, bytes.Equal(src.b, dst.b), "the data arrived")
}

// TestSelectiveRepeatResendsOnlyTheHoles: a 64-packet WRITE loses its
// packets 5, 20, 21 and 40 on the way. With selective repeat the responder
// keeps what follows each gap and names each gap when it finds it; the
// requester resends what the selective NAKs name and nothing else, and no
// timer fires. (A gap that outlives its NAK by much is named again: on a
// slow machine that can happen here, and the test counts it.) Without
// selective repeat (go-back-N) the same losses cost far more packets.
func TestSelectiveRepeatResendsOnlyTheHoles(t *testing.T) {
	lost := map[int64]bool{5: true, 20: true, 21: true, 40: true}
	const size, pkts = 64 << 10, 64 // MTU 1024
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			var mu sync.Mutex
			var snaks [][2]uint32
			var hook traceFunc = func(qp *QP, format string, args ...any) {
				if strings.HasPrefix(format, "B tx snak") {
					mu.Lock()
					snaks = append(snaks, [2]uint32{args[0].(uint32), args[1].(uint32)})
					mu.Unlock()
				}
			}
			traceHook.Store(&hook)
			defer traceHook.Store(nil)
			a, b := srPair(t, mode, abi.ECESelectiveRepeat, func(i int64) bool { return lost[i] })
			srWrite(t, a, b, size)
			traceHook.Store(nil)
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			cb, err := b.n.eng.Counters(b.qpn)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			first := a.qpn * 1000 & 0xffffff // a's first PSN (bringUp)
			gaps := map[[2]uint32]bool{}
			var named uint64
			for _, g := range snaks {
				named += uint64(roce.PSNDiff(g[1], g[0]))
				gaps[[2]uint32{g[0] - first, g[1] - first}] = true
			}
			for _, g := range [][2]uint32{{5, 6}, {20, 22}, {40, 41}} {
				assert.True(t, gaps[g], "gap %v named (named: %v)", g, gaps)
			}
			// The requester resends what the NAKs named, less what was
			// acknowledged by the time a NAK came.
			resent := ca.PacketsSent.Load() - pkts
			assert.GreaterOrEqual(t, resent, uint64(len(lost)), "each lost packet again")
			assert.LessOrEqual(t, resent, named, "nothing the selective NAKs did not name")
			assert.Equal(t, uint64(len(snaks)), cb.Rare().SeqNAKsSent.Load())
			assert.Zero(t, ca.Rare().Timeouts.Load(), "no timer needed")
			assert.Equal(t, resent-uint64(len(lost)), cb.Rare().Duplicates.Load(), "only a gap named twice arrives twice")

			g, gb := srPair(t, mode, 0, func(i int64) bool { return lost[i] })
			srWrite(t, g, gb, size)
			cg, err := g.n.eng.Counters(g.qpn)
			require.NoError(t, err)
			t.Logf("packets sent for %d: selective repeat %d (%d selective NAKs), go-back-N %d", pkts, ca.PacketsSent.Load(), len(snaks), cg.PacketsSent.Load())
			assert.Greater(t, cg.PacketsSent.Load(), uint64(pkts+30), "go-back-N resends from each gap")
		})
	}
}

// TestSelectiveRepeatMixedOps: SENDs, READs and atomics behind a lost
// packet are kept, then executed in PSN order once the gap is filled: each
// exactly once, with the right data.
func TestSelectiveRepeatMixedOps(t *testing.T) {
	// Frame 1 is the first packet of the WRITE that follows the first
	// SEND; everything after it arrives before its resend.
	a, b := srPair(t, roce.ModeUDP, abi.ECEOptions, func(i int64) bool { return i == 1 })
	na, nb := a.n, b.n
	w := na.buffer(3000, 0x1000000, abi.AccessAll, 11)
	wd := nb.buffer(3000, 0x2000000, abi.AccessAll, 12)
	s := na.buffer(100, 0x3000000, abi.AccessAll, 13)
	sd := nb.buffer(100, 0x4000000, abi.AccessAll, 14)
	rd := na.buffer(2500, 0x5000000, abi.AccessAll, 15)
	rs := nb.buffer(2500, 0x6000000, abi.AccessAll, 16)
	ctr := nb.buffer(8, 0x7000000, abi.AccessAll, 0)
	clear(ctr.b)
	old := na.buffer(8, 0x8000000, abi.AccessAll, 0)
	s0 := na.buffer(10, 0x9000000, abi.AccessAll, 17)
	s0d := nb.buffer(10, 0xa000000, abi.AccessAll, 18)

	b.recv(t, 1, s0d.sge(0, 10))
	b.recv(t, 3, sd.sge(0, 100))
	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, s0.sge(0, 10))
	a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: wd.va, RKey: wd.key}, w.sge(0, 3000))
	a.send(t, abi.SendWQE{WrID: 3, Opcode: abi.WRSend, Flags: abi.SendSignaled}, s.sge(0, 100))
	a.send(t, abi.SendWQE{WrID: 4, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: rs.va, RKey: rs.key}, rd.sge(0, 2500))
	a.send(t, abi.SendWQE{WrID: 5, Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, RemoteAddr: ctr.va, RKey: ctr.key, CompareAdd: 5}, old.sge(0, 8))
	require.True(t, a.scq.wait(5, waitFor), "five completions")
	require.True(t, b.rcq.wait(2, waitFor), "two receives")
	for i, c := range a.scq.all() {
		assert.Equal(t, abi.WCSuccess, c.Status, "WR %d", c.WrID)
		assert.Equal(t, uint64(i+1), c.WrID, "in order")
	}
	for i, c := range b.rcq.all() {
		assert.Equal(t, abi.WCSuccess, c.Status)
		assert.Equal(t, []uint64{1, 3}[i], c.WrID)
	}
	assert.Equal(t, w.b, wd.b, "WRITE")
	assert.Equal(t, s.b, sd.b, "SEND")
	assert.Equal(t, s0.b, s0d.b, "first SEND")
	assert.Equal(t, rs.b, rd.b, "READ")
	assert.Equal(t, []byte{5, 0, 0, 0, 0, 0, 0, 0}, ctr.b, "FETCH_ADD applied once")
	cb, err := nb.eng.Counters(b.qpn)
	require.NoError(t, err)
	assert.NotZero(t, cb.Rare().SeqNAKsSent.Load(), "the gap was named (again, if it outlived its NAK on a slow machine)")
	assert.Zero(t, nb.eng.WorkerCounters(0).HeldPackets.Load(), "nothing kept once done")
}

// TestSelectiveRepeatTailLoss: the last packet of the last message is lost;
// nothing follows it to show the gap, so the adaptive timer resends it
// (with the oldest unacknowledged packet), long before the IBTA timeout
// (1 s here) and without consuming a retry.
func TestSelectiveRepeatTailLoss(t *testing.T) {
	var mu sync.Mutex
	var retries []string
	var hook traceFunc = func(qp *QP, format string, args ...any) {
		if l := fmt.Sprintf(format, args...); strings.HasPrefix(l, "retry") {
			mu.Lock()
			retries = append(retries, l)
			mu.Unlock()
		}
	}
	traceHook.Store(&hook)
	defer traceHook.Store(nil)
	a, b := srPair(t, roce.ModeUDP, abi.ECEOptions, func(i int64) bool { return i == 3 })
	srWrite(t, a, b, 4096)
	ca, err := a.n.eng.Counters(a.qpn)
	require.NoError(t, err)
	assert.NotZero(t, ca.Rare().Timeouts.Load(), "a timeout found the loss")
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, retries)
	for _, l := range retries {
		// A slow machine may time out the probe too; the IBTA timeout
		// (1 s) never passes here, so no retry is ever counted.
		assert.True(t, strings.HasPrefix(l, "retry rto "), "the adaptive timer, no retry counted: %q", l)
	}
}

// TestLossySelectiveRepeat is TestLossy with both options in force: every
// WR completes exactly once with the right data under drops, duplicates,
// reordering, delays and corruption both ways.
func TestLossySelectiveRepeat(t *testing.T) { testLossy(t, abi.ECEOptions, 0x5e1ec700) }

// TestAdaptiveTimer: the timer follows RFC 6298 from the samples, doubles
// at each timeout without progress, never exceeds the IBTA timeout, and
// counts a retry only once a whole IBTA timeout passed without progress.
// The test is the worker (not started): its clock is set by hand.
func TestAdaptiveTimer(t *testing.T) {
	e, err := New(Config{Links: []Link{&nullLink{ready: make(chan struct{}, 1)}}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	w := e.workers[0]
	qp, err := newQP(QPConfig{QPN: 1, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16), RecvCQ: newFakeCQ(16),
		Mem: newFakeMem(), SQDepth: 16}, w)
	require.NoError(t, err)
	qp.setECE(abi.ECEAdaptiveRTO)
	const code = 10 // 4.19 ms
	ibta := ackTimeout(code)
	qp.state = abi.QPSRTS
	qp.attr.Timeout, qp.attr.RetryCnt, qp.comp.retryLeft = code, 7, 7
	qp.comp.psn, qp.req.psn, qp.req.ackAllUntil = 100, 110, 100

	assert.Equal(t, int64(rtoInit), qp.srTimeout(ibta), "before any sample")
	w.now = 1_000_000
	qp.srSent(&packet{psn: 104, ackReq: true}, false)
	qp.srSent(&packet{psn: 105, ackReq: true}, false) // one at a time
	w.now += 50_000
	qp.progress(105) // acknowledges 104: a 50 µs sample
	assert.Equal(t, int64(50_000), qp.sr.srtt)
	assert.Equal(t, int64(25_000), qp.sr.rttvar)
	assert.Equal(t, int64(150_000), qp.srTimeout(ibta), "SRTT + 4 RTTVAR")
	qp.srSent(&packet{psn: 106, ackReq: true}, true) // a resend: not timed (Karn)
	assert.False(t, qp.sr.rttOn)

	qp.armRetry()
	require.True(t, qp.retryTimer.armed())
	assert.Equal(t, w.now+150_000, qp.retryTimer.when)
	w.now += 150_000
	w.fire()
	assert.Equal(t, uint64(1), qp.Counters.Rare().Timeouts.Load())
	assert.Equal(t, uint8(7), qp.comp.retryLeft, "no retry counted within the IBTA timeout")
	assert.Equal(t, w.now+300_000, qp.retryTimer.when, "doubled")
	progressAt := w.now - 150_000
	for qp.srTimeout(ibta) < ibta {
		w.now = qp.retryTimer.when
		w.fire()
		if w.now-progressAt < ibta {
			assert.Equal(t, uint8(7), qp.comp.retryLeft, "within an IBTA timeout of the progress")
		}
	}
	assert.Equal(t, ibta, qp.srTimeout(ibta), "at most the IBTA timeout")
	assert.Equal(t, uint8(6), qp.comp.retryLeft, "one retry counted: the first timeout an IBTA timeout after the progress")
	w.now = qp.retryTimer.when // another IBTA timeout later
	w.fire()
	assert.Equal(t, uint8(5), qp.comp.retryLeft, "one retry per IBTA timeout without progress")
	qp.progress(107)
	assert.Equal(t, uint8(7), qp.comp.retryLeft)
	assert.Equal(t, int64(150_000), qp.srTimeout(ibta), "progress ends the backoff")
}

// TestSelectiveRepeatWriteOnly: single-packet WRITEs (the responder's
// one-step case, respWriteOnly) with packets lost: the responder keeps
// what follows each gap, and the resent WRITE that fills it lets the kept
// ones run, in order; every WRITE lands and completes.
func TestSelectiveRepeatWriteOnly(t *testing.T) {
	lost := map[int64]bool{3: true, 10: true, 11: true}
	a, b := srPair(t, roce.ModeUDP, abi.ECESelectiveRepeat, func(i int64) bool { return lost[i] })
	const n, size = 24, 64
	src := a.n.buffer(n*size, 0x10000000, abi.AccessAll, 1)
	dst := b.n.buffer(n*size, 0x20000000, abi.AccessAll, 2)
	for i := range n {
		require.NoError(t, a.sq.post(abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			RemoteAddr: dst.va + uint64(i*size), RKey: dst.key}, []abi.SGE{src.sge(i*size, size)}, nil))
	}
	a.n.eng.Kick(a.qpn)
	require.True(t, a.scq.wait(n, waitFor), "WRITE completions")
	for i, c := range a.scq.all() {
		require.Equal(t, abi.WCSuccess, c.Status)
		require.Equal(t, uint64(i), c.WrID, "in order")
	}
	require.True(t, bytes.Equal(src.b, dst.b), "the data arrived")
	cb, err := b.n.eng.Counters(b.qpn)
	require.NoError(t, err)
	assert.NotZero(t, cb.Rare().SeqNAKsSent.Load(), "the gaps were found")
	ca, err := a.n.eng.Counters(a.qpn)
	require.NoError(t, err)
	assert.Zero(t, ca.Rare().Timeouts.Load(), "no timer needed: the filled gap let the kept WRITEs run")
}
