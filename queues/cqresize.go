package queues

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/vrnic/vrnic/abi"
)

// ErrCQTooSmall: a resize asked for fewer entries than the CQ holds
// unconsumed (ibv_resize_cq's EINVAL).
var ErrCQTooSmall = errors.New("queues: CQ has more unconsumed entries than the new size")

// Resize moves the CQ to ring, of count entries (RESIZE_CQ, ABI 1.4). The
// caller makes sure no Push runs meanwhile. It reads the client's
// consumer index once: the entries not yet consumed, [ci, pi), must fit in
// count (else ErrCQTooSmall) and ci must not be ahead of pi nor more than
// the old count behind (else ErrIndex); on error nothing changes. Each of
// them is copied to the new ring at the same free-running index, its
// owner bit that of the index in a ring of count entries, and every other
// slot, the indices [pi, ci+count), is written as not ready for its next
// pass, so the client goes on polling from ci with the new count whatever
// the new ring held. The free-running indices carry over. It returns how
// many entries were carried over.
func (c *CQ) Resize(ring []byte, count uint32) (uint32, error) {
	if count < 2 || count > abi.MaxCQE || bits.OnesCount32(count) != 1 {
		return 0, fmt.Errorf("%w: %d CQEs (want a power of two, 2..%d)", ErrConfig, count, abi.MaxCQE)
	}
	need := uint64(count) * abi.SizeofCQE
	full := need
	if c.ts != nil {
		full += uint64(count) * 8 // the timestamps after the CQEs
	}
	if uint64(len(ring)) < full {
		return 0, fmt.Errorf("%w: CQ ring of %d bytes, need %d", ErrConfig, len(ring), full)
	}
	if !aligned(ring, 8) {
		return 0, fmt.Errorf("%w: CQ ring not 8-byte aligned", ErrConfig)
	}
	if c.broken != nil {
		return 0, c.broken
	}
	ci := c.w.CI.Load()
	used := c.pi - ci
	if used > c.count {
		return 0, fmt.Errorf("%w: CQ consumer index %d, producer index %d, %d entries", ErrIndex, ci, c.pi, c.count)
	}
	if used > count {
		return 0, fmt.Errorf("%w: %d unconsumed, %d wanted", ErrCQTooSmall, used, count)
	}
	var ts []byte
	if c.ts != nil {
		ts = ring[need:full:full]
	}
	ring = ring[:need:need]
	var e abi.CQE
	for j := ci; j != ci+count; j++ {
		off := int(j&(count-1)) * abi.SizeofCQE
		dst := ring[off : off+abi.SizeofCQE]
		owner := abi.CQEPhase(j, count)
		if j-ci < used {
			so := int(j&c.mask) * abi.SizeofCQE
			e.Decode(c.ring[so : so+abi.SizeofCQE])
			if ts != nil {
				copy(ts[int(j&(count-1))*8:][:8], c.ts[int(j&c.mask)*8:][:8])
			}
		} else {
			e = abi.CQE{}
			owner ^= 1
		}
		e.PutBody(dst)
		storeU32(dst, abi.OffCQETail, e.TailWordWith(owner))
	}
	c.ring, c.count, c.mask, c.ciCache, c.ts = ring, count, count-1, ci, ts
	return used, nil
}

// InitCQRing writes the count entries of ring from free-running index
// from on as not ready (a resized CQ that never had a producer).
func InitCQRing(ring []byte, count, from uint32) error {
	if count < 2 || count > abi.MaxCQE || bits.OnesCount32(count) != 1 || uint64(len(ring)) < uint64(count)*abi.SizeofCQE || !aligned(ring, 8) {
		return fmt.Errorf("%w: CQ ring of %d bytes for %d entries", ErrConfig, len(ring), count)
	}
	var e abi.CQE
	for j := from; j != from+count; j++ {
		off := int(j&(count-1)) * abi.SizeofCQE
		dst := ring[off : off+abi.SizeofCQE]
		e.PutBody(dst)
		storeU32(dst, abi.OffCQETail, e.TailWordWith(abi.CQEPhase(j, count)^1))
	}
	return nil
}
