package loss

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// Series is the results of one injector and mode: Reps[k] holds the
// results of repetition k, every condition and test, measured together
// (its clean results are the baseline of its ratios).
type Series struct {
	Injector Injector
	SR       bool
	Reps     [][]*Result
}

// find returns the result of test under condition key in rep, or nil.
func find(rep []*Result, key string, test Test) *Result {
	for _, r := range rep {
		if r.Cond.Key == key && r.Test == test {
			return r
		}
	}
	return nil
}

// values collects f over the reps for one condition and test, skipping
// failed runs; failed counts those.
func (s *Series) values(key string, test Test, f func(r, clean *Result) (float64, bool)) (vs []float64, failed int) {
	for _, rep := range s.Reps {
		r, clean := find(rep, key, test), find(rep, Clean.Key, test)
		if r == nil {
			continue
		}
		if r.Err != nil || clean == nil || clean.Err != nil {
			failed++
			continue
		}
		if v, ok := f(r, clean); ok {
			vs = append(vs, v)
		}
	}
	return vs, failed
}

// span formats the range of vs with format fn: "a" or "a–b".
func span(vs []float64, failed int, fn func(float64) string) string {
	s := "–"
	if len(vs) > 0 {
		lo, hi := slices.Min(vs), slices.Max(vs)
		s = fn(lo)
		if fn(hi) != s {
			s += "–" + fn(hi)
		}
	}
	if failed > 0 {
		s += fmt.Sprintf(" (%d failed)", failed)
	}
	return s
}

// thousands formats n with comma separators.
func thousands(n float64) string {
	s := fmt.Sprintf("%.0f", math.Round(n))
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func mbps(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.1f", v)
	}
	return thousands(v)
}

