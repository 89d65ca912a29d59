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
//
// UD (SEND and SEND with immediate only): AH is the destination (an AH
// of the QP's PD), RemoteQPN the destination QP and RemoteQKey its Q_Key;
// a RemoteQKey with bit 31 set means the sending QP's own Q_Key. The
// message is at most the port's MTU (abi.PortAttr.ActiveMTU); a longer
// one completes with abi.WCLocLenErr. The receiver's buffers get the
// 40-byte GRH first (abi.GRHLen). UC carries SEND and RDMA WRITE (with and
// without immediate) and no READ or atomics. UD and UC sends complete
// once the message left the device, with no acknowledgement.
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

// workQueue is the posting side of one work ring (the SQ or RQ of a QP,
// an SRQ): its slots in host memory, the free-running producer index, and
// two words of the object's doorbell record, the producer index this side
// stores and the consumer index the daemon publishes.
type workQueue struct {
	ring   *Buffer // nil: no ring (the RQ of a QP with an SRQ)
	stride uint32  // bytes per slot
	mask   uint32  // slots - 1
	pi     uint32  // next slot to fill
	piWord []byte  // doorbell record word of pi
	ciWord []byte  // doorbell record word of the daemon's consumer index
	// sumWord, sumBit: the record's bit in the page's doorbell summary
	// (ABI 1.3; sumWord nil when the daemon has none).
	sumWord []byte
	sumBit  uint32
}

func newWorkQueue(ring *Buffer, slots, stride uint32, rec []byte, piOff, ciOff int, sum summaryBit) workQueue {
	return workQueue{ring: ring, stride: stride, mask: slots - 1, piWord: rec[piOff:], ciWord: rec[ciOff:],
		sumWord: sum.word, sumBit: sum.bit}
}

// slot returns the next slot to fill, or ErrQueueFull while the daemon has
// not consumed the WQE it would overwrite (flow control: the daemon
// publishes how far it consumed the ring).
func (q *workQueue) slot() ([]byte, error) {
	if q.pi-load32(q.ciWord) > q.mask {
		return nil, ErrQueueFull
	}
	return q.ring.Bytes[(q.pi&q.mask)*q.stride:][:q.stride], nil
}

// publish hands the slot returned by slot to the daemon: it stores the new
// producer index and kicks the daemon only if it sleeps (kick_needed).
func (q *workQueue) publish(c *Context) {
	q.pi++
	store32(q.piWord, q.pi)
	q.mark()
	c.kick()
}

// mark marks the queue's record in the doorbell summary (ABI 1.3), after
// a producer index store.
func (q *workQueue) mark() {
	if q.sumWord != nil && load32(q.sumWord)&q.sumBit == 0 {
		or32(q.sumWord, q.sumBit)
	}
}

// postRecv writes wr into the next slot of a receive ring (RQ or SRQ)
// whose WQEs hold up to maxSGE SGEs, and publishes it.
func (q *workQueue) postRecv(c *Context, wr *RecvWR, maxSGE uint32) error {
	slot, err := q.slot()
	if err != nil {
		return err
	}
	if uint32(len(wr.SGL)) > maxSGE {
		return ErrTooMany
	}
	h := abi.RecvWQE{WrID: wr.WrID, NumSGE: uint32(len(wr.SGL))}
	h.Put(slot)
	for i := range wr.SGL {
		wr.SGL[i].Put(slot[abi.SizeofRecvWQE+i*abi.SizeofSGE:])
	}
	q.publish(c)
	return nil
}

// PostSend writes wr into the next send ring slot, publishes the new
// producer index in the QP's doorbell record and kicks the daemon only if
// it sleeps (kick_needed). No round trip to the daemon, no allocation.
// The daemon validates the WQE when it consumes it: a malformed one
// completes with an error status and moves the QP to ERROR.
func (qp *QP) PostSend(wr *SendWR) error {
	slot, err := qp.sq.slot()
	if err != nil {
		return err
	}
	inline := wr.Flags&abi.SendInline != 0
	if inline {
		if uint32(len(wr.Inline)) > qp.Cap.MaxInlineData {
			return ErrTooMany
		}
	} else if uint32(len(wr.SGL)) > qp.Cap.MaxSendSGE {
		return ErrTooMany
	}
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
	qp.sq.publish(qp.ctx)
	return nil
}

// PostRecv writes wr into the next receive ring slot and publishes the
// producer index.
func (qp *QP) PostRecv(wr *RecvWR) error {
	if qp.rq.ring == nil {
		return ErrNoRQ
	}
	return qp.rq.postRecv(qp.ctx, wr, qp.Cap.MaxRecvSGE)
}

// PostRecv posts a receive WQE to the SRQ.
func (s *SRQ) PostRecv(wr *RecvWR) error { return s.rq.postRecv(s.ctx, wr, s.maxSGE) }
