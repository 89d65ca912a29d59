package dataplane

import (
	"reflect"
	"sync/atomic"

	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
)

// countersOf loads the engine's counters of one QP (nil: all zero) into
// the operator's type. The two structs declare the same counters in the
// same order (engine.QPCounters as atomics, device.QPCounters as the JSON
// the operator reads; TestCountersMirror checks it), so the copy walks the
// fields instead of naming them a third time. Control path only.
func countersOf(c *engine.QPCounters) device.QPCounters {
	var out device.QPCounters
	if c == nil {
		return out
	}
	src, dst := reflect.ValueOf(c).Elem(), reflect.ValueOf(&out).Elem()
	for i := range dst.NumField() {
		dst.Field(i).SetUint(src.Field(i).Addr().Interface().(*atomic.Uint64).Load())
	}
	return out
}
