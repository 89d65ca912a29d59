package main

import (
	"bufio"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// scaleLimits is a vrnicd config that lets one uid hold 100,000 QPs and
// more (1000 per context).
const scaleLimits = `{"limits": {"per_device": {"contexts": 1024, "qp": 262144, "cq": 65536, "pd": 65536},
	"per_uid": {"contexts": 1024}}}`

// scaleQPs is the number of QP pairs of the scale benchmarks:
// VRNIC_SCALE_QPS, default 100,000.
func scaleQPs(b *testing.B) int {
	n := 100000
	if v := os.Getenv("VRNIC_SCALE_QPS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err, "VRNIC_SCALE_QPS")
	}
	return n
}

// scaleDaemons starts two vrnicd (UDP link, one worker each) that accept
// many QPs.
func scaleDaemons(b *testing.B) (*daemon, *daemon) {
	cfg := filepath.Join(b.TempDir(), "limits.json")
	require.NoError(b, os.WriteFile(cfg, []byte(scaleLimits), 0o600))
	a, c, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(b, err)
	da := startDaemon(b, "scale-a", "-config", cfg, "-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String())
	dc := startDaemon(b, "scale-b", "-config", cfg, "-link", "udp", "-local", netip.AddrPortFrom(c, launch.RoCEPort).String())
	return da, dc
}

// holdIdle creates pairs connected idle QP pairs between the two daemons
// (scale -hold, in this process) and returns a function that destroys
// them and waits for the end.
func holdIdle(b *testing.B, da, dc *daemon, pairs int) func() *scaleReport {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	type res struct {
		r   *scaleReport
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := runScale(&scaleConfig{devA: da.sock, devB: dc.sock, pidA: da.pid, pidB: dc.pid, pairs: pairs,
			depth: 16, block: min(1000, pairs), perContext: 1000, hold: true, stdin: inR}, outW)
		outW.Close()
		done <- res{r, err}
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		r := <-done
		require.NoError(b, r.err)
		require.NoError(b, err)
		b.Fatalf("scale printed %q", line)
	}
	go io.Copy(io.Discard, outR)
	return func() *scaleReport {
		inW.Write([]byte("\n"))
		r := <-done
		require.NoError(b, r.err)
		return r.r
	}
}

// sendLatP runs send_lat (8 bytes) and returns its p50 and p99 in ns.
func sendLatP(b *testing.B, da, dc *daemon, iters int) [2]float64 {
	rs := perfJSON(b, da.sock, dc.sock, "-test", "send_lat", "-size", "8", "-iters", strconv.Itoa(iters))
	require.Len(b, rs, 1)
	l := rs[0].Latency
	require.NotNil(b, l)
	return [2]float64{float64(l.P50), float64(l.P99)}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkUDPSendLatIdleQPs measures send_lat (as BenchmarkUDPSendLat)
// between two vrnicd over the UDP link with no other QP, then with
// VRNIC_SCALE_QPS (default 100,000) connected idle QP pairs (one QP of
// each pair on each daemon, 1000 per context, depth 16), then again
// without them, and reports the p50 and p99 with the idle QPs over the
// same without (the mean of the two runs without): the cost of an idle QP
// to an active one.
func BenchmarkUDPSendLatIdleQPs(b *testing.B) {
	da, dc := scaleDaemons(b)
	iters := max(b.N, 5000)
	b.ResetTimer()
	none1 := sendLatP(b, da, dc, iters)
	release := holdIdle(b, da, dc, scaleQPs(b))
	idle1 := sendLatP(b, da, dc, iters)
	idle2 := sendLatP(b, da, dc, iters)
	r := release()
	none2 := sendLatP(b, da, dc, iters)
	b.StopTimer()
	for i, name := range []string{"p50", "p99"} {
		base := (none1[i] + none2[i]) / 2
		idle := (idle1[i] + idle2[i]) / 2
		b.ReportMetric(base, name+"-none-ns")
		b.ReportMetric(idle, name+"-idle-ns")
		b.ReportMetric(idle/base, name+"-ratio")
		b.Logf("%s: without idle QPs %.1f, %.1f µs; with %d idle pairs %.1f, %.1f µs; ratio %.2f",
			name, none1[i]/1e3, none2[i]/1e3, r.Pairs, idle1[i]/1e3, idle2[i]/1e3, idle/base)
	}
}

// BenchmarkQPScale creates VRNIC_SCALE_QPS (default 100,000) QP pairs
// between two vrnicd over the UDP link, one QP of each pair on each
// daemon, connects each pair (RESET → RTS both ways), then destroys
// them, timing blocks of 1000 pairs. It reports the time per pair of the
// last block created over the first's (create-ratio), of the first block
// destroyed (every pair present) over the last's (destroy-ratio), and
// each daemon's anonymous resident memory per idle QP (RssAnon with every
// pair over before the first, divided by the pairs).
func BenchmarkQPScale(b *testing.B) {
	da, dc := scaleDaemons(b)
	pairs := scaleQPs(b)
	b.ResetTimer()
	r, err := runScale(&scaleConfig{devA: da.sock, devB: dc.sock, pidA: da.pid, pidB: dc.pid, pairs: pairs,
		depth: 16, block: min(1000, pairs), perContext: 1000}, io.Discard)
	b.StopTimer()
	require.NoError(b, err)
	b.ReportMetric(r.Create[0], "create-first-us/pair")
	b.ReportMetric(r.Create[len(r.Create)-1], "create-last-us/pair")
	b.ReportMetric(r.CreateRatio, "create-ratio")
	b.ReportMetric(r.Destroy[0], "destroy-first-us/pair")
	b.ReportMetric(r.Destroy[len(r.Destroy)-1], "destroy-last-us/pair")
	b.ReportMetric(r.DestroyRatio, "destroy-ratio")
	b.ReportMetric(r.BytesPerQP[0], "rss-a-B/qp")
	b.ReportMetric(r.BytesPerQP[1], "rss-b-B/qp")
	var w strings.Builder
	writeScale(&w, r)
	b.Log("\n" + w.String())
}

// BenchmarkUDPWriteBWManyQPs measures write_bw of 64 KiB messages between
// two vrnicd over the UDP link on one QP (16 outstanding) and on
// VRNIC_MANY_QPS (default 1000) QPs posted in turn (16 outstanding over
// all of them), interleaved, two rounds each, and reports the many-QP
// aggregate over the one-QP rate (medians).
func BenchmarkUDPWriteBWManyQPs(b *testing.B) {
	da, dc := scaleDaemons(b)
	many := 1000
	if v := os.Getenv("VRNIC_MANY_QPS"); v != "" {
		var err error
		many, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	dur := "3s"
	run := func(args ...string) float64 {
		rs := perfJSON(b, da.sock, dc.sock, append([]string{"-test", "write_bw", "-size", "65536", "-duration", dur}, args...)...)
		require.Len(b, rs, 1)
		return rs[0].MBps
	}
	b.ResetTimer()
	var one, all []float64
	for range 2 {
		one = append(one, run("-qps", "1", "-depth", "16"))
		all = append(all, run("-qps", strconv.Itoa(many), "-depth", "1", "-total-depth", "16"))
	}
	b.StopTimer()
	b.ReportMetric(median(one), "one-MB/s")
	b.ReportMetric(median(all), "many-MB/s")
	b.ReportMetric(median(all)/median(one), "ratio")
	b.Logf("one QP %v MB/s; %d QPs %v MB/s", one, many, all)
}
