package ibverbs_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// benchCase is one comparison: a perftest program through the library
// and vrnic-perf with the same parameters.
type benchCase struct {
	name     string
	perftest []string // program and arguments
	perf     []string // vrnic-perf client arguments
	lat      bool     // latency (µs, lower is better); else message rate (Mpps)
}

// A latency case gives two figures, a bandwidth case one.
const (
	figTypical = iota // perftest t_typical, vrnic-perf p50; or Mpps
	figP99            // both programs' 99th percentile
)

// TestBenchTable measures perftest through vrnic's libibverbs against
// vrnic-perf on the same two daemons, interleaved, and prints the table
// of BENCHMARKS.md (medians and ratios library/vrnic-perf). It runs only
// with VRNIC_IBVERBS_BENCH=1 (VRNIC_IBVERBS_BENCH_ROUNDS, default 3;
// VRNIC_IBVERBS_BENCH_ONLY, a substring of the rows' names, keeps only
// the rows that have it, e.g. "_lat"):
//
//	VRNIC_IBVERBS_BENCH=1 go test -run TestBenchTable -v ./tests/ibverbs/
func TestBenchTable(t *testing.T) {
	if os.Getenv("VRNIC_IBVERBS_BENCH") != "1" {
		t.Skip("a measurement, not a test: set VRNIC_IBVERBS_BENCH=1 to run it")
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("VRNIC_IBVERBS_BENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	var out launch.Buffer
	_, err := launch.GoBuild("github.com/vrnic/vrnic/cmd/vrnic-perf", bin, "vrnic-perf", &out)
	require.NoError(t, err, "%s", out.String())
	p := startPair(t)
	// perftest's defaults: TX depth 128 and a completion every 100 WRs
	// for bandwidth, one at a time for latency; MTU 4096, no inline data
	// (the library offers none: "Max inline data : 0[B]").
	cases := []benchCase{
		{"ib_write_bw 64 KiB", []string{"ib_write_bw", "-s", "65536", "-n", "5000"},
			[]string{"-test", "write_bw", "-size", "65536", "-iters", "5000", "-depth", "128", "-cq-mod", "100"}, false},
		{"ib_write_bw 8 B", []string{"ib_write_bw", "-s", "8", "-n", "20000"},
			[]string{"-test", "write_bw", "-size", "8", "-iters", "20000", "-depth", "128", "-cq-mod", "100"}, false},
		// 20000 8-byte WRITEs take 10 to 20 ms, the time daemons and
		// programs take to get going; perftest's duration mode (-D)
		// gives the steady rate.
		{"ib_write_bw 8 B, 3 s", []string{"ib_write_bw", "-s", "8", "-D", "3"},
			[]string{"-test", "write_bw", "-size", "8", "-duration", "3s", "-depth", "128", "-cq-mod", "100"}, false},
		{"ib_send_lat 8 B", []string{"ib_send_lat", "-s", "8", "-n", "5000"},
			[]string{"-test", "send_lat", "-size", "8", "-iters", "5000"}, true},
		// Both are measured against vrnic-perf's send_lat, the issue's
		// yardstick for the library's latency.
		{"ib_write_lat 8 B", []string{"ib_write_lat", "-s", "8", "-n", "5000"},
			[]string{"-test", "send_lat", "-size", "8", "-iters", "5000"}, true},
	}
	if only := os.Getenv("VRNIC_IBVERBS_BENCH_ONLY"); only != "" {
		cases = slices.DeleteFunc(cases, func(c benchCase) bool { return !strings.Contains(c.name, only) })
		require.NotEmpty(t, cases, "no row's name contains VRNIC_IBVERBS_BENCH_ONLY=%q", only)
	}
	// lib[i][f], perf[i][f]: case i's figure f, a value per round.
	lib := make([][2][]float64, len(cases))
	perf := make([][2][]float64, len(cases))
	for r := 0; r < rounds; r++ {
		for i, c := range cases {
			testenv.NeedTool(t, c.perftest[0])
			for f, v := range runPerftest(t, p, c) {
				lib[i][f] = append(lib[i][f], v)
			}
			for f, v := range runVrnicPerf(t, p, c) {
				perf[i][f] = append(perf[i][f], v)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| test | figure | libibverbs (perftest) | vrnic-perf | ratio library/vrnic-perf |\n|---|---|---|---|---|\n")
	for i, c := range cases {
		figs := []string{"Mpps"}
		if c.lat {
			figs = []string{"latency µs (perftest t_typical, vrnic-perf p50)", "latency µs, 99th percentile"}
		}
		for f, fig := range figs {
			l, v := median(lib[i][f]), median(perf[i][f])
			ratio := l / v
			if c.lat {
				ratio = v / l // higher is better in both
			}
			fmt.Fprintf(&b, "| %s | %s | %.3g %v | %.3g %v | **%.2f** |\n", c.name, fig, l, fmtAll(lib[i][f]), v, fmtAll(perf[i][f]), ratio)
		}
	}
	t.Logf("%d rounds, medians (every round in brackets):\n%s", rounds, b.String())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func fmtAll(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, strconv.FormatFloat(x, 'g', 3, 64))
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// runPerftest runs c's perftest program and returns its message rate
// (Mpps), or its typical and 99th-percentile latency (µs). A latency
// report's figures: t_min, t_max, t_typical, t_avg, t_stdev, 99% and
// 99.9% percentile; a bandwidth report's: BW peak, BW average, MsgRate.
func runPerftest(t *testing.T, p *pair, c benchCase) []float64 {
	t.Helper()
	_, cli := pingpong(t, p, c.perftest[0], "-x", c.perftest[1:]...)
	rows := parseReport(cli)
	require.Len(t, rows, 1, "%s", cli)
	if c.lat {
		require.Len(t, rows[0].figs, 7, "%s", cli)
		return []float64{figTypical: rows[0].figs[2], figP99: rows[0].figs[5]}
	}
	return []float64{figTypical: rows[0].figs[2]}
}

// runVrnicPerf runs vrnic-perf's server on a and client on b and returns
// its message rate (Mpps), or its p50 and p99 latency (µs).
func runVrnicPerf(t *testing.T, p *pair, c benchCase) []float64 {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", p.addr[0], freeTCPPort(t))
	var sout, cout launch.Buffer
	perf := filepath.Join(bin, "vrnic-perf")
	srv, err := launch.Start(launch.Spec{Name: "vrnic-perf server", Bin: perf,
		Args: []string{"server", "-dev", filepath.Join(p.dir, "a.sock"), "-listen", addr}, Stdout: &sout, Stderr: &sout})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Stop(0, 5*time.Second) })
	deadline := time.Now().Add(10 * time.Second)
	for !listening(mustAtoi(addr[strings.LastIndex(addr, ":")+1:])) {
		require.True(t, srv.Running() && time.Now().Before(deadline), "vrnic-perf server: %s", sout.String())
		time.Sleep(10 * time.Millisecond)
	}
	cli, err := launch.Start(launch.Spec{Name: "vrnic-perf client", Bin: perf,
		Args: append([]string{"client", "-dev", filepath.Join(p.dir, "b.sock"), "-server", addr, "-json"}, c.perf...), Stdout: &cout, Stderr: &cout})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Stop(0, 5*time.Second) })
	require.True(t, cli.Wait(120*time.Second), "vrnic-perf client hangs: %s", cout.String())
	require.NoError(t, cli.Err(), "%s", cout.String())
	require.True(t, srv.Wait(10*time.Second), "vrnic-perf server: %s", sout.String())
	var res struct {
		Results []struct {
			Mops    float64 `json:"mops"`
			Latency struct {
				P50 float64 `json:"p50_ns"`
				P99 float64 `json:"p99_ns"`
			} `json:"latency"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal([]byte(cout.String()), &res), "%s", cout.String())
	require.Len(t, res.Results, 1)
	if l := res.Results[0].Latency; c.lat {
		return []float64{figTypical: l.P50 / 1000, figP99: l.P99 / 1000}
	}
	return []float64{figTypical: res.Results[0].Mops}
}
