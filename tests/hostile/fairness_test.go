package hostile

// Fairness under control-path load (issue #12): the victim's operation
// latencies on a daemon with one engine worker, alone and while the
// control path is flooded (the bad-datagram flood, 3,000 connections
// opened and closed, 50 clients with traffic killed mid-work), in one run
// on one daemon.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fairnessUnloaded is how long the victim's latencies are measured alone
// (about as long as the load lasts, so that both worst cases come from
// about as many operations).
const fairnessUnloaded = 5 * time.Second

// latStats summarizes latencies.
type latStats struct {
	n                  int
	p50, p99, worst    time.Duration // of every operation
	p99Data, worstData time.Duration // of the RDMA WRITEs and READs
	p99Ctl, worstCtl   time.Duration // of the commands (QUERY_DEVICE)
}

func (s latStats) String() string {
	return fmt.Sprintf("%d ops: p50 %v, p99 %v, worst %v (RDMA: p99 %v, worst %v; commands: p99 %v, worst %v)",
		s.n, s.p50, s.p99, s.worst, s.p99Data, s.worstData, s.p99Ctl, s.worstCtl)
}

// latSummary summarizes the victim's samples (takeLatencies: WRITE,
// READ, QUERY_DEVICE, repeated).
func latSummary(l []time.Duration) latStats {
	var data, ctl []time.Duration
	for i, d := range l {
		if i%3 == 2 {
			ctl = append(ctl, d)
		} else {
			data = append(data, d)
		}
	}
	pct := func(s []time.Duration, p float64) time.Duration {
		if len(s) == 0 {
			return 0
		}
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	l = slices.Clone(l)
	for _, s := range [][]time.Duration{l, data, ctl} {
		slices.Sort(s)
	}
	return latStats{n: len(l), p50: pct(l, 0.50), p99: pct(l, 0.99), worst: pct(l, 1),
		p99Data: pct(data, 0.99), worstData: pct(data, 1), p99Ctl: pct(ctl, 0.99), worstCtl: pct(ctl, 1)}
}

// fairnessArgsEnv adds arguments to the fairness daemon's command line
// (-cpuprofile FILE, -trace FILE: where its time goes under the load).
const fairnessArgsEnv = "VRNIC_FAIRNESS_DAEMON_ARGS"

// fairnessResult is one fairness run.
type fairnessResult struct {
	unloaded, loaded latStats
	load             time.Duration
	flood            floodReport
	killed           killedStats
}

// fairnessRun starts a daemon (in-memory link, one worker) and the
// victim, measures the victim alone for fairnessUnloaded, then under the
// control-path load, and checks the daemon recovers.
func fairnessRun(t testing.TB, seed uint64) fairnessResult {
	e := opsSetup(t)
	d := e.opsStartDaemon(t, "fair0", strings.Fields(os.Getenv(fairnessArgsEnv))...)
	v := memHelperNewVictim(t, d.socket)
	base := loadBaseline(t, d, v)
	var r fairnessResult

	v.takeLatencies()
	time.Sleep(fairnessUnloaded)
	r.unloaded = latSummary(v.takeLatencies())

	start := time.Now()
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		r.killed = killedRun(t, e, d, seed, 50, 10)
	}()
	defer func() { <-killed }() // also when the flood fails t
	r.flood = floodRun(t, e, d, floodConfig{Seed: seed, Senders: 4, Msgs: 2500, Deaf: 400, Churn: 3000, Parallel: 8,
		VictimQPNs: []uint32{v.qpA.QPN, v.qpB.QPN}})
	<-killed
	r.load = time.Since(start)
	r.loaded = latSummary(v.takeLatencies())
	_, st := v.progress()
	require.NoError(t, st.err, "the victim failed under the load")
	assert.Empty(t, r.killed.errors, "killed clients that did not get to their kill point")
	assert.Empty(t, r.flood.Errors, "the flood client's connections")
	assert.Zero(t, r.flood.ForeignOK, "commands on the victim's QPs that succeeded")
	loadCheckRecovered(t, d, v, base)
	return r
}

// fairnessWorstBound is the probe's liveness bound on the victim's worst
// operation under the load. Not a performance figure (the machines the
// tests run on are shared): the benchmark below measures.
const fairnessWorstBound = time.Second

// TestFairnessControlFlood: with one engine worker, the victim's worst
// operation (RDMA WRITE, RDMA READ, QUERY_DEVICE) while the control path
// is flooded stays under a second. It logs both worst cases and the
// ratio; BenchmarkVictimUnderControlFlood reports them as metrics.
func TestFairnessControlFlood(t *testing.T) {
	seed := hostileSeed(t)
	r := fairnessRun(t, seed)
	t.Logf("victim alone:      %v", r.unloaded)
	t.Logf("victim under load: %v", r.loaded)
	t.Logf("load %v: flood %d datagrams, %d connections, clients killed at %v",
		r.load.Round(time.Millisecond), r.flood.Sent+r.flood.DeafSent, r.flood.ChurnOpened, r.killed.at)
	t.Logf("worst-case ratio %.1f", float64(r.loaded.worst)/float64(max(r.unloaded.worst, 1)))
	assert.Positive(t, r.loaded.n, "the victim did no operation under the load")
	assert.Less(t, r.loaded.worst, fairnessWorstBound, "the victim's worst operation under the control-path load")
}

// BenchmarkVictimUnderControlFlood measures the victim's operation
// latencies alone and under the control-path load of
// TestFairnessControlFlood, in one run on one daemon (-workers 1), and
// reports them (µs) and the ratios of the worst cases and p99s. Each
// iteration is one whole run (about 20 s): run it with -benchtime 1x.
func BenchmarkVictimUnderControlFlood(b *testing.B) {
	seed := hostileSeed(b)
	var r fairnessResult
	for i := range b.N {
		r = fairnessRun(b, seed+uint64(i))
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(r.unloaded.worst), "unloaded-worst-µs")
	b.ReportMetric(us(r.loaded.worst), "flooded-worst-µs")
	b.ReportMetric(us(r.loaded.worst)/max(us(r.unloaded.worst), 1), "worst-ratio")
	b.ReportMetric(us(r.unloaded.p99), "unloaded-p99-µs")
	b.ReportMetric(us(r.loaded.p99), "flooded-p99-µs")
	b.ReportMetric(us(r.loaded.p99)/max(us(r.unloaded.p99), 1), "p99-ratio")
	b.ReportMetric(us(r.unloaded.worstData), "unloaded-worst-rdma-µs")
	b.ReportMetric(us(r.loaded.worstData), "flooded-worst-rdma-µs")
	b.ReportMetric(us(r.unloaded.worstCtl), "unloaded-worst-cmd-µs")
	b.ReportMetric(us(r.loaded.worstCtl), "flooded-worst-cmd-µs")
	b.ReportMetric(float64(r.loaded.n), "flooded-ops")
	b.Logf("alone %v; under load %v (load %v)", r.unloaded, r.loaded, r.load.Round(time.Millisecond))
}
