// Package metrics exposes a vrnic device to Prometheus: on each scrape it
// reads one snapshot of the device (what an operator's INFO reply says,
// the QPs by type and state) and of its communication manager, and turns
// them into metrics named and labelled by Prometheus conventions: base
// units, _total for counters, one family per quantity with its causes as
// a label (frames dropped by reason, NAKs by kind), and only bounded
// label sets (no per-QP or per-client labels).
package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vrnic/vrnic/admin"
)

// QPCount is how many QPs of one type are in one state.
type QPCount struct {
	Type, State string
	N           int
}

// Snapshot is what one scrape reads of a device.
type Snapshot struct {
	Info admin.Info
	QPs  []QPCount
	// CM is the communication manager's state; nil for a device without
	// one.
	CM *admin.CMInfo
}

// Source returns the current snapshot.
type Source func() Snapshot

const ns = "vrnic"

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(ns+"_"+name, help, append([]string{"device"}, labels...), nil)
}

// The metric families. Each carries the device label.
var (
	dInfo      = desc("device_info", "The device: its link type and ABI version (value 1).", "link", "abi")
	dUptime    = desc("device_uptime_seconds", "Seconds since the device started.")
	dWorkers   = desc("device_workers", "Engine workers of the device.")
	dConns     = desc("control_connections", "Open control-socket connections.")
	dResources = desc("resources", "Live resources of the device, by kind.", "kind")
	dLimits    = desc("resource_limit", "The device-wide limit of each resource kind (0: the default).", "kind")
	dQPs       = desc("qps", "Live QPs by type and state.", "type", "state")
	dControl   = desc("control_events_total", "Control-path events, by kind (commands, command errors, refused connections, ...).", "event")

	dPackets    = desc("packets_total", "RoCE packets the device's QPs sent and received.", "direction")
	dRetrans    = desc("retransmits_total", "Go-back-N retransmissions started by requesters.")
	dTimeouts   = desc("ack_timeouts_total", "Local ACK timeouts of requesters.")
	dNAKsSent   = desc("naks_sent_total", "NAKs responders sent, by kind (rnr, sequence, and the fatal invalid_request, remote_access, remote_operational).", "kind")
	dNAKsRecv   = desc("naks_received_total", "NAKs requesters received, by kind (as naks_sent_total).", "kind")
	dDups       = desc("duplicate_requests_total", "Duplicate requests responders received.")
	dQPDropped  = desc("qp_dropped_packets_total", "Packets a QP's checks dropped, by reason ('other': a check not counted on its own).", "reason")
	dCQEs       = desc("completions_total", "Completions written, by queue.", "queue")
	dWireFrames = desc("wire_frames_total", "Frames the engine received from and sent to the link.", "direction")
	dWireDrop   = desc("wire_dropped_frames_total", "Received frames dropped before any QP saw them, by reason.", "reason")
	dCQOverflow = desc("cq_overflows_total", "Completions lost to a full CQ.")
	dBuildErr   = desc("frame_build_errors_total", "Frames the engine could not build.")
	dRejected   = desc("rejected_wqes_total", "Work requests rejected (malformed WQEs, broken rings), by reason.", "reason")
	dLinkErr    = desc("link_errors_total", "Failed calls of the link (a failed batch counts once), by direction.", "direction")

	dCMMADs     = desc("cm_mads_total", "CM MADs, by direction and kind (sent includes answers; retransmitted after a timeout).", "direction")
	dCMBad      = desc("cm_rejected_mads_total", "Received CM MADs not acted on, by reason.", "reason")
	dCMHalfOpen = desc("cm_half_open_connections", "Connect requests received and not yet established.")
	dCMDropped  = desc("cm_dropped_requests_total", "Half-open connect requests dropped, by reason.", "reason")
	dCMRejects  = desc("cm_rejects_total", "REJs sent and received, by direction and reason (the IBTA's, snake_case; other: undefined).", "direction", "reason")
)

// Collector is a prometheus.Collector of one device.
type Collector struct{ src Source }

