package main

import (
	"bufio"
	"io"
	"net/netip"
	"os"
	"os/exec"
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
// many QPs, on the loopback addresses given or, if one is taken, two free
// ones.
func scaleDaemons(b *testing.B, addrA, addrB string) (*daemon, *daemon) {
	cfg := filepath.Join(b.TempDir(), "limits.json")
	require.NoError(b, os.WriteFile(cfg, []byte(scaleLimits), 0o600))
	a, c, err := launch.LoopbackPair(netip.MustParseAddr(addrA), netip.MustParseAddr(addrB))
	require.NoError(b, err)
	da := startDaemon(b, "scale-a", "-config", cfg, "-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String())
	dc := startDaemon(b, "scale-b", "-config", cfg, "-link", "udp", "-local", netip.AddrPortFrom(c, launch.RoCEPort).String())
	return da, dc
}

// sendLatP runs send_lat (8 bytes) and returns its p50 and p99 in ns.
func sendLatP(b *testing.B, da, dc *daemon, iters int) [2]float64 {
	rs := perfJSON(b, da.sock, dc.sock, "-test", "send_lat", "-size", "8", "-iters", strconv.Itoa(iters))
	require.Len(b, rs, 1)
	l := rs[0].Latency
	require.NotNil(b, l)
	return [2]float64{float64(l.P50), float64(l.P99)}
}

// median is the middle value of v, or the mean of the two middle ones.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

// BenchmarkUDPSendLatIdleQPs measures send_lat (8 bytes, 20,000
// iterations) between two vrnicd over the UDP link that hold
// VRNIC_SCALE_QPS (default 100,000) connected idle QP pairs (one QP of
// each pair on each daemon, 1000 per context, depth 16, held by a process
// of their own), against the same between a second pair of vrnicd, same
// binary and configuration, that holds none. The two pairs run one after
// the other, VRNIC_IDLE_ROUNDS rounds (default 8), the order alternating
// (ABBA), so that the machine's drift falls on both alike. It reports,
// for p50 and p99, the median over the rounds of the round's ratio (idle
// over none) and the median of each pair's figures. The idle pair is
// measured too before its QPs exist and after they are gone.
func BenchmarkUDPSendLatIdleQPs(b *testing.B) {
	da, dc := scaleDaemons(b, "127.0.0.1", "127.0.0.2")
	ea, ec := scaleDaemons(b, "127.0.0.3", "127.0.0.4")
	rounds := 8
	if v := os.Getenv("VRNIC_IDLE_ROUNDS"); v != "" {
		var err error
		rounds, err = strconv.Atoi(v)
		require.NoError(b, err, "VRNIC_IDLE_ROUNDS")
	}
	iters := max(b.N, 20000)
	b.ResetTimer()
	before := sendLatP(b, da, dc, iters)
	pairs := scaleQPs(b)
	release := holdIdleProc(b, da, dc, pairs)
	var idle, none, ratio [2][]float64
	for r := range rounds {
		var pi, pn [2]float64
		if r%2 == 0 {
			pi = sendLatP(b, da, dc, iters)
			pn = sendLatP(b, ea, ec, iters)
		} else {
			pn = sendLatP(b, ea, ec, iters)
			pi = sendLatP(b, da, dc, iters)
		}
		for i := range 2 {
			idle[i], none[i] = append(idle[i], pi[i]), append(none[i], pn[i])
			ratio[i] = append(ratio[i], pi[i]/pn[i])
		}
	}
	release()
	after := sendLatP(b, da, dc, iters)
	b.StopTimer()
	for i, name := range []string{"p50", "p99"} {
		mi, mn, mr := median(idle[i]), median(none[i]), median(ratio[i])
		b.ReportMetric(mn, name+"-none-ns")
		b.ReportMetric(mi, name+"-idle-ns")
		b.ReportMetric(mr, name+"-ratio")
		b.Logf("%s µs: %d idle pairs %v; none %v; median ratio of the rounds %.2f (of the medians %.2f); the idle pair before %.1f, after %.1f",
			name, pairs, toMicros(idle[i]), toMicros(none[i]), mr, mi/mn, before[i]/1e3, after[i]/1e3)
	}
}

// toMicros converts ns to µs, one decimal.
func toMicros(ns []float64) []float64 {
	r := make([]float64, len(ns))
	for i, v := range ns {
		r[i] = float64(int(v/100)) / 10
	}
	return r
}

// holdIdleProc is holdIdle in a child process (this binary running
// vrnic-perf scale -hold): the idle QPs' client side lives apart from
// the measuring process, as another program's would.
func holdIdleProc(b *testing.B, da, dc *daemon, pairs int) (release func()) {
	cmd := exec.Command(os.Args[0], "scale", "-dev-a", da.sock, "-dev-b", dc.sock, "-qps", strconv.Itoa(pairs),
		"-depth", "16", "-per-context", "1000", "-hold")
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	require.NoError(b, cmd.Start())
	done := false
	b.Cleanup(func() {
		if !done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	rd := bufio.NewReader(out)
	for {
		line, err := rd.ReadString('\n')
		require.NoError(b, err, "scale -hold: %s", errOut.String())
		if strings.TrimSpace(line) == "ready" {
			break
		}
	}
	go io.Copy(io.Discard, rd)
	return func() {
		in.Write([]byte("\n"))
		in.Close()
		require.NoError(b, cmd.Wait(), "scale -hold: %s", errOut.String())
		done = true
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
	da, dc := scaleDaemons(b, "127.0.0.1", "127.0.0.2")
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

// BenchmarkUDPWriteBWManyQPs measures write_bw between two vrnicd over
// the UDP link on one QP (16 outstanding), on one QP spreading its WRs
// over VRNIC_MANY_QPS message areas (-areas: the memory of that many QPs)
// and on VRNIC_MANY_QPS (default 1000) QPs posted in turn (16 outstanding
// over all of them), in VRNIC_MANY_ROUNDS rounds (default 4) of one run
// each, the order rotating from round to round, messages of
// VRNIC_MANY_SIZE bytes (default 65536). It reports the medians of the
// rounds' ratios, the many-QP aggregate over one QP (ratio) and over one
// QP touching as much memory (ratio-same-memory), and of each rate.
func BenchmarkUDPWriteBWManyQPs(b *testing.B) {
	da, dc := scaleDaemons(b, "127.0.0.1", "127.0.0.2")
	env := func(name string, def int) int {
		v := os.Getenv(name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		require.NoError(b, err, name)
		require.Positive(b, n, name)
		return n
	}
	many, rounds, size := env("VRNIC_MANY_QPS", 1000), env("VRNIC_MANY_ROUNDS", 4), env("VRNIC_MANY_SIZE", 65536)
	runs := [][]string{
		{"-qps", "1", "-depth", "16"},
		{"-qps", "1", "-depth", "16", "-areas", strconv.Itoa(many)},
		{"-qps", strconv.Itoa(many), "-depth", "1", "-total-depth", "16"},
	}
	b.ResetTimer()
	var rate [3][]float64
	var ratio, same []float64
	for r := range rounds {
		var got [3]float64
		for k := range runs {
			i := (r + k) % len(runs)
			rs := perfJSON(b, da.sock, dc.sock, append([]string{"-test", "write_bw", "-size", strconv.Itoa(size), "-duration", "3s"}, runs[i]...)...)
			require.Len(b, rs, 1)
			got[i] = rs[0].MBps
			rate[i] = append(rate[i], got[i])
		}
		ratio, same = append(ratio, got[2]/got[0]), append(same, got[2]/got[1])
	}
	b.StopTimer()
	b.ReportMetric(median(rate[0]), "one-MB/s")
	b.ReportMetric(median(rate[1]), "one-areas-MB/s")
	b.ReportMetric(median(rate[2]), "many-MB/s")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(median(same), "ratio-same-memory")
	b.Logf("%d-byte WRITEs, MB/s by round: one QP %.0f; one QP over %d areas %.0f; %d QPs %.0f; ratios %.2f, to the same memory %.2f",
		size, rate[0], many, rate[1], many, rate[2], ratio, same)
}
