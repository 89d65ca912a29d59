package cc

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultParamsAreMLX5(t *testing.T) {
	p := DefaultParams()
	require.NoError(t, p.Validate())
	// kernel-notes/congestion.md: the mlx5 / NVIDIA firmware defaults.
	assert.Equal(t, 300*time.Microsecond, p.TimeReset)
	assert.Equal(t, uint64(32767), p.ByteReset)
	assert.Equal(t, uint32(1), p.Threshold)
	assert.Equal(t, Mbps(5), p.AIRate)
	assert.Equal(t, Mbps(50), p.HAIRate)
	assert.Equal(t, uint32(11), p.GD)
	assert.Equal(t, uint32(50), p.MinDecFac)
	assert.Equal(t, Mbps(1), p.MinRate)
	assert.Equal(t, uint64(0), p.RateOnFirstCNP)
	assert.Equal(t, uint32(1019), p.AlphaG)
	assert.Equal(t, time.Microsecond, p.AlphaPeriod)
	assert.Equal(t, 4*time.Microsecond, p.MinTimeBetweenCNPs)
	assert.Equal(t, uint32(1023), p.InitialAlpha)
}

func TestParamsSetString(t *testing.T) {
	p := DefaultParams()
	require.NoError(t, p.Set("rpg_time_reset=1500"))
	require.NoError(t, p.Set("line_rate = 1000"))
	require.NoError(t, p.Set("rpg_ai_rate=0.5"))
	require.NoError(t, p.Set("dce_tcp_g=1000"))
	require.NoError(t, p.Validate())
	assert.Equal(t, 1500*time.Microsecond, p.TimeReset)
	assert.Equal(t, Mbps(1000), p.LineRate)
	assert.Equal(t, uint64(500_000), p.AIRate)
	assert.Equal(t, uint32(1000), p.AlphaG)
	s := p.String()
	assert.Contains(t, s, "rpg_time_reset=1500")
	assert.Contains(t, s, "line_rate=1000")
	// String's output is Set's input: every pair reads back the same.
	var q Params
	for _, kv := range strings.Fields(s) {
		require.NoError(t, q.Set(kv), kv)
	}
	assert.Equal(t, p, q)

	for _, bad := range []string{"nope=1", "rpg_gd", "rpg_gd=x", "rpg_ai_rate=-1", "dce_tcp_g=99999999999"} {
		assert.ErrorIs(t, p.Set(bad), ErrParam, bad)
	}
	for _, bad := range []string{"rpg_gd=3", "dce_tcp_g=0", "rpg_min_rate=0", "rpg_min_dec_fac=101", "line_rate=0", "pace_burst=10", "rpg_time_reset=0"} {
		q := DefaultParams()
		require.NoError(t, q.Set(bad))
		assert.ErrorIs(t, q.Validate(), ErrParam, bad)
	}
}

func TestFirstCNPCutsFromLineRate(t *testing.T) {
	p := DefaultParams()
	var r RP
	r.Init(&p)
	require.False(t, r.Active())
	assert.Equal(t, p.LineRate, r.Rate())
	now := int64(1_000_000)
	next := r.OnCNP(now)
	require.True(t, r.Active())
	assert.Equal(t, now+int64(p.TimeReset), next)
	// α = 1023/1024: Rc = L(1 - 1023/2048), above min_dec_fac's 50 %.
	want := float64(p.LineRate) * (1 - 1023.0/2048)
	assert.InDelta(t, want, float64(r.Rate()), 1)
	assert.Equal(t, p.LineRate, r.Target())
	// α after the CNP: α·g + (1-g).
	g := 1019.0 / 1024
	a := 1023.0/1024*g + (1 - g)
	assert.Equal(t, uint32(a*1024+0.5), r.Alpha(now))

	// A second CNP in the same α period: Rt = Rc, cut by α/2 again.
	rc := float64(r.Rate())
	r.OnCNP(now)
	assert.InDelta(t, rc, float64(r.Target()), 1)
	assert.InDelta(t, rc*(1-a/2), float64(r.Rate()), 2)
}

func TestRateOnFirstCNPAndFloors(t *testing.T) {
	p := DefaultParams()
	p.RateOnFirstCNP = Mbps(2000)
	p.MinDecFac = 90 // one cut keeps at least 90 %
	var r RP
	r.Init(&p)
	r.OnCNP(0)
	assert.InDelta(t, float64(Mbps(1800)), float64(r.Rate()), 1)
	// Many CNPs: never below rpg_min_rate.
	p.MinDecFac = 0
	for i := range 200 {
		r.OnCNP(int64(i))
	}
	assert.Equal(t, p.MinRate, r.Rate())
}

