package dataplane

import (
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
)

// countersOf loads the engine's counters of one QP (nil: all zero) into
// the operator's type. engine.QPCounterValues declares the same counters
// in the same order as device.QPCounters (admin.QPCounters, the JSON the
// operator reads), so one converts to the other: the compiler checks the
// two agree. Control path only.
func countersOf(c *engine.QPCounters) device.QPCounters {
	if c == nil {
		return device.QPCounters{}
	}
	return device.QPCounters(c.Load())
}
