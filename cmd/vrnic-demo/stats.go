package main

import (
	"slices"
	"time"
)

// latencies collects per-operation latencies of one kind.
type latencies struct {
	name  string
	bytes uint64
	d     []time.Duration
}

func (l *latencies) add(d time.Duration, n int) {
	l.d = append(l.d, d)
	l.bytes += uint64(n)
}

// percentile returns the q-quantile (0 < q <= 1) of sorted by the
// nearest-rank method: the smallest value with at least q of the values
// at or below it.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted)) + 0.999999999)
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// stats sorts the latencies and summarises them.
func (l *latencies) stats() opStats {
	slices.Sort(l.d)
	return opStats{Name: l.name, Ops: uint64(len(l.d)), Bytes: l.bytes,
		P50: percentile(l.d, 0.50), P99: percentile(l.d, 0.99), P999: percentile(l.d, 0.999)}
}

// merge summarises several kinds together.
func merge(name string, ls ...*latencies) opStats {
	all := &latencies{name: name}
	for _, l := range ls {
		all.d = append(all.d, l.d...)
		all.bytes += l.bytes
	}
	return all.stats()
}
