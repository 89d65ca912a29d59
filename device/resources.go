package device

import (
	"github.com/vrnic/vrnic/dma"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/doorbell"
)

// firstQPN is the first QPN handed out: 0 and 1 are the special QPs of
// InfiniBand (SMI, GSI) and are never used.
const firstQPN = 2

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
	db     *doorbell.Page

	nextHandle uint32
	counts     ResourceCounts
	hostMem    map[uint32]*hostMem
	pds        map[uint32]*pd
	mrs        map[uint32]*mr
	mws        map[uint32]*mw // by handle (memory windows, mw.go)
	cqs        map[uint32]*CQ
	qps        *qpTable[uint32] // by QPN
	srqs       map[uint32]*SRQ
	ahs        map[uint32]*AH
	xrcds      map[uint32]*xrcdRef // XRC domains opened (xrc.go)
	dms        map[uint32]*dm      // device memory (mrdm.go)

	// lingering counts destroyed QPs whose engine worker has not
	// confirmed the removal yet (DataPlane.DestroyQP returned a channel).
	// While it is non-zero the release of memory a worker may touch in
	// this context (ring pins of QPs, CQs and SRQs, doorbell records, the
	// doorbell page) is deferred to deferred, run in order once the last
	// such QP is confirmed (releaseLater).
	lingering int
	// eventfds counts the completion eventfds of the context's CQs (the
	// uid's descriptor account, UIDLimits.FDs).
	eventfds int
	// events is the context's asynchronous event socket (OPEN_EVENTS),
	// nil until the client asks for it (events.go).
	events   atomic.Pointer[eventSink]
	deferred []func()

	// dev is the context's device (CMClient: the uid's CM ID account).
	dev *Device

	// odp is the client process ODP MRs reach (ODP_ATTACH, odp.go), nil
	// until attached; closed when the context is released.
	odp *dma.Process
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
	if _, ok := cx.xrcds[h]; ok {
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
	// users counts the MRs, MWs, QPs, AHs and SRQs in this PD.
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
	odp    bool // on-demand paging (odp.go): no pages
	dm     *dm  // a device memory MR's DM, else nil
}

// CQ is a completion queue. The data plane reads it through the accessors,
// with the device lock held (DataPlane calls) or on values copied then.
type CQ struct {
	handle   uint32
	ringPA   uint64
	cqeCount uint32
	dbIndex  uint32
	eventfd  int // -1: none; owned by the CQ
	ring     *pin
	users    int      // QPs using it as send or receive CQ
	cx       *Context // its context (events)
	ts       bool     // completion timestamps (abi.CQFlagTimestamp): the ring has them after the CQEs
	// overflowed is set the first time the CQ could not take a CQE.
	overflowed atomic.Bool
}

// SRQ is a shared receive queue (accessors as for CQ).
type SRQ struct {
	handle uint32
	pd     *pd
	ringPA uint64
	maxWR  uint32
	maxSGE uint32
	// armed is srq_limit: 0, or the WQE count under which the SRQ
	// raises SRQ_LIMIT_REACHED once (and disarms); MODIFY_SRQ arms it,
	// the data plane disarms it on an engine worker.
	armed   atomic.Uint32
	wqeSize uint32
	dbIndex uint32
	ring    *pin
	users   int      // QPs attached
	cx      *Context // its context (events)
	xrc     *xrcSRQ  // an XRC SRQ's domain, CQ and number (xrc.go); nil otherwise
}

// AH is an address handle (UD). The data plane reads it through the
// accessors during AddAH and RemoveAH (the device lock is held).
type AH struct {
	handle uint32
	pd     *pd
	attr   abi.AHAttr
	cx     *Context
	// local and remote are the source GID (the device's GID at the
	// AV's sgid_index) and the destination GID, IPv4-mapped ones as IPv4.
	local, remote netip.Addr
}

// Handle returns the AH's handle (a send WQE's ah_handle).
func (a *AH) Handle() uint32 { return a.handle }

// Owner returns the owner of the AH's context: a WQE may name only the
// AHs of its QP's context.
func (a *AH) Owner() Owner { return a.cx.owner }

// PDHandle returns the handle of the AH's PD.
func (a *AH) PDHandle() uint32 { return a.pd.handle }

// Attr returns the address vector as the client gave it.
func (a *AH) Attr() abi.AHAttr { return a.attr }

// Path returns the source and destination addresses of the AH.
func (a *AH) Path() (local, remote netip.Addr) { return a.local, a.remote }

