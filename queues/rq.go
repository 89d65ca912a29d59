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
	d := RecvDest{SGEs: wr.SGE[:0]}
	ok, err := q.NextInto(&d)
	wr.WrID, wr.NumSGE, wr.Length = d.WrID, uint32(len(d.SGEs)), d.Length
	return ok, err
}

// RecvDest is where NextInto decodes a receive WQE; the capacity of SGEs
// must hold the queue's max_sge.
type RecvDest struct {
	WrID   uint64
	SGEs   []abi.SGE
	Length uint64 // the SGE lengths
}

// NextInto consumes the next receive WQE seen by the last Poll straight
// into d, reading each field of the slot once (see SQ.NextInto). A
// malformed WQE returns true with a *WQEError, d.WrID set and no SGEs.
func (q *RecvQueue) NextInto(d *RecvDest) (bool, error) {
	off, index, ok := q.next()
	if !ok {
		return false, nil
	}
	slot := q.ring[off : off+q.stride]
	var h abi.RecvWQE
	h.Decode(slot)
	d.WrID, d.SGEs, d.Length = h.WrID, d.SGEs[:0], 0
	r := ReasonNone
	switch {
	case h.Reserved != 0:
		r = ReasonReserved
	case h.NumSGE > q.maxSGE || int(h.NumSGE) > cap(d.SGEs): // maxSGE SGEs fit the slot by construction
		r = ReasonTooManySGE
	}
	if r == ReasonNone {
		sges := d.SGEs[:h.NumSGE]
		var total uint64
		for i := range sges {
			o := abi.SizeofRecvWQE + i*abi.SizeofSGE
			sges[i].Decode(slot[o : o+abi.SizeofSGE])
			total += uint64(sges[i].Length)
		}
		if total > abi.MaxMsgBytes {
			r = ReasonLength
		} else {
			d.SGEs, d.Length = sges, total
		}
	}
	if r != ReasonNone {
		return true, &WQEError{WrID: h.WrID, Index: index, Reason: r}
	}
	return true, nil
}
