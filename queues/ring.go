package queues

import (
	"fmt"
	"math/bits"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// consumer is the index logic shared by the work queues: the daemon
// consumes slots the client produced.
//
// The fields are ordered so that the struct has no padding (every QP
// holds two).
type consumer struct {
	ring []byte // exactly slots*stride bytes of client memory

	pi *atomic.Uint32 // client-written producer index (doorbell record)
	ci *atomic.Uint32 // daemon-written consumer index (doorbell record)

	slots  uint32 // power of two, private
	mask   uint32
	stride uint32 // slot size in bytes, private

	head      uint32 // next index to consume
	tail      uint32 // producer index validated by the last poll
	published uint32 // last value stored to ci
	broken    error  // sticky ErrIndex
}

func (c *consumer) init(ring []byte, slots, stride, maxSlots uint32, pi, ci *atomic.Uint32) error {
	if slots == 0 || slots > maxSlots || bits.OnesCount32(slots) != 1 {
		return fmt.Errorf("%w: %d slots (want a power of two, 1..%d)", ErrConfig, slots, maxSlots)
	}
	if pi == nil || ci == nil {
		return fmt.Errorf("%w: missing doorbell words", ErrConfig)
	}
	need := uint64(slots) * uint64(stride)
	if uint64(len(ring)) < need {
		return fmt.Errorf("%w: ring of %d bytes, need %d", ErrConfig, len(ring), need)
	}
	c.ring = ring[:need:need]
	c.slots, c.mask, c.stride = slots, slots-1, stride
	c.pi, c.ci = pi, ci
	c.head, c.tail, c.published = 0, 0, 0
	ci.Store(0)
	return nil
}

// poll reads the producer index once, validates it and returns how many
// slots are ready.
func (c *consumer) poll() (uint32, error) {
	if c.broken != nil {
		return 0, c.broken
	}
	pi := c.pi.Load()
	if n := pi - c.head; n > c.slots {
		c.broken = fmt.Errorf("%w: producer index %d, consumer index %d, %d slots", ErrIndex, pi, c.head, c.slots)
		return 0, c.broken
	}
	c.tail = pi
	return pi - c.head, nil
}

// next returns the byte offset and index of the next slot and advances
// head; ok is false when the last poll's slots are all consumed.
func (c *consumer) next() (off, index uint32, ok bool) {
	if c.head == c.tail {
		return 0, 0, false
	}
	index = c.head
	c.head++
	return (index & c.mask) * c.stride, index, true
}

// publish stores the consumer index for the client (one atomic store per
// batch, and none when nothing was consumed).
func (c *consumer) publish() {
	if c.head != c.published {
		c.ci.Store(c.head)
		c.published = c.head
	}
}

// Slots is the ring's slot count.
func (c *consumer) Slots() uint32 { return c.slots }

// Head is the free-running index of the next WQE to consume.
func (c *consumer) Head() uint32 { return c.head }

// Pending is the number of WQEs seen by the last Poll and not yet consumed.
func (c *consumer) Pending() uint32 { return c.tail - c.head }

// Err is the sticky error of a broken ring (nil while healthy).
func (c *consumer) Err() error { return c.broken }

// MaxSlotBytes is the largest slot of any send or receive queue (the
// largest WQE: abi.MaxSGE SGEs or abi.MaxInline inline bytes).
const MaxSlotBytes = (1 + max((abi.MaxSGE+abi.SGEsPerBlock-1)/abi.SGEsPerBlock, (abi.MaxInline+abi.WQEBlock-1)/abi.WQEBlock)) * abi.WQEBlock

// SlotBuffer is the storage of one slot's inline data for SQ.Next; queues
// consumed by one goroutine may share one (SQConfig.Slot).
type SlotBuffer [MaxSlotBytes]byte
