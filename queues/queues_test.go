package queues

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// testSQ is a send queue over private memory with a client-side poster.
type testSQ struct {
	ring   []byte
	cfg    SQConfig
	pi, ci atomic.Uint32
	q      *SQ
	post   uint32 // client's producer index
}

func newTestSQ(t testing.TB, cfg SQConfig) *testSQ {
	t.Helper()
	s := &testSQ{cfg: cfg, ring: make([]byte, cfg.RingBytes())}
	q, err := NewSQ(s.ring, cfg, &s.pi, &s.ci)
	require.NoError(t, err)
	s.q = q
	return s
}

// postRaw writes a raw slot (control block plus trailer) and rings the
// doorbell.
func (s *testSQ) postRaw(w *abi.SendWQE, trailer []byte) {
	stride := s.cfg.Stride()
	off := (s.post & (s.cfg.Slots - 1)) * stride
	slot := s.ring[off : off+stride]
	clear(slot)
	w.Put(slot)
	copy(slot[abi.SizeofSendWQE:], trailer)
	s.post++
	s.pi.Store(s.post)
}

func (s *testSQ) postSGEs(w abi.SendWQE, sges ...abi.SGE) {
	w.NumSGE = uint8(len(sges))
	tr := make([]byte, len(sges)*abi.SizeofSGE)
	for i := range sges {
		sges[i].Put(tr[i*abi.SizeofSGE:])
	}
	s.postRaw(&w, tr)
}

func TestSQConfigRejected(t *testing.T) {
	var pi, ci atomic.Uint32
	cases := []struct {
		name string
		cfg  SQConfig
		ring int
	}{
		{"zero slots", SQConfig{Slots: 0}, 1 << 20},
		{"not power of two", SQConfig{Slots: 3}, 1 << 20},
		{"too many slots", SQConfig{Slots: abi.MaxQPWR * 2}, 1 << 20},
		{"too many sges", SQConfig{Slots: 4, MaxSGE: abi.MaxSGE + 1}, 1 << 20},
		{"too much inline", SQConfig{Slots: 4, MaxInline: abi.MaxInline + 1}, 1 << 20},
		{"short ring", SQConfig{Slots: 4, MaxSGE: 4}, 4*128 - 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewSQ(make([]byte, c.ring), c.cfg, &pi, &ci)
			assert.ErrorIs(t, err, ErrConfig)
		})
	}
	_, err := NewSQ(make([]byte, 1024), SQConfig{Slots: 4}, nil, &ci)
	assert.ErrorIs(t, err, ErrConfig)
}

func TestSQValidWQEs(t *testing.T) {
	s := newTestSQ(t, SQConfig{Slots: 8, MaxSGE: 5, MaxInline: 100})
	assert.Equal(t, uint32(3*64), s.cfg.Stride())
	s.postSGEs(abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled},
		abi.SGE{Addr: 0x1000, Length: 10, LKey: 7}, abi.SGE{Addr: 0x2000, Length: 20, LKey: 8})
	inline := []byte("hello, inline")
	s.postRaw(&abi.SendWQE{WrID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendInline, InlineLen: uint32(len(inline)), RemoteAddr: 0x99, RKey: 3}, inline)
	s.postSGEs(abi.SendWQE{WrID: 3, Opcode: abi.WRAtomicFetchAdd, CompareAdd: 5}, abi.SGE{Addr: 8, Length: 8, LKey: 1})
	s.postSGEs(abi.SendWQE{WrID: 4, Opcode: abi.WRSend}, make([]abi.SGE, 5)...)

	n, err := s.q.Poll()
	require.NoError(t, err)
	require.Equal(t, uint32(4), n)
	var wr SendWR
	ok, err := s.q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), wr.WrID)
	assert.Equal(t, []abi.SGE{{Addr: 0x1000, Length: 10, LKey: 7}, {Addr: 0x2000, Length: 20, LKey: 8}}, wr.SGEs())
	assert.Equal(t, uint64(30), wr.Length)

	ok, err = s.q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), wr.WrID)
	assert.Equal(t, inline, wr.Inline)
	assert.Equal(t, uint64(0x99), wr.RemoteAddr)
	// Inline is a private copy: clobbering the slot does not change it.
	stride := s.cfg.Stride()
	clear(s.ring[stride : 2*stride])
	assert.Equal(t, inline, wr.Inline)

	ok, err = s.q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), wr.WrID)
	assert.Equal(t, uint64(5), wr.CompareAdd)
	assert.Equal(t, abi.WRAtomicFetchAdd, wr.Opcode)

	ok, err = s.q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Len(t, wr.SGEs(), 5)

	ok, err = s.q.Next(&wr)
	assert.False(t, ok)
	assert.NoError(t, err)
	assert.Zero(t, s.ci.Load())
	s.q.Publish()
	assert.Equal(t, uint32(4), s.ci.Load())
}

