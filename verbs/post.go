package verbs

import (
	"errors"

	"github.com/vrnic/vrnic/abi"
)

// Posting errors. They are returned without wrapping so that posting
// allocates nothing.
var (
	ErrQueueFull = errors.New("verbs: work queue full")
	ErrTooMany   = errors.New("verbs: too many SGEs or inline bytes for the queue")
	ErrNoRQ      = errors.New("verbs: QP uses an SRQ; post receives to the SRQ")
)

// SendWR is a send work request (ibv_send_wr). SGL and Inline are read
// during PostSend only.
type SendWR struct {
	WrID       uint64
	Opcode     abi.WROpcode
	Flags      abi.SendFlags
	SGL        []abi.SGE
	Inline     []byte // with abi.SendInline: copied into the WQE
	ImmData    uint32
	InvRKey    uint32
	RemoteAddr uint64
	RKey       uint32
	AH         *AH // UD
	RemoteQPN  uint32
	RemoteQKey uint32
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive work request.
type RecvWR struct {
	WrID uint64
	SGL  []abi.SGE
}

// PostSend writes wr into the next send ring slot, publishes the new
// producer index in the QP's doorbell record and kicks the daemon only if
// it sleeps (kick_needed). No round trip to the daemon, no allocation.
// The daemon validates the WQE when it consumes it: a malformed one
// completes with an error status and moves the QP to ERROR.
func (qp *QP) PostSend(wr *SendWR) error {
	n := qp.sqMask + 1
	// Flow control: the daemon publishes how far it consumed the ring.
	if qp.sqPI-load32(qp.rec[abi.OffDBSQCI:]) >= n {
		return ErrQueueFull
	}
	inline := wr.Flags&abi.SendInline != 0
	if inline {
		if uint32(len(wr.Inline)) > qp.Cap.MaxInlineData {
			return ErrTooMany
		}
	} else if uint32(len(wr.SGL)) > qp.Cap.MaxSendSGE {
		return ErrTooMany
	}
	slot := qp.sq.Bytes[(qp.sqPI&qp.sqMask)*qp.sqStride:][:qp.sqStride]
	w := abi.SendWQE{WrID: wr.WrID, Opcode: wr.Opcode, Flags: wr.Flags, ImmData: wr.ImmData,
		InvalidateRKey: wr.InvRKey, RemoteAddr: wr.RemoteAddr, RKey: wr.RKey, RemoteQPN: wr.RemoteQPN,
		RemoteQKey: wr.RemoteQKey, CompareAdd: wr.CompareAdd, Swap: wr.Swap}
	if wr.AH != nil {
		w.AHHandle = wr.AH.Handle
	}
	if inline {
		w.InlineLen = uint32(len(wr.Inline))
		copy(slot[abi.WQEBlock:], wr.Inline)
	} else {
		w.NumSGE = uint8(len(wr.SGL))
		for i := range wr.SGL {
			wr.SGL[i].Put(slot[abi.WQEBlock+i*abi.SizeofSGE:])
		}
	}
	w.Put(slot)
	qp.sqPI++
	store32(qp.rec[abi.OffDBSQPI:], qp.sqPI)
	qp.ctx.kick()
	return nil
}

// PostRecv writes wr into the next receive ring slot and publishes the
// producer index.
func (qp *QP) PostRecv(wr *RecvWR) error {
	if qp.srq {
		return ErrNoRQ
	}
	if qp.rqPI-load32(qp.rec[abi.OffDBRQCI:]) >= qp.rqMask+1 {
		return ErrQueueFull
	}
	if uint32(len(wr.SGL)) > qp.Cap.MaxRecvSGE {
		return ErrTooMany
	}
	putRecv(qp.rq.Bytes[(qp.rqPI&qp.rqMask)*qp.rqStride:][:qp.rqStride], wr)
	qp.rqPI++
	store32(qp.rec[abi.OffDBRQPI:], qp.rqPI)
	qp.ctx.kick()
	return nil
}

// PostRecv posts a receive WQE to the SRQ.
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if s.pi-load32(s.rec[abi.OffDBSRQCI:]) >= s.mask+1 {
		return ErrQueueFull
	}
	if uint32(len(wr.SGL)) > s.maxSGE {
		return ErrTooMany
	}
	putRecv(s.ring.Bytes[(s.pi&s.mask)*s.stride:][:s.stride], wr)
	s.pi++
	store32(s.rec[abi.OffDBSRQPI:], s.pi)
	s.ctx.kick()
	return nil
}

func putRecv(slot []byte, wr *RecvWR) {
	h := abi.RecvWQE{WrID: wr.WrID, NumSGE: uint32(len(wr.SGL))}
	h.Put(slot)
	for i := range wr.SGL {
		wr.SGL[i].Put(slot[abi.SizeofRecvWQE+i*abi.SizeofSGE:])
	}
}
