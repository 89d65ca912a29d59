package hostile

// Key probes: keys a client sees tell nothing of other keys.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// keysMaxMRs is the daemon's MR limit in these probes (its key table has
// as many indices), so that indices come back within a few hundred
// registrations.
const keysMaxMRs = 64

// TestKeysNotPredictable registers MRs at once and one after another and
// checks that lkey and rkey differ, that indices are not handed out in
// order and that variants are not a counter: no key follows from
// another.
func TestKeysNotPredictable(t *testing.T) {
	d := memHelperStartDaemon(t, `{"name":"keys","link":{"type":"mem"},"limits":{"per_device":{"mr":64,"mw":1}}}`)
	v := memHelperNewVictim(t, d.sock)
	const access = abi.AccessLocalWrite | abi.AccessRemoteRead | abi.AccessRemoteWrite

	// At once: as many as the device allows besides the victim's two.
	var mrs []*verbs.MR
	for range keysMaxMRs - 2 {
		mr, err := v.pd.RegMR(v.tgt, access)
		require.NoError(t, err)
		mrs = append(mrs, mr)
	}
	inOrder, same, lowBytes := 0, 0, map[uint8]bool{}
	for i, mr := range mrs {
		if mr.LKey == mr.RKey {
			same++
		}
		lowBytes[uint8(mr.RKey)] = true
		if i > 0 && mr.RKey>>8 == mrs[i-1].RKey>>8+1 {
			inOrder++
		}
	}
	t.Logf("%d MRs at once: %d indices following their predecessor, %d distinct rkey variants", len(mrs), inOrder, len(lowBytes))
	assert.Zero(t, same, "MRs whose rkey is their lkey")
	assert.Less(t, inOrder, len(mrs)/4, "indices handed out in order")
	assert.Greater(t, len(lowBytes), len(mrs)/3, "rkey variants spread (62 uniform draws from 256 give about 55)")
	for _, mr := range mrs {
		require.NoError(t, mr.Dereg())
	}

	// One after another: the difference between consecutive rkeys.
	same = 0
	diffs := map[uint32]int{}
	var prev uint32
	const rounds = 300
	for range rounds {
		mr, err := v.pd.RegMR(v.tgt, access)
		require.NoError(t, err)
		if mr.LKey == mr.RKey {
			same++
		}
		if prev != 0 {
			diffs[mr.RKey-prev]++
		}
		prev = mr.RKey
		require.NoError(t, mr.Dereg())
	}
	most := 0
	for _, n := range diffs {
		most = max(most, n)
	}
	t.Logf("%d re-registrations: %d distinct differences between consecutive rkeys, the most common %d times", rounds, len(diffs), most)
	assert.Zero(t, same, "MRs whose rkey is their lkey")
	assert.Less(t, most, rounds/10, "consecutive rkeys differ by the same amount too often")
}

// TestKeysStaleAfterReuse deregisters an MR and registers again until an
// MR gets the same key index, then checks that a peer holding the old
// rkey is refused (REM_ACCESS_ERR) while the new rkey works.
func TestKeysStaleAfterReuse(t *testing.T) {
	d := memHelperStartDaemon(t, `{"name":"keys","link":{"type":"mem"},"limits":{"per_device":{"mr":64,"mw":1}}}`)
	v := memHelperNewVictim(t, d.sock)
	const access = abi.AccessLocalWrite | abi.AccessRemoteRead | abi.AccessRemoteWrite
	old, err := v.pd.RegMR(v.tgt, access)
	require.NoError(t, err)
	require.NoError(t, old.Dereg())
	var same *verbs.MR
	for range 1000 {
		mr, err := v.pd.RegMR(v.tgt, access)
		require.NoError(t, err)
		if mr.RKey>>8 == old.RKey>>8 {
			same = mr
			break
		}
		require.NoError(t, mr.Dereg())
	}
	require.NotNil(t, same, "index %#x never came back in 1000 registrations (%d MRs on the device)", old.RKey>>8, keysMaxMRs)
	t.Logf("index %#x: old lkey %#x rkey %#x, new lkey %#x rkey %#x", old.RKey>>8, old.LKey, old.RKey, same.LKey, same.RKey)
	for _, k := range []uint32{old.LKey, old.RKey} {
		assert.NotEqual(t, k, same.LKey)
		assert.NotEqual(t, k, same.RKey)
	}

	n := uint32(4096)
	st, err := v.post(abi.WRRDMARead, v.mrA.SGE(0, n), same.RKey, same.Addr)
	require.NoError(t, err)
	require.Equal(t, abi.WCSuccess, st, "the new rkey works")
	st, err = v.post(abi.WRRDMARead, v.mrA.SGE(0, n), old.RKey, same.Addr)
	require.NoError(t, err)
	assert.Equal(t, abi.WCRemAccessErr, st, "the stale rkey is refused")
	_, err = v.c.QueryDevice()
	require.NoError(t, err, "the daemon answers")
}