func TestSQMalformed(t *testing.T) {
	cfg := SQConfig{Slots: 4, MaxSGE: 4, MaxInline: 64}
	sge := abi.SGE{Addr: 1, Length: 1, LKey: 1}
	cases := []struct {
		name    string
		wqe     abi.SendWQE
		sges    int
		reason  Reason
		trailer []byte
	}{
		{"unknown opcode 10", abi.SendWQE{Opcode: 10}, 0, ReasonOpcode, nil},
		{"bind with sge", abi.SendWQE{Opcode: abi.WRBindMW}, 1, ReasonReserved, nil},
		{"unknown opcode 200", abi.SendWQE{Opcode: 200}, 0, ReasonOpcode, nil},
		{"unknown flag", abi.SendWQE{Opcode: abi.WRSend, Flags: 0x10}, 0, ReasonFlags, nil},
		{"reserved0", abi.SendWQE{Opcode: abi.WRSend, Reserved0: 1}, 0, ReasonReserved, nil},
		{"too many sges", abi.SendWQE{Opcode: abi.WRSend}, 5, ReasonTooManySGE, nil},
		{"inline too long", abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendInline, InlineLen: 65}, 0, ReasonInlineTooLong, nil},
		{"inline huge", abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendInline, InlineLen: 0xffffffff}, 0, ReasonInlineTooLong, nil},
		{"inline with sge", abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendInline, InlineLen: 1}, 1, ReasonInlineWithSGE, nil},
		{"inline read", abi.SendWQE{Opcode: abi.WRRDMARead, Flags: abi.SendInline, InlineLen: 1}, 0, ReasonInlineOpcode, nil},
		{"inline_len without inline", abi.SendWQE{Opcode: abi.WRSend, InlineLen: 4}, 0, ReasonReserved, nil},
		{"atomic no sge", abi.SendWQE{Opcode: abi.WRAtomicCmpAndSwp}, 0, ReasonAtomicSGE, nil},
		{"atomic short sge", abi.SendWQE{Opcode: abi.WRAtomicFetchAdd}, 1, ReasonAtomicSGE, nil},
		{"atomic write with sge", abi.SendWQE{Opcode: abi.WRAtomicWrite}, 1, ReasonAtomicSGE, nil},
		{"flush with sge", abi.SendWQE{Opcode: abi.WRFlush}, 1, ReasonAtomicSGE, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newTestSQ(t, cfg)
			c.wqe.WrID = 0xabc
			sges := make([]abi.SGE, c.sges)
			for i := range sges {
				sges[i] = sge
			}
			s.postSGEs(c.wqe, sges...)
			// Bypass postSGEs' NumSGE for inline cases with SGEs.
			_, err := s.q.Poll()
			require.NoError(t, err)
			var wr SendWR
			ok, err := s.q.Next(&wr)
			require.True(t, ok)
			require.ErrorIs(t, err, ErrMalformedWQE)
			var we *WQEError
			require.ErrorAs(t, err, &we)
			assert.Equal(t, c.reason, we.Reason)
			assert.Equal(t, uint64(0xabc), we.WrID)
			assert.Zero(t, wr.NumSGE)
			assert.Nil(t, wr.Inline)
			ok, _ = s.q.Next(&wr)
			assert.False(t, ok, "malformed WQE is consumed")
		})
	}
	t.Run("total length", func(t *testing.T) {
		s := newTestSQ(t, cfg)
		big := abi.SGE{Length: 1 << 30}
		s.postSGEs(abi.SendWQE{Opcode: abi.WRSend}, big, big, abi.SGE{Length: 1})
		_, err := s.q.Poll()
		require.NoError(t, err)
		var wr SendWR
		_, err = s.q.Next(&wr)
		var we *WQEError
		require.ErrorAs(t, err, &we)
		assert.Equal(t, ReasonLength, we.Reason)
	})
}

