package engine

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cowAHTable is the AHTable this package had before, kept as the
// benchmarks' baseline: an immutable map published with one atomic store,
// copied whole by every Set and Delete.
type cowAHTable struct {
	mu sync.Mutex
	m  atomic.Pointer[map[uint32]*AH]
}

func (t *cowAHTable) Lookup(h uint32) *AH {
	m := t.m.Load()
	if m == nil {
		return nil
	}
	return (*m)[h]
}

func (t *cowAHTable) Set(h uint32, a *AH) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var old map[uint32]*AH
	if p := t.m.Load(); p != nil {
		old = *p
	}
	m := make(map[uint32]*AH, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if a != nil {
		m[h] = a
	} else {
		delete(m, h)
	}
	t.m.Store(&m)
}

func (t *cowAHTable) Delete(h uint32) { t.Set(h, nil) }

// ahTableLike is what the benchmarks use of both tables.
type ahTableLike interface {
	Set(h uint32, a *AH)
	Delete(h uint32)
	Lookup(h uint32) *AH
}

// ahFillRelease adds n AHs to t (handles spaced out as a context's are)
// then removes them all: the life of a context's AHs.
func ahFillRelease(t ahTableLike, n int, a *AH) {
	for i := range uint32(n) {
		t.Set(3*i+1, a)
	}
	for i := range uint32(n) {
		t.Delete(3*i + 1)
	}
}

// BenchmarkAHTableAddRemove: a context's AHs added then removed, per AH
// (ns/AH), at 64 and 4096 AHs (the default per-client limit), against
// the copy-on-write map of before measured in the same run (cow-ns/AH,
// x-cow: how many times the old cost). The table's cost per AH stays flat
// from 64 to 4096; the old one grows with the number of AHs.
func BenchmarkAHTableAddRemove(b *testing.B) {
	a := testAH(1)
	for _, n := range []int{64, 4096} {
		var cowB *testing.B // the baseline is quadratic: measured once per b
		var cow float64
		b.Run(fmt.Sprintf("ahs=%d", n), func(b *testing.B) {
			if b != cowB {
				cowB = b
				rounds := max(1, (1<<22)/(n*n))
				start := time.Now()
				for range rounds {
					ahFillRelease(&cowAHTable{}, n, a)
				}
				cow = float64(time.Since(start).Nanoseconds()) / float64(rounds*2*n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				ahFillRelease(&AHTable{}, n, a)
			}
			b.StopTimer()
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N*2*n)
			b.ReportMetric(ns, "ns/AH")
			b.ReportMetric(cow, "cow-ns/AH")
			b.ReportMetric(cow/ns, "x-cow")
		})
	}
}

// ahChurn does ops rounds of DESTROY_AH of the oldest of n AHs (handles
// next-n .. next-1) and CREATE_AH of a new one, and returns the next
// handle.
func ahChurn(t ahTableLike, n int, next uint32, ops int, a *AH) uint32 {
	for range ops {
		t.Delete(next - uint32(n))
		t.Set(next, a)
		next++
	}
	return next
}

// BenchmarkAHTableChurn: one op is the removal of the oldest AH and the
// addition of a new one while the table holds 64 or 4096 AHs, against
// the copy-on-write map of before in the same run (cow-ns/op, x-cow). The
// table's cost per op does not depend on the number of AHs; the old one
// copied them all twice.
func BenchmarkAHTableChurn(b *testing.B) {
	a := testAH(1)
	for _, n := range []int{64, 4096} {
		b.Run(fmt.Sprintf("ahs=%d", n), func(b *testing.B) {
			var cow cowAHTable
			m := make(map[uint32]*AH, n)
			for h := range uint32(n) {
				m[h] = a
			}
			cow.m.Store(&m)
			ops := max(1, min(b.N, (1<<20)/n))
			start := time.Now()
			ahChurn(&cow, n, uint32(n), ops, a)
			cowNs := float64(time.Since(start).Nanoseconds()) / float64(ops)

			var tab AHTable
			next := ahChurn(&tab, 0, 0, n, a) // fill
			b.ReportAllocs()
			b.ResetTimer()
			ahChurn(&tab, n, next, b.N, a)
			b.StopTimer()
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(cowNs, "cow-ns/op")
			b.ReportMetric(cowNs/ns, "x-cow")
		})
	}
}

// BenchmarkAHTableLookup: the worker's lookup among 4096 AHs (hits and
// misses; 0 allocs/op), against the old map's lookup in the same run
// (x-cow: the table's time over the map's).
func BenchmarkAHTableLookup(b *testing.B) {
	const n = 4096
	a := testAH(1)
	var tab AHTable
	var cow cowAHTable
	for i := range uint32(n) {
		tab.Set(3*i+1, a)
		cow.Set(3*i+1, a)
	}
	var hits int
	run := func(t ahTableLike, ops int) time.Duration {
		start := time.Now()
		for i := range ops {
			if t.Lookup(uint32(i)&(4*n-1)) != nil {
				hits++
			}
		}
		return time.Since(start)
	}
	base := run(&cow, max(b.N, 100_000))
	baseNs := float64(base.Nanoseconds()) / float64(max(b.N, 100_000))
	b.ReportAllocs()
	b.ResetTimer()
	run(&tab, b.N)
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns/baseNs, "x-cow")
	if hits == 0 {
		b.Fatal("no hit")
	}
}
