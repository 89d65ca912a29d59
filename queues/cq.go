package queues

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// CQWords are the CQ's doorbell record words.
type CQWords struct {
	CI       *atomic.Uint32 // cq_ci, client-written: CQEs consumed
	PI       *atomic.Uint32 // cq_pi, daemon-written: CQEs written
	Overflow *atomic.Uint32 // overflow, daemon-written; may be nil
}

// CQ is the daemon's producer view of a client completion queue.
type CQ struct {
	ring    []byte // count*32 bytes of client memory, 4-byte aligned
	count   uint32 // power of two, private
	mask    uint32
	w       CQWords
	pi      uint32 // next entry to write
	ciCache uint32 // client consumer index as last validated
	pubPI   uint32
	broken  error
	// ts is the timestamp array of a CQ with completion timestamps
	// (count*8 bytes after the CQEs, abi.CQFlagTimestamp), else nil.
	ts []byte
}

// SetTimestamps gives the CQ its timestamp array (count*8 bytes of client
// memory, 8-byte aligned): each Push stores the time of the completion
// there, in nanoseconds of CLOCK_REALTIME, before the CQE's owner byte.
func (c *CQ) SetTimestamps(ts []byte) error {
	need := uint64(c.count) * 8
	if uint64(len(ts)) < need || !aligned(ts, 8) {
		return fmt.Errorf("%w: timestamp array of %d bytes for %d CQEs", ErrConfig, len(ts), c.count)
	}
	c.ts = ts[:need:need]
	return nil
}

// NewCQ returns a completion queue of count entries over ring (client
// memory, zeroed by the client, at least count*32 bytes, 8-byte aligned).
func NewCQ(ring []byte, count uint32, w CQWords) (*CQ, error) {
	if count < 2 || count > abi.MaxCQE || bits.OnesCount32(count) != 1 {
		return nil, fmt.Errorf("%w: %d CQEs (want a power of two, 2..%d)", ErrConfig, count, abi.MaxCQE)
	}
	if w.CI == nil || w.PI == nil {
		return nil, fmt.Errorf("%w: missing doorbell words", ErrConfig)
	}
	need := uint64(count) * abi.SizeofCQE
	if uint64(len(ring)) < need {
		return nil, fmt.Errorf("%w: CQ ring of %d bytes, need %d", ErrConfig, len(ring), need)
	}
	if !aligned(ring, 8) {
		return nil, fmt.Errorf("%w: CQ ring not 8-byte aligned", ErrConfig)
	}
	w.PI.Store(0)
	return &CQ{ring: ring[:need:need], count: count, mask: count - 1, w: w}, nil
}

// Push writes e as the next CQE (its Owner field is ignored: the phase is
// computed here). The body goes first, then the tail word holding the owner
// byte with one atomic store. A full CQ returns ErrCQFull and sets the
// overflow word; the ring is left untouched. A client consumer index ahead
// of the producer returns ErrIndex (sticky).
func (c *CQ) Push(e *abi.CQE) error {
	if c.broken != nil {
		return c.broken
	}
	if c.pi-c.ciCache >= c.count {
		ci := c.w.CI.Load()
		used := c.pi - ci
		if used > c.count {
			c.broken = fmt.Errorf("%w: CQ consumer index %d, producer index %d, %d entries", ErrIndex, ci, c.pi, c.count)
			return c.broken
		}
		c.ciCache = ci
		if used == c.count {
			if c.w.Overflow != nil {
				c.w.Overflow.Store(1)
			}
			return ErrCQFull
		}
	}
	off := int(c.pi&c.mask) * abi.SizeofCQE
	slot := c.ring[off : off+abi.SizeofCQE]
	e.PutBody(slot)
	if c.ts != nil {
		i := int(c.pi&c.mask) * 8
		binary.LittleEndian.PutUint64(c.ts[i:i+8], uint64(time.Now().UnixNano()))
	}
	storeU32(slot, abi.OffCQETail, e.TailWordWith(abi.CQEPhase(c.pi, c.count)))
	c.pi++
	return nil
}

// Publish stores cq_pi if it moved (once per batch; clients poll the owner
// bit, cq_pi is informational and used by CQ arming).
func (c *CQ) Publish() {
	if c.pi != c.pubPI {
		c.w.PI.Store(c.pi)
		c.pubPI = c.pi
	}
}

// PI is the free-running index of the next CQE to write.
func (c *CQ) PI() uint32 { return c.pi }

// Count is the number of entries.
func (c *CQ) Count() uint32 { return c.count }

// Err is the sticky error of a broken CQ.
func (c *CQ) Err() error { return c.broken }

// ReadCQE is the consumer side of a CQ entry, for clients and tests: it
// loads the tail word of entry index (free-running) atomically and, if the
// owner bit shows the entry is valid for this pass, decodes it into e.
func ReadCQE(ring []byte, count, index uint32, e *abi.CQE) bool {
	off := int(index&(count-1)) * abi.SizeofCQE
	slot := ring[off : off+abi.SizeofCQE]
	if !abi.CQEReady(loadU32(slot, abi.OffCQETail), index, count) {
		return false
	}
	e.Decode(slot)
	return true
}
