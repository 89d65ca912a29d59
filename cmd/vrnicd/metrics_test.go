package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/verbs"
)

// scrape fetches url and parses the text exposition; it also runs
// Prometheus' linter (what promtool check metrics runs) on the bytes and
// returns its findings for the vrnic_ families.
func scrape(t *testing.T, url string) (map[string]*dto.MetricFamily, []promlint.Problem, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(b))
	require.NoError(t, err)
	all, err := promlint.New(bytes.NewReader(b)).Lint()
	require.NoError(t, err)
	var mine []promlint.Problem
	for _, pr := range all {
		if strings.HasPrefix(pr.Metric, "vrnic_") {
			mine = append(mine, pr)
		}
	}
	return mfs, mine, b
}

// value returns the value of the sample of family name whose labels
// include want (0 when there is none).
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	mf := mfs[name]
	if mf == nil {
		return 0
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// TestMetricsScrape runs the daemon with -metrics-addr, scrapes it before
// and after RC traffic between two of its QPs, and checks what must move:
// packets sent and received, completions by queue, frames by direction,
// the QPs by type and state, the resources; the exposition passes
// Prometheus' linter and promtool check metrics. A bad address is refused at start.
func TestMetricsScrape(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	logs := syncWriter{w: &strings.Builder{}}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-name", "p0", "-runtime-dir", dir, "-link", "mem", "-workers", "2", "-metrics-addr", "127.0.0.1:0"}, &logs)
	}()
	defer func() {
		cancel()
		require.NoError(t, <-done, "%s", logs.String())
	}()
	sock := admin.SocketPath(dir, "p0")
	require.Eventually(t, func() bool { _, err := admin.Serving(sock); return err == nil }, 10*time.Second, 10*time.Millisecond)
	m := regexp.MustCompile(`msg="metrics served" addr=(\S+)`).FindStringSubmatch(logs.String())
	require.NotNil(t, m, "%s", logs.String())
	url := "http://" + m[1] + "/metrics"
	dev := map[string]string{"device": "p0"}
	with := func(k, v string) map[string]string { return map[string]string{"device": "p0", k: v} }

	before, problems, _ := scrape(t, url)
	assert.Empty(t, problems)
	assert.Equal(t, 1.0, value(before, "vrnic_device_info", map[string]string{"device": "p0", "link": "mem"}))
	assert.Equal(t, 2.0, value(before, "vrnic_device_workers", dev))
	assert.Zero(t, value(before, "vrnic_resources", with("kind", "qps")))
	assert.NotNil(t, before["process_resident_memory_bytes"], "the daemon's process metrics")

	a, b := connectedPair(t, sock)
	const n = 20
	for i := range n {
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(i), SGL: []abi.SGE{b.mr.SGE(0, 64)}}))
		require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, SGL: []abi.SGE{a.mr.SGE(0, 32)}}))
		pollOne(t, a.cq)
		pollOne(t, b.cq)
	}

	after, problems, raw := scrape(t, url)
	assert.Empty(t, problems)
	// And Debian's promtool on the whole exposition.
	cmd := exec.Command(testenv.NeedTool(t, "promtool"), "check", "metrics")
	cmd.Stdin = bytes.NewReader(raw)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics: %s", out)
	assert.Empty(t, strings.TrimSpace(string(out)))
	assert.Equal(t, 2.0, value(after, "vrnic_qps", map[string]string{"device": "p0", "type": "RC", "state": "RTS"}))
	assert.Equal(t, 2.0, value(after, "vrnic_resources", with("kind", "qps")))
	assert.Equal(t, 2.0, value(after, "vrnic_resources", with("kind", "contexts")))
	sent := value(after, "vrnic_packets_total", with("direction", "sent")) - value(before, "vrnic_packets_total", with("direction", "sent"))
	recv := value(after, "vrnic_packets_total", with("direction", "received")) - value(before, "vrnic_packets_total", with("direction", "received"))
	assert.GreaterOrEqual(t, sent, float64(2*n), "a SEND and its ACK each")
	assert.GreaterOrEqual(t, recv, float64(2*n))
	assert.Equal(t, float64(n), value(after, "vrnic_completions_total", with("queue", "send")))
	assert.Equal(t, float64(n), value(after, "vrnic_completions_total", with("queue", "recv")))
	assert.GreaterOrEqual(t, value(after, "vrnic_wire_frames_total", with("direction", "tx")), float64(2*n))
	assert.Greater(t, value(after, "vrnic_control_events_total", with("event", "commands")),
		value(before, "vrnic_control_events_total", with("event", "commands")))
	assert.Zero(t, value(after, "vrnic_wire_dropped_frames_total", with("reason", "icrc")))
}

// TestMetricsBadAddr: an address the daemon cannot listen on stops it at
// start with an error naming metrics.
func TestMetricsBadAddr(t *testing.T) {
	logs := syncWriter{w: &strings.Builder{}}
	err := run(context.Background(), []string{"-name", "p1", "-runtime-dir", t.TempDir(), "-link", "mem", "-metrics-addr", "256.0.0.1:1"}, &logs)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metrics")
}
