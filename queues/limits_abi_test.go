package queues

// The ABI limits are accepted and work, not only limit+1 rejected: rings
// of the largest sizes, every slot filled with WQEs of the most SGEs or the
// most inline bytes, each decoded back exactly.

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// maxSGEs returns abi.MaxSGE distinct SGEs for WQE i.
func maxSGEs(i uint32) []abi.SGE {
	sges := make([]abi.SGE, abi.MaxSGE)
	for j := range sges {
		sges[j] = abi.SGE{Addr: uint64(i)<<20 | uint64(j)<<8, Length: i%1024 + uint32(j) + 1, LKey: i<<8 | uint32(j)}
	}
	return sges
}

// maxInline returns abi.MaxInline bytes for WQE i, depending on the
// position (bytes j and j+256 differ too) and on i.
func maxInline(i uint32) []byte {
	b := make([]byte, abi.MaxInline)
	for j := range b {
		b[j] = byte(j) ^ byte(j>>8)*0x55 ^ byte(i) ^ byte(i>>8)*31
	}
	return b
}

func sum(sges []abi.SGE) (n uint64) {
	for _, s := range sges {
		n += uint64(s.Length)
	}
	return n
}

// TestSQAtABILimits fills a send queue of abi.MaxQPWR slots sized for
// abi.MaxSGE SGEs and abi.MaxInline inline bytes, alternating WQEs of 32
// SGEs and of 512 inline bytes, and decodes all of them; then it runs the
// full ring around once more.
func TestSQAtABILimits(t *testing.T) {
	cfg := SQConfig{Slots: abi.MaxQPWR, MaxSGE: abi.MaxSGE, MaxInline: abi.MaxInline}
	// 32 SGEs need 8 blocks, 512 inline bytes 8 blocks: 1+8 per slot.
	require.Equal(t, uint32(9*abi.WQEBlock), cfg.Stride())
	require.Equal(t, uint32(abi.SizeofSendWQE+abi.MaxSGE*abi.SizeofSGE), cfg.Stride())
	require.Equal(t, uint32(abi.SizeofSendWQE+abi.MaxInline), cfg.Stride())
	s := newTestSQ(t, cfg)
	var wr SendWR
	for pass := range uint32(2) {
		base := pass * abi.MaxQPWR
		for i := base; i < base+abi.MaxQPWR; i++ {
			if i%2 == 0 {
				s.postSGEs(abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: uint64(i) << 12, RKey: i}, maxSGEs(i)...)
			} else {
				s.postRaw(&abi.SendWQE{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendInline, InlineLen: abi.MaxInline}, maxInline(i))
			}
		}
		n, err := s.q.Poll()
		require.NoError(t, err)
		require.Equal(t, uint32(abi.MaxQPWR), n, "a full ring of the largest size")
		for i := base; i < base+abi.MaxQPWR; i++ {
			ok, err := s.q.Next(&wr)
			require.True(t, ok)
			require.NoError(t, err, "WQE %d", i)
			require.Equal(t, uint64(i), wr.WrID)
			if i%2 == 0 {
				want := maxSGEs(i)
				require.Equal(t, uint8(abi.MaxSGE), wr.NumSGE)
				require.Equal(t, want, wr.SGEs(), "WQE %d: all %d SGEs", i, abi.MaxSGE)
				require.Equal(t, sum(want), wr.Length)
				require.Nil(t, wr.Inline)
				require.Equal(t, uint64(i)<<12, wr.RemoteAddr)
			} else {
				require.Zero(t, wr.NumSGE)
				require.Equal(t, maxInline(i), wr.Inline, "WQE %d: all %d inline bytes", i, abi.MaxInline)
				require.Equal(t, uint64(abi.MaxInline), wr.Length)
			}
		}
		ok, _ := s.q.Next(&wr)
		require.False(t, ok)
		s.q.Publish()
		require.Equal(t, base+abi.MaxQPWR, s.ci.Load())
	}
}

// TestSQMaxSGEMaxLength: 32 SGEs whose lengths add up to exactly
// abi.MaxMsgBytes are accepted; one byte more is not.
func TestSQMaxSGEMaxLength(t *testing.T) {
	s := newTestSQ(t, SQConfig{Slots: 2, MaxSGE: abi.MaxSGE})
	sges := make([]abi.SGE, abi.MaxSGE)
	for j := range sges {
		sges[j] = abi.SGE{Addr: uint64(j) << 26, Length: abi.MaxMsgBytes / abi.MaxSGE, LKey: 1}
	}
	s.postSGEs(abi.SendWQE{WrID: 1, Opcode: abi.WRSend}, sges...)
	sges[abi.MaxSGE-1].Length++
	s.postSGEs(abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, sges...)
	_, err := s.q.Poll()
	require.NoError(t, err)
	var wr SendWR
	ok, err := s.q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, uint64(abi.MaxMsgBytes), wr.Length)
	assert.Len(t, wr.SGEs(), abi.MaxSGE)
	ok, err = s.q.Next(&wr)
	require.True(t, ok)
	var we *WQEError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, ReasonLength, we.Reason)
}

