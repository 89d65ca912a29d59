package queues_test

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/queues"
)

// inprocBaseline posts and consumes n WQEs through a ring of slots slots in
// one goroutine with the same WQE building and checking work as the
// two-process run: the cost of the ring code itself, no sharing, no
// scheduling.
func inprocBaseline(tb testing.TB, n uint64, slots uint32) time.Duration {
	cfg := queues.SQConfig{Slots: slots, MaxSGE: 1, MaxInline: bodyLen}
	ring := make([]byte, cfg.RingBytes())
	var pi, ci atomic.Uint32
	sq, err := queues.NewSQ(ring, cfg, &pi, &ci)
	if err != nil {
		tb.Fatal(err)
	}
	stride, mask := cfg.Stride(), slots-1
	var wr queues.SendWR
	var scratch [bodyLen]byte
	post, next := uint32(0), uint64(1)
	start := time.Now()
	for seq := uint64(1); seq <= n; {
		for ; seq <= n && post-ci.Load() < slots; seq++ {
			putWQE(ring[(post&mask)*stride:(post&mask+1)*stride], seq)
			post++
			pi.Store(post)
		}
		if _, err := sq.Poll(); err != nil {
			tb.Fatal(err)
		}
		for {
			ok, err := sq.Next(&wr)
			if !ok {
				break
			}
			body(wr.WrID, scratch[:])
			if err != nil || wr.WrID != next || wr.ImmData != checksum(wr.WrID, wr.RemoteAddr, wr.Inline) || !bytes.Equal(scratch[:], wr.Inline) {
				tb.Fatalf("baseline WQE %d bad (%v)", next, err)
			}
			next++
		}
		sq.Publish()
	}
	return time.Since(start)
}

// BenchmarkTwoProcess measures the cross-process post+consume rate through
// a 64-slot ring (b.N WQEs from a client process), busy-polling and with
// eventfd wake-ups. It reports WQE/s, the client's kicks per WQE, the
// system calls per WQE of the client's posting thread (exact, from a perf
// event; else the write(2) calls of /proc/PID/io), and the ratio of the
// cost per WQE to an in-process baseline measured in the same run. The
// system calls are checked as in TestTwoProcess.
func BenchmarkTwoProcess(b *testing.B) {
	for _, mode := range []xprocMode{modeBusy, modeSleep} {
		b.Run(mode.name, func(b *testing.B) {
			b.ReportAllocs()
			n := uint64(b.N)
			res := runXProc(b, mode, n, 64)
			b.StopTimer()
			base := inprocBaseline(b, n, 64)
			perOp := float64(res.elapsed.Nanoseconds()) / float64(n)
			b.ReportMetric(float64(n)/res.elapsed.Seconds(), "WQE/s")
			b.ReportMetric(perOp, "ns/WQE") // ns/op also counts the client's start-up
			b.ReportMetric(float64(res.kicks)/float64(n), "kicks/op")
			if res.sys.Exact {
				b.ReportMetric(float64(res.sys.Count)/float64(n), "client-syscalls/op")
			} else if res.syscwErr == nil {
				b.ReportMetric(float64(res.syscw)/float64(n), "client-writes/op")
			}
			b.Logf("N=%d: client posting-thread system calls %v", n, res.sys)
			checkClientSyscalls(b, res)
			b.ReportMetric(perOp/(float64(base.Nanoseconds())/float64(n)), "x-inproc")
			b.ReportMetric(float64(res.stats.Sleeps)/float64(n), "sleeps/op")
		})
	}
}

// BenchmarkInProcess is the baseline alone (ns/op per WQE).
func BenchmarkInProcess(b *testing.B) {
	b.ReportAllocs()
	d := inprocBaseline(b, uint64(b.N), 64)
	b.ReportMetric(float64(b.N)/d.Seconds(), "WQE/s")
}

// BenchmarkSQConsume measures Poll+Next+Publish per WQE over a full ring
// against copying the same slots (the memcpy floor).
func BenchmarkSQConsume(b *testing.B) {
	for _, sges := range []uint32{1, 4, 32} {
		b.Run(fmt.Sprintf("sge=%d", sges), func(b *testing.B) {
			cfg := queues.SQConfig{Slots: 256, MaxSGE: sges}
			ring := make([]byte, cfg.RingBytes())
			stride := cfg.Stride()
			for i := range cfg.Slots {
				w := abi.SendWQE{WrID: uint64(i), Opcode: abi.WRSend, NumSGE: uint8(sges)}
				w.Put(ring[i*stride:])
				for j := range sges {
					(&abi.SGE{Addr: 4096, Length: 64, LKey: 1}).Put(ring[i*stride+64+j*16:])
				}
			}
			var pi, ci atomic.Uint32
			sq, err := queues.NewSQ(ring, cfg, &pi, &ci)
			if err != nil {
				b.Fatal(err)
			}
			var wr queues.SendWR
			dst := make([]byte, stride)
			start := time.Now()
			for i := 0; i < b.N; i++ {
				copy(dst, ring[(uint32(i)%cfg.Slots)*stride:][:stride])
			}
			base := time.Since(start)
			b.ReportAllocs()
			b.ResetTimer()
			post := uint32(0)
			for i := 0; i < b.N; {
				post += cfg.Slots
				pi.Store(post)
				sq.Poll()
				for ; i < b.N; i++ {
					ok, err := sq.Next(&wr)
					if !ok {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				if sq.Pending() != 0 {
					break
				}
				sq.Publish()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(base.Nanoseconds()+1), "x-memcpy")
		})
	}
}
