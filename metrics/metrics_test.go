package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
)

func snapshot() Snapshot {
	in := admin.Info{Device: "d0", ABIVersion: "1.4", LinkType: "udp", Workers: 2, UptimeSec: 12.5, Connections: 3,
		Resources: admin.ResourceCounts{Contexts: 2, QP: 4, MR: 5},
		Counters:  map[string]int64{"commands": 40, "command_errors": 2},
		DataPath: admin.QPCounters{PacketsSent: 100, PacketsReceived: 90, Dropped: 10, QKeyViolations: 2, NoRecvWQE: 1,
			RNRNAKsSent: 3, SeqNAKsReceived: 4, SendCQEs: 50, RecvCQEs: 45, RemAccessNAKsSent: 5},
		Wire:         admin.WireCounters{RxFrames: 95, TxFrames: 101, ICRCErrors: 6, UnknownQP: 8},
		RejectedWQEs: map[string]uint64{"too_many_sge": 2, "ring_index": 1},
	}
	in.Limits.PerDevice.QP = 1000
	in.Held = admin.HeldResources{HostMemBytes: 1 << 20, PinnedBytes: 4 << 20, LockedBytes: 2 << 20, MRPages: 7, FDs: 9}
	in.LastLinkError, in.LastLinkErrorAt = "send: connection refused", time.Unix(1700000000, 0)
	var lat engine.Latencies
	lat[engine.LatWrite].Buckets[0] = 2 // at most 1.024 µs
	lat[engine.LatWrite].Buckets[3] = 1 // (4.096, 8.192] µs
	lat[engine.LatWrite].SumNanos = 8000
	return Snapshot{Info: in, QPs: []QPCount{{"RC", "RTS", 3}, {"UD", "INIT", 1}}, Latency: &lat,
		Faults: []admin.FaultRuleInfo{
			{FaultRule: admin.FaultRule{ID: 3, Action: admin.FaultAction{Type: "drop"}}, Matched: 10, Applied: 4},
			{FaultRule: admin.FaultRule{ID: 7, Disabled: true, Action: admin.FaultAction{Type: "verb", Verb: "rnr"}}, Matched: 2, Applied: 2},
		},
		Link: &admin.LinkStats{Link: "udp", Ports: []admin.UDPPortStats{
			{TxFrames: 30, TxDatagrams: 10, TxCalls: 5, TxGSO: 4, GSO: true, RxFrames: 8, RxCalls: 2, SendErrors: 1},
			{TxFrames: 2, TxDatagrams: 2, TxCalls: 2, GRO: true, RxFrames: 4, RxCalls: 4, RxTruncated: 3},
		}},
		CM: &admin.CMInfo{Enabled: true, MADsSent: 9, MADsReceived: 8, Invalid: 1, HalfOpen: 2,
			RejectsSent: map[string]uint64{"consumer defined": 3}, RejectsReceived: map[string]uint64{"stale conn": 1, "other": 2}}}
}

