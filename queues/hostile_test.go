package queues_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
)

// TestHostileConcurrentWriter lets a hostile "client" goroutine scribble
// random bytes over the shared ring and write random producer indices
// while the daemon side consumes. The ring and the index words live in a
// shared mapping and a doorbell page, as they would for a client. Whatever the
// interleaving, the daemon side must not panic, every WQE it accepts must
// satisfy the queue's limits (it validated its private copy, so a change
// after the check cannot matter), and every rejection must be a defined
// error.
func TestHostileConcurrentWriter(t *testing.T) {
	cfg := queues.SQConfig{Slots: 16, MaxSGE: 4, MaxInline: 64}
	ring, err := unix.Mmap(-1, 0, int(cfg.RingBytes()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(ring)
	_, _, rec := newQPRecord(t)
	pi := rec.SQPI
	sq, err := queues.NewSQ(ring, cfg, pi, rec.SQCI)
	require.NoError(t, err)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the hostile client
		defer wg.Done()
		rng := rand.New(rand.NewPCG(5, 6))
		post := uint32(0)
		for !stop.Load() {
			switch rng.IntN(64) {
			case 0: // rarely, an arbitrary index: the ring breaks for good
				if rng.IntN(1000) == 0 {
					pi.Store(rng.Uint32())
				}
			case 1, 2, 3: // post what is in the slots, within flow control
				post = min(post+uint32(rng.IntN(4)), rec.SQCI.Load()+cfg.Slots)
				pi.Store(post)
			default: // a plausible WQE, then random damage
				off := rng.IntN(int(cfg.Slots)) * int(cfg.Stride())
				w := abi.SendWQE{WrID: rng.Uint64(), Opcode: abi.WROpcode(rng.IntN(11)),
					Flags: abi.SendFlags(rng.IntN(16)), NumSGE: uint8(rng.IntN(6)), InlineLen: uint32(rng.IntN(80))}
				w.Put(ring[off:])
				for range rng.IntN(4) {
					ring[off+rng.IntN(int(cfg.Stride()))] = byte(rng.Uint32())
				}
			}
		}
	}()

	var wr queues.SendWR
	accepted, rejected, broken := 0, 0, 0
	for pass := 0; pass < 200000 && broken == 0; pass++ {
		if _, err := sq.Poll(); err != nil {
			require.ErrorIs(t, err, queues.ErrIndex)
			broken++
			break
		}
		for {
			ok, err := sq.Next(&wr)
			if !ok {
				break
			}
			if err != nil {
				var we *queues.WQEError
				require.True(t, errors.As(err, &we), "%v", err)
				require.NotEqual(t, queues.ReasonNone, we.Reason)
				rejected++
				continue
			}
			accepted++
			require.True(t, wr.Opcode.Valid())
			require.LessOrEqual(t, uint32(wr.NumSGE), cfg.MaxSGE)
			require.LessOrEqual(t, len(wr.Inline), int(cfg.MaxInline))
			if wr.Flags&abi.SendInline != 0 {
				require.Equal(t, uint64(len(wr.Inline)), wr.Length)
			}
		}
		sq.Publish()
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("accepted %d, rejected %d, ring broken by an impossible index: %v", accepted, rejected, broken > 0)
	assert.Positive(t, accepted+rejected+broken)
}

// newQPRecord returns a new doorbell page (closed when the test ends), the
// index of a QP record allocated in it and that record's words: where a
// client and the daemon share a queue's indices.
func newQPRecord(t testing.TB) (*doorbell.Page, uint32, doorbell.QPRecord) {
	t.Helper()
	page, err := doorbell.New()
	require.NoError(t, err)
	t.Cleanup(func() { page.Close() })
	idx, err := page.Alloc()
	require.NoError(t, err)
	rec, err := page.QP(idx)
	require.NoError(t, err)
	return page, idx, rec
}
