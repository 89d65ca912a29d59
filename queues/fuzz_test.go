package queues

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// u32s turns fuzz bytes into a list of index values written by a hostile
// client.
func u32s(b []byte) []uint32 {
	var out []uint32
	for len(b) >= 4 {
		out = append(out, binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	return out
}

// FuzzSQ lets a hostile client choose the ring contents and every producer
// index value. The daemon side must never panic (any read outside the ring
// slice would), must report an impossible index as ErrIndex exactly when
// pi - head > slots, and must return for every consumed WQE either a WQE
// that satisfies the queue limits or a *WQEError with an error status.
func FuzzSQ(f *testing.F) {
	ok := make([]byte, 4*128)
	(&abi.SendWQE{WrID: 1, Opcode: abi.WRSend, NumSGE: 2}).Put(ok)
	(&abi.SendWQE{WrID: 2, Opcode: abi.WRSend, Flags: abi.SendInline, InlineLen: 40}).Put(ok[128:])
	(&abi.SendWQE{WrID: 3, Opcode: abi.WRAtomicCmpAndSwp, NumSGE: 1}).Put(ok[256:])
	(&abi.SGE{Length: 8}).Put(ok[256+64:])
	f.Add(ok, []byte{3, 0, 0, 0, 4, 0, 0, 0}, uint8(0))
	f.Add(bytes.Repeat([]byte{0xff}, 512), []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint8(1))
	f.Add([]byte{}, []byte{9, 0, 0, 0}, uint8(2))
	f.Fuzz(func(t *testing.T, ringBytes, indices []byte, shape uint8) {
		cfg := SQConfig{Slots: 1 << (shape % 4), MaxSGE: uint32(shape>>2) % (abi.MaxSGE + 1), MaxInline: uint32(shape) * 2 % (abi.MaxInline + 1)}
		ring := make([]byte, cfg.RingBytes())
		copy(ring, ringBytes)
		var pi, ci atomic.Uint32
		q, err := NewSQ(ring, cfg, &pi, &ci)
		require.NoError(t, err)
		fuzzIndices(t, q, &pi, &ci, cfg.Slots, u32s(indices), func(wr *SendWR, err error) {
			if err != nil {
				require.Zero(t, wr.NumSGE)
				return
			}
			require.True(t, wr.Opcode.Valid())
			require.LessOrEqual(t, uint32(wr.NumSGE), cfg.MaxSGE)
			require.LessOrEqual(t, len(wr.Inline), int(cfg.MaxInline))
			require.LessOrEqual(t, wr.Length, uint64(abi.MaxMsgBytes))
		})
	})
}

// FuzzRecvQueue is FuzzSQ for receive queues.
func FuzzRecvQueue(f *testing.F) {
	ok := make([]byte, 64)
	(&abi.RecvWQE{WrID: 1, NumSGE: 3}).Put(ok)
	f.Add(ok, []byte{1, 0, 0, 0}, uint8(3))
	f.Add(bytes.Repeat([]byte{0x7f}, 300), []byte{2, 0, 0, 0, 1, 0, 0, 0}, uint8(200))
	f.Fuzz(func(t *testing.T, ringBytes, indices []byte, shape uint8) {
		cfg := RecvConfig{Slots: 1 << (shape % 4), MaxSGE: uint32(shape>>2) % (abi.MaxSGE + 1)}
		ring := make([]byte, cfg.RingBytes())
		copy(ring, ringBytes)
		var pi, ci atomic.Uint32
		q, err := NewSRQ(ring, cfg, &pi, &ci)
		require.NoError(t, err)
		fuzzIndices(t, q, &pi, &ci, cfg.Slots, u32s(indices), func(wr *RecvWR, err error) {
			if err == nil {
				require.LessOrEqual(t, wr.NumSGE, cfg.MaxSGE)
			}
		})
	})
}

// workQueue is a daemon-side work queue: SQ or RecvQueue.
type workQueue[W any] interface {
	Head() uint32
	Poll() (uint32, error)
	Err() error
	Next(wr *W) (bool, error)
	Publish()
}

// fuzzIndices stores each of indices as the producer index pi of q (slots
// slots) and consumes what it accepts. Poll must report ErrIndex exactly
// when pi - head > slots, and otherwise the number of new WQEs; each WQE
// Next returns is passed to check with its error, which is nil or a
// *WQEError with an error status; Publish must store the index in ci.
func fuzzIndices[W any](t *testing.T, q workQueue[W], pi, ci *atomic.Uint32, slots uint32, indices []uint32, check func(wr *W, err error)) {
	var wr W
	for _, v := range indices {
		head := q.Head()
		pi.Store(v)
		n, err := q.Poll()
		if v-head > slots || q.Err() != nil {
			require.ErrorIs(t, err, ErrIndex)
			return
		}
		require.NoError(t, err)
		require.Equal(t, v-head, n)
		for {
			got, err := q.Next(&wr)
			if !got {
				require.NoError(t, err)
				break
			}
			if err != nil {
				var we *WQEError
				require.True(t, errors.As(err, &we))
				require.ErrorIs(t, err, ErrMalformedWQE)
				require.NotEqual(t, ReasonNone, we.Reason)
			}
			check(&wr, err)
		}
		q.Publish()
		require.Equal(t, v, ci.Load())
	}
}

// FuzzCQ lets a hostile client choose every consumer index value. Push
// never panics, never overwrites an entry the client has not consumed
// (ErrCQFull leaves the ring unchanged), and reports a consumer index ahead
// of the producer as ErrIndex.
func FuzzCQ(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 4, 0, 0, 0, 8, 0, 0, 0}, uint8(2))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint8(1))
	f.Fuzz(func(t *testing.T, indices []byte, shape uint8) {
		count := uint32(2) << (shape % 4)
		ring := make([]byte, count*abi.SizeofCQE)
		var ci, pi, over atomic.Uint32
		cq, err := NewCQ(ring, count, CQWords{CI: &ci, PI: &pi, Overflow: &over})
		require.NoError(t, err)
		for _, v := range u32s(indices) {
			ci.Store(v)
			for range count + 1 {
				before := append([]byte(nil), ring...)
				p := cq.PI()
				e := abi.CQE{WrID: uint64(p)}
				err := cq.Push(&e)
				switch {
				case err == nil:
					var got abi.CQE
					require.True(t, ReadCQE(ring, count, p, &got))
					require.Equal(t, uint64(p), got.WrID)
				case errors.Is(err, ErrCQFull):
					require.Equal(t, before, ring)
					require.Equal(t, uint32(1), over.Load())
				default:
					require.ErrorIs(t, err, ErrIndex)
					require.Equal(t, before, ring)
					return
				}
			}
			cq.Publish()
			require.Equal(t, cq.PI(), pi.Load())
		}
	})
}
