package engine

import (
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// steady brings a pair to steady state for allocation tests and
// benchmarks: one worker each, MTU 4096, Ethernet frames.
func steady(t testing.TB) (*tqp, *tqp) { return steadyMode(t, roce.ModeEthernet) }

func steadyMode(t testing.TB, mode roce.Mode) (*tqp, *tqp) {
	o := defaultOpts()
	o.mtu = roce.MTU4096
	// ACK timeout 4.096 µs × 2^20, about 4 s: the in-memory link loses
	// nothing, but under an instruction counter (valgrind: one thread at
	// a time, some 50 times slower) the default 17 ms expired and the
	// retries ran out, leaving most messages flushed instead of sent.
	o.timeout = 20
	return pairOn(t, newNetworkMode(t, mode, 128, 64), 1, nil, nil, o)
}

// TestZeroAllocWrite: the steady-state RDMA WRITE path (post, segment,
// build, link, parse, place, ACK, complete) allocates nothing, in either
// mode.
func TestZeroAllocWrite(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { testZeroAllocWrite(t, mode) })
	}
}

func testZeroAllocWrite(t *testing.T, mode roce.Mode) {
	a, b := steadyMode(t, mode)
	allocs, src, dst := writeAllocs(a, b)
	assert.Zero(t, allocs, "allocations per 64 KiB WRITE")
	ca, _ := a.n.eng.Counters(a.qpn)
	cb, _ := b.n.eng.Counters(b.qpn)
	t.Logf("A sent %d rcvd %d retrans %d timeouts %d; B sent %d rcvd %d dropped %d dups %d; sleeps A %d B %d",
		ca.PacketsSent.Load(), ca.PacketsReceived.Load(), ca.Rare().Retransmits.Load(), ca.Rare().Timeouts.Load(),
		cb.PacketsSent.Load(), cb.PacketsReceived.Load(), cb.Rare().Dropped.Load(), cb.Rare().Duplicates.Load(),
		a.n.eng.WorkerCounters(0).Sleeps.Load(), b.n.eng.WorkerCounters(0).Sleeps.Load())
	assert.Equal(t, sum(src.b), sum(dst.b))
	for _, c := range a.scq.all() {
		require.Equal(t, abi.WCSuccess, c.Status)
	}
}

// writeAllocs runs signaled 64 KiB RDMA WRITEs from a to b, 50 to warm
// up, and returns the allocations per WRITE after them and the two
// buffers.
func writeAllocs(a, b *tqp) (allocs float64, src, dst *buffer) {
	src = a.n.buffer(64<<10, 0x1000, abi.AccessAll, 1)
	dst = b.n.buffer(64<<10, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, 64<<10)}
	wr := abi.SendWQE{Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}
	var n int64
	run := func() {
		n++
		wr.WrID = uint64(n)
		if err := a.sq.post(wr, sges, nil); err != nil {
			panic(err)
		}
		a.n.eng.Kick(a.qpn)
		a.scq.spin(n)
	}
	for range 50 {
		run()
	}
	return testing.AllocsPerRun(200, run), src, dst
}

// TestZeroAllocSend: the same for SEND/RECV.
func TestZeroAllocSend(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) { testZeroAllocSend(t, mode) })
	}
}

func testZeroAllocSend(t *testing.T, mode roce.Mode) {
	a, b := steadyMode(t, mode)
	src := a.n.buffer(10000, 0x1000, abi.AccessAll, 1)
	dst := b.n.buffer(10000, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, 10000)}
	rsge := dst.sge(0, 10000)
	wr := abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendSignaled}
	assert.Zero(t, sendAllocs(a, b, wr, sges, rsge), "allocations per SEND")
	assert.Equal(t, sum(src.b), sum(dst.b))
}

// sendAllocs returns the allocations per SEND of wr from a to b, each
// with a receive of rsge posted first, after a warm-up.
func sendAllocs(a, b *tqp, wr abi.SendWQE, sges []abi.SGE, rsge abi.SGE) float64 {
	var n int64
	run := func() {
		n++
		sendOnce(a, b, wr, sges, rsge, n)
	}
	for range 50 {
		run()
	}
	return testing.AllocsPerRun(200, run)
}

// sendOnce posts a receive of rsge on b and wr (as wr_id n) on a, and
// waits for the n-th send and receive completions.
func sendOnce(a, b *tqp, wr abi.SendWQE, sges []abi.SGE, rsge abi.SGE, n int64) {
	wr.WrID = uint64(n)
	if err := b.rq.post(uint64(n), rsge); err != nil {
		panic(err)
	}
	if err := a.sq.post(wr, sges, nil); err != nil {
		panic(err)
	}
	a.n.eng.Kick(a.qpn)
	a.scq.spin(n)
	b.rcq.spin(n)
}

// BenchmarkWrite1MiB measures 1 MiB RDMA WRITE goodput between two
// engines over the in-memory link (MTU 4096) and reports it as a ratio to
// a baseline doing, in the same run, only the unavoidable per-byte work:
// copy each MTU into a frame, CRC it (ICRC), CRC it again (check), copy it
// out.
func BenchmarkWrite1MiB(b *testing.B) {
	for _, depth := range []int{1, 4} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) { benchWrite1MiB(b, depth) })
	}
}

