// Package metrics exposes a vrnic device to Prometheus: on each scrape it
// reads one snapshot of the device (what an operator's INFO reply says,
// the QPs by type and state) and of its communication manager, and turns
// them into metrics named and labelled by Prometheus conventions: base
// units, _total for counters, one family per quantity with its causes as
// a label (frames dropped by reason, NAKs by kind), and only bounded
// label sets (no per-QP or per-client labels).
package metrics

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
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
	// Latency holds the completion-latency histograms by opcode; nil:
	// not known (no data plane, or it is closing).
	Latency *engine.Latencies
	// Faults are the device's fault rules with their counters.
	Faults []admin.FaultRuleInfo
	// Link is the link's own counters; nil: the link has none (the
	// in-memory link).
	Link *admin.LinkStats
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
	dRetrans    = desc("retransmits_total", "Retransmissions started by requesters: go-back-N restarts; with selective repeat, each selective NAK acted on and each timeout's probe.")
	dOOOHeld    = desc("out_of_order_held_packets", "Request packets responders keep out of order now, waiting for a gap to be filled (selective repeat).")
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
	dLinkLast   = desc("link_last_error_timestamp_seconds", "When the newest failed link call failed (Unix time), with its direction and text.", "direction", "error")
	dHeld       = desc("held_bytes", "Memory the daemon holds for the clients: host memory regions, pinned by MRs and rings, of that locked in RAM.", "kind")
	dLockFail   = desc("memory_lock_failures_total", "Locks of pinned memory that failed (RLIMIT_MEMLOCK): the memory stays pageable.")
	dMRPages    = desc("mr_pages", "Page-table entries of the clients' MRs.")
	dFDs        = desc("client_fds", "File descriptors the daemon holds for the clients (connections, doorbell pages, eventfds, memfds).")

	dLatency = desc("completion_latency_seconds", "Time from when the engine took a WQE to its successful CQE, by completion opcode (resolution: one worker pass).", "opcode")

	dFaultMatched = desc("fault_rule_matched_total", "Frames or verb events each fault rule's filters selected, by rule id and action.", "rule", "action")
	dFaultApplied = desc("fault_rule_applied_total", "Times each fault rule's action was applied (frames dropped, duplicated, ...; verb faults struck), by rule id and action.", "rule", "action")
	dFaultRules   = desc("fault_rules", "Installed fault rules, by state.", "state")

	dLinkFrames   = desc("link_frames_total", "Frames the link carried, by direction.", "direction")
	dLinkBytes    = desc("link_bytes_total", "Bytes of the frames the link carried, by direction.", "direction")
	dLinkDgrams   = desc("link_datagrams_total", "UDP datagrams the link sent and received (one carries several frames with segmentation offload), by direction.", "direction")
	dLinkCalls    = desc("link_syscalls_total", "sendmmsg and recvmmsg calls that moved data, by direction (frames per call: link_frames_total over this).", "direction")
	dLinkSeg      = desc("link_segmented_total", "Datagrams or packets holding two frames or more (UDP GSO/GRO, TAP USO), by direction.", "direction")
	dLinkSegFr    = desc("link_segmented_frames_total", "Frames carried in segmented packets (TAP), by direction.", "direction")
	dLinkOffload  = desc("link_segmentation_offload_ports", "Ports (UDP) or queues (TAP) with segmentation offload on, by direction (tx: UDP GSO, TAP USO; rx: UDP GRO).", "direction")
	dLinkOffOff   = desc("link_offload_refused_total", "Segmented sends the kernel refused (the port then sends one datagram per frame).")
	dLinkBackp    = desc("link_backpressure_total", "Sends stopped early because the kernel had no room (the frames are kept and sent later).")
	dLinkDrop     = desc("link_dropped_frames_total", "Frames the link dropped, by reason (UDP: send_error, truncated, foreign_family, unsendable, inbox_full; TAP: send_error, bad_input, loop_queue_full, not_roce, misqueued).", "reason")
	dLinkCallErr  = desc("link_syscall_errors_total", "Failed reads or receive calls of the link's own (besides link_errors_total), by direction.", "direction")
	dLinkWakeups  = desc("link_wakeups_total", "Times the link's poller woke a sleeping worker.")
	dLinkSteered  = desc("link_steered_frames_total", "Frames the TAP's steering program saw, by kind (roce: put on its QP's queue; non_roce: to queue 0).", "kind")
	dLinkFilter   = desc("link_filter_verdicts_total", "The TAP filter program's verdicts, by reason.", "reason")
	dLinkNeighbor = desc("link_neighbor_events_total", "The device's ARP and neighbour discovery activity, by counter.", "event")

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
		dPackets, dRetrans, dOOOHeld, dTimeouts, dNAKsSent, dNAKsRecv, dDups, dQPDropped, dCQEs, dWireFrames, dWireDrop,
		dCQOverflow, dBuildErr, dLinkErr, dLinkLast, dRejected, dCMMADs, dCMBad, dCMHalfOpen, dCMDropped, dCMRejects,
		dHeld, dLockFail, dMRPages, dFDs, dLatency, dFaultMatched, dFaultApplied, dFaultRules,
		dLinkFrames, dLinkBytes, dLinkDgrams, dLinkCalls, dLinkSeg, dLinkSegFr, dLinkOffload, dLinkOffOff, dLinkBackp,
		dLinkDrop, dLinkCallErr, dLinkWakeups, dLinkSteered, dLinkFilter, dLinkNeighbor} {
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
	// Dropped includes the Q_Key violations and missing receive WQEs,
	// and each request a responder answered with a fatal NAK.
	other := dp.Dropped - min(dp.Dropped, dp.QKeyViolations+dp.NoRecvWQE)
	fatal := min(other, dp.InvalidReqNAKsSent+dp.RemAccessNAKsSent+dp.RemOpNAKsSent)
	counter(dQPDropped, dp.QKeyViolations, "qkey_violation")
	counter(dQPDropped, dp.NoRecvWQE, "no_recv_wqe")
	counter(dQPDropped, fatal, "fatal_nak")
	counter(dQPDropped, other-fatal, "other")
	counter(dCQEs, dp.SendCQEs, "send")
	counter(dCQEs, dp.RecvCQEs, "recv")

	w := in.Wire
	counter(dWireFrames, w.RxFrames, "rx")
	counter(dWireFrames, w.TxFrames, "tx")
	counter(dWireDrop, w.ParseErrors, "malformed")
	counter(dWireDrop, w.ICRCErrors, "icrc")
	counter(dWireDrop, w.UnknownQP, "unknown_qp")
	counter(dWireDrop, w.BadPeer, "bad_peer")
	gauge(dOOOHeld, float64(w.HeldPackets))
	counter(dCQOverflow, w.CQOverflows)
	counter(dBuildErr, w.BuildErrors)
	for reason, n := range in.RejectedWQEs {
		counter(dRejected, n, reason)
	}
	counter(dLinkErr, w.LinkSendErrors, "send")
	counter(dLinkErr, w.LinkRecvErrors, "receive")
	if in.LastLinkError != "" {
		dir, text, _ := strings.Cut(in.LastLinkError, ": ")
		gauge(dLinkLast, float64(in.LastLinkErrorAt.UnixNano())/1e9, dir, text)
	}
	h := in.Held
	gauge(dHeld, float64(h.HostMemBytes), "host_memory")
	gauge(dHeld, float64(h.PinnedBytes), "pinned")
	gauge(dHeld, float64(h.LockedBytes), "locked")
	counter(dLockFail, h.LockFailures)
	gauge(dMRPages, float64(h.MRPages))
	gauge(dFDs, float64(h.FDs))

	if l := s.Latency; l != nil {
		for op := range engine.NumLatencyOps {
			hist := &l[op]
			buckets := make(map[float64]uint64, engine.LatencyBuckets)
			var cum uint64
			for i := range engine.LatencyBuckets {
				cum += hist.Buckets[i]
				buckets[float64(engine.LatencyBound(i))/1e9] = cum
			}
			ch <- prometheus.MustNewConstHistogram(dLatency, hist.Count(), float64(hist.SumNanos)/1e9, buckets, dev, op.String())
		}
	}

	rules := map[string]int{"enabled": 0, "disabled": 0}
	for _, r := range s.Faults {
		id, action := strconv.FormatUint(uint64(r.ID), 10), r.Action.Type
		if action == "verb" && r.Action.Verb != "" {
			action = r.Action.Verb
		}
		counter(dFaultMatched, r.Matched, id, action)
		counter(dFaultApplied, r.Applied, id, action)
		if r.Disabled {
			rules["disabled"]++
		} else {
			rules["enabled"]++
		}
	}
	for state, n := range rules {
		gauge(dFaultRules, float64(n), state)
	}

	if l := s.Link; l != nil {
		collectLink(l, gauge, counter)
	}

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

// collectLink turns the link's own counters into the link_ families: the
// UDP link's ports or the TAP link's queues, summed.
func collectLink(l *admin.LinkStats, gauge func(*prometheus.Desc, float64, ...string), counter func(*prometheus.Desc, uint64, ...string)) {
	switch l.Link {
	case "udp":
		var t admin.UDPPortStats
		var gso, gro int
		for _, p := range l.Ports {
			t.TxFrames += p.TxFrames
			t.TxBytes += p.TxBytes
			t.TxDatagrams += p.TxDatagrams
			t.TxCalls += p.TxCalls
			t.RxFrames += p.RxFrames
			t.RxBytes += p.RxBytes
			t.RxDatagrams += p.RxDatagrams
			t.RxCalls += p.RxCalls
			t.TxGSO += p.TxGSO
			t.RxGRO += p.RxGRO
			t.GSOOff += p.GSOOff
			t.Backpressure += p.Backpressure
			t.SendErrors += p.SendErrors
			t.RecvErrors += p.RecvErrors
			t.RxTruncated += p.RxTruncated
			t.RxForeign += p.RxForeign
			t.TxInvalid += p.TxInvalid
			t.Wakeups += p.Wakeups
			t.RxForwarded += p.RxForwarded
			t.RxForwardDrops += p.RxForwardDrops
			if p.GSO {
				gso++
			}
			if p.GRO {
				gro++
			}
		}
		counter(dLinkFrames, t.TxFrames, "tx")
		counter(dLinkFrames, t.RxFrames, "rx")
		counter(dLinkFrames, t.RxForwarded, "forwarded")
		counter(dLinkBytes, t.TxBytes, "tx")
		counter(dLinkBytes, t.RxBytes, "rx")
		counter(dLinkDgrams, t.TxDatagrams, "tx")
		counter(dLinkDgrams, t.RxDatagrams, "rx")
		counter(dLinkCalls, t.TxCalls, "tx")
		counter(dLinkCalls, t.RxCalls, "rx")
		counter(dLinkSeg, t.TxGSO, "tx")
		counter(dLinkSeg, t.RxGRO, "rx")
		gauge(dLinkOffload, float64(gso), "tx")
		gauge(dLinkOffload, float64(gro), "rx")
		counter(dLinkOffOff, t.GSOOff)
		counter(dLinkBackp, t.Backpressure)
		counter(dLinkDrop, t.SendErrors, "send_error")
		counter(dLinkDrop, t.RxTruncated, "truncated")
		counter(dLinkDrop, t.RxForeign, "foreign_family")
		counter(dLinkDrop, t.TxInvalid, "unsendable")
		counter(dLinkDrop, t.RxForwardDrops, "inbox_full")
		counter(dLinkCallErr, t.RecvErrors, "rx")
		counter(dLinkWakeups, t.Wakeups)
	case "tap":
		var t admin.QueueStats
		for _, q := range l.Queues {
			t.Steered += q.Steered
			t.RxFrames += q.RxFrames
			t.RxBytes += q.RxBytes
			t.RxNeighbor += q.RxNeighbor
			t.RxOther += q.RxOther
			t.RxMisqueued += q.RxMisqueued
			t.ReadErrors += q.ReadErrors
			t.TxFrames += q.TxFrames
			t.TxBytes += q.TxBytes
			t.TxErrors += q.TxErrors
			t.Wakeups += q.Wakeups
			t.TxGSO += q.TxGSO
			t.TxGSOFrames += q.TxGSOFrames
			t.RxGSO += q.RxGSO
			t.RxGSOFrames += q.RxGSOFrames
			t.RxBad += q.RxBad
			t.LoopFrames += q.LoopFrames
			t.LoopDropped += q.LoopDropped
		}
		counter(dLinkFrames, t.TxFrames, "tx")
		counter(dLinkFrames, t.RxFrames, "rx")
		counter(dLinkFrames, t.LoopFrames, "loop")
		counter(dLinkBytes, t.TxBytes, "tx")
		counter(dLinkBytes, t.RxBytes, "rx")
		counter(dLinkSeg, t.TxGSO, "tx")
		counter(dLinkSeg, t.RxGSO, "rx")
		counter(dLinkSegFr, t.TxGSOFrames, "tx")
		counter(dLinkSegFr, t.RxGSOFrames, "rx")
		uso := 0.0
		if l.Offload == "uso" {
			uso = float64(len(l.Queues))
		}
		gauge(dLinkOffload, uso, "tx")
		counter(dLinkDrop, t.TxErrors, "send_error")
		counter(dLinkDrop, t.RxBad, "bad_input")
		counter(dLinkDrop, t.LoopDropped, "loop_queue_full")
		counter(dLinkDrop, t.RxOther, "not_roce")
		counter(dLinkCallErr, t.ReadErrors, "rx")
		counter(dLinkWakeups, t.Wakeups)
		counter(dLinkDrop, t.RxMisqueued, "misqueued")
		counter(dLinkSteered, t.Steered, "roce")
		counter(dLinkSteered, l.SteerNonRoCE, "non_roce")
		for reason, n := range l.Filter {
			counter(dLinkFilter, n, reason)
		}
		for ev, n := range l.Neighbors {
			counter(dLinkNeighbor, n, ev)
		}
		counter(dLinkNeighbor, t.RxNeighbor, "frames_received")
	}
}
