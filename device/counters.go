package device

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
