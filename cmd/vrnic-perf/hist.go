package main

import (
	"math"
	"math/bits"
	"time"
)

// histogram records latencies in nanoseconds without allocating, with a
// bounded relative error, like HdrHistogram: values below 128 ns have
// their own bucket; above, each power of two is split into 64 buckets, so
// a bucket spans at most 1/64 (1.6 %) of its value. Minimum, maximum and
// mean are exact.
//
// Bucket index of v: with s = max(0, bitlen(v) - 7) and m = v >> s
// (64 <= m < 128 when s > 0), index = 64·s + m.
type histogram struct {
	counts   [histBuckets]uint64
	n        uint64
	sum      float64
	min, max uint64
}

const histBuckets = 64*58 + 128

func (h *histogram) reset() { *h = histogram{min: math.MaxUint64} }

func histIndex(v uint64) int {
	s := max(bits.Len64(v)-7, 0)
	return 64*s + int(v>>s)
}

// histLow is the smallest value of bucket i.
func histLow(i int) uint64 {
	if i < 128 {
		return uint64(i)
	}
	s := i/64 - 1
	m := uint64(i - 64*s)
	return m << s
}

func (h *histogram) add(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

// quantile returns the q-quantile (0 < q <= 1) by the nearest-rank method:
// the middle of the bucket holding the smallest value with at least q of
// the values at or below it, clamped to the exact minimum and maximum.
func (h *histogram) quantile(q float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo := histLow(i)
			hi := histLow(i + 1)
			return min(max((lo+hi-1)/2, h.min), h.max)
		}
	}
	return h.max
}

// latencyStats are the figures of a latency test in nanoseconds.
type latencyStats struct {
	Samples uint64  `json:"samples"`
	Min     uint64  `json:"min_ns"`
	P50     uint64  `json:"p50_ns"`
	P99     uint64  `json:"p99_ns"`
	P999    uint64  `json:"p999_ns"`
	Max     uint64  `json:"max_ns"`
	Avg     float64 `json:"avg_ns"`
}

func (h *histogram) stats() *latencyStats {
	if h.n == 0 {
		return &latencyStats{}
	}
	return &latencyStats{Samples: h.n, Min: h.min, P50: h.quantile(0.5), P99: h.quantile(0.99),
		P999: h.quantile(0.999), Max: h.max, Avg: h.sum / float64(h.n)}
}