func ratio(v float64) string {
	switch {
	case v < 0.01:
		return fmt.Sprintf("%.3f", v)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// dur formats a latency: µs below a millisecond, else ms.
func dur(ns float64) string {
	d := time.Duration(ns)
	if d < time.Millisecond {
		return fmt.Sprintf("%.0f µs", ns/1e3)
	}
	return fmt.Sprintf("%.1f ms", ns/1e6)
}

func count(v float64) string { return thousands(v) }

// Title names the series.
func (s *Series) Title() string {
	mode := "go-back-N"
	if s.SR {
		mode = "selective repeat (vrnic-perf " + SRFlag + ")"
	}
	return fmt.Sprintf("%s, %s, %d run(s)", s.Injector, mode, len(s.Reps))
}

// WriteTables writes the series' tables as Markdown: goodput and latency
// with their ratios to the clean run of the same repetition, then the
// counters that explain them. Cells give the range over the repetitions.
func (s *Series) WriteTables(w io.Writer, conds []Condition) {
	fmt.Fprintf(w, "%s\n\n", s.Title())
	fmt.Fprintln(w, "| random drop of requests | write_bw 64 KiB goodput, MB/s | of clean | send_lat 8 B p50 / p99 | p99 of clean | read_lat 8 B p50 / p99 | p99 of clean |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, c := range conds {
		cells := []string{c.Label}
		mb, f := s.values(c.Key, WriteBW, func(r, _ *Result) (float64, bool) { return r.Perf.MBps, true })
		cells = append(cells, span(mb, f, mbps))
		rt, f := s.values(c.Key, WriteBW, func(r, cl *Result) (float64, bool) { return r.Perf.MBps / cl.Perf.MBps, cl.Perf.MBps > 0 })
		cells = append(cells, span(rt, f, ratio))
		for _, test := range []Test{SendLat, ReadLat} {
			p50, f := s.values(c.Key, test, func(r, _ *Result) (float64, bool) { return float64(r.Perf.P50()), true })
			p99, _ := s.values(c.Key, test, func(r, _ *Result) (float64, bool) { return float64(r.Perf.P99()), true })
			cells = append(cells, span(p50, f, dur)+" / "+span(p99, 0, dur))
			rt, f := s.values(c.Key, test, func(r, cl *Result) (float64, bool) {
				return float64(r.Perf.P99()) / float64(cl.Perf.P99()), cl.Perf.P99() > 0
			})
			cells = append(cells, span(rt, f, ratio))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "write_bw counters (daemon A sends the WRITEs, B the ACKs):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| condition | requests needed | requests sent again | lost to the injector | sent again per loss | retransmits (A) | timeouts (A) | seq NAKs sent (B) | discarded by B's QP | duplicates (B) | ICRC errors (B) | socket drops A / B |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range conds {
		cell := func(f func(r *Result) (float64, bool), fn func(float64) string) string {
			vs, failed := s.values(c.Key, WriteBW, func(r, _ *Result) (float64, bool) { return f(r) })
			return span(vs, failed, fn)
		}
		u := func(f func(r *Result) uint64) func(r *Result) (float64, bool) {
			return func(r *Result) (float64, bool) { return float64(f(r)), true }
		}
		ok := func(f func(r *Result) (uint64, bool)) func(r *Result) (float64, bool) {
			return func(r *Result) (float64, bool) { n, ok := f(r); return float64(n), ok }
		}
		cells := []string{c.Label,
			cell(u((*Result).Needed), count),
			cell(ok((*Result).Resent), count),
			cell(ok((*Result).Lost), count),
			cell((*Result).ResentPerLost, ratio),
			cell(u(func(r *Result) uint64 { return r.Client.DataPath.Retransmits }), count),
			cell(u(func(r *Result) uint64 { return r.Client.DataPath.Timeouts }), count),
			cell(u(func(r *Result) uint64 { return r.Server.DataPath.SeqNAKsSent }), count),
			cell(u(func(r *Result) uint64 { return r.Server.DataPath.Dropped }), count),
			cell(u(func(r *Result) uint64 { return r.Server.DataPath.Duplicates }), count),
			cell(u(func(r *Result) uint64 { return r.Server.Wire.ICRCErrors }), count),
			cell(u(func(r *Result) uint64 { return r.Client.SocketDrops }), count) + " / " +
				cell(u(func(r *Result) uint64 { return r.Server.SocketDrops }), count),
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "latency tests' counters (both daemons; the loss applies to both sides' requests):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| condition | send_lat samples | send_lat timeouts / retransmits | read_lat samples | read_lat timeouts / retransmits |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, c := range conds {
		cells := []string{c.Label}
		for _, test := range []Test{SendLat, ReadLat} {
			n, f := s.values(c.Key, test, func(r, _ *Result) (float64, bool) { return float64(r.Perf.Ops), true })
			to, _ := s.values(c.Key, test, func(r, _ *Result) (float64, bool) {
				return float64(r.Client.DataPath.Timeouts + r.Server.DataPath.Timeouts), true
			})
			re, _ := s.values(c.Key, test, func(r, _ *Result) (float64, bool) {
				return float64(r.Client.DataPath.Retransmits + r.Server.DataPath.Retransmits), true
			})
			cells = append(cells, span(n, f, count), span(to, 0, count)+" / "+span(re, 0, count))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}

	// Counters this package does not put in a column (a transport mode
	// may add its own), so that nothing the daemons count is hidden.
	known := map[string]bool{"packets_sent": true, "packets_received": true, "retransmits": true, "timeouts": true,
		"seq_naks_sent": true, "seq_naks_received": true, "duplicates": true, "dropped": true, "send_cqes": true, "recv_cqes": true,
		"wire.rx_frames": true, "wire.tx_frames": true, "wire.icrc_errors": true}
	var extra []string
	for _, c := range conds {
		for _, test := range Tests {
			sums := map[string]uint64{}
			for _, rep := range s.Reps {
				r := find(rep, c.Key, test)
				if r == nil {
					continue
				}
				for side, sd := range map[string]*Side{"A": &r.Client, "B": &r.Server} {
					for k, v := range sd.All {
						if !known[k] {
							sums[side+" "+k] += v
						}
					}
				}
			}
			if len(sums) > 0 {
				extra = append(extra, fmt.Sprintf("%s %s: %s", c.Key, test, counterList(sums)))
			}
		}
	}
	if len(extra) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Other counters that moved (sums over the runs):")
		fmt.Fprintln(w)
		for _, e := range extra {
			fmt.Fprintf(w, "- %s\n", e)
		}
	}
	fmt.Fprintln(w)
}

// counterList formats counters as "name=value ..." in name order.
func counterList(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(s, " ")
}
