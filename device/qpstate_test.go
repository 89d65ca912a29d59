package device

import (
	"errors"
	"fmt"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var allStates = []QPState{StateReset, StateInit, StateRTR, StateRTS, StateSQD, StateSQE, StateErr}

type legalTransition struct {
	typ       QPType
	cur, next QPState
	req, opt  AttrMask
}

// legalTransitions lists every legal (type, cur, next) from the table.
func legalTransitions() []legalTransition {
	var out []legalTransition
	for _, typ := range []QPType{QPTypeRC, QPTypeUD, QPTypeUC} {
		col, _ := qpTypeIndex(typ)
		for _, cur := range allStates {
			for _, next := range allStates {
				tr := qpTransitions[cur][next]
				if !tr.valid || (typ == QPTypeRC && cur == StateSQE) {
					continue
				}
				opt := tr.optional[col]
				if curStateAllowed(cur, next) {
					opt |= AttrCurState
				}
				out = append(out, legalTransition{typ, cur, next, tr.required[col], opt})
			}
		}
	}
	return out
}

func TestCheckTransitionLegal(t *testing.T) {
	lt := legalTransitions()
	require.Len(t, lt, 20+23+23) // RC: no SQE row; UD and UC: every row
	for _, tr := range lt {
		t.Run(fmt.Sprintf("%s/%v-%v", tr.typ.String(), tr.cur, tr.next), func(t *testing.T) {
			// Required only, and required plus every optional attribute.
			assert.NoError(t, checkTransition(tr.typ, tr.cur, tr.next, AttrState|tr.req))
			assert.NoError(t, checkTransition(tr.typ, tr.cur, tr.next, AttrState|tr.req|tr.opt))
			// Dropping any one required attribute names it.
			for m := tr.req; m != 0; m &= m - 1 {
				bit := AttrMask(1) << bits.TrailingZeros32(uint32(m))
				err := checkTransition(tr.typ, tr.cur, tr.next, AttrState|tr.req&^bit)
				require.Error(t, err)
				assert.ErrorIs(t, err, errInval)
				assert.Contains(t, err.Error(), "missing required attribute "+bit.String())
			}
			// Any attribute neither required nor optional is refused by name.
			for i := range numAttrBits {
				bit := AttrMask(1) << i
				if bit == AttrState || (tr.req|tr.opt)&bit != 0 {
					continue
				}
				err := checkTransition(tr.typ, tr.cur, tr.next, AttrState|tr.req|bit)
				require.Error(t, err, "attribute %v", bit)
				assert.ErrorIs(t, err, errInval)
				assert.Contains(t, err.Error(), "attribute "+bit.String()+" not allowed")
			}
		})
	}
}

func TestCheckTransitionIllegal(t *testing.T) {
	// Spot checks with the message they get, then every pair not in the
	// table.
	cases := []struct {
		typ       QPType
		cur, next QPState
	}{
		{QPTypeRC, StateReset, StateRTR},
		{QPTypeRC, StateReset, StateRTS},
		{QPTypeRC, StateReset, StateSQD},
		{QPTypeRC, StateInit, StateRTS},
		{QPTypeRC, StateInit, StateSQD},
		{QPTypeRC, StateRTR, StateInit},
		{QPTypeRC, StateRTR, StateRTR},
		{QPTypeRC, StateRTR, StateSQD},
		{QPTypeRC, StateRTS, StateInit},
		{QPTypeRC, StateRTS, StateRTR},
		{QPTypeRC, StateRTS, StateSQE},
		{QPTypeRC, StateSQD, StateInit},
		{QPTypeRC, StateSQE, StateRTS}, // RC never has an SQE state to leave
		{QPTypeRC, StateErr, StateInit},
		{QPTypeRC, StateErr, StateRTS},
		{QPTypeUD, StateReset, StateRTR},
		{QPTypeUD, StateInit, StateRTS},
		{QPTypeUD, StateSQE, StateSQD},
		{QPTypeUD, StateErr, StateRTS},
		{QPTypeUC, StateReset, StateRTR},
		{QPTypeUC, StateRTS, StateSQE},
		{QPTypeUC, StateSQE, StateSQD},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%v-%v", c.typ.String(), c.cur, c.next), func(t *testing.T) {
			err := checkTransition(c.typ, c.cur, c.next, AttrState)
			require.Error(t, err)
			assert.ErrorIs(t, err, errInval)
			assert.Equal(t, fmt.Sprintf("illegal QP state transition %v -> %v for %s QP", c.cur, c.next, c.typ.String()), err.Error())
		})
	}
	legal := map[[3]uint32]bool{}
	for _, tr := range legalTransitions() {
		legal[[3]uint32{uint32(tr.typ), uint32(tr.cur), uint32(tr.next)}] = true
	}
	illegal := 0
	for _, typ := range []QPType{QPTypeRC, QPTypeUD, QPTypeUC} {
		for _, cur := range allStates {
			for _, next := range allStates {
				if legal[[3]uint32{uint32(typ), uint32(cur), uint32(next)}] {
					continue
				}
				illegal++
				// Whatever attributes come with it.
				err := checkTransition(typ, cur, next, attrAll)
				assert.ErrorIs(t, err, errInval, "%s %v->%v", typ.String(), cur, next)
				assert.Contains(t, err.Error(), "illegal QP state transition")
			}
		}
	}
	assert.Equal(t, 3*49-len(legalTransitions()), illegal)
}

