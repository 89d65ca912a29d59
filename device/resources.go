package device

import (
	"time"

	"github.com/vrnic/vrnic/abi"
)

// firstQPN is the first QPN handed out: 0 and 1 are the special QPs of
// InfiniBand (SMI, GSI) and are never used.
const firstQPN = 2

// qpnMask keeps QPNs in the 24 bits of the BTH destination QP field.
const qpnMask = 1<<24 - 1

// Context is one client connection after OPEN_CONTEXT: the client's
// doorbell page and every object it created. All fields are guarded by
// Device.mu.
type Context struct {
	handle uint32
	owner  Owner
	name   string
	pid    int32
	uid    uint32
	opened time.Time
	db     DoorbellPage

	nextHandle uint32
	counts     ResourceCounts
	hostMem    map[uint32]*hostMem
	pds        map[uint32]*pd
	mrs        map[uint32]*mr
	cqs        map[uint32]*cq
	qps        map[uint32]*QP
	srqs       map[uint32]*srq
	ahs        map[uint32]*ah
}

// newHandle returns a handle not used by any object of the context (all
// object kinds share one handle space, so a handle of the wrong kind is
// never confused with a live object of another kind).
func (cx *Context) newHandle() uint32 {
	for {
		cx.nextHandle++
		h := cx.nextHandle
		if h == 0 || h == abi.NoSRQ {
			continue
		}
		if cx.handleUsed(h) {
			continue
		}
		return h
	}
}

func (cx *Context) handleUsed(h uint32) bool {
	if _, ok := cx.pds[h]; ok {
		return true
	}
	if _, ok := cx.cqs[h]; ok {
		return true
	}
	if _, ok := cx.srqs[h]; ok {
		return true
	}
	if _, ok := cx.ahs[h]; ok {
		return true
	}
	return false
}

type hostMem struct {
	handle uint32
	pa     uint64
	length uint64
	locked bool
}

type pd struct {
	handle uint32
	// users counts the MRs, QPs, AHs and SRQs in this PD.
	users int
}

type mr struct {
	handle uint32
	pd     *pd
	iova   uint64
	length uint64
	access uint32
	lkey   uint32
	rkey   uint32
	npages uint32
	shift  uint32
}

type cq struct {
	handle   uint32
	ringPA   uint64
	cqeCount uint32
	dbIndex  uint32
	eventfd  int // -1: none; owned by the CQ
	ring     Pin
	users    int // QPs using it as send or receive CQ
}

type srq struct {
	handle  uint32
	pd      *pd
	ringPA  uint64
	maxWR   uint32
	maxSGE  uint32
	limit   uint32
	wqeSize uint32
	dbIndex uint32
	ring    Pin
	users   int // QPs attached
}

type ah struct {
	handle uint32
	pd     *pd
	attr   abi.AHAttr
}

// QP is a queue pair owned by the device. The engine reads its
// configuration through the accessor methods; they must be called with the
// device lock held (i.e. from Engine callbacks) or on values the engine
// copied then.
type QP struct {
	qpn      uint32
	ctx      *Context
	typ      QPType
	pd       *pd
	sendCQ   *cq
	recvCQ   *cq
	srq      *srq
	sigAll   bool
	cap      abi.QPCap
	sqPA     uint64
	rqPA     uint64
	sqBlocks uint32
	rqSize   uint32
	sqRing   Pin
	rqRing   Pin // nil with an SRQ
	dbIndex  uint32
	state    QPState
	attr     abi.QPAttr // the attributes as last set (state fields kept in sync)
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// Type returns the QP type.
func (q *QP) Type() QPType { return q.typ }

// State returns the current state.
func (q *QP) State() QPState { return q.state }

// Attr returns the attributes as last set by MODIFY_QP.
func (q *QP) Attr() abi.QPAttr { return q.attr }

// Cap returns the granted capacities (ring slot counts, SGEs, inline).
func (q *QP) Cap() abi.QPCap { return q.cap }

// SQ returns the send ring bytes (pinned while the QP exists) and the
// slot size in 64-byte blocks.
func (q *QP) SQ() ([]byte, uint32) { return q.sqRing.Bytes(), q.sqBlocks }

// RQ returns the receive ring bytes and the slot size in bytes; nil with
// an SRQ.
func (q *QP) RQ() ([]byte, uint32) {
	if q.rqRing == nil {
		return nil, q.rqSize
	}
	return q.rqRing.Bytes(), q.rqSize
}

// DBIndex returns the QP's record index in its context's doorbell page.
func (q *QP) DBIndex() uint32 { return q.dbIndex }

// Owner returns the owner id of the QP's context (for address
// translation).
func (q *QP) Owner() Owner { return q.ctx.owner }

// PDHandle returns the handle of the QP's PD (MR checks compare it).
func (q *QP) PDHandle() uint32 { return q.pd.handle }

// SigAll reports whether every send WR completes signaled.
func (q *QP) SigAll() bool { return q.sigAll }