func TestSQIndexValidation(t *testing.T) {
	cases := []struct {
		name string
		pi   uint32
		n    uint32
		err  error
	}{
		{"empty", 0, 0, nil},
		{"full", 8, 8, nil},
		{"over full", 9, 0, ErrIndex},
		{"backwards", 0xffffffff, 0, ErrIndex},
		{"huge", 0x80000000, 0, ErrIndex},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newTestSQ(t, SQConfig{Slots: 8, MaxSGE: 1})
			s.pi.Store(c.pi)
			n, err := s.q.Poll()
			if c.err != nil {
				require.ErrorIs(t, err, c.err)
				_, err2 := s.q.Poll()
				assert.ErrorIs(t, err2, ErrIndex, "sticky")
				s.pi.Store(0)
				_, err2 = s.q.Poll()
				assert.ErrorIs(t, err2, ErrIndex, "stays broken")
				assert.Error(t, s.q.Err())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.n, n)
		})
	}
}

// TestSQWrapAndPublish runs the ring around the u32 index wrap and checks
// the consumer index is published once per batch.
func TestSQWrapAndPublish(t *testing.T) {
	s := newTestSQ(t, SQConfig{Slots: 4, MaxSGE: 1})
	// Start both sides just below the u32 wrap.
	start := uint32(0xfffffffa)
	s.q.head, s.q.tail, s.q.published = start, start, start
	s.post = start
	var wr SendWR
	next := uint64(0)
	for round := range 5 {
		for range 3 {
			s.postSGEs(abi.SendWQE{WrID: next + 100, Opcode: abi.WRSend}, abi.SGE{Length: 1})
			next++
		}
		n, err := s.q.Poll()
		require.NoError(t, err)
		require.Equal(t, uint32(3), n, "round %d", round)
		before := s.ci.Load()
		for range 3 {
			ok, err := s.q.Next(&wr)
			require.True(t, ok)
			require.NoError(t, err)
		}
		assert.Equal(t, before, s.ci.Load(), "ci not stored before Publish")
		s.q.Publish()
		assert.Equal(t, s.post, s.ci.Load())
		assert.Equal(t, next+99, wr.WrID)
	}
	assert.Less(t, s.post, start, "the index wrapped")
}

func TestRecvQueue(t *testing.T) {
	cfg := RecvConfig{Slots: 4, MaxSGE: 3}
	assert.Equal(t, uint32(64), cfg.Stride())
	ring := make([]byte, cfg.RingBytes())
	var pi, ci atomic.Uint32
	q, err := NewRQ(ring, cfg, &pi, &ci)
	require.NoError(t, err)
	post := func(i uint32, h abi.RecvWQE, sges ...abi.SGE) {
		slot := ring[(i&3)*64 : (i&3)*64+64]
		h.Put(slot)
		for j, s := range sges {
			s.Put(slot[16+16*j:])
		}
		pi.Store(i + 1)
	}
	post(0, abi.RecvWQE{WrID: 1, NumSGE: 2}, abi.SGE{Addr: 1, Length: 100, LKey: 2}, abi.SGE{Addr: 2, Length: 28, LKey: 2})
	post(1, abi.RecvWQE{WrID: 2, NumSGE: 4})
	post(2, abi.RecvWQE{WrID: 3, Reserved: 1})
	post(3, abi.RecvWQE{WrID: 4, NumSGE: 0xffffffff})
	n, err := q.Poll()
	require.NoError(t, err)
	require.Equal(t, uint32(4), n)
	var wr RecvWR
	ok, err := q.Next(&wr)
	require.True(t, ok)
	require.NoError(t, err)
	assert.Equal(t, uint64(128), wr.Length)
	assert.Len(t, wr.SGEs(), 2)
	for _, want := range []Reason{ReasonTooManySGE, ReasonReserved, ReasonTooManySGE} {
		ok, err = q.Next(&wr)
		require.True(t, ok)
		var we *WQEError
		require.ErrorAs(t, err, &we)
		assert.Equal(t, want, we.Reason)
		assert.Zero(t, wr.NumSGE)
	}
	q.Publish()
	assert.Equal(t, uint32(4), ci.Load())

	_, err = NewSRQ(ring, RecvConfig{Slots: abi.MaxSRQWR * 2, MaxSGE: 1}, &pi, &ci)
	assert.ErrorIs(t, err, ErrConfig)
	_, err = NewRQ(ring, RecvConfig{Slots: 4, MaxSGE: 33}, &pi, &ci)
	assert.ErrorIs(t, err, ErrConfig)
}

type testCQ struct {
	ring         []byte
	ci, pi, over atomic.Uint32
	cq           *CQ
}

func newTestCQ(t testing.TB, count uint32) *testCQ {
	t.Helper()
	c := &testCQ{ring: make([]byte, count*abi.SizeofCQE)}
	cq, err := NewCQ(c.ring, count, CQWords{CI: &c.ci, PI: &c.pi, Overflow: &c.over})
	require.NoError(t, err)
	c.cq = cq
	return c
}

