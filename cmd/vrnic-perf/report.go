package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/vrnic/vrnic/abi"
)

// result is the outcome of one message size.
type result struct {
	Test        testKind      `json:"test"`
	Transport   string        `json:"transport"`
	Atomic      string        `json:"atomic,omitempty"`
	Size        int           `json:"size"`
	QPs         int           `json:"qps"`
	Depth       int           `json:"depth"`
	MTU         int           `json:"mtu"`
	Inline      bool          `json:"inline"`
	CQMod       int           `json:"cq_mod"`
	Events      bool          `json:"events"`
	Ops         uint64        `json:"ops"`
	Bytes       uint64        `json:"bytes"`
	Seconds     float64       `json:"seconds"`
	Gbps        float64       `json:"gbps"`
	MBps        float64       `json:"mbps"`
	Mops        float64       `json:"mops"`
	Latency     *latencyStats `json:"latency,omitempty"`
	Client      counters      `json:"client_counters"`
	Server      counters      `json:"server_counters"`
	Retransmits uint64        `json:"retransmits"`
	Verified    bool          `json:"verified"`
	Lost        uint64        `json:"lost,omitempty"` // UC/UD SENDs that never arrived
	LoopAllocs  uint64        `json:"loop_allocs"`
	// ECE names the ECE options in force on the QPs ("sr,rto", "none").
	ECE string `json:"ece"`
}

func (e *endpoint) makeResult(size int, m measurement, c counters) result {
	o := e.opt
	r := result{Test: o.Test, Transport: o.Transport, Size: size, QPs: o.QPs, Depth: o.Depth, MTU: o.MTU, Inline: o.inline(size),
		CQMod: o.CQMod, Events: o.Events, Ops: m.ops, Bytes: m.ops * uint64(size), Seconds: m.elapsed.Seconds(), Client: c,
		ECE: abi.ECEString(e.ece)}
	if o.Test == atomicBW {
		r.Atomic = o.Atomic
	}
	if r.Seconds > 0 {
		r.Gbps = float64(r.Bytes) * 8 / r.Seconds / 1e9
		r.MBps = float64(r.Bytes) / r.Seconds / 1e6
		r.Mops = float64(r.Ops) / r.Seconds / 1e6
	}
	if o.Test.latency() {
		r.Latency = e.hist.stats()
	}
	return r
}

// report is the --json document.
type report struct {
	Results []result `json:"results"`
}

func writeJSON(w io.Writer, rs []result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(report{Results: rs})
}

// writeTable prints results like perftest: one line per size.
func writeTable(w io.Writer, o *options, rs []result) {
	ece := "none"
	if len(rs) > 0 {
		ece = rs[0].ECE
	}
	what := string(o.Test)
	if o.Test == atomicBW {
		what += " " + o.Atomic
	}
	if o.Transport != transportRC {
		what += " over " + strings.ToUpper(o.Transport)
	}
	fmt.Fprintf(w, "%s: %d QP(s), depth %d, MTU %d, inline ≤ %d B, signal every %d, %s, ECE %s\n", what, o.QPs, o.Depth, o.MTU,
		o.Inline, o.CQMod, map[bool]string{true: "completion events", false: "polling"}[o.Events], ece)
	if o.Test.latency() {
		half := ""
		if o.Test.pingPong() {
			half = " (one-way = round trip / 2)"
		}
		fmt.Fprintf(w, "latency in µs%s\n", half)
		fmt.Fprintf(w, "%10s %10s %9s %9s %9s %9s %9s %9s %8s %6s\n", "bytes", "iters", "min", "p50", "p99", "p99.9", "max", "avg", "Mops/s", "retx")
		for _, r := range rs {
			l := r.Latency
			fmt.Fprintf(w, "%10d %10d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.3f %6d\n", r.Size, r.Ops,
				us(l.Min), us(l.P50), us(l.P99), us(l.P999), us(l.Max), l.Avg/1e3, r.Mops, r.Retransmits)
		}
		return
	}
	if o.unreliable() && o.Test == sendBW {
		fmt.Fprintf(w, "%10s %12s %10s %12s %10s %10s %s\n", "bytes", "ops", "Gb/s", "MB/s", "Mops/s", "lost", "verified")
		for _, r := range rs {
			fmt.Fprintf(w, "%10d %12d %10.3f %12.2f %10.4f %10d %v\n", r.Size, r.Ops, r.Gbps, r.MBps, r.Mops, r.Lost, r.Verified)
		}
		return
	}
	fmt.Fprintf(w, "%10s %12s %10s %12s %10s %6s %s\n", "bytes", "ops", "Gb/s", "MB/s", "Mops/s", "retx", "verified")
	for _, r := range rs {
		fmt.Fprintf(w, "%10d %12d %10.3f %12.2f %10.4f %6d %v\n", r.Size, r.Ops, r.Gbps, r.MBps, r.Mops, r.Retransmits, r.Verified)
	}
}

func us(ns uint64) float64 { return float64(ns) / 1e3 }
