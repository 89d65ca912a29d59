package doorbell

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// FuzzCQNotifier lets a hostile client write any sequence of arm words.
// The notifier never panics, writes the completion eventfd at most once per
// change of the arm sequence, never for an unarmed word, never for a
// non-solicited CQE under a solicited-only arm, never for a CQE the client
// says it consumed, and its private record of
// the last notified sequence is what it publishes in arm_sn_done.
func FuzzCQNotifier(f *testing.F) {
	f.Add([]byte{1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0})
	f.Add([]byte{3, 1, 0, 0, 0, 3, 1, 0, 0, 1})
	f.Fuzz(func(t *testing.T, steps []byte) {
		p, err := New()
		require.NoError(t, err)
		defer p.Close()
		i, err := p.Alloc()
		require.NoError(t, err)
		rec, _ := p.CQ(i)
		comp, err := NewEventFD()
		require.NoError(t, err)
		ew := NewEventWriter() // flushed by hand below
		n := NewCQNotifier(rec, comp, ew)
		defer n.Close()
		lastNotified := uint32(0)
		// Each step writes one CQE and has 1 flag byte (bit 0: write an arm
		// word, bit 1: solicited CQE, bit 2: write cq_ci), then 4 bytes of
		// arm word and/or 4 bytes of consumer index.
		le := func(b []byte) uint32 { return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24 }
		for len(steps) > 0 {
			flags := steps[0]
			steps = steps[1:]
			rec.PI.Add(1)
			if flags&1 != 0 && len(steps) >= 4 {
				rec.Arm.Store(le(steps))
				steps = steps[4:]
			}
			if flags&4 != 0 && len(steps) >= 4 {
				rec.CI.Store(le(steps))
				steps = steps[4:]
			}
			w := rec.Arm.Load()
			unconsumed := int32(rec.PI.Load()-1-rec.CI.Load()) >= 0
			sent := n.Completed(flags&2 != 0)
			ew.flush()
			cnt, err := comp.Drain()
			require.NoError(t, err)
			require.Equal(t, sent, cnt == 1)
			if sent {
				require.NotZero(t, w&abi.CQArmArmed)
				require.NotEqual(t, lastNotified, abi.ArmSN(w), "notified twice for one sequence")
				require.True(t, unconsumed, "notified for a CQE the client had consumed")
				if w&abi.CQArmSolicited != 0 {
					require.NotZero(t, flags&2)
				}
				lastNotified = abi.ArmSN(w)
				require.Equal(t, lastNotified, rec.ArmSNDone.Load())
			}
		}
	})
}
