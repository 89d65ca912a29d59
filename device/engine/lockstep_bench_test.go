package engine

import (
	"runtime"
	"sync/atomic"
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
		a.postGroup(wr, sges, k)
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

// postGroup posts k copies of wr on q, the last one signaled (the SQ must
// have room: the caller keeps fewer in flight), and kicks the engine.
func (q *tqp) postGroup(wr abi.SendWQE, sges []abi.SGE, k int) {
	for i := range k {
		w := wr
		if i == k-1 {
			w.Flags = abi.SendSignaled
		}
		if err := q.sq.post(w, sges, nil); err != nil {
			panic(err)
		}
	}
	q.n.eng.Kick(q.qpn)
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

// BenchmarkWrite8BPair measures the 8-byte WRITE rate of one worker pair
// that has two CPUs to itself, as a NIC's pair of cores would: each
// worker busy-polls on a thread of its own pinned to its own CPU (the
// requester's CPU 0, the responder's CPU 1), with no scheduler between
// passes and nothing else on the two CPUs; the client posts its WRs from
// the requester's thread between its passes (what it costs is in the
// requester's figure). 128 WRs stay in flight, every 32nd signaled, as in
// BenchmarkWrite8B's depth=128 form, whose three busy goroutines (client,
// requester, responder) share two CPUs and the Go scheduler. msg/s is the
// pair's rate; req-cpu-ns/msg the requester thread's CPU time per message,
// posting included (it polls: its whole time); req-idle/msg the passes
// per message in which the requester found nothing to do (waiting for the
// responder). Frames still cross between the CPUs through the in-memory
// link.
func BenchmarkWrite8BPair(b *testing.B) {
	if runtime.NumCPU() < 2 || runtime.GOMAXPROCS(0) < 2 {
		b.Skip("needs two CPUs")
	}
	for _, mode := range modes {
		b.Run(mode.String(), func(b *testing.B) { benchWrite8BPair(b, mode, 128, 32) })
	}
}

// pinThread locks the calling goroutine to its thread and the thread to
// CPU cpu.
func pinThread(b *testing.B, cpu int) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		b.Fatalf("pin to CPU %d: %v", cpu, err)
	}
}

func benchWrite8BPair(b *testing.B, mode roce.Mode, depth, every int) {
	o := defaultOpts()
	o.mtu = roce.MTU4096
	o.timeout = 20 // as steadyMode
	nw := newNetworkMode(b, mode, 128, 64)
	na := newNodeStart(b, nw, "10.0.0.1", 1, nil, nil, false)
	nb := newNodeStart(b, nw, "10.0.0.2", 1, nil, nil, false)
	a := na.newQP(b, 0x11, o)
	r := nb.newQP(b, 0x22, o)
	connect(b, a, r, o)
	wa, wb := a.w(), r.w()
	wa.pass() // the creates and modifications
	wb.pass()
	src := a.n.buffer(8, 0x1000, abi.AccessAll, 1)
	dst := r.n.buffer(8, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, 8)}
	wr := abi.SendWQE{Opcode: abi.WRRDMAWrite, RemoteAddr: dst.va, RKey: dst.key}

	// The responder: pinned to CPU 1, a pass after another until stop.
	var stop atomic.Bool
	respDone := make(chan struct{})
	go func() {
		defer close(respDone)
		pinThread(b, 1)
		defer runtime.UnlockOSThread()
		for !stop.Load() {
			wb.pass()
		}
	}()
	defer func() {
		stop.Store(true)
		<-respDone
	}()

	var done int64 // signaled completions seen since the CQ's reset
	inflight := 0  // groups
	idle := 0
	run := func(n int) {
		for spins := 0; n > 0 || inflight > 0; {
			if n > 0 && inflight < depth/every {
				k := min(every, n)
				a.postGroup(wr, sges, k)
				inflight++
				n -= k
				continue
			}
			if wa.pass() {
				spins = 0
			} else if idle, spins = idle+1, spins+1; spins > 50_000_000 {
				panic("pair: no progress")
			}
			for c := a.scq.count.Load(); inflight > 0 && c > done; inflight-- {
				done++
			}
			if done >= 4096 && inflight == 0 {
				a.scq.reset()
				done = 0
			}
		}
	}
	pinThread(b, 0)
	defer runtime.UnlockOSThread()
	run(depth)
	idle = 0
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := threadCPU()
	start := time.Now()
	run(b.N)
	d := time.Since(start)
	cpu := threadCPU() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(b.N)/d.Seconds(), "msg/s")
	b.ReportMetric(float64(cpu)/float64(b.N), "req-cpu-ns/msg")
	b.ReportMetric(float64(idle)/float64(b.N), "req-idle/msg")
	require.Equal(b, dst.b, src.b)
}
