package engine

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// lockstepPair is steadyMode with the workers not running: the caller
// drives each side's single worker a pass at a time, on one goroutine,
// so what a message costs is measured without the scheduler (no spinning,
// no sleeps, no wake-ups, no second CPU).
func lockstepPair(t testing.TB, mode roce.Mode) (a, b *tqp) {
	o := defaultOpts()
	o.mtu = roce.MTU4096
	o.timeout = 20
	nw := newNetworkMode(t, mode, 128, 64)
	na := newNodeStart(t, nw, "10.0.0.1", 1, nil, nil, false)
	nb := newNodeStart(t, nw, "10.0.0.2", 1, nil, nil, false)
	a = na.newQP(t, 0x11, o)
	b = nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	// Apply the creates and modifications.
	a.w().pass()
	b.w().pass()
	return a, b
}

// w is the worker owning q (the lockstep pairs have one each).
func (q *tqp) w() *worker { return q.n.eng.workers[0] }

// lockstep runs both sides' passes until done reports true, adding the
// time each side's passes took to ta and tb.
func lockstep(a, b *tqp, ta, tb *time.Duration, done func() bool) {
	wa, wb := a.w(), b.w()
	for spins := 0; !done(); spins++ {
		t0 := time.Now()
		wa.pass()
		t1 := time.Now()
		wb.pass()
		*ta += t1.Sub(t0)
		*tb += time.Since(t1)
		if spins > 1_000_000 {
			panic("lockstep: no progress")
		}
	}
}

// BenchmarkWrite8BLockstep is BenchmarkWrite8B with both engines driven
// by the benchmark's goroutine (locked to its thread): cpu-ns/msg is the
// thread's CPU time per message, both sides and the posting together,
// which the other threads of a loaded machine do not inflate; the time of the requester's side
// (req-ns/msg: fetching WQEs, building and sending frames, taking ACKs,
// completing) and the responder's (resp-ns/msg: receiving, checking,
// placing, acknowledging) per 8-byte WRITE, with no scheduler in the
// figure. pair-msg/s is the rate the slower side allows when each has a
// CPU of its own.
func BenchmarkWrite8BLockstep(b *testing.B) {
	for _, mode := range modes {
		b.Run(mode.String(), func(b *testing.B) { benchWrite8BLockstep(b, mode) })
	}
}

func benchWrite8BLockstep(b *testing.B, mode roce.Mode) {
	a, r := lockstepPair(b, mode)
	src := a.n.buffer(8, 0x1000, abi.AccessAll, 1)
	dst := r.n.buffer(8, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, 8)}
	wr := abi.SendWQE{Opcode: abi.WRRDMAWrite, RemoteAddr: dst.va, RKey: dst.key}
	var sig int64
	var ta, tb time.Duration
	batch := func(k int) {
		for i := range k {
			w := wr
			if i == k-1 {
				w.Flags = abi.SendSignaled
			}
			if err := a.sq.post(w, sges, nil); err != nil {
				panic(err)
			}
		}
		a.n.eng.Kick(a.qpn)
		sig++
		want := sig
		lockstep(a, r, &ta, &tb, func() bool { return a.scq.count.Load() >= want })
		if sig%4096 == 0 {
			a.scq.reset()
			sig = 0
		}
	}
	batch(64)
	ta, tb = 0, 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := threadCPU()
	left := b.N
	for left > 0 {
		k := min(left, 64)
		batch(k)
		left -= k
	}
	cpu := threadCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/msg")
	req := float64(ta.Nanoseconds()) / float64(b.N)
	resp := float64(tb.Nanoseconds()) / float64(b.N)
	b.ReportMetric(req, "req-ns/msg")
	b.ReportMetric(resp, "resp-ns/msg")
	b.ReportMetric(1e9/max(req, resp), "pair-msg/s")
	require.Equal(b, dst.b, src.b)
}

// threadCPU returns the CPU time of the calling thread in nanoseconds: a
// figure the other threads of a loaded machine do not inflate.
func threadCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}