// QP is a queue pair owned by the device. The data plane reads its
// configuration through the accessor methods; they must be called with the
// device lock held (i.e. from DataPlane calls) or on values copied then,
// except StateWord, which is shared with the transport (see StateWord).
//
// The fields are ordered so that the struct has no padding (an idle QP
// holds it: BENCHMARKS.md, "Idle QPs"). The rings' addresses are the
// pins'.
type QP struct {
	qpn      uint32
	typ      QPType
	dbIndex  uint32
	sqBlocks uint32
	rqSize   uint32
	// portMTU is the link's largest MTU: a UD QP's message limit.
	portMTU abi.MTU
	ctx     *Context
	pd      *pd
	sendCQ  *CQ
	recvCQ  *CQ
	srq     *SRQ
	xrcd    *xrcdRef // XRC target QP: its domain (xrc.go)
	sqRing  *pin
	rqRing  *pin // nil with an SRQ
	state   StateWord
	// attr are the attributes as last set (QUERY_QP takes the state from
	// state); attr.Cap the granted capacities.
	attr abi.QPAttr
	// local is the path's source address, the source GID of the address
	// vector looked up in the device's GID table, as IPv4 when it is
	// IPv4-mapped (RoCE v2 GIDs); invalid until an AV is set. The
	// destination is attr.AHAttr.DGID (Path).
	local netip.Addr
	// peer is the remote QP this RC or UC QP claimed at RTR (claimed set; see
	// connect.go).
	peer    peerKey
	claimed bool
	sigAll  bool
	// ece are the ECE options in force (ece.go): set by MODIFY_QP's
	// VRNIC_QP_ECE, cleared by RESET.
	ece uint32
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// PortMTU returns the port's largest MTU, the largest message of a UD QP.
func (q *QP) PortMTU() abi.MTU { return q.portMTU }

// Type returns the QP type.
func (q *QP) Type() QPType { return q.typ }

// State returns the current state.
func (q *QP) State() QPState { return q.state.Load() }

// StateWord returns the QP's state word, which the transport updates when
// it moves the QP to ERR on its own.
func (q *QP) StateWord() *StateWord { return &q.state }

// Path returns the addresses of the QP's path (see QP.local); both are
// invalid before an address vector was set.
func (q *QP) Path() (local, remote netip.Addr) {
	if !q.local.IsValid() {
		return netip.Addr{}, netip.Addr{}
	}
	return q.local, netip.AddrFrom16(q.attr.AHAttr.DGID).Unmap()
}

// Attr returns the attributes as last set by MODIFY_QP.
func (q *QP) Attr() abi.QPAttr { return q.attr }

// Cap returns the granted capacities (ring slot counts, SGEs, inline).
func (q *QP) Cap() abi.QPCap { return q.attr.Cap }

// SQ returns the send ring bytes (pinned while the QP exists) and the
// slot size in 64-byte blocks.
func (q *QP) SQ() ([]byte, uint32) { return q.sqRing.bytes(), q.sqBlocks }

// RQ returns the receive ring bytes and the slot size in bytes; nil with
// an SRQ.
func (q *QP) RQ() ([]byte, uint32) {
	if q.rqRing == nil {
		return nil, q.rqSize
	}
	return q.rqRing.bytes(), q.rqSize
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

// Handle returns the CQ handle.
func (c *CQ) Handle() uint32 { return c.handle }

// Ring returns the CQE ring (pinned while the CQ exists) and its entry
// count (a power of two).
func (c *CQ) Ring() ([]byte, uint32) { return c.ring.bytes(), c.cqeCount }

// Timestamps reports whether the CQ's ring carries completion timestamps
// after its CQEs (abi.CQFlagTimestamp).
func (c *CQ) Timestamps() bool { return c.ts }

// ringBytes is the ring size of n entries of a CQ with or without
// timestamps.
func cqRingBytes(n uint32, ts bool) uint64 {
	if ts {
		return uint64(n) * (cqeSize + 8)
	}
	return uint64(n) * cqeSize
}

// DBIndex returns the CQ's record index in its context's doorbell page.
func (c *CQ) DBIndex() uint32 { return c.dbIndex }

// EventFd returns the completion eventfd, or -1 (owned by the CQ).
func (c *CQ) EventFd() int { return c.eventfd }

// Handle returns the SRQ handle.
func (s *SRQ) Handle() uint32 { return s.handle }

// Ring returns the receive ring, its slot count and slot size in bytes.
func (s *SRQ) Ring() ([]byte, uint32, uint32) { return s.ring.bytes(), s.maxWR, s.wqeSize }

// DBIndex returns the SRQ's record index in the doorbell page.
func (s *SRQ) DBIndex() uint32 { return s.dbIndex }

// Limit returns the SRQ limit (0: not armed). The data plane reads it
// on an engine worker as it takes WQEs (see LimitReached).
func (s *SRQ) Limit() uint32 { return s.armed.Load() }

// SendCQ returns the QP's send CQ.
func (q *QP) SendCQ() *CQ { return q.sendCQ }

// RecvCQ returns the QP's receive CQ.
func (q *QP) RecvCQ() *CQ { return q.recvCQ }

// SRQ returns the QP's SRQ, or nil.
func (q *QP) SRQ() *SRQ { return q.srq }

// Doorbells returns the doorbell page of the QP's context (QP, CQ and SRQ
// records live there).
func (q *QP) Doorbells() *doorbell.Page { return q.ctx.db }

// MaxSGE returns the SGEs a receive WQE of the SRQ may have.
func (s *SRQ) MaxSGE() uint32 { return s.maxSGE }
