package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPercentile(t *testing.T) {
	seq := func(n int) []time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			d[i] = time.Duration(i + 1)
		}
		return d
	}
	for _, c := range []struct {
		name string
		in   []time.Duration
		q    float64
		want time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", seq(1), 0.999, 1},
		{"median of 10", seq(10), 0.5, 5},
		{"p99 of 100", seq(100), 0.99, 99},
		{"p99.9 of 100 is the max", seq(100), 0.999, 100},
		{"p99.9 of 2000", seq(2000), 0.999, 1998},
		{"p100", seq(7), 1, 7},
	} {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, percentile(c.in, c.q)) })
	}
}

func TestLatenciesStats(t *testing.T) {
	l := &latencies{name: "x"}
	for _, v := range []int{5, 1, 4, 2, 3} {
		l.add(time.Duration(v)*time.Microsecond, 100)
	}
	s := l.stats()
	assert.Equal(t, opStats{Name: "x", Ops: 5, Bytes: 500, P50: 3 * time.Microsecond, P99: 5 * time.Microsecond, P999: 5 * time.Microsecond}, s)
	m := merge("all", l, &latencies{d: []time.Duration{time.Microsecond * 10}, bytes: 8})
	assert.Equal(t, uint64(6), m.Ops)
	assert.Equal(t, uint64(508), m.Bytes)
	assert.Equal(t, 10*time.Microsecond, m.P999)
}

func TestPatterns(t *testing.T) {
	b := make([]byte, 64)
	fillSend(b, 42)
	assert.True(t, checkSend(b, 42))
	assert.False(t, checkSend(b, 43), "another sequence does not match")
	b[63] ^= 1
	assert.False(t, checkSend(b, 42), "one flipped bit is caught")
	fillWrite(b, 7)
	w := append([]byte(nil), b...)
	fillWrite(b, 8)
	assert.NotEqual(t, w, b)
}
