package device

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/dma"
)

// FuzzModifyQP drives the state machine with arbitrary MODIFY_QP
// commands on a QP in an arbitrary state. Invariants: no panic; a
// rejected command changes nothing; an accepted one took a transition of
// the table with every required attribute, and the stored values are in
// range.
func FuzzModifyQP(f *testing.F) {
	sp, err := dma.NewSpace(dma.Config{NoMlock: true})
	require.NoError(f, err)
	f.Cleanup(sp.Close)
	d, err := New(Config{Name: "fz", Space: sp,
		Link: LinkInfo{GIDs: [][16]byte{{15: 1}}, MaxMTU: abi.MTU4096}})
	require.NoError(f, err)
	seed := func(typ QPType, cur QPState, mask AttrMask, a abi.QPAttr) {
		b := make([]byte, abi.Sizeof(&a))
		abi.Marshal(b, &a)
		f.Add(uint32(typ), uint8(cur), uint32(mask), b)
	}
	good := abi.QPAttr{QPState: StateInit, PortNum: 1, PathMTU: abi.MTU1024, AHAttr: abi.AHAttr{DGID: [16]byte{1}, PortNum: 1}}
	seed(QPTypeRC, StateReset, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags, good)
	good.QPState = StateRTR
	seed(QPTypeRC, StateInit, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, good)
	good.QPState = StateRTS
	seed(QPTypeUD, StateRTR, AttrState|AttrSQPSN, good)
	seed(QPTypeUD, StateSQE, AttrState|AttrQKey, good)
	seed(QPTypeRC, StateErr, attrAll, good)
	seed(QPTypeRC, StateInit|3<<5, AttrState|AttrECE|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer, good)
	seed(QPTypeUC, StateReset|1<<5, AttrState|AttrECE|AttrPKeyIndex|AttrPort|AttrAccessFlags, good)
	f.Fuzz(func(t *testing.T, typ uint32, cur uint8, mask uint32, attr []byte) {
		var a abi.QPAttr
		if len(attr) < abi.Sizeof(&a) {
			return
		}
		abi.Unmarshal(attr, &a)
		q := &QP{typ: QPType(typ), attr: abi.QPAttr{Cap: abi.QPCap{MaxSendWR: 1}}}
		q.state.store(QPState(cur % numStates))
		type snapshot struct {
			state         QPState
			attr          abi.QPAttr
			local, remote netip.Addr
		}
		snap := func() snapshot {
			local, remote := q.Path()
			return snapshot{q.state.Load(), q.attr, local, remote}
		}
		before := snap()
		// The ECE options come from the state byte's top bits (bit 2 of
		// them is no option: refused).
		ece := uint32(cur >> 5)
		err := d.modifyQPLocked(q, AttrMask(mask), &a, ece)
		if err != nil {
			require.Equal(t, before, snap(), "a refused modify changes nothing")
			require.NotEmpty(t, err.Error())
			return
		}
		col, ok := qpTypeIndex(q.typ)
		require.True(t, ok, "only RC and UD QPs are accepted")
		tr := qpTransitions[before.state][q.state.Load()]
		require.True(t, tr.valid)
		require.Zero(t, tr.required[col]&^AttrMask(mask), "required attributes present")
		require.LessOrEqual(t, q.attr.SQPSN, uint32(maxPSN))
		require.LessOrEqual(t, q.attr.RQPSN, uint32(maxPSN))
		require.LessOrEqual(t, q.attr.DestQPNum, uint32(maxQPN24))
		require.LessOrEqual(t, q.attr.Timeout, uint8(maxTimer5))
		require.LessOrEqual(t, q.attr.RetryCnt, uint8(maxRetry3))
		require.LessOrEqual(t, q.attr.MaxRdAtomic, uint8(abi.MaxRdAtomic))
		require.Zero(t, q.ece&^abi.ECEOptions, "only known ECE options")
		if !eceQPType(q.typ) {
			require.Zero(t, q.ece, "ECE options on RC and XRC QPs only")
		}
		if st := q.state.Load(); st != StateReset && st != StateErr && AttrMask(mask)&AttrPathMTU != 0 {
			require.GreaterOrEqual(t, q.attr.PathMTU, abi.MTU256)
		}
	})
}
