package main

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
)

func TestHistogramQuantiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		{"small", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(120)) }},
		{"microseconds", func(r *rand.Rand) time.Duration { return time.Duration(1000 + r.IntN(50000)) }},
		{"long tail", func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * 20000) }},
		{"constant", func(*rand.Rand) time.Duration { return 12345 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var h histogram
			h.reset()
			var all []uint64
			for range 20000 {
				d := tc.gen(r)
				h.add(d)
				all = append(all, uint64(d))
			}
			slices.Sort(all)
			s := h.stats()
			assert.Equal(t, uint64(len(all)), s.Samples)
			assert.Equal(t, all[0], s.Min)
			assert.Equal(t, all[len(all)-1], s.Max)
			for _, q := range []struct {
				q   float64
				got uint64
			}{{0.5, s.P50}, {0.99, s.P99}, {0.999, s.P999}} {
				want := all[int(q.q*float64(len(all))+0.999999)-1]
				assert.InDelta(t, float64(want), float64(q.got), float64(want)/64+1, "q %v", q.q)
			}
		})
	}
}

func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 63, 64, 127, 128, 129, 255, 256, 1000, 1 << 20, 1<<40 + 5, 1<<63 + 1} {
		i := histIndex(v)
		require.Less(t, i, histBuckets)
		assert.GreaterOrEqual(t, i, prev, "index grows with the value")
		prev = i
		assert.LessOrEqual(t, histLow(i), v, "bucket %d starts at or below %d", i, v)
		if i+1 < histBuckets {
			assert.Greater(t, histLow(i+1), v, "next bucket starts above %d", v)
		}
	}
	var h histogram
	h.reset()
	assert.Equal(t, &latencyStats{}, h.stats(), "no samples")
}

func TestOptions(t *testing.T) {
	o := options{Atomic: atomicFetchAdd, Verify: true, QPs: 1, Depth: 128, MTU: 4096}
	require.NoError(t, o.finish())
	assert.Equal(t, writeBW, o.Test)
	assert.Equal(t, 65536, o.Size)
	assert.Equal(t, 5000, o.Iters)
	assert.Equal(t, 64, o.CQMod)
	assert.Equal(t, []int{65536}, o.sizes())

	l := options{Test: sendLat, Atomic: atomicFetchAdd, QPs: 1, Depth: 128, MTU: 1024}
	require.NoError(t, l.finish())
	assert.Equal(t, 1, l.Depth, "latency tests: one operation in flight")
	assert.Equal(t, 8, l.Size)
	assert.Equal(t, 1000, l.Iters)

	a := options{Test: atomicBW, Atomic: atomicCmpSwap, QPs: 1, Depth: 16, MTU: 4096, Size: 4096, Sweep: true}
	require.NoError(t, a.finish())
	assert.Equal(t, 8, a.Size, "atomics move 8 bytes")
	assert.False(t, a.Sweep)

	s := options{Test: readBW, Atomic: atomicFetchAdd, QPs: 1, Depth: 16, MTU: 4096, Sweep: true, Iters: 1000}
	require.NoError(t, s.finish())
	sizes := s.sizes()
	require.Len(t, sizes, 24)
	assert.Equal(t, 1, sizes[0])
	assert.Equal(t, maxSize, sizes[23])
	assert.Equal(t, 1000, s.itersFor(1))
	assert.Equal(t, minSweepIt*2, s.itersFor(maxSize), "large sizes of a sweep run fewer iterations")

	w := options{Test: writeBW, Atomic: atomicFetchAdd, QPs: 1, Depth: 16, MTU: 4096, Inline: 64, Size: 64}
	require.NoError(t, w.finish())
	assert.True(t, w.inline(64))
	assert.False(t, w.inline(65))
	assert.Equal(t, 1, w.Areas, "one message area by default")
	r := options{Test: readBW, Atomic: atomicFetchAdd, QPs: 1, Depth: 16, MTU: 4096, Inline: 64, Size: 64}
	require.NoError(t, r.finish())
	assert.False(t, r.inline(64), "READ has nothing to inline")

	for name, spoil := range map[string]func(o *options){
		"test":      func(o *options) { o.Test = "ib_write_bw" },
		"atomic":    func(o *options) { o.Atomic = "swap" },
		"size":      func(o *options) { o.Size = maxSize + 1 },
		"negative":  func(o *options) { o.Size = -1 },
		"both":      func(o *options) { o.Iters, o.Duration = 10, time.Second },
		"depth":     func(o *options) { o.Depth = maxDepth + 1 },
		"qps":       func(o *options) { o.QPs = 0 },
		"lat qps":   func(o *options) { o.Test, o.QPs = readLat, 2 },
		"events":    func(o *options) { o.Test, o.Events = writeLat, true },
		"mtu":       func(o *options) { o.MTU = 1500 },
		"inline":    func(o *options) { o.Inline = abi.MaxInline + 1 },
		"cq-mod":    func(o *options) { o.CQMod = 200 },
		"cq size":   func(o *options) { o.QPs, o.Depth = 64, 4096 },
		"rx-depth":  func(o *options) { o.RecvDepth = abi.MaxQPWR + 1 },
		"areas":     func(o *options) { o.Areas = maxAreas + 1 },
		"areas neg": func(o *options) { o.Areas = -1 },
		"areas lat": func(o *options) { o.Test, o.Areas = sendLat, 2 },
		"areas big": func(o *options) { o.Size, o.Areas = maxSize, 1024 },
	} {
		t.Run(name, func(t *testing.T) {
			o := options{Atomic: atomicFetchAdd, QPs: 1, Depth: 128, MTU: 4096}
			spoil(&o)
			assert.ErrorIs(t, o.finish(), errOption)
		})
	}
}

