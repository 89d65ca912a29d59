package dma

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// withBaseline runs op b.N times under the benchmark timer and base b.N
// times with the timer stopped, interleaved in blocks so both see the same
// cache and machine load, and reports op's time as a multiple of base's
// measured in the same run (absolute times drift on shared machines; the
// ratio much less).
func withBaseline(b *testing.B, base, op func()) {
	b.ReportAllocs()
	block := max(1, b.N/16)
	var baseDur time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += block {
		n := min(block, b.N-done)
		b.StopTimer()
		start := time.Now()
		for range n {
			base()
		}
		baseDur += time.Since(start)
		b.StartTimer()
		for range n {
			op()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(baseDur.Nanoseconds())/float64(b.N), "baseline-ns/op")
	b.ReportMetric(float64(b.Elapsed())/float64(baseDur), "x-baseline")
}

// benchMR registers size bytes of a fresh region as an MR whose 4 KiB
// pages are in reverse PA order (no two adjacent pages merge), so every
// copy walks the page table page by page.
func benchMR(b *testing.B, size int) (*Space, hostMem, MRInfo) {
	s := newSpace(b, Config{})
	h := addHostMem(b, s, 1, size)
	fill(h.client, 1)
	pages := make([]uint64, size/4096)
	for i := range pages {
		pages[i] = h.pa(uint64(len(pages)-1-i) * 4096)
	}
	mr, err := s.RegisterMR(1, 1, 0x10000, uint64(size), AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic, PageShift4K, pages)
	require.NoError(b, err)
	return s, h, mr
}

func BenchmarkTranslate(b *testing.B) {
	s, _, mr := benchMR(b, 1*mib)
	acc := s.NewAccessor()
	defer acc.Close()
	pd := PD{1, 1}
	segs := make([][]byte, 32)
	for _, bc := range []struct {
		name   string
		off, n uint64
	}{{"1page", 100, 1000}, {"4KiB-straddle", 2048, 4096}, {"64KiB-16pages", 0, 64 * kib}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				acc.Enter()
				if _, err := acc.Translate(mr.LKey, pd, 0x10000+bc.off, bc.n, AccessLocalWrite, segs); err != nil {
					b.Fatal(err)
				}
				acc.Exit()
			}
		})
	}
	b.Run("parallel-1page", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			acc := s.NewAccessor()
			defer acc.Close()
			segs := make([][]byte, 4)
			for pb.Next() {
				acc.Enter()
				if _, err := acc.Translate(mr.LKey, pd, 0x10100, 1000, 0, segs); err != nil {
					b.Error(err)
					return
				}
				acc.Exit()
			}
		})
	})
}

// BenchmarkGather and BenchmarkScatter compare a copy through the MR
// (reverse-ordered pages, the message split over 2 SGEs) with a plain
// copy() of the same number of bytes from/to the same mapping.
func BenchmarkGather(b *testing.B) { benchSGECopy(b, false) }

func BenchmarkScatter(b *testing.B) { benchSGECopy(b, true) }

// benchSGECopy runs BenchmarkGather (from the MR into a local buffer) or,
// with scatter, BenchmarkScatter (from a local buffer into the MR).
func benchSGECopy(b *testing.B, scatter bool) {
	for _, bc := range copyCases {
		b.Run(bc.name, func(b *testing.B) {
			size := bc.size
			s, h, mr := benchMR(b, 2*size)
			acc := s.NewAccessor()
			defer acc.Close()
			pd := PD{1, 1}
			half := uint32(size / 2)
			// Start mid-page so every SGE straddles pages.
			sges := []SGE{{Addr: 0x10000 + 2048, Length: half, LKey: mr.LKey}, {Addr: 0x10000 + 2048 + uint64(half), Length: half, LKey: mr.LKey}}
			client := h.client[2048 : 2048+size]
			local := make([]byte, size)
			fill(local, 9)
			b.SetBytes(int64(size))
			if scatter {
				withBaseline(b, func() { bc.copy(client, local) }, func() {
					if _, err := acc.ScatterAt(pd, sges, 0, local); err != nil {
						b.Fatal(err)
					}
				})
				return
			}
			withBaseline(b, func() { bc.copy(local, client) }, func() {
				if _, err := acc.GatherAt(pd, sges, 0, local); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// copyCases: the message sizes, and the baseline copying the same bytes.
// Go's memmove switches to non-temporal stores from 1 MiB on, which the
// page-sized copies of a gather or scatter never reach, so 1 MiB is also
// measured against copy() of 4 KiB pieces.
var copyCases = []struct {
	name string
	size int
	copy func(dst, src []byte)
}{
	{"4KiB", 4 * kib, plainCopy},
	{"1MiB", 1 * mib, plainCopy},
	{"1MiB-vs-4KiB-copies", 1 * mib, pieceCopy},
}

func plainCopy(dst, src []byte) { copy(dst, src) }

func pieceCopy(dst, src []byte) {
	for o := 0; o < len(src); o += 4 * kib {
		copy(dst[o:o+4*kib], src[o:o+4*kib])
	}
}

// BenchmarkAtomics compares FetchAdd and CompareSwap through an rkey with
// a bare atomic.AddUint64 on the same mapped word.
func BenchmarkAtomics(b *testing.B) {
	s, h, mr := benchMR(b, 64*kib)
	acc := s.NewAccessor()
	defer acc.Close()
	pd := PD{1, 1}
	va := uint64(0x10000 + 4096 + 64)
	// MR page 1 is region page 14 (reverse order).
	word := word64(h.client[14*4096+64 : 14*4096+72])
	b.Run("FetchAdd", func(b *testing.B) {
		withBaseline(b, func() { atomic.AddUint64(word, 1) }, func() {
			if _, err := acc.FetchAdd(mr.RKey, pd, va, 1); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("CompareSwap", func(b *testing.B) {
		withBaseline(b, func() { atomic.AddUint64(word, 1) }, func() {
			if _, err := acc.CompareSwap(mr.RKey, pd, va, 5, 6); err != nil {
				b.Fatal(err)
			}
		})
	})
}