// benchWrite1MiB keeps depth 1 MiB WRITEs in flight (each signaled, one
// posted as one completes, as perftest's write_bw with tx-depth depth).
func benchWrite1MiB(b *testing.B, depth int) {
	const size = 1 << 20
	a, r := steady(b)
	src := a.n.buffer(size, 0x1000, abi.AccessAll, 1)
	dst := r.n.buffer(size, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, size)}
	wr := abi.SendWQE{Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}
	var posted, done int64
	post := func() {
		posted++
		wr.WrID = uint64(posted)
		if err := a.sq.post(wr, sges, nil); err != nil {
			panic(err)
		}
		a.n.eng.Kick(a.qpn)
	}
	// run posts n WRs keeping depth in flight and waits for all of them.
	run := func(n int) {
		end := posted + int64(n)
		for posted < end && posted-done < int64(depth) {
			post()
		}
		for done < end {
			done++
			a.scq.spin(done)
			if posted < end {
				post()
			}
		}
		if done >= 4096 {
			a.scq.reset()
			posted, done = 0, 0
		}
	}
	run(4)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	run(b.N)
	engine := time.Since(start)
	b.StopTimer()
	base := baselineCopyCRC(src.b, dst.b, b.N)
	b.ReportMetric(base.Seconds()/engine.Seconds(), "ratio")
	b.ReportMetric(float64(size)*float64(b.N)/engine.Seconds()/1e9, "GB/s")
}

var crcSink uint32

// baselineCopyCRC does the per-byte work of n 1 MiB transfers at MTU 4096
// and returns the time it took.
func baselineCopyCRC(src, dst []byte, n int) time.Duration {
	frame := make([]byte, DefaultFrameCap)
	start := time.Now()
	for range n {
		for off := 0; off < len(src); off += 4096 {
			m := copy(frame[64:], src[off:min(off+4096, len(src))])
			crcSink += crc32.ChecksumIEEE(frame[:64+m])
			crcSink += crc32.ChecksumIEEE(frame[:64+m])
			copy(dst[off:], frame[64:64+m])
		}
	}
	return time.Since(start)
}

// BenchmarkWrite8B measures the 8-byte RDMA WRITE message rate of one
// worker pair two ways. batch=64: batches of 64 WRs, the last one
// signaled, each batch waited for before the next (the two engines drain
// and idle at each batch's end). depth=128: as perftest's write_bw with
// tx-depth 128 and a completion every 32 WRs, 128 WRs stay in flight and
// each signaled completion lets 32 more be posted, so the client, the
// requester and the responder overlap.
func BenchmarkWrite8B(b *testing.B) {
	b.Run("batch=64", benchWrite8BBatch)
	b.Run("depth=128", func(b *testing.B) { benchWrite8BDepth(b, 128, 32) })
}

func write8B(b *testing.B) (*tqp, abi.SendWQE, []abi.SGE) {
	a, r := steady(b)
	src := a.n.buffer(8, 0x1000, abi.AccessAll, 1)
	dst := r.n.buffer(8, 0x1000, abi.AccessAll, 2)
	return a, abi.SendWQE{Opcode: abi.WRRDMAWrite, RemoteAddr: dst.va, RKey: dst.key}, []abi.SGE{src.sge(0, 8)}
}

func benchWrite8BBatch(b *testing.B) {
	a, wr, sges := write8B(b)
	var sig int64
	batch := func(k int) {
		a.postBatch(wr, sges, k)
		a.waitSignaled(&sig)
	}
	batch(64)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	left := b.N
	for left > 0 {
		k := min(left, 64)
		batch(k)
		left -= k
	}
	d := time.Since(start)
	b.ReportMetric(float64(b.N)/d.Seconds(), "msg/s")
}

// benchWrite8BDepth keeps depth WRs in flight in groups of every, the
// last of each group signaled.
func benchWrite8BDepth(b *testing.B, depth, every int) {
	a, wr, sges := write8B(b)
	var done int64 // signaled completions waited for since the CQ's reset
	inflight := 0  // groups
	wait := func() {
		done++
		a.scq.spin(done)
		inflight--
	}
	run := func(n int) {
		for n > 0 {
			if inflight == depth/every {
				wait()
			}
			k := min(every, n)
			a.postBatch(wr, sges, k)
			inflight++
			n -= k
			if done >= 4096 {
				// Empty the CQ while nothing is in flight.
				for inflight > 0 {
					wait()
				}
				a.scq.reset()
				done = 0
			}
		}
		for inflight > 0 {
			wait()
		}
	}
	run(depth)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	run(b.N)
	d := time.Since(start)
	b.ReportMetric(float64(b.N)/d.Seconds(), "msg/s")
}

// postBatch posts k copies of wr on q, the last one signaled, kicking
// the engine while the SQ is full and once at the end, without
// allocating.
func (q *tqp) postBatch(wr abi.SendWQE, sges []abi.SGE, k int) {
	for i := range k {
		w := wr
		if i == k-1 {
			w.Flags = abi.SendSignaled
		}
		for q.sq.post(w, sges, nil) != nil {
			q.n.eng.Kick(q.qpn)
		}
	}
	q.n.eng.Kick(q.qpn)
}

// waitSignaled waits for the next signaled completion on q's send CQ,
// *sig counting them; the CQ is emptied every 4096.
func (q *tqp) waitSignaled(sig *int64) {
	*sig++
	q.scq.spin(*sig)
	if *sig%4096 == 0 {
		q.scq.reset()
		*sig = 0
	}
}