func TestCheckTransitionBadInputs(t *testing.T) {
	err := checkTransition(QPType(9), StateReset, StateInit, AttrState)
	assert.ErrorIs(t, err, errInval)
	err = checkTransition(QPTypeRC, StateReset, QPState(7), AttrState)
	assert.ErrorIs(t, err, errInval)
	err = checkTransition(QPTypeRC, StateReset, StateReset, AttrMask(1<<21))
	assert.ErrorIs(t, err, errInval)
	assert.Contains(t, err.Error(), "unknown attribute mask bits")
	// Errno mapping of the state machine errors.
	assert.Equal(t, "EINVAL", errnoName(errnoOf(err)))
}

func TestAttrMaskString(t *testing.T) {
	assert.Equal(t, "0", AttrMask(0).String())
	assert.Equal(t, "STATE|AV|PATH_MTU", (AttrState | AttrAV | AttrPathMTU).String())
	assert.Equal(t, "DEST_QPN|bit25", (AttrDestQPN | 1<<25).String())
	// Every bit has a distinct name.
	seen := map[string]bool{}
	for i := range numAttrBits {
		s := (AttrMask(1) << i).String()
		assert.False(t, seen[s], s)
		seen[s] = true
	}
}

func TestErrnoOf(t *testing.T) {
	for _, e := range errnoTable {
		assert.Equal(t, e.errno, errnoOf(errorf(e.err, "x")))
		assert.Equal(t, e.errno, errnoOf(fmt.Errorf("wrapped: %w", e.err)))
	}
	assert.Equal(t, "EIO", errnoName(errnoOf(errors.New("plain"))))
}

