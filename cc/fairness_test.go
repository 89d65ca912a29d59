package cc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDCQCNConvergesToFairShare runs reaction points, pacers and
// notification points against a model of one bottleneck queue on a fake
// clock: n senders of 1 KiB packets into a link of capacity c whose queue
// marks CE on the packets that find more than k bytes queued; a CNP
// reaches its sender one base RTT after the marked packet. The senders
// start one after the other (the first alone at the line rate), so they
// begin far from fair. Over the second half of the run their goodputs
// must be within Jain's index 0.9 of fair, the link well used, the queue
// short and nothing dropped. The parameters are the congestion scenario's
// (tests/congestion), and the model lands where that scenario does
// (BENCHMARKS.md, "Congestion control").
func TestDCQCNConvergesToFairShare(t *testing.T) {
	p := DefaultParams()
	for _, kv := range []string{"line_rate=1000", "rpg_ai_rate=1", "rpg_hai_rate=10", "rpg_time_reset=2000",
		"dce_tcp_rtt=500", "min_time_between_cnps=500", "pace_burst=4096"} {
		require.NoError(t, p.Set(kv))
	}
	require.NoError(t, p.Validate())
	const (
		n       = 6
		pkt     = 1024
		c       = 100e6 / 8 / 1e9 // link: bytes per ns (100 Mb/s)
		k       = 2 * 12500       // mark above 2 ms of queue at 100 Mb/s
		limit   = 40 * 12500      // drop beyond 40 ms
		rtt     = int64(100 * time.Microsecond)
		step    = int64(time.Microsecond)
		runFor  = int64(20 * time.Second)
		joinGap = int64(200 * time.Millisecond)
	)
	type sender struct {
		rp      RP
		pace    Pacer
		np      NP // the receiver's, for this sender's QP
		timer   int64
		cnps    []int64 // arrival times of CNPs in flight
		start   int64
		sent    float64
		counted float64 // bytes delivered in the second half
	}
	s := make([]*sender, n)
	for i := range s {
		s[i] = &sender{start: int64(i) * joinGap}
		s[i].rp.Init(&p)
	}
	var queue, maxQueue float64
	drops, lateDrops := 0, 0
	for now := int64(0); now < runFor; now += step {
		for _, x := range s {
			if now < x.start {
				continue
			}
			for len(x.cnps) > 0 && x.cnps[0] <= now {
				x.cnps = x.cnps[1:]
				x.timer = x.rp.OnCNP(now)
				x.pace.SetRate(x.rp.Rate(), p.PaceBurst, now)
			}
			if x.timer != 0 && now >= x.timer {
				x.timer = x.rp.OnTimer(now)
				x.pace.SetRate(x.rp.Rate(), p.PaceBurst, now)
			}
			// Unlimited, a sender still cannot exceed the line rate.
			if !x.rp.Active() {
				x.pace.SetRate(p.LineRate, p.PaceBurst, now)
			}
			for x.pace.Ready(now) {
				x.pace.Spend(pkt)
				if x.rp.OnSent(pkt) {
					x.pace.SetRate(x.rp.Rate(), p.PaceBurst, now)
				}
				if queue+pkt > limit {
					drops++
					if now >= runFor/2 {
						lateDrops++
					}
					continue // tail drop: the queue holds at most 40 ms
				}
				queue += pkt
				if queue > k && x.np.Allow(now, &p) {
					x.cnps = append(x.cnps, now+rtt+int64(queue/c))
				}
				if now >= runFor/2 {
					x.counted += pkt
				}
			}
		}
		queue = max(0, queue-c*float64(step))
		if now >= runFor/2 {
			maxQueue = max(maxQueue, queue)
		}
	}
	var sum, sum2, total float64
	rates := make([]float64, n)
	for i, x := range s {
		rates[i] = x.counted * 8 / (float64(runFor/2) / 1e9) / 1e6
		sum += rates[i]
		sum2 += rates[i] * rates[i]
		total += rates[i]
	}
	jain := sum * sum / (n * sum2)
	t.Logf("Mb/s per sender %.1f, total %.1f, Jain %.3f, largest queue %.0f bytes (%.1f ms), drops %d", rates, total, jain, maxQueue, maxQueue/c/1e6, drops)
	assert.GreaterOrEqual(t, jain, 0.9)
	assert.Greater(t, total, 70.0, "the link is used")
	assert.Less(t, maxQueue, limit/2.0, "the queue stays short once converged")
	assert.Zero(t, lateDrops, "no drop once converged")
}
