package dataplane

import (
	"testing"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/queues"
)

// BenchmarkSQSource measures the send adapter (index check, decode and
// validation by package queues, copy into the engine's private WQE,
// consumer-index publish) against the queues consumer alone in the same
// run, and reports the ratio.
func BenchmarkSQSource(b *testing.B) {
	sges := []abi.SGE{{Addr: 0x1000, Length: 4096, LKey: 0x100}, {Addr: 0x3000, Length: 100, LKey: 0x100}}
	wqe := abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: 0x5000, RKey: 7}

	// Baseline: queues.SQ's Poll/Next/Publish on the same ring.
	q, _ := newTestSQ(b, 256, 2, 64)
	sq, err := queues.NewSQ(q.ring, queues.SQConfig{Slots: 256, MaxSGE: 2, MaxInline: 64}, q.rec.SQPI, q.rec.SQCI)
	if err != nil {
		b.Fatal(err)
	}
	var wr queues.SendWR
	const n = 200000
	start := time.Now()
	for range n {
		q.post(wqe, sges, nil)
		sq.Poll()
		sq.Next(&wr)
		sq.Publish()
	}
	base := time.Since(start)

	q2, s := newTestSQ(b, 256, 2, 64)
	w := newSendWork(2, 64)
	b.ReportAllocs()
	b.ResetTimer()
	start = time.Now()
	for range b.N {
		q2.post(wqe, sges, nil)
		if ok, err := s.PollSend(w); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	el := time.Since(start)
	b.ReportMetric(float64(el)/float64(b.N)/(float64(base)/n), "x_queues_only")
}
