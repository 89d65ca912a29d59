package queues

import (
	"encoding/binary"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// cqe is a CQE with every field set from id.
func cqe(id uint64) abi.CQE {
	return abi.CQE{WrID: id, ByteLen: uint32(id) * 3, ImmOrInv: uint32(id) ^ 0xabcd, QPNum: 0x123456, SrcQP: uint32(id) + 7,
		Status: abi.WCStatus(id % 3), Opcode: abi.WCOpcode(id % 5), WCFlags: abi.WCFlags(id % 4), VendorErr: uint8(id),
		PKeyIndex: uint16(id) + 1, SL: uint8(id % 16)}
}

// wantCQE checks that entry index of ring (count entries) is ready and
// equals cqe(id), every field.
func wantCQE(t *testing.T, ring []byte, count, index uint32, id uint64) {
	t.Helper()
	var e abi.CQE
	require.True(t, ReadCQE(ring, count, index, &e), "entry %d ready", index)
	want := cqe(id)
	want.Owner = abi.CQEPhase(index, count)
	assert.Equal(t, want, e, "entry %d", index)
}

// garbage fills b with 0xff: every owner bit set, so nothing the client
// left in a new ring may look ready by chance.
func garbage(n uint32) []byte {
	b := make([]byte, n*abi.SizeofCQE)
	for i := range b {
		b[i] = 0xff
	}
	return b
}

func TestCQResize(t *testing.T) {
	c := newTestCQ(t, 4)
	// Five pushed and consumed: the indices are in the second pass.
	for i := range uint64(5) {
		e := cqe(i)
		require.NoError(t, c.cq.Push(&e))
		c.ci.Store(uint32(i) + 1)
	}
	for i := uint64(5); i < 8; i++ { // three outstanding: 5, 6, 7
		e := cqe(i)
		require.NoError(t, c.cq.Push(&e))
	}
	c.cq.Publish()

	_, err := c.cq.Resize(garbage(2), 2)
	assert.ErrorIs(t, err, ErrCQTooSmall, "3 outstanding do not fit in 2")
	wantCQE(t, c.ring, 4, 7, 7) // unchanged

	big := garbage(16)
	n, err := c.cq.Resize(big, 16)
	require.NoError(t, err)
	assert.Equal(t, uint32(3), n)
	for i := uint32(5); i < 8; i++ {
		wantCQE(t, big, 16, i, uint64(i))
	}
	var e abi.CQE
	for i := uint32(8); i < 5+16; i++ {
		assert.False(t, ReadCQE(big, 16, i, &e), "index %d not ready", i)
	}
	assert.Equal(t, uint32(16), c.cq.Count())
	// Later CQEs go to the new ring, after the carried ones.
	for i := uint64(8); i < 20; i++ {
		e := cqe(i)
		require.NoError(t, c.cq.Push(&e))
	}
	e = cqe(99)
	assert.NoError(t, c.cq.Push(&e), "16 outstanding (5..20) fill it")
	assert.ErrorIs(t, c.cq.Push(&e), ErrCQFull)
}

func TestCQResizeShrinkWraps(t *testing.T) {
	c := newTestCQ(t, 8)
	for i := range uint64(14) {
		e := cqe(i)
		require.NoError(t, c.cq.Push(&e))
		c.ci.Store(uint32(min(i+1, 11)))
	} // 11, 12, 13 outstanding; index 13 is in pass 1 of 8, pass 3 of 4
	small := garbage(4)
	n, err := c.cq.Resize(small, 4)
	require.NoError(t, err)
	assert.Equal(t, uint32(3), n)
	for i := uint32(11); i < 14; i++ {
		wantCQE(t, small, 4, i, uint64(i))
	}
	var e abi.CQE
	assert.False(t, ReadCQE(small, 4, 14, &e))
	e = cqe(14)
	require.NoError(t, c.cq.Push(&e))
	wantCQE(t, small, 4, 14, 14)
	assert.ErrorIs(t, c.cq.Push(&e), ErrCQFull, "4 outstanding in 4")
}

func TestCQResizeBadInput(t *testing.T) {
	c := newTestCQ(t, 4)
	e := cqe(1)
	require.NoError(t, c.cq.Push(&e))
	c.ci.Store(5) // ahead of the producer
	_, err := c.cq.Resize(garbage(4), 4)
	assert.ErrorIs(t, err, ErrIndex)
	c.ci.Store(0)
	_, err = c.cq.Resize(garbage(4), 3)
	assert.ErrorIs(t, err, ErrConfig, "not a power of two")
	_, err = c.cq.Resize(garbage(2), 4)
	assert.ErrorIs(t, err, ErrConfig, "ring too short")
	_, err = c.cq.Resize(garbage(5)[1:], 4)
	assert.ErrorIs(t, err, ErrConfig, "misaligned")
	n, err := c.cq.Resize(garbage(2), 2)
	require.NoError(t, err, "the CQ is unchanged by the refusals")
	assert.Equal(t, uint32(1), n)

	r := garbage(8)
	require.NoError(t, InitCQRing(r, 8, 0))
	for i := range uint32(8) {
		assert.False(t, ReadCQE(r, 8, i, &e))
	}
}

// TestCQTimestamps: a CQ with timestamps stores the time of each Push at
// its index after the CQEs, and a resize carries each one over with its
// CQE to the new ring's index.
func TestCQTimestamps(t *testing.T) {
	const n = 4
	ring := make([]byte, n*(abi.SizeofCQE+8))
	var ci, pi, over atomic.Uint32
	c, err := NewCQ(ring, n, CQWords{CI: &ci, PI: &pi, Overflow: &over})
	require.NoError(t, err)
	assert.ErrorIs(t, c.SetTimestamps(ring[n*abi.SizeofCQE:n*abi.SizeofCQE+8]), ErrConfig, "too short")
	require.NoError(t, c.SetTimestamps(ring[n*abi.SizeofCQE:]))
	ts := func(r []byte, count, i uint32) uint64 {
		off := int(count)*abi.SizeofCQE + int(i&(count-1))*8
		return binary.LittleEndian.Uint64(r[off:])
	}
	before := uint64(time.Now().UnixNano())
	for i := range uint64(6) { // indices 0..5; 0 and 1 consumed
		e := cqe(i)
		require.NoError(t, c.Push(&e))
		if i < 2 {
			ci.Store(uint32(i) + 1)
		}
	}
	after := uint64(time.Now().UnixNano())
	var got [6]uint64
	for i := uint32(2); i < 6; i++ {
		got[i] = ts(ring, n, i)
		assert.True(t, got[i] >= before && got[i] <= after, "index %d: %d not in [%d, %d]", i, got[i], before, after)
		if i > 2 {
			assert.GreaterOrEqual(t, got[i], got[i-1], "in push order")
		}
	}
	big := make([]byte, 8*abi.SizeofCQE) // no room for the timestamps
	_, err = c.Resize(big, 8)
	assert.ErrorIs(t, err, ErrConfig, "a ring without the timestamp array")
	big = make([]byte, 8*(abi.SizeofCQE+8))
	m, err := c.Resize(big, 8)
	require.NoError(t, err)
	assert.Equal(t, uint32(4), m)
	for i := uint32(2); i < 6; i++ {
		wantCQE(t, big, 8, i, uint64(i))
		assert.Equal(t, got[i], ts(big, 8, i), "index %d's timestamp carried over", i)
	}
	e := cqe(6)
	require.NoError(t, c.Push(&e))
	assert.GreaterOrEqual(t, ts(big, 8, 6), got[5], "later CQEs stamp the new ring")
}
