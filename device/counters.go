package device

import "github.com/vrnic/vrnic/device/engine"

// Data-path totals.
//
// The engine counts per QP (engine.QPCounters, atomics its workers
// update). The device's totals are not counted on the hot path: an
// operator query (AdminInfoCmd, vrnicctl info/counters) sums the counters
// of the live QPs and adds those of the QPs destroyed so far, which
// freeQP folded into Device.dpRetired when it destroyed them. So the
// totals never go down while the daemon runs.

// add adds every counter of o to c.
func (c *QPCounters) add(o QPCounters) {
	c.PacketsSent += o.PacketsSent
	c.PacketsReceived += o.PacketsReceived
	c.Retransmits += o.Retransmits
	c.Timeouts += o.Timeouts
	c.RNRNaksReceived += o.RNRNaksReceived
	c.RNRNaksSent += o.RNRNaksSent
	c.SeqNaksReceived += o.SeqNaksReceived
	c.SeqNaksSent += o.SeqNaksSent
	c.Duplicates += o.Duplicates
	c.Dropped += o.Dropped
	c.SendCQEs += o.SendCQEs
	c.RecvCQEs += o.RecvCQEs
}

// countersOf loads the engine's counters of one QP (nil: all zero).
func countersOf(c *engine.QPCounters) QPCounters {
	if c == nil {
		return QPCounters{}
	}
	return QPCounters{
		PacketsSent:     c.PacketsSent.Load(),
		PacketsReceived: c.PacketsReceived.Load(),
		Retransmits:     c.Retransmits.Load(),
		Timeouts:        c.Timeouts.Load(),
		RNRNaksReceived: c.RNRNAKsReceived.Load(),
		RNRNaksSent:     c.RNRNAKsSent.Load(),
		SeqNaksReceived: c.SeqNAKsReceived.Load(),
		SeqNaksSent:     c.SeqNAKsSent.Load(),
		Duplicates:      c.Duplicates.Load(),
		Dropped:         c.Dropped.Load(),
		SendCQEs:        c.SendCQEs.Load(),
		RecvCQEs:        c.RecvCQEs.Load(),
	}
}

// engineCounters returns the engine's live counters of QP qpn, or nil
// (no such QP, or a UD QP, which has no data path). Taken under
// Device.mu, like every dp.mu.
func (dp *DataPlane) engineCounters(qpn uint32) *engine.QPCounters {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if x := dp.qps[qpn]; x != nil {
		return x.ctrs
	}
	return nil
}

// retireQPCounters returns the function that, once the engine has
// destroyed q, gives q's final counters: with the DataPlane the engine's
// atomics, read after DestroyQP so that nothing counted in between is
// lost; with another engine a snapshot taken now. Called with d.mu held.
func (d *Device) retireQPCounters(q *QP) func() QPCounters {
	if dp, ok := d.engine.(*DataPlane); ok {
		c := dp.engineCounters(q.qpn)
		return func() QPCounters { return countersOf(c) }
	}
	snap := d.engine.Counters(q)
	return func() QPCounters { return snap }
}

// dataPathTotalsLocked sums the counters of every live QP and those of the
// QPs destroyed so far. Called with d.mu held.
func (d *Device) dataPathTotalsLocked() QPCounters {
	t := d.dpRetired
	for _, q := range d.qps {
		t.add(d.engine.Counters(q))
	}
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
