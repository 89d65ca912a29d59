package device

import "github.com/vrnic/vrnic/admin"

// Data-path totals.
//
// The engine counts per QP (atomics its workers update). The device's
// totals are not counted on the hot path: an operator query (InfoCmd,
// vrnicctl info/counters) sums the counters of the live QPs and adds those
// of the QPs destroyed so far, which freeQP folded into Device.dpRetired
// from the final counters DataPlane.DestroyQP returned. So the totals never
// go down while the daemon runs.

// dataPathTotalsLocked sums the counters of every live QP and those of the
// QPs destroyed so far. Called with d.mu held.
func (d *Device) dataPathTotalsLocked() QPCounters {
	t := d.dpRetired
	d.qps.each(func(q *QP) { t.Add(d.dp.Counters(q)) })
	return t
}

// DataPathTotals returns the device-wide data-path totals: the engine's
// per-QP counters summed over the live QPs and every QP destroyed since
// the device started.
func (d *Device) DataPathTotals() QPCounters {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dataPathTotalsLocked()
}

// QPStateCount is how many QPs of one type are in one state.
type QPStateCount struct {
	Type, State string
	N           int
}

// Snapshot returns, under one hold of the device lock, what an operator's
// INFO reply says of the device and how many live QPs there are of each
// type in each state: what a metrics scrape reads.
func (d *Device) Snapshot() (admin.Info, []QPStateCount) {
	d.mu.Lock()
	defer d.mu.Unlock()
	counts := map[[2]string]int{}
	d.qps.each(func(q *QP) { counts[[2]string{q.typ.String(), q.state.Load().String()}]++ })
	out := make([]QPStateCount, 0, len(counts))
	for k, n := range counts {
		out = append(out, QPStateCount{Type: k[0], State: k[1], N: n})
	}
	return d.infoLocked(), out
}
