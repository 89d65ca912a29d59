package ibverbs_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/mwprogs"
	"github.com/vrnic/vrnic/internal/testenv"
)

// mwBenchCase is one figure of TestMiddlewareBenchTable: run returns a
// latency in µs (one way, as perftest's t_typical and ucx_perftest's
// latency are: half a round trip) or a bandwidth in MB/s (2^20 bytes).
type mwBenchCase struct {
	name, unit string
	run        func(t *testing.T) float64
}

// TestMiddlewareBenchTable measures, interleaved on the same two daemons,
// perftest (ib_send_lat, ib_write_bw) and what middleware gets from the
// same device through the same library (ucx_perftest over rc_verbs,
// libfabric's fi_pingpong over MSG and RDM endpoints), and
// prints the table of BENCHMARKS.md with each middleware figure as a ratio
// to perftest's. It runs only with VRNIC_MW_BENCH=1
// (VRNIC_MW_BENCH_ROUNDS, default 3):
//
//	VRNIC_MW_BENCH=1 go test -run TestMiddlewareBenchTable -v ./tests/ibverbs/
func TestMiddlewareBenchTable(t *testing.T) {
	if os.Getenv("VRNIC_MW_BENCH") != "1" {
		t.Skip("a measurement, not a test: set VRNIC_MW_BENCH=1 to run it")
	}
	rounds := 3
	if r, err := strconv.Atoi(os.Getenv("VRNIC_MW_BENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	for _, tool := range []string{"ib_send_lat", "ib_write_bw", "ucx_perftest", "fi_pingpong"} {
		testenv.NeedTool(t, tool)
	}
	p := startPair(t)
	e := mwEnv(p)
	perftest := func(prog string, fig int, args ...string) func(t *testing.T) float64 {
		return func(t *testing.T) float64 {
			_, cli := pingpong(t, p, prog, "-x", args...)
			rows := parseReport(cli)
			require.Len(t, rows, 1, "%s", cli)
			return rows[0].figs[fig]
		}
	}
	ucx := func(test string, size, iters int, lat bool) func(t *testing.T) float64 {
		return func(t *testing.T) float64 {
			r := mwprogs.UCXPerftest(t, e, "rc_verbs,ud_verbs", test, iters, size)
			if lat {
				return r.LatAvgUsec
			}
			return r.BWOverallMB
		}
	}
	fi := func(ep string, size int, lat bool) func(t *testing.T) float64 {
		return func(t *testing.T) float64 {
			iters := 2000
			if size > 4096 {
				iters = 500
			}
			r := mwprogs.FIPingpong(t, e, "verbs", ep, false, iters, size)
			if lat {
				return r.Usec
			}
			return r.MBps
		}
	}
	cases := []mwBenchCase{
		{"ib_send_lat 8 B (t_typical)", "µs", perftest("ib_send_lat", 2, "-s", "8", "-n", "5000")},
		{"ucx_perftest tag_lat 8 B, rc_verbs (average)", "µs", ucx("tag_lat", 8, 5000, true)},
		{"ib_write_bw 64 KiB (BW average)", "MB/s", perftest("ib_write_bw", 1, "-s", "65536", "-n", "5000")},
		{"ucx_perftest ucp_put_bw 64 KiB, rc_verbs", "MB/s", ucx("ucp_put_bw", 65536, 5000, false)},
		{"ucx_perftest tag_bw 64 KiB, rc_verbs", "MB/s", ucx("tag_bw", 65536, 5000, false)},
		{"fi_pingpong -e msg 64 B (usec/xfer)", "µs", fi("msg", 64, true)},
		{"fi_pingpong -e rdm 64 B (usec/xfer)", "µs", fi("rdm", 64, true)},
		{"fi_pingpong -e msg 64 KiB (MB/sec: a ping-pong, one message at a time)", "MB/s", fi("msg", 65536, false)},
	}
	got := make([][]float64, len(cases))
	for range rounds {
		for i, c := range cases {
			t.Run(fmt.Sprint(i), func(t *testing.T) { got[i] = append(got[i], c.run(t)) })
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| test | median | every round | vs. perftest |\n|---|---|---|---|\n")
	base := map[string]float64{"µs": median(got[0]), "MB/s": median(got[2])}
	for i, c := range cases {
		m := median(got[i])
		ratio := m / base[c.unit]
		if c.unit == "µs" {
			ratio = base[c.unit] / m // higher is better in both
		}
		fmt.Fprintf(&b, "| %s | %.3g %s | %v | %.2f |\n", c.name, m, c.unit, fmtAll(got[i]), ratio)
	}
	t.Logf("%d rounds:\n%s", rounds, b.String())
}