func TestCheckCQE(t *testing.T) {
	ok := abi.CQE{Status: abi.WCSuccess}
	assert.NoError(t, checkCQE(&ok, "write_bw"))
	for _, st := range []abi.WCStatus{abi.WCRemAccessErr, abi.WCRemInvReqErr, abi.WCStatus(200)} {
		c := abi.CQE{Status: st, QPNum: 0x11, WrID: 7, Opcode: abi.WCOpcode(abi.WRRDMAWrite)}
		err := checkCQE(&c, "write_bw")
		require.ErrorIs(t, err, errCompletion)
		assert.Contains(t, err.Error(), "QP 0x11 WR 7")
		assert.Contains(t, err.Error(), st.String())
	}
}

func TestFillPattern(t *testing.T) {
	a, b, c := make([]byte, 4096), make([]byte, 4096), make([]byte, 4096)
	fillPattern(a, 4096, 0)
	fillPattern(b, 4096, 0)
	fillPattern(c, 4096, 1)
	assert.Equal(t, a, b, "both sides compute the same data")
	assert.NotEqual(t, a, c, "each QP has its own data")
	d := make([]byte, 13)
	fillPattern(d, 13, 0)
	assert.NotEqual(t, make([]byte, 13), d, "short and odd sizes are filled")
	assert.NotEqual(t, checksum(a), checksum(c))
}

func TestReportJSON(t *testing.T) {
	rs := []result{{Test: sendLat, Size: 8, Ops: 10, Latency: &latencyStats{Samples: 10, Min: 1000}}}
	var b []byte
	w := &launch.Buffer{}
	require.NoError(t, writeJSON(w, rs))
	b = []byte(w.String())
	var r report
	require.NoError(t, json.Unmarshal(b, &r))
	assert.Equal(t, rs, r.Results)
	tw := &launch.Buffer{}
	o := options{Test: sendLat, QPs: 1, Depth: 1, MTU: 4096, CQMod: 1}
	writeTable(tw, &o, rs)
	assert.Contains(t, tw.String(), "one-way = round trip / 2")
	assert.Contains(t, tw.String(), "1.00") // min 1000 ns in µs
}

// FuzzDecodeMessage: any line from the peer is either refused with an
// error or yields a message within the limits the code relies on.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"kind":"hello","options":{"test":"write_bw","atomic":"fetch_add","size":4096,"iters":10,"depth":16,"qps":2,"mtu":4096,"cq_mod":4,"verify":true},"qps":[{"qpn":17,"psn":5,"rkey":3,"addr":4096,"len":8192}]}`))
	f.Add([]byte(`{"kind":"start","size":1,"iters":5}`))
	f.Add([]byte(`{"kind":"done","size":64,"sent":[1,2,3],"checksum":77}`))
	f.Add([]byte(`{"kind":"verdict","counters":{"retransmits":3}}`))
	f.Add([]byte(`{"kind":"error","error":"x"}`))
	f.Add([]byte(`{"kind":"start","size":99999999}`))
	f.Add([]byte(`{"kind":"hello","qps":[{"qpn":16777216}]}`))
	f.Add([]byte(`{"kind":"hello","options":{"test":"write_lat","qps":9,"depth":1,"mtu":4096,"atomic":"fetch_add"}}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := decodeMessage(line)
		if err != nil {
			assert.ErrorIs(t, err, errProtocol)
			return
		}
		assert.LessOrEqual(t, len(m.QPs), maxQPs)
		assert.LessOrEqual(t, len(m.Sent), maxQPs)
		assert.True(t, m.Size >= 0 && m.Size <= maxSize)
		for _, q := range m.QPs {
			assert.Less(t, q.QPN, uint32(1<<24))
			assert.Less(t, q.PSN, uint32(1<<24))
		}
		if o := m.Options; o != nil {
			assert.NoError(t, o.finish(), "options accepted once stay valid")
			assert.True(t, o.Size >= 1 && o.Size <= maxSize)
			assert.True(t, o.QPs >= 1 && o.QPs <= maxQPs)
			assert.True(t, o.CQMod >= 1 && o.CQMod <= o.Depth)
			assert.NotZero(t, rcpair.MTU(o.MTU))
		}
	})
}