// New returns the collector of the device src reads.
func New(src Source) *Collector { return &Collector{src: src} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dInfo, dUptime, dWorkers, dConns, dResources, dLimits, dQPs, dControl,
		dPackets, dRetrans, dTimeouts, dNAKsSent, dNAKsRecv, dDups, dQPDropped, dCQEs, dWireFrames, dWireDrop,
		dCQOverflow, dBuildErr, dLinkErr, dRejected, dCMMADs, dCMBad, dCMHalfOpen, dCMDropped, dCMRejects} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: one snapshot per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src()
	in := &s.Info
	dev := in.Device
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{dev}, labels...)...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{dev}, labels...)...)
	}
	gauge(dInfo, 1, in.LinkType, in.ABIVersion)
	gauge(dUptime, in.UptimeSec)
	gauge(dWorkers, float64(in.Workers))
	gauge(dConns, float64(in.Connections))
	for _, r := range resourceKinds(in.Resources, in.Limits.PerDevice) {
		gauge(dResources, float64(r.have), r.kind)
		if r.kind != "contexts" {
			gauge(dLimits, float64(r.limit), r.kind)
		}
	}
	for _, q := range s.QPs {
		gauge(dQPs, float64(q.N), q.Type, q.State)
	}
	for k, v := range in.Counters {
		counter(dControl, uint64(max(v, 0)), k)
	}

	dp := in.DataPath
	counter(dPackets, dp.PacketsSent, "sent")
	counter(dPackets, dp.PacketsReceived, "received")
	counter(dRetrans, dp.Retransmits)
	counter(dTimeouts, dp.Timeouts)
	counter(dNAKsSent, dp.RNRNAKsSent, "rnr")
	counter(dNAKsSent, dp.SeqNAKsSent, "sequence")
	counter(dNAKsSent, dp.InvalidReqNAKsSent, "invalid_request")
	counter(dNAKsSent, dp.RemAccessNAKsSent, "remote_access")
	counter(dNAKsSent, dp.RemOpNAKsSent, "remote_operational")
	counter(dNAKsRecv, dp.RNRNAKsReceived, "rnr")
	counter(dNAKsRecv, dp.SeqNAKsReceived, "sequence")
	counter(dNAKsRecv, dp.InvalidReqNAKsReceived, "invalid_request")
	counter(dNAKsRecv, dp.RemAccessNAKsReceived, "remote_access")
	counter(dNAKsRecv, dp.RemOpNAKsReceived, "remote_operational")
	counter(dDups, dp.Duplicates)
	// Dropped includes the Q_Key violations and missing receive WQEs.
	other := dp.Dropped - min(dp.Dropped, dp.QKeyViolations+dp.NoRecvWQE)
	counter(dQPDropped, dp.QKeyViolations, "qkey_violation")
	counter(dQPDropped, dp.NoRecvWQE, "no_recv_wqe")
	counter(dQPDropped, other, "other")
	counter(dCQEs, dp.SendCQEs, "send")
	counter(dCQEs, dp.RecvCQEs, "recv")

	w := in.Wire
	counter(dWireFrames, w.RxFrames, "rx")
	counter(dWireFrames, w.TxFrames, "tx")
	counter(dWireDrop, w.ParseErrors, "malformed")
	counter(dWireDrop, w.ICRCErrors, "icrc")
	counter(dWireDrop, w.UnknownQP, "unknown_qp")
	counter(dWireDrop, w.BadPeer, "bad_peer")
	counter(dCQOverflow, w.CQOverflows)
	counter(dBuildErr, w.BuildErrors)
	for reason, n := range in.RejectedWQEs {
		counter(dRejected, n, reason)
	}
	counter(dLinkErr, w.LinkSendErrors, "send")
	counter(dLinkErr, w.LinkRecvErrors, "receive")

	if cm := s.CM; cm != nil && cm.Enabled {
		counter(dCMMADs, cm.MADsSent, "sent")
		counter(dCMMADs, cm.Retransmissions, "retransmitted")
		counter(dCMMADs, cm.MADsReceived, "received")
		counter(dCMBad, cm.Duplicates, "duplicate")
		counter(dCMBad, cm.Invalid, "invalid")
		counter(dCMBad, cm.Unmatched, "unmatched")
		gauge(dCMHalfOpen, float64(cm.HalfOpen))
		counter(dCMDropped, cm.Shed, "shed")
		counter(dCMDropped, cm.Expired, "expired")
		for dir, m := range map[string]map[string]uint64{"sent": cm.RejectsSent, "received": cm.RejectsReceived} {
			for reason, n := range m {
				counter(dCMRejects, n, dir, strings.ReplaceAll(reason, " ", "_"))
			}
		}
	}
}

type resourceKind struct {
	kind        string
	have, limit int
}

func resourceKinds(have, limit admin.ResourceCounts) []resourceKind {
	return []resourceKind{
		{"contexts", have.Contexts, limit.Contexts},
		{"host_memory_regions", have.HostMem, limit.HostMem},
		{"pds", have.PD, limit.PD},
		{"mrs", have.MR, limit.MR},
		{"cqs", have.CQ, limit.CQ},
		{"qps", have.QP, limit.QP},
		{"srqs", have.SRQ, limit.SRQ},
		{"ahs", have.AH, limit.AH},
		{"mws", have.MW, limit.MW},
	}
}