// TestRecvAtABILimits fills an RQ of abi.MaxQPWR slots and an SRQ of
// abi.MaxSRQWR slots with WQEs of abi.MaxSGE SGEs and decodes them all.
func TestRecvAtABILimits(t *testing.T) {
	for _, c := range []struct {
		name  string
		slots uint32
		make  func([]byte, RecvConfig, *atomic.Uint32, *atomic.Uint32) (*RecvQueue, error)
	}{
		{"RQ", abi.MaxQPWR, NewRQ},
		{"SRQ", abi.MaxSRQWR, NewSRQ},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := RecvConfig{Slots: c.slots, MaxSGE: abi.MaxSGE}
			// 16 + 32*16 = 528 bytes, rounded up to 64: 576.
			require.Equal(t, uint32(576), cfg.Stride())
			ring := make([]byte, cfg.RingBytes())
			var pi, ci atomic.Uint32
			q, err := c.make(ring, cfg, &pi, &ci)
			require.NoError(t, err)
			stride := cfg.Stride()
			for i := range c.slots {
				slot := ring[i*stride : (i+1)*stride]
				(&abi.RecvWQE{WrID: uint64(i) + 1000, NumSGE: abi.MaxSGE}).Put(slot)
				for j, g := range maxSGEs(i) {
					g.Put(slot[abi.SizeofRecvWQE+j*abi.SizeofSGE:])
				}
			}
			pi.Store(c.slots)
			n, err := q.Poll()
			require.NoError(t, err)
			require.Equal(t, c.slots, n, "a full ring of the largest size")
			var wr RecvWR
			for i := range c.slots {
				ok, err := q.Next(&wr)
				require.True(t, ok)
				require.NoError(t, err, "WQE %d", i)
				want := maxSGEs(i)
				require.Equal(t, uint64(i)+1000, wr.WrID)
				require.Equal(t, want, wr.SGEs(), "WQE %d: all %d SGEs", i, abi.MaxSGE)
				require.Equal(t, sum(want), wr.Length)
			}
			q.Publish()
			assert.Equal(t, c.slots, ci.Load())
		})
	}
}

// TestCQAtABILimit fills a CQ of abi.MaxCQE entries (one more is
// ErrCQFull), reads them all back and does it again across the phase flip.
func TestCQAtABILimit(t *testing.T) {
	c := newTestCQ(t, abi.MaxCQE)
	require.Equal(t, uint32(abi.MaxCQE), c.cq.Count())
	var got abi.CQE
	for pass := range uint32(2) {
		base := pass * abi.MaxCQE
		for i := base; i < base+abi.MaxCQE; i++ {
			e := abi.CQE{WrID: uint64(i), QPNum: i & 0xffffff, ByteLen: i, Opcode: abi.WCRecv, ImmOrInv: ^i}
			require.NoError(t, c.cq.Push(&e), "CQE %d", i)
		}
		extra := abi.CQE{WrID: 1 << 40}
		require.ErrorIs(t, c.cq.Push(&extra), ErrCQFull, fmt.Sprintf("pass %d: CQE %d of %d", pass, abi.MaxCQE+1, abi.MaxCQE))
		c.cq.Publish()
		require.Equal(t, base+abi.MaxCQE, c.pi.Load())
		for i := base; i < base+abi.MaxCQE; i++ {
			require.True(t, ReadCQE(c.ring, abi.MaxCQE, i, &got), "CQE %d", i)
			require.Equal(t, uint64(i), got.WrID)
			require.Equal(t, i, got.ByteLen)
			require.Equal(t, ^i, got.ImmOrInv)
			require.Equal(t, i&0xffffff, got.QPNum)
			require.Equal(t, abi.CQEPhase(i, abi.MaxCQE), got.Owner)
		}
		require.False(t, ReadCQE(c.ring, abi.MaxCQE, base+abi.MaxCQE, &got), "the next pass's entry is not valid yet")
		c.ci.Store(base + abi.MaxCQE)
		c.over.Store(0)
	}
}
