package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/vrnic/vrnic/abi"
)

// never is a VerbFaults whose faults never strike: the cost of the
// hooks themselves.
type never struct{}

func (never) VerbFault(VerbPoint, uint32, uint32) (time.Duration, bool) { return 0, false }

// TestZeroAllocVerbHooks: with verb faults installed (none striking) the
// SEND/RECV path still allocates nothing.
func TestZeroAllocVerbHooks(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, b := steady(t)
	a.n.eng.SetVerbFaults(never{})
	b.n.eng.SetVerbFaults(never{})
	src := a.n.buffer(1000, 0x1000, abi.AccessAll, 1)
	dst := b.n.buffer(1000, 0x1000, abi.AccessAll, 2)
	wr := abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendSignaled}
	assert.Zero(t, sendAllocs(a, b, wr, []abi.SGE{src.sge(0, 1000)}, dst.sge(0, 1000)))
}

// BenchmarkVerbHooks measures 8-byte SENDs (each through the requester's
// fetch hook and the responder's receive hook) in rounds alternating no
// verb faults (the hooks' nil pointer: the default) and verb faults
// installed that never strike, and reports the message rate without
// over the rate with ("ratio": about 1 means the hooks cost nothing
// measurable even when installed; with none installed they are one
// atomic load of a nil pointer).
func BenchmarkVerbHooks(b *testing.B) {
	qa, qb := steady(b)
	src := qa.n.buffer(8, 0x1000, abi.AccessAll, 1)
	dst := qb.n.buffer(8, 0x1000, abi.AccessAll, 2)
	sges := []abi.SGE{src.sge(0, 8)}
	rsge := dst.sge(0, 8)
	wr := abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendSignaled}
	var n int64
	one := func() {
		n++
		sendOnce(qa, qb, wr, sges, rsge, n)
		if n%2048 == 0 {
			qa.scq.reset()
			qb.rcq.reset()
			n = 0
		}
	}
	for range 100 {
		one()
	}
	b.ReportAllocs()
	b.ResetTimer()
	var bare, hooked time.Duration
	const round = 256
	for left, i := b.N, 0; left > 0; i++ {
		k := min(left, round)
		var f VerbFaults
		if i%2 == 1 {
			f = never{}
		}
		qa.n.eng.SetVerbFaults(f)
		qb.n.eng.SetVerbFaults(f)
		start := time.Now()
		for range k {
			one()
		}
		if f == nil {
			bare += time.Since(start)
		} else {
			hooked += time.Since(start)
		}
		left -= k
	}
	if hooked > 0 && bare > 0 {
		b.ReportMetric(hooked.Seconds()/bare.Seconds(), "ratio")
	}
}
