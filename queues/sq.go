package queues

import (
	"fmt"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// SQConfig sizes a send queue; the daemon keeps it in private memory.
type SQConfig struct {
	Slots     uint32 // power of two, 1..abi.MaxQPWR
	MaxSGE    uint32 // <= abi.MaxSGE
	MaxInline uint32 // <= abi.MaxInline
	// Slot, if set, is where Next copies inline data (SendWR.Inline
	// aliases it until the next Next of any queue sharing it), instead of
	// a buffer of the queue's own, taken at its first Next. NextInto
	// needs none.
	Slot *SlotBuffer
}

// Stride is the slot size in bytes.
func (c SQConfig) Stride() uint32 { return abi.SQWQEBlocks(c.MaxSGE, c.MaxInline) * abi.WQEBlock }

// RingBytes is the ring size in bytes.
func (c SQConfig) RingBytes() uint64 { return uint64(c.Slots) * uint64(c.Stride()) }

// SendWR is a decoded, validated send WQE in daemon memory.
type SendWR struct {
	abi.SendWQE
	// SGE holds NumSGE entries (see SGEs).
	SGE [abi.MaxSGE]abi.SGE
	// Inline is the inline data (SendInline). It aliases the queue's private
	// slot copy, not client memory, and is valid until the next Next.
	Inline []byte
	// Length is the total message length: the SGE lengths or inline_len.
	Length uint64
}

// SGEs returns the decoded scatter/gather list.
func (wr *SendWR) SGEs() []abi.SGE { return wr.SGE[:wr.NumSGE] }

// SQ is the daemon's consumer view of a client send queue.
type SQ struct {
	consumer
	maxSGE    uint32
	maxInline uint32
	buf       *SlotBuffer // Next's inline data (SQConfig.Slot: shared; nil until needed)
}

// NewSQ returns a send queue over ring (client memory, at least
// cfg.RingBytes() long) whose producer index is pi (sq_pi) and consumer
// index ci (sq_ci). It stores 0 to ci.
func NewSQ(ring []byte, cfg SQConfig, pi, ci *atomic.Uint32) (*SQ, error) {
	if cfg.MaxSGE > abi.MaxSGE || cfg.MaxInline > abi.MaxInline {
		return nil, fmt.Errorf("%w: max_sge %d (limit %d), max_inline %d (limit %d)",
			ErrConfig, cfg.MaxSGE, abi.MaxSGE, cfg.MaxInline, abi.MaxInline)
	}
	q := &SQ{maxSGE: cfg.MaxSGE, maxInline: cfg.MaxInline}
	if err := q.init(ring, cfg.Slots, cfg.Stride(), abi.MaxQPWR, pi, ci); err != nil {
		return nil, err
	}
	q.buf = cfg.Slot
	return q, nil
}

// Ring returns the client memory the queue reads its slots from.
func (q *SQ) Ring() []byte { return q.ring }

// Poll loads the client's producer index once and returns how many WQEs are
// ready. An impossible index returns ErrIndex (sticky): the QP must move to
// ERROR.
func (q *SQ) Poll() (uint32, error) { return q.poll() }

// Publish stores the consumer index (sq_ci) if it moved.
func (q *SQ) Publish() { q.publish() }

// Next consumes the next WQE seen by the last Poll into wr. It returns
// false when there is none. A malformed WQE is consumed too and returns
// true with a *WQEError (wr.WrID is set): complete it with the error's
// status and move the QP to ERROR.
func (q *SQ) Next(wr *SendWR) (bool, error) {
	if q.buf == nil {
		q.buf = new(SlotBuffer) // only for Next: NextInto copies into its caller's storage
	}
	d := SendDest{WQE: &wr.SendWQE, SGEs: wr.SGE[:0], Inline: q.buf[abi.SizeofSendWQE:abi.SizeofSendWQE]}
	ok, err := q.NextInto(&d)
	wr.Inline, wr.Length = nil, d.Length
	if ok && err == nil && wr.Flags&abi.SendInline != 0 {
		wr.Inline = d.Inline
	}
	return ok, err
}

// SendDest is where NextInto decodes a WQE: the caller's control block,
// and SGE and inline storage whose capacities hold the queue's max_sge
// and max_inline (the lengths are set by NextInto).
type SendDest struct {
	WQE    *abi.SendWQE
	SGEs   []abi.SGE
	Inline []byte
	// Length is the message length: the SGE lengths or inline_len.
	Length uint64
}

// NextInto consumes the next WQE seen by the last Poll straight into d:
// every field of the slot is read once from the ring into d and every
// decision is made on d, so nothing the client stores meanwhile can change
// what was checked, and the WQE is copied once. It returns false when
// there is none; like Next, true with a *WQEError for a malformed WQE
// (d.WQE.WrID set, no SGEs or inline data). The capacities of d.SGEs and
// d.Inline must hold the queue's max_sge and max_inline.
func (q *SQ) NextInto(d *SendDest) (bool, error) {
	off, index, ok := q.next()
	if !ok {
		return false, nil
	}
	slot := q.ring[off : off+q.stride]
	d.WQE.Decode(slot)
	d.SGEs, d.Inline, d.Length = d.SGEs[:0], d.Inline[:0], 0
	if r := q.check(d, slot); r != ReasonNone {
		// Leave nothing a careless caller could index out of range with.
		d.WQE.NumSGE, d.SGEs, d.Inline, d.Length = 0, d.SGEs[:0], d.Inline[:0], 0
		return true, &WQEError{WrID: d.WQE.WrID, Index: index, Reason: r}
	}
	return true, nil
}

func carriesData(op abi.WROpcode) bool {
	switch op {
	case abi.WRSend, abi.WRSendWithImm, abi.WRSendWithInv, abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		return true
	}
	return false
}

// check validates the decoded control block in d and decodes the SGEs or
// copies the inline data from slot into d.
func (q *SQ) check(d *SendDest, slot []byte) Reason {
	w := d.WQE
	switch {
	case !w.Opcode.Valid():
		return ReasonOpcode
	case w.Flags&^abi.SendFlagsAll != 0:
		return ReasonFlags
	case w.Reserved0 != 0:
		return ReasonReserved
	}
	if w.Flags&abi.SendInline != 0 {
		switch {
		case w.NumSGE != 0:
			return ReasonInlineWithSGE
		case !carriesData(w.Opcode):
			return ReasonInlineOpcode
		case w.InlineLen > q.maxInline: // maxInline <= stride-64 by construction
			return ReasonInlineTooLong
		}
		n := abi.SizeofSendWQE + w.InlineLen
		d.Inline = append(d.Inline, slot[abi.SizeofSendWQE:n]...)
		d.Length = uint64(w.InlineLen)
		return ReasonNone
	}
	if w.InlineLen != 0 {
		return ReasonReserved
	}
	if w.Opcode == abi.WRBindMW && w.NumSGE != 0 {
		return ReasonReserved // a bind names its MR by lkey, not by SGEs
	}
	if uint32(w.NumSGE) > q.maxSGE { // maxSGE SGEs fit the slot by construction
		return ReasonTooManySGE
	}
	n := int(w.NumSGE)
	if cap(d.SGEs) < n {
		return ReasonTooManySGE // the caller's storage is short: never with max_sge
	}
	sges := d.SGEs[:n]
	var total uint64
	for i := range sges {
		o := abi.SizeofSendWQE + i*abi.SizeofSGE
		sges[i].Decode(slot[o : o+abi.SizeofSGE])
		total += uint64(sges[i].Length)
	}
	d.SGEs, d.Length = sges, total
	if total > abi.MaxMsgBytes {
		return ReasonLength
	}
	if w.Opcode == abi.WRAtomicCmpAndSwp || w.Opcode == abi.WRAtomicFetchAdd {
		if w.NumSGE != 1 || sges[0].Length != 8 {
			return ReasonAtomicSGE
		}
	}
	// FLUSH and ATOMIC WRITE (ABI 1.4) carry everything in the WQE: no
	// local buffer.
	if (w.Opcode == abi.WRFlush || w.Opcode == abi.WRAtomicWrite) && w.NumSGE != 0 {
		return ReasonAtomicSGE
	}
	return ReasonNone
}
