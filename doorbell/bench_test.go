package doorbell

import (
	"testing"
	"time"
)

// BenchmarkRing measures the client's doorbell: with the daemon polling
// (kick_needed 0: one atomic store and one load, no system call) and with
// it asleep (kick_needed 1: plus an eventfd write). The polling case
// reports its cost as a fraction of the kicking one, measured in the same
// run.
func BenchmarkRing(b *testing.B) {
	p, err := New()
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	i, err := p.Alloc()
	if err != nil {
		b.Fatal(err)
	}
	rec, _ := p.QP(i)
	run := func(n int, kick uint32) float64 {
		p.KickNeeded().Store(kick)
		kicks := 0
		for v := range n {
			k, err := p.Ring(rec.SQPI, uint32(v))
			if err != nil {
				b.Fatal(err)
			}
			if k {
				kicks++
			}
			if kick != 0 && v&1023 == 1023 {
				p.Kick().Drain()
			}
		}
		return float64(kicks) / float64(n)
	}
	// Baseline for the ratio: kicking posts, measured in this run.
	const baseN = 20000
	start := time.Now()
	run(baseN, 1)
	kickNs := float64(time.Since(start).Nanoseconds()) / baseN
	b.Run("polling", func(b *testing.B) {
		b.ReportAllocs()
		kicks := run(b.N, 0)
		b.ReportMetric(kicks, "kicks/op")
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/kickNs, "x-kicking")
	})
	b.Run("sleeping", func(b *testing.B) {
		b.ReportAllocs()
		b.ReportMetric(run(b.N, 1), "kicks/op")
	})
}

// BenchmarkSignal measures raising a completion eventfd: the kernel
// signalling it for the caller (KernelSignaller: one io_submit, never
// blocks) against a plain write(2) of 1 (what an engine worker did before,
// and what blocks when the client clears O_NONBLOCK and saturates the
// counter), measured in the same run. The reader drains every 1024
// signals, as a client would.
func BenchmarkSignal(b *testing.B) {
	e, err := NewEventFD()
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	k, err := NewKernelSignaller(1)
	if err != nil {
		b.Skip(err)
	}
	defer k.Close()
	run := func(n int, f func() error) {
		for i := range n {
			if err := f(); err != nil {
				b.Fatal(err)
			}
			if i&1023 == 1023 {
				e.Drain()
			}
		}
		e.Drain()
	}
	const baseN = 20000
	run(baseN, e.Signal) // warm up
	start := time.Now()
	run(baseN, e.Signal)
	writeNs := float64(time.Since(start).Nanoseconds()) / baseN
	b.Run("write", func(b *testing.B) {
		b.ReportAllocs()
		run(b.N, e.Signal)
	})
	b.Run("kernel", func(b *testing.B) {
		b.ReportAllocs()
		raise := func() error { return k.Raise(e.Fd()) }
		run(b.N, raise)
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/writeNs, "x-write")
	})
}
