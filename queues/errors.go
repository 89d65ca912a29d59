package queues

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrConfig: a ring's size parameters or memory are invalid (control
	// path: reported to the client as EINVAL).
	ErrConfig = errors.New("queues: invalid ring configuration")
	// ErrIndex: a client-written index is impossible (pi - ci > slots, or a
	// CQ consumer index ahead of the producer). The ring is broken; the
	// owner moves the QP (or CQ) to the error state.
	ErrIndex = errors.New("queues: client index out of range")
	// ErrMalformedWQE: a WQE failed validation; it is wrapped in a *WQEError.
	ErrMalformedWQE = errors.New("queues: malformed WQE")
	// ErrCQFull: the CQ has no free entry; the CQ overflowed.
	ErrCQFull = errors.New("queues: completion queue full")
)

// Reason says why a WQE was rejected.
type Reason uint8

// Reasons for rejecting a WQE.
const (
	ReasonNone Reason = iota
	ReasonOpcode
	ReasonFlags
	ReasonReserved
	ReasonTooManySGE
	ReasonInlineTooLong
	ReasonInlineWithSGE
	ReasonInlineOpcode
	ReasonAtomicSGE
	ReasonLength
)

var reasonNames = [...]string{
	ReasonNone:          "none",
	ReasonOpcode:        "unknown opcode",
	ReasonFlags:         "unknown flags",
	ReasonReserved:      "reserved field not zero",
	ReasonTooManySGE:    "num_sge exceeds the queue's max_sge",
	ReasonInlineTooLong: "inline_len exceeds the queue's max_inline",
	ReasonInlineWithSGE: "inline WQE with num_sge != 0",
	ReasonInlineOpcode:  "inline data with an opcode that carries none",
	ReasonAtomicSGE:     "atomic needs exactly one 8-byte SGE (FLUSH and ATOMIC WRITE none)",
	ReasonLength:        "total length exceeds the largest message",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// WQEError is a rejected WQE: its wr_id (so the caller can complete it with
// an error CQE), the index it had and why it was rejected. It matches
// ErrMalformedWQE with errors.Is. Which completion status a Reason means
// is the transport's decision (package device/engine, status.go), not this
// package's.
type WQEError struct {
	WrID   uint64
	Index  uint32 // free-running ring index of the WQE
	Reason Reason
}

func (e *WQEError) Error() string {
	return fmt.Sprintf("queues: malformed WQE %d (wr_id %#x): %s", e.Index, e.WrID, e.Reason)
}

// Is makes errors.Is(err, ErrMalformedWQE) true.
func (e *WQEError) Is(target error) bool { return target == ErrMalformedWQE }
