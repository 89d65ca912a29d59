package queues

import (
	"fmt"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// RecvConfig sizes a receive queue (RQ or SRQ).
type RecvConfig struct {
	Slots  uint32 // power of two, 1..abi.MaxQPWR (abi.MaxSRQWR for an SRQ)
	MaxSGE uint32 // <= abi.MaxSGE
	// Slot is as SQConfig.Slot: a buffer shared by queues that one
	// goroutine consumes (not an SRQ's, which several
	// workers consume under its lock).
	Slot *SlotBuffer
}

// Stride is the slot size in bytes.
func (c RecvConfig) Stride() uint32 { return abi.RQWQESize(c.MaxSGE) }

// RingBytes is the ring size in bytes.
func (c RecvConfig) RingBytes() uint64 { return uint64(c.Slots) * uint64(c.Stride()) }

// RecvWR is a decoded, validated receive WQE in daemon memory.
type RecvWR struct {
	WrID   uint64
	NumSGE uint32
	SGE    [abi.MaxSGE]abi.SGE
	Length uint64 // sum of the SGE lengths
}

// SGEs returns the decoded scatter/gather list.
func (wr *RecvWR) SGEs() []abi.SGE { return wr.SGE[:wr.NumSGE] }

// RecvQueue is the daemon's consumer view of a client RQ or SRQ.
type RecvQueue struct {
	consumer
	maxSGE uint32
	buf    *SlotBuffer // private copy of one slot (RecvConfig.Slot: shared)
}

// NewRQ returns a receive queue over ring whose producer index is pi (rq_pi)
// and consumer index ci (rq_ci).
func NewRQ(ring []byte, cfg RecvConfig, pi, ci *atomic.Uint32) (*RecvQueue, error) {
	return newRecvQueue(ring, cfg, abi.MaxQPWR, pi, ci)
}

// NewSRQ returns a shared receive queue over ring whose producer index is
// pi (srq_pi) and consumer index ci (srq_ci).
func NewSRQ(ring []byte, cfg RecvConfig, pi, ci *atomic.Uint32) (*RecvQueue, error) {
	return newRecvQueue(ring, cfg, abi.MaxSRQWR, pi, ci)
}

func newRecvQueue(ring []byte, cfg RecvConfig, maxSlots uint32, pi, ci *atomic.Uint32) (*RecvQueue, error) {
	if cfg.MaxSGE > abi.MaxSGE {
		return nil, fmt.Errorf("%w: max_sge %d (limit %d)", ErrConfig, cfg.MaxSGE, abi.MaxSGE)
	}
	q := &RecvQueue{maxSGE: cfg.MaxSGE}
	if err := q.init(ring, cfg.Slots, cfg.Stride(), maxSlots, pi, ci); err != nil {
		return nil, err
	}
	q.buf = slotBuffer(cfg.Slot)
	return q, nil
}

// Poll loads the client's producer index once and returns how many WQEs are
// ready; an impossible index returns ErrIndex (sticky).
func (q *RecvQueue) Poll() (uint32, error) { return q.poll() }

// Publish stores the consumer index if it moved.
func (q *RecvQueue) Publish() { q.publish() }

// Next consumes the next receive WQE seen by the last Poll into wr; see
// SQ.Next for the error contract.
func (q *RecvQueue) Next(wr *RecvWR) (bool, error) {
	off, index, ok := q.next()
	if !ok {
		return false, nil
	}
	slot := q.ring[off : off+q.stride]
	copy(q.buf[:abi.SizeofRecvWQE], slot)
	var h abi.RecvWQE
	h.Decode(q.buf[:])
	wr.WrID, wr.NumSGE, wr.Length = h.WrID, 0, 0
	r := ReasonNone
	switch {
	case h.Reserved != 0:
		r = ReasonReserved
	case h.NumSGE > q.maxSGE: // maxSGE SGEs fit the slot by construction
		r = ReasonTooManySGE
	}
	if r == ReasonNone {
		n := abi.SizeofRecvWQE + h.NumSGE*abi.SizeofSGE
		copy(q.buf[abi.SizeofRecvWQE:n], slot[abi.SizeofRecvWQE:n])
		var total uint64
		for i := range h.NumSGE {
			o := abi.SizeofRecvWQE + i*abi.SizeofSGE
			wr.SGE[i].Decode(q.buf[o : o+abi.SizeofSGE])
			total += uint64(wr.SGE[i].Length)
		}
		if total > abi.MaxMsgBytes {
			r = ReasonLength
		} else {
			wr.NumSGE, wr.Length = h.NumSGE, total
		}
	}
	if r != ReasonNone {
		return true, &WQEError{WrID: h.WrID, Index: index, Reason: r}
	}
	return true, nil
}