func TestCQPushPhaseAndFull(t *testing.T) {
	c := newTestCQ(t, 4)
	var got abi.CQE
	consumed := uint32(0)
	for pass := range 3 {
		for i := range 4 {
			e := abi.CQE{WrID: uint64(pass*4 + i), ByteLen: 7, Status: abi.WCSuccess, Opcode: abi.WCRecv, PKeyIndex: 0x102, SL: 3, Owner: 0xfe}
			require.NoError(t, c.cq.Push(&e))
		}
		// Full: a fifth push fails and leaves the ring untouched.
		snap := append([]byte(nil), c.ring...)
		extra := abi.CQE{WrID: 999}
		require.ErrorIs(t, c.cq.Push(&extra), ErrCQFull)
		assert.Equal(t, snap, c.ring, "full CQ must not overwrite")
		assert.Equal(t, uint32(1), c.over.Load())
		c.cq.Publish()
		assert.Equal(t, c.cq.PI(), c.pi.Load())
		for i := range 4 {
			require.True(t, ReadCQE(c.ring, 4, consumed, &got), "pass %d entry %d", pass, i)
			assert.Equal(t, uint64(pass*4+i), got.WrID)
			assert.Equal(t, abi.CQEPhase(consumed, 4), got.Owner)
			assert.Equal(t, uint16(0x102), got.PKeyIndex)
			assert.Equal(t, uint8(3), got.SL)
			consumed++
		}
		assert.False(t, ReadCQE(c.ring, 4, consumed, &got), "stale entry of the previous pass")
		c.ci.Store(consumed)
		c.over.Store(0)
	}
}

func TestCQBadConsumerIndex(t *testing.T) {
	c := newTestCQ(t, 4)
	e := abi.CQE{}
	for range 4 {
		require.NoError(t, c.cq.Push(&e))
	}
	c.ci.Store(9) // ahead of the producer (4)
	err := c.cq.Push(&e)
	require.ErrorIs(t, err, ErrIndex)
	assert.ErrorIs(t, c.cq.Push(&e), ErrIndex, "sticky")
}

func TestCQConfigRejected(t *testing.T) {
	var a, b atomic.Uint32
	for _, n := range []uint32{0, 1, 3, abi.MaxCQE * 2} {
		_, err := NewCQ(make([]byte, 1<<21), n, CQWords{CI: &a, PI: &b})
		assert.ErrorIs(t, err, ErrConfig, "count %d", n)
	}
	_, err := NewCQ(make([]byte, 63), 2, CQWords{CI: &a, PI: &b})
	assert.ErrorIs(t, err, ErrConfig)
	_, err = NewCQ(make([]byte, 129)[1:], 2, CQWords{CI: &a, PI: &b})
	assert.ErrorIs(t, err, ErrConfig, "misaligned")
}

func TestNoAllocPerWQE(t *testing.T) {
	s := newTestSQ(t, SQConfig{Slots: 64, MaxSGE: 4, MaxInline: 64})
	for i := range 64 {
		w := abi.SendWQE{WrID: uint64(i), Opcode: abi.WRSend, NumSGE: 2}
		s.postRaw(&w, make([]byte, 32))
	}
	s.post = 0
	s.pi.Store(0)
	c := newTestCQ(t, 64)
	var wr SendWR
	cqe := abi.CQE{Opcode: abi.WCSend}
	allocs := testing.AllocsPerRun(200, func() {
		// Client re-posts the same 64 slots; daemon consumes and completes.
		s.post += 64
		s.pi.Store(s.post)
		if _, err := s.q.Poll(); err != nil {
			panic(err)
		}
		for {
			ok, err := s.q.Next(&wr)
			if !ok {
				break
			}
			if err != nil {
				panic(err)
			}
			cqe.WrID = wr.WrID
			if err := c.cq.Push(&cqe); err != nil {
				panic(err)
			}
		}
		s.q.Publish()
		c.cq.Publish()
		c.ci.Store(c.cq.PI())
	})
	assert.Zero(t, allocs)
	assert.Equal(t, s.post, s.ci.Load())
}

func TestMaxSlotBytes(t *testing.T) {
	sq := SQConfig{MaxSGE: abi.MaxSGE, MaxInline: abi.MaxInline}.Stride()
	rq := RecvConfig{MaxSGE: abi.MaxSGE}.Stride()
	if MaxSlotBytes != max(sq, rq) {
		t.Fatalf("MaxSlotBytes %d, largest slot %d", MaxSlotBytes, max(sq, rq))
	}
}
