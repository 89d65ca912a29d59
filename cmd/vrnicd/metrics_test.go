package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
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

// labelled reports whether m's labels include want.
func labelled(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// value returns the value of the sample of family name whose labels
// include want (0 when there is none).
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	for _, m := range mfs[name].GetMetric() {
		if !labelled(m, want) {
			continue
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

// histCount returns the sample count of the histogram of family name
// whose labels include want (0 when there is none).
func histCount(mfs map[string]*dto.MetricFamily, name string, want map[string]string) uint64 {
	for _, m := range mfs[name].GetMetric() {
		if labelled(m, want) {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// scrapeErr is scrape for a goroutine other than the test's: the parsed
// exposition, or what went wrong.
func scrapeErr(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// metricsURL is the /metrics address daemon d logged.
func metricsURL(t *testing.T, d *daemon) string {
	t.Helper()
	m := regexp.MustCompile(`msg="metrics served" addr=(\S+)`).FindStringSubmatch(d.logs.String())
	require.NotNil(t, m, "%s", d.logs)
	return "http://" + m[1] + "/metrics"
}

// deviceInfo reads the daemon's INFO reply (what vrnicctl info and its
// -json print).
func deviceInfo(t *testing.T, sock string) admin.Info {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Call(admin.InfoCmd, nil)
	require.NoError(t, err)
	var in admin.Info
	require.NoError(t, json.Unmarshal(b, &in))
	return in
}

// TestMetricsUDPFaults runs two daemons over the UDP link with metrics,
// scrapes them while RC traffic (WRITE, READ, SEND) flows, then puts
// fault rules in the way and checks that the counters of each cause move,
// and only as far as the faults say:
//
//   - a dropped single-packet WRITE: an ACK timeout and a retransmission
//     on the requester, one hit of the drop rule;
//   - the second packet of a 4-packet WRITE dropped: a PSN sequence NAK
//     sent by the responder and received by the requester;
//   - an rnr verb fault on the responder: an RNR NAK each way;
//   - a WRITE with a bad rkey: a remote access NAK sent and received, the
//     responder's drop counted as answered with a fatal NAK, the
//     requester's QP in ERR; INFO (vrnicctl info -json) says the same.
//
// Completion-latency histograms count the opcodes used on the side that
// completed them; the link's own counters (frames, syscalls, datagrams),
// the memory and descriptors held and the process metrics are there;
// every scrape passes Prometheus' linter and, where installed, promtool
// check metrics.
func TestMetricsUDPFaults(t *testing.T) {
	la := netip.MustParseAddrPort("127.0.43.1:4791")
	lb := netip.MustParseAddrPort("127.0.43.2:4791")
	a := startDaemon(t, "m0", la, "-metrics-addr", "127.0.43.1:0")
	b := startDaemon(t, "m1", lb, "-metrics-addr", "127.0.43.2:0")
	urlA, urlB := metricsURL(t, a), metricsURL(t, b)
	devA := func(kv ...string) map[string]string {
		m := map[string]string{"device": "m0"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	devB := func(kv ...string) map[string]string {
		m := devA(kv...)
		m["device"] = "m1"
		return m
	}
	ea, eb := connectPair(t, a, b, 14) // ACK timeout 67 ms

	// Traffic and scrapes at once: WRITEs go on until the scraper has
	// completed two scrapes of each daemon while they flowed.
	scrapes := make(chan error, 1)
	var scraped atomic.Int32
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				scrapes <- nil
				return
			default:
			}
			for _, u := range []string{urlA, urlB} {
				if _, err := scrapeErr(u); err != nil {
					scrapes <- err
					return
				}
			}
			scraped.Add(1)
		}
	}()
	writes := 0
	for ; writes < 20 || (scraped.Load() < 2 && writes < 100000); writes++ {
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(writes), Opcode: abi.WRRDMAWrite,
			SGL: []abi.SGE{ea.mr.SGE(0, 64)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
		require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
	}
	close(stop)
	require.NoError(t, <-scrapes)
	require.GreaterOrEqual(t, scraped.Load(), int32(2))
	const reads, sends = 10, 5
	for i := range reads {
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMARead,
			SGL: []abi.SGE{ea.mr.SGE(4096, 256)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
		require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
	}
	for i := range sends {
		require.NoError(t, eb.qp.PostRecv(&verbs.RecvWR{WrID: uint64(i), SGL: []abi.SGE{eb.mr.SGE(0, 512)}}))
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, SGL: []abi.SGE{ea.mr.SGE(0, 100)}}))
		require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
		require.Equal(t, abi.WCSuccess, pollOne(t, eb.cq).Status)
	}

	a1, problems, _ := scrape(t, urlA)
	assert.Empty(t, problems)
	b1, problems, _ := scrape(t, urlB)
	assert.Empty(t, problems)
	assert.GreaterOrEqual(t, histCount(a1, "vrnic_completion_latency_seconds", devA("opcode", "rdma_write")), uint64(writes))
	assert.Equal(t, uint64(reads), histCount(a1, "vrnic_completion_latency_seconds", devA("opcode", "rdma_read")))
	assert.Equal(t, uint64(sends), histCount(a1, "vrnic_completion_latency_seconds", devA("opcode", "send")))
	assert.Equal(t, uint64(sends), histCount(b1, "vrnic_completion_latency_seconds", devB("opcode", "recv")))
	assert.Zero(t, histCount(b1, "vrnic_completion_latency_seconds", devB("opcode", "rdma_write")), "the responder completes no WRITE")
	// The link's own counters.
	for _, f := range []string{"vrnic_link_frames_total", "vrnic_link_syscalls_total", "vrnic_link_datagrams_total", "vrnic_link_bytes_total"} {
		for _, dir := range []string{"tx", "rx"} {
			assert.Positive(t, value(a1, f, devA("direction", dir)), "%s %s", f, dir)
		}
	}
	assert.GreaterOrEqual(t, value(a1, "vrnic_link_frames_total", devA("direction", "tx")), value(a1, "vrnic_link_syscalls_total", devA("direction", "tx")))
	// What the daemon holds for its client and its own process.
	assert.Positive(t, value(a1, "vrnic_held_bytes", devA("kind", "host_memory")))
	assert.Positive(t, value(a1, "vrnic_held_bytes", devA("kind", "pinned")))
	assert.Positive(t, value(a1, "vrnic_mr_pages", devA()))
	assert.Positive(t, value(a1, "vrnic_client_fds", devA()))
	assert.NotNil(t, a1["process_open_fds"])
	assert.NotNil(t, a1["go_goroutines"])

	addRule := func(d *daemon, r admin.FaultRule) string {
		rep, err := faultCall(t, d.sock, admin.FaultRequest{Op: admin.FaultAdd, Rules: []admin.FaultRule{r}})
		require.NoError(t, err)
		require.Len(t, rep.Rules, 1)
		return strconv.FormatUint(uint64(rep.Rules[0].ID), 10)
	}
	qpnB := eb.qp.QPN

	// A lost single-packet WRITE: only the ACK timeout recovers it.
	drop := addRule(a, admin.FaultRule{Dir: "tx", QPN: &qpnB, Op: []string{"write"}, Round: "first", Count: 1, Action: admin.FaultAction{Type: "drop"}})
	require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: 1000, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{ea.mr.SGE(0, 64)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
	require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
	a2, _, _ := scrape(t, urlA)
	assert.Equal(t, 1.0, value(a2, "vrnic_fault_rule_applied_total", devA("rule", drop, "action", "drop")))
	assert.GreaterOrEqual(t, value(a2, "vrnic_fault_rule_matched_total", devA("rule", drop, "action", "drop")), 1.0)
	// (A loaded machine may add spurious timeouts; the drop adds one.)
	assert.GreaterOrEqual(t, value(a2, "vrnic_ack_timeouts_total", devA())-value(a1, "vrnic_ack_timeouts_total", devA()), 1.0)
	assert.GreaterOrEqual(t, value(a2, "vrnic_retransmits_total", devA())-value(a1, "vrnic_retransmits_total", devA()), 1.0)
	assert.Equal(t, 1.0, value(a2, "vrnic_fault_rules", devA("state", "enabled")))

	// The second packet of a 4-packet WRITE lost: the responder sees a
	// PSN gap and NAKs it.
	seq := addRule(a, admin.FaultRule{Dir: "tx", QPN: &qpnB, Message: &admin.FaultMessage{Kind: "write", Packet: 2}, Round: "first", Count: 1,
		Action: admin.FaultAction{Type: "drop"}})
	require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: 1001, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{ea.mr.SGE(0, 4096)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
	require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)

	// The responder pretends no receive is posted once: RNR NAK.
	rnr := addRule(b, admin.FaultRule{QPN: &qpnB, Count: 1, Action: admin.FaultAction{Type: "verb", Verb: "rnr"}})
	require.NoError(t, eb.qp.PostRecv(&verbs.RecvWR{WrID: 2000, SGL: []abi.SGE{eb.mr.SGE(0, 512)}}))
	require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: 2000, Opcode: abi.WRSend, SGL: []abi.SGE{ea.mr.SGE(0, 100)}}))
	require.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
	require.Equal(t, abi.WCSuccess, pollOne(t, eb.cq).Status)

	a3, _, _ := scrape(t, urlA)
	b3, _, _ := scrape(t, urlB)
	assert.Equal(t, 1.0, value(a3, "vrnic_fault_rule_applied_total", devA("rule", seq, "action", "drop")))
	assert.Equal(t, 1.0, value(b3, "vrnic_fault_rule_applied_total", devB("rule", rnr, "action", "rnr")))
	assert.GreaterOrEqual(t, value(b3, "vrnic_naks_sent_total", devB("kind", "sequence")), 1.0)
	assert.GreaterOrEqual(t, value(a3, "vrnic_naks_received_total", devA("kind", "sequence")), 1.0)
	assert.Equal(t, 1.0, value(b3, "vrnic_naks_sent_total", devB("kind", "rnr")))
	assert.Equal(t, 1.0, value(a3, "vrnic_naks_received_total", devA("kind", "rnr")))
	assert.Greater(t, value(a3, "vrnic_retransmits_total", devA()), value(a2, "vrnic_retransmits_total", devA()))
	for _, kind := range []string{"invalid_request", "remote_access", "remote_operational"} {
		assert.Zero(t, value(b3, "vrnic_naks_sent_total", devB("kind", kind)), kind)
		assert.Zero(t, value(a3, "vrnic_naks_received_total", devA("kind", kind)), kind)
	}

	// A bad rkey: the responder's class C error, a remote access NAK.
	require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: 3000, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{ea.mr.SGE(0, 64)}, RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey ^ 0x5a00}))
	require.Equal(t, abi.WCRemAccessErr, pollOne(t, ea.cq).Status)
	require.Eventually(t, func() bool {
		m, err := scrapeErr(urlB)
		return err == nil && value(m, "vrnic_naks_sent_total", devB("kind", "remote_access")) == 1
	}, 10*time.Second, 10*time.Millisecond)
	a4, problems, rawA := scrape(t, urlA)
	assert.Empty(t, problems)
	b4, problems, rawB := scrape(t, urlB)
	assert.Empty(t, problems)
	assert.Equal(t, 1.0, value(a4, "vrnic_naks_received_total", devA("kind", "remote_access")))
	assert.Equal(t, 1.0, value(b4, "vrnic_qp_dropped_packets_total", devB("reason", "fatal_nak")))
	assert.Equal(t, 1.0, value(a4, "vrnic_qps", devA("type", "RC", "state", "ERR")))
	assert.Equal(t, 1.0, value(b4, "vrnic_fault_rules", devB("state", "enabled")))
	// The failed WRITE counts in no latency histogram.
	assert.Equal(t, histCount(a3, "vrnic_completion_latency_seconds", devA("opcode", "rdma_write")),
		histCount(a4, "vrnic_completion_latency_seconds", devA("opcode", "rdma_write")))

	// INFO, which vrnicctl info and info -json print, keeps the causes.
	ia, ib := deviceInfo(t, a.sock), deviceInfo(t, b.sock)
	assert.Equal(t, uint64(1), ia.DataPath.RemAccessNAKsReceived)
	assert.Equal(t, uint64(1), ib.DataPath.RemAccessNAKsSent)
	assert.Equal(t, uint64(1), ib.DataPath.RNRNAKsSent)
	assert.NotZero(t, ib.DataPath.SeqNAKsSent)
	assert.NotZero(t, ia.DataPath.Timeouts)
	assert.Positive(t, ia.Held.FDs)

	t.Run("promtool", func(t *testing.T) {
		tool := testenv.NeedTool(t, "promtool")
		for _, raw := range [][]byte{rawA, rawB} {
			cmd := exec.Command(tool, "check", "metrics")
			cmd.Stdin = bytes.NewReader(raw)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "promtool check metrics: %s", out)
			assert.Empty(t, strings.TrimSpace(string(out)))
		}
	})
}
