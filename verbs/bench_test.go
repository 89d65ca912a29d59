package verbs

import (
	"testing"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// baselineNs times n plain copies of size bytes into a ring of slots (what
// a post costs at least: moving the WQE bytes) plus one atomic store.
func baselineNs(ring []byte, stride, size, n int, word []byte) float64 {
	src := make([]byte, size)
	slots := len(ring) / stride
	start := time.Now()
	for i := range n {
		copy(ring[(i%slots)*stride:], src)
		store32(word, uint32(i))
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// BenchmarkPostSend posts a 2-SGE send (64-byte control block + 32 bytes
// of SGEs) while the daemon polls (no kick), and reports the cost relative
// to copying the same 96 bytes into the ring (x-copy).
func BenchmarkPostSend(b *testing.B) {
	f := newFixture(b, abi.QPTRC)
	qp := f.qp
	wr := SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{f.mr.SGE(0, 64), f.mr.SGE(64, 64)}}
	base := baselineNs(qp.sq.ring.Bytes, int(qp.sq.stride), 96, max(b.N, 1000), qp.rec[abi.OffDBSQPI+8:])
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := qp.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
		store32(qp.rec[abi.OffDBSQCI:], qp.sq.pi)
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns/base, "x-copy")
}

// BenchmarkPollCQ reaps one CQE per poll (the producer side, writing the
// CQE, is inside the loop and also in the baseline) and reports the cost
// relative to the baseline of producing plus copying the 32 bytes.
func BenchmarkPollCQ(b *testing.B) {
	f := newFixture(b, abi.QPTRC)
	cq := f.cq
	wc := make([]abi.CQE, 4)
	dst := make([]byte, abi.SizeofCQE)
	i := uint32(0)
	n := max(b.N, 1000)
	start := time.Now()
	for k := range n {
		produce(cq, uint32(k), uint64(k))
		copy(dst, cq.ring.Bytes[(uint32(k)&cq.mask)*abi.SizeofCQE:])
	}
	base := float64(time.Since(start).Nanoseconds()) / float64(n)
	// Continue the ring where the baseline left it: reset the consumer.
	clear(cq.ring.Bytes)
	cq.ci = 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		produce(cq, i, uint64(i))
		i++
		if cq.Poll(wc) != 1 {
			b.Fatal("no completion")
		}
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns/base, "x-copy")
}