func TestAlphaDecaysPerPeriod(t *testing.T) {
	p := DefaultParams()
	p.AlphaPeriod = 10 * time.Microsecond
	var r RP
	r.Init(&p)
	r.OnCNP(0)
	a0 := float64(r.Alpha(0)) / 1024
	g := 1019.0 / 1024
	for _, k := range []int64{1, 5, 50, 400} {
		now := k * int64(p.AlphaPeriod)
		want := a0 * math.Pow(g, float64(k))
		assert.InDelta(t, want, float64(r.Alpha(now))/1024, 1.0/1024, "after %d periods", k)
	}
	// A partial period decays nothing more.
	a := r.Alpha(400*int64(p.AlphaPeriod) + 9_999)
	assert.Equal(t, a, r.Alpha(400*int64(p.AlphaPeriod)))
}

func TestIncreaseStages(t *testing.T) {
	p := DefaultParams()
	p.RateOnFirstCNP = Mbps(2000) // room below the line rate for Rt to grow
	var r RP
	r.Init(&p)
	now := int64(0)
	next := r.OnCNP(now)
	rt := float64(r.Target())

	// Timer expiry 1 (T=1, BC=0): fast recovery, Rt unchanged, Rc halfway.
	rc := float64(r.Rate())
	now = next
	next = r.OnTimer(now)
	require.NotZero(t, next)
	assert.InDelta(t, rt, float64(r.Target()), 1)
	assert.InDelta(t, (rt+rc)/2, float64(r.Rate()), 1)

	// Expiry 2 (T=2 > F, BC=0 ≤ F): additive, Rt += ai.
	now = next
	next = r.OnTimer(now)
	assert.InDelta(t, rt+float64(p.AIRate), float64(r.Target()), 1)
	rt = float64(r.Target())

	// Two byte-counter expiries (BC=2 > F, T=2 > F): hyper, Rt += hai.
	r.OnSent(p.ByteReset - 1)
	assert.InDelta(t, rt, float64(r.Target()), 1, "no expiry before rpg_byte_reset bytes")
	assert.True(t, r.OnSent(1)) // BC=1: additive
	assert.InDelta(t, rt+float64(p.AIRate), float64(r.Target()), 1)
	rt = float64(r.Target())
	assert.True(t, r.OnSent(p.ByteReset)) // BC=2: hyper
	assert.InDelta(t, rt+float64(p.HAIRate), float64(r.Target()), 1)

	// Timers alone bring it back to the line rate; then unlimited, no
	// more timer.
	for i := 0; next != 0; i++ {
		require.Less(t, i, 100000)
		require.True(t, r.Active())
		now = next
		next = r.OnTimer(now)
	}
	assert.False(t, r.Active())
	assert.Equal(t, p.LineRate, r.Rate())
	assert.Zero(t, r.OnTimer(now+1))
	assert.False(t, r.OnSent(1<<20))
}

func TestNPSpacing(t *testing.T) {
	p := DefaultParams()
	var n NP
	assert.True(t, n.Allow(100, &p))
	assert.False(t, n.Allow(100+int64(p.MinTimeBetweenCNPs)-1, &p))
	assert.True(t, n.Allow(100+int64(p.MinTimeBetweenCNPs), &p))
	p.MinTimeBetweenCNPs = 0
	assert.True(t, n.Allow(100+int64(4*time.Microsecond), &p))
	assert.True(t, n.Allow(100+int64(4*time.Microsecond), &p))
}

func TestPacerLongRunRate(t *testing.T) {
	for _, tc := range []struct {
		bps   uint64
		frame int
		dur   time.Duration
	}{{Mbps(100), 1100, time.Second}, {Mbps(1), 4200, 20 * time.Second}, {Mbps(7000), 60, 10 * time.Millisecond}, {Mbps(33), 3, 10 * time.Millisecond}} {
		var pc Pacer
		assert.True(t, pc.Ready(0), "unlimited before SetRate")
		pc.SetRate(tc.bps, 16<<10, 0)
		now, sent := int64(0), 0
		for now < int64(tc.dur) {
			if !pc.Ready(now) {
				at := pc.ReadyAt(now)
				require.Greater(t, at, now)
				now = at
				require.True(t, pc.Ready(now))
			}
			pc.Spend(tc.frame)
			sent += tc.frame
		}
		got := float64(sent) * 8 / (float64(now) / 1e9)
		assert.InEpsilon(t, float64(tc.bps), got, 0.02, "%+v", tc)
	}
	// Back to unlimited.
	var pc Pacer
	pc.SetRate(Mbps(1), 4096, 0)
	pc.Spend(1 << 20)
	assert.False(t, pc.Ready(1))
	pc.SetRate(0, 4096, 1)
	assert.True(t, pc.Ready(1))
	assert.Equal(t, int64(1), pc.ReadyAt(1))
}

func TestNoAllocs(t *testing.T) {
	p := DefaultParams()
	var r RP
	r.Init(&p)
	var pc Pacer
	var n NP
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 1000
		r.OnCNP(now)
		r.OnSent(40000)
		r.OnTimer(now)
		pc.SetRate(r.Rate(), p.PaceBurst, now)
		if pc.Ready(now) {
			pc.Spend(1000)
		}
		pc.ReadyAt(now)
		n.Allow(now, &p)
	})
	assert.Zero(t, allocs)
}
