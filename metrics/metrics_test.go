package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
)

func snapshot() Snapshot {
	in := admin.Info{Device: "d0", ABIVersion: "1.4", LinkType: "udp", Workers: 2, UptimeSec: 12.5, Connections: 3,
		Resources: admin.ResourceCounts{Contexts: 2, QP: 4, MR: 5},
		Counters:  map[string]int64{"commands": 40, "command_errors": 2},
		DataPath: admin.QPCounters{PacketsSent: 100, PacketsReceived: 90, Dropped: 7, QKeyViolations: 2, NoRecvWQE: 1,
			RNRNAKsSent: 3, SeqNAKsReceived: 4, SendCQEs: 50, RecvCQEs: 45, RemAccessNAKsSent: 5},
		Wire:         admin.WireCounters{RxFrames: 95, TxFrames: 101, ICRCErrors: 6, UnknownQP: 8},
		RejectedWQEs: map[string]uint64{"too_many_sge": 2, "ring_index": 1},
	}
	in.Limits.PerDevice.QP = 1000
	return Snapshot{Info: in, QPs: []QPCount{{"RC", "RTS", 3}, {"UD", "INIT", 1}},
		CM: &admin.CMInfo{Enabled: true, MADsSent: 9, MADsReceived: 8, Invalid: 1, HalfOpen: 2,
			RejectsSent: map[string]uint64{"consumer defined": 3}, RejectsReceived: map[string]uint64{"stale conn": 1, "other": 2}}}
}

// TestCollect: every family is named as Prometheus' own linter
// (promtool check metrics) wants, and the values and causes come through
// as labels: frames dropped by reason, QPs by type and state, the QP
// drops split so that "other" excludes the counted causes.
func TestCollect(t *testing.T) {
	c := New(snapshot)
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)

	want := `
# HELP vrnic_qp_dropped_packets_total Packets a QP's checks dropped, by reason ('other': a check not counted on its own).
# TYPE vrnic_qp_dropped_packets_total counter
vrnic_qp_dropped_packets_total{device="d0",reason="no_recv_wqe"} 1
vrnic_qp_dropped_packets_total{device="d0",reason="other"} 4
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
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"vrnic_qp_dropped_packets_total", "vrnic_qps", "vrnic_wire_dropped_frames_total", "vrnic_naks_sent_total",
		"vrnic_cm_half_open_connections", "vrnic_resource_limit", "vrnic_cm_rejects_total", "vrnic_rejected_wqes_total"))

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