// kernelTable is Linux's qp_state_table (drivers/infiniband/core/verbs.c,
// ib_modify_qp_is_ok) for RC, UD and UC, transcribed row by row: each
// legal (type, cur, next) with its required and optional attributes.
// CUR_STATE is in the optional sets where the kernel lists it. RESET and
// ERR as targets take no attributes, from every state (RESET→ERR too).
func kernelTable() []legalTransition {
	const (
		rc, ud, uc = QPTypeRC, QPTypeUD, QPTypeUC
		apm        = AttrAltPath | AttrPathMigState
	)
	out := []legalTransition{
		{rc, StateReset, StateInit, AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{ud, StateReset, StateInit, AttrPKeyIndex | AttrPort | AttrQKey, 0},
		{uc, StateReset, StateInit, AttrPKeyIndex | AttrPort | AttrAccessFlags, 0},
		{rc, StateInit, StateInit, 0, AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{ud, StateInit, StateInit, 0, AttrPKeyIndex | AttrPort | AttrQKey},
		{uc, StateInit, StateInit, 0, AttrPKeyIndex | AttrPort | AttrAccessFlags},
		{rc, StateInit, StateRTR, AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
			AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{ud, StateInit, StateRTR, 0, AttrPKeyIndex | AttrQKey},
		{uc, StateInit, StateRTR, AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN, AttrAltPath | AttrAccessFlags | AttrPKeyIndex},
		{rc, StateRTR, StateRTS, AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
			AttrCurState | apm | AttrAccessFlags | AttrMinRNRTimer},
		{ud, StateRTR, StateRTS, AttrSQPSN, AttrCurState | AttrQKey},
		{uc, StateRTR, StateRTS, AttrSQPSN, AttrCurState | apm | AttrAccessFlags},
		{rc, StateRTS, StateRTS, 0, AttrCurState | AttrAccessFlags | apm | AttrMinRNRTimer},
		{ud, StateRTS, StateRTS, 0, AttrCurState | AttrQKey},
		{uc, StateRTS, StateRTS, 0, AttrCurState | AttrAccessFlags | apm},
		{rc, StateRTS, StateSQD, 0, AttrEnSQDAsync},
		{ud, StateRTS, StateSQD, 0, AttrEnSQDAsync},
		{uc, StateRTS, StateSQD, 0, AttrEnSQDAsync},
		{rc, StateSQD, StateRTS, 0, AttrCurState | apm | AttrAccessFlags | AttrMinRNRTimer},
		{ud, StateSQD, StateRTS, 0, AttrCurState | AttrQKey},
		{uc, StateSQD, StateRTS, 0, AttrCurState | apm | AttrAccessFlags},
		{rc, StateSQD, StateSQD, 0, AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic |
			AttrMaxDestRdAtomic | apm | AttrAccessFlags | AttrPKeyIndex | AttrMinRNRTimer},
		{ud, StateSQD, StateSQD, 0, AttrPKeyIndex | AttrQKey},
		{uc, StateSQD, StateSQD, 0, AttrAV | apm | AttrAccessFlags | AttrPKeyIndex},
		// The kernel's SQE row has no RC column: an RC QP never gets there.
		{ud, StateSQE, StateRTS, 0, AttrCurState | AttrQKey},
		{uc, StateSQE, StateRTS, 0, AttrCurState | AttrAccessFlags},
	}
	for _, typ := range []QPType{rc, ud, uc} {
		for _, cur := range allStates {
			if typ == rc && cur == StateSQE {
				continue
			}
			out = append(out, legalTransition{typ, cur, StateReset, 0, 0}, legalTransition{typ, cur, StateErr, 0, 0})
		}
	}
	return out
}

// TestTransitionsMatchKernel: vrnic's table is the kernel's, every legal
// transition with the same required and optional attributes and no other
// transition legal, so that a mask Linux accepts passes the mask check
// here, and a mask Linux refuses with EINVAL is refused with EINVAL.
func TestTransitionsMatchKernel(t *testing.T) {
	want := map[[3]uint32]legalTransition{}
	for _, tr := range kernelTable() {
		want[[3]uint32{uint32(tr.typ), uint32(tr.cur), uint32(tr.next)}] = tr
	}
	got := map[[3]uint32]legalTransition{}
	for _, tr := range legalTransitions() {
		got[[3]uint32{uint32(tr.typ), uint32(tr.cur), uint32(tr.next)}] = tr
	}
	require.Len(t, want, len(kernelTable()))
	for k, w := range want {
		assert.Equal(t, w, got[k], "%s %v -> %v", w.typ.String(), w.cur, w.next)
	}
	for k, g := range got {
		_, ok := want[k]
		assert.True(t, ok, "%s %v -> %v is legal in vrnic, not in the kernel", g.typ.String(), g.cur, g.next)
	}
	// CAP is in no row of the kernel's table: refused everywhere.
	for _, tr := range kernelTable() {
		assert.ErrorIs(t, checkTransition(tr.typ, tr.cur, tr.next, AttrState|tr.req|AttrCap), errInval)
	}
}