// TestCollect: every family is named as Prometheus' own linter
// (promtool check metrics) wants, and the values and causes come through
// as labels: frames dropped by reason, QPs by type and state, the QP
// drops split so that "other" excludes the counted causes (the requests
// answered with a fatal NAK among them).
func TestCollect(t *testing.T) {
	c := New(snapshot)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)

	want := `
# HELP vrnic_qp_dropped_packets_total Packets a QP's checks dropped, by reason ('other': a check not counted on its own).
# TYPE vrnic_qp_dropped_packets_total counter
vrnic_qp_dropped_packets_total{device="d0",reason="fatal_nak"} 5
vrnic_qp_dropped_packets_total{device="d0",reason="no_recv_wqe"} 1
vrnic_qp_dropped_packets_total{device="d0",reason="other"} 2
vrnic_qp_dropped_packets_total{device="d0",reason="qkey_violation"} 2
# HELP vrnic_rejected_wqes_total Work requests rejected (malformed WQEs, broken rings), by reason.
# TYPE vrnic_rejected_wqes_total counter
vrnic_rejected_wqes_total{device="d0",reason="ring_index"} 1
vrnic_rejected_wqes_total{device="d0",reason="too_many_sge"} 2
# HELP vrnic_qps Live QPs by type and state.
# TYPE vrnic_qps gauge
vrnic_qps{device="d0",state="INIT",type="UD"} 1
vrnic_qps{device="d0",state="RTS",type="RC"} 3
# HELP vrnic_wire_dropped_frames_total Received frames dropped before any QP saw them, by reason.
# TYPE vrnic_wire_dropped_frames_total counter
vrnic_wire_dropped_frames_total{device="d0",reason="bad_peer"} 0
vrnic_wire_dropped_frames_total{device="d0",reason="icrc"} 6
vrnic_wire_dropped_frames_total{device="d0",reason="malformed"} 0
vrnic_wire_dropped_frames_total{device="d0",reason="unknown_qp"} 8
# HELP vrnic_naks_sent_total NAKs responders sent, by kind (rnr, sequence, and the fatal invalid_request, remote_access, remote_operational).
# TYPE vrnic_naks_sent_total counter
vrnic_naks_sent_total{device="d0",kind="invalid_request"} 0
vrnic_naks_sent_total{device="d0",kind="remote_access"} 5
vrnic_naks_sent_total{device="d0",kind="remote_operational"} 0
vrnic_naks_sent_total{device="d0",kind="rnr"} 3
vrnic_naks_sent_total{device="d0",kind="sequence"} 0
# HELP vrnic_cm_rejects_total REJs sent and received, by direction and reason (the IBTA's, snake_case; other: undefined).
# TYPE vrnic_cm_rejects_total counter
vrnic_cm_rejects_total{device="d0",direction="received",reason="other"} 2
vrnic_cm_rejects_total{device="d0",direction="received",reason="stale_conn"} 1
vrnic_cm_rejects_total{device="d0",direction="sent",reason="consumer_defined"} 3
# HELP vrnic_cm_half_open_connections Connect requests received and not yet established.
# TYPE vrnic_cm_half_open_connections gauge
vrnic_cm_half_open_connections{device="d0"} 2
# HELP vrnic_resource_limit The device-wide limit of each resource kind (0: the default).
# TYPE vrnic_resource_limit gauge
vrnic_resource_limit{device="d0",kind="ahs"} 0
vrnic_resource_limit{device="d0",kind="cqs"} 0
vrnic_resource_limit{device="d0",kind="host_memory_regions"} 0
vrnic_resource_limit{device="d0",kind="mrs"} 0
vrnic_resource_limit{device="d0",kind="mws"} 0
vrnic_resource_limit{device="d0",kind="pds"} 0
vrnic_resource_limit{device="d0",kind="qps"} 1000
vrnic_resource_limit{device="d0",kind="srqs"} 0
# HELP vrnic_fault_rule_applied_total Times each fault rule's action was applied (frames dropped, duplicated, ...; verb faults struck), by rule id and action.
# TYPE vrnic_fault_rule_applied_total counter
vrnic_fault_rule_applied_total{action="drop",device="d0",rule="3"} 4
vrnic_fault_rule_applied_total{action="rnr",device="d0",rule="7"} 2
# HELP vrnic_fault_rule_matched_total Frames or verb events each fault rule's filters selected, by rule id and action.
# TYPE vrnic_fault_rule_matched_total counter
vrnic_fault_rule_matched_total{action="drop",device="d0",rule="3"} 10
vrnic_fault_rule_matched_total{action="rnr",device="d0",rule="7"} 2
# HELP vrnic_fault_rules Installed fault rules, by state.
# TYPE vrnic_fault_rules gauge
vrnic_fault_rules{device="d0",state="disabled"} 1
vrnic_fault_rules{device="d0",state="enabled"} 1
# HELP vrnic_link_syscalls_total sendmmsg and recvmmsg calls that moved data, by direction (frames per call: link_frames_total over this).
# TYPE vrnic_link_syscalls_total counter
vrnic_link_syscalls_total{device="d0",direction="rx"} 6
vrnic_link_syscalls_total{device="d0",direction="tx"} 7
# HELP vrnic_link_segmentation_offload_ports Ports (UDP) or queues (TAP) with segmentation offload on, by direction (tx: UDP GSO, TAP USO; rx: UDP GRO).
# TYPE vrnic_link_segmentation_offload_ports gauge
vrnic_link_segmentation_offload_ports{device="d0",direction="rx"} 1
vrnic_link_segmentation_offload_ports{device="d0",direction="tx"} 1
# HELP vrnic_held_bytes Memory the daemon holds for the clients: host memory regions, pinned by MRs and rings, of that locked in RAM.
# TYPE vrnic_held_bytes gauge
vrnic_held_bytes{device="d0",kind="host_memory"} 1.048576e+06
vrnic_held_bytes{device="d0",kind="locked"} 2.097152e+06
vrnic_held_bytes{device="d0",kind="pinned"} 4.194304e+06
# HELP vrnic_link_last_error_timestamp_seconds When the newest failed link call failed (Unix time), with its direction and text.
# TYPE vrnic_link_last_error_timestamp_seconds gauge
vrnic_link_last_error_timestamp_seconds{device="d0",direction="send",error="connection refused"} 1.7e+09
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"vrnic_qp_dropped_packets_total", "vrnic_qps", "vrnic_wire_dropped_frames_total", "vrnic_naks_sent_total",
		"vrnic_cm_half_open_connections", "vrnic_resource_limit", "vrnic_cm_rejects_total", "vrnic_rejected_wqes_total",
		"vrnic_fault_rule_applied_total", "vrnic_fault_rule_matched_total", "vrnic_fault_rules", "vrnic_link_syscalls_total",
		"vrnic_link_segmentation_offload_ports", "vrnic_held_bytes", "vrnic_link_last_error_timestamp_seconds"))
	assert.Equal(t, 3.0, gathered(t, c, "vrnic_link_dropped_frames_total", "reason", "truncated"))
	assert.Equal(t, 32.0, gathered(t, c, "vrnic_link_frames_total", "direction", "tx"))

	// The latency histograms: one per opcode, cumulative buckets in
	// seconds, the sum in seconds.
	assert.Equal(t, int(engine.NumLatencyOps), testutil.CollectAndCount(c, "vrnic_completion_latency_seconds"))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var write *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() != "vrnic_completion_latency_seconds" {
			continue
		}
		require.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType())
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "opcode" && l.GetValue() == "rdma_write" {
					write = m.GetHistogram()
				}
			}
		}
	}
	require.NotNil(t, write)
	assert.Equal(t, uint64(3), write.GetSampleCount())
	assert.InDelta(t, 8e-6, write.GetSampleSum(), 1e-12)
	require.Len(t, write.GetBucket(), engine.LatencyBuckets)
	assert.InDelta(t, 1.024e-6, write.GetBucket()[0].GetUpperBound(), 1e-15)
	assert.Equal(t, uint64(2), write.GetBucket()[0].GetCumulativeCount())
	assert.Equal(t, uint64(2), write.GetBucket()[2].GetCumulativeCount())
	assert.Equal(t, uint64(3), write.GetBucket()[3].GetCumulativeCount())
	assert.Equal(t, uint64(3), write.GetBucket()[engine.LatencyBuckets-1].GetCumulativeCount())

	// A device without a CM, a link of its own or latencies has no such
	// families.
	bare := func() Snapshot { s := snapshot(); s.CM, s.Link, s.Latency = nil, nil, nil; return s }
	assert.Zero(t, testutil.CollectAndCount(New(bare), "vrnic_link_frames_total"))
	assert.Zero(t, testutil.CollectAndCount(New(bare), "vrnic_completion_latency_seconds"))
	// A device without a CM has no CM families.
	noCM := func() Snapshot { s := snapshot(); s.CM = nil; return s }
	assert.Zero(t, testutil.CollectAndCount(New(noCM), "vrnic_cm_mads_total"))
	assert.Equal(t, 3, testutil.CollectAndCount(c, "vrnic_cm_mads_total"))
}

// TestRegistryLint: the whole registry (device, process and Go runtime
// collectors) gathers, and the device families pass the linter.
func TestRegistryLint(t *testing.T) {
	reg := Registry(snapshot)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.Contains(t, names, "vrnic_packets_total")
	assert.Contains(t, names, "process_resident_memory_bytes")
	assert.Contains(t, names, "go_goroutines")
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	require.NoError(t, err)
	for _, p := range problems {
		assert.False(t, strings.HasPrefix(p.Metric, "vrnic_"), "%s: %s", p.Metric, p.Text)
	}
}

// gathered returns the value of the sample of family name whose label k
// is v (0 when there is none).
func gathered(t *testing.T, c prometheus.Collector, name, k, v string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					if m.Counter != nil {
						return m.GetCounter().GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestCollectTAP: the TAP link's queues are summed into the same link_
// families, with its steering, filter and neighbour counters.
func TestCollectTAP(t *testing.T) {
	src := func() Snapshot {
		s := snapshot()
		s.Link = &admin.LinkStats{Link: "tap", Offload: "uso",
			Queues: []admin.QueueStats{
				{Steered: 5, TAPQueueStats: admin.TAPQueueStats{RxFrames: 5, TxFrames: 6, TxGSO: 1, TxGSOFrames: 4, RxMisqueued: 1}},
				{Steered: 3, TAPQueueStats: admin.TAPQueueStats{RxFrames: 3, TxFrames: 1, RxOther: 2}},
			},
			SteerNonRoCE: 4, Filter: map[string]uint64{"pass_arp": 2, "drop_ethertype": 9}, Neighbors: map[string]uint64{"ARPRequestsIn": 2}}
		return s
	}
	c := New(src)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.Equal(t, 7.0, gathered(t, c, "vrnic_link_frames_total", "direction", "tx"))
	assert.Equal(t, 8.0, gathered(t, c, "vrnic_link_frames_total", "direction", "rx"))
	assert.Equal(t, 4.0, gathered(t, c, "vrnic_link_segmented_frames_total", "direction", "tx"))
	assert.Equal(t, 2.0, gathered(t, c, "vrnic_link_segmentation_offload_ports", "direction", "tx"))
	assert.Equal(t, 1.0, gathered(t, c, "vrnic_link_dropped_frames_total", "reason", "misqueued"))
	assert.Equal(t, 2.0, gathered(t, c, "vrnic_link_dropped_frames_total", "reason", "not_roce"))
	assert.Equal(t, 4.0, gathered(t, c, "vrnic_link_steered_frames_total", "kind", "non_roce"))
	assert.Equal(t, 9.0, gathered(t, c, "vrnic_link_filter_verdicts_total", "reason", "drop_ethertype"))
	assert.Equal(t, 2.0, gathered(t, c, "vrnic_link_neighbor_events_total", "event", "ARPRequestsIn"))
}
