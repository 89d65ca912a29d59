package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/roce"
)

// QP1: the General Services Interface QP of the device (IBTA 13.5.1).
//
// QP1 is a UD QP numbered 1 that belongs to the daemon, not to a client:
// P_Key 0xFFFF, Q_Key 0x80010000 (the well-known GSI Q_Key). It runs on
// the engine like any UD QP, over adapters of its own instead of a
// client's rings and memory:
//
//	arena (daemon memory, lkey qp1LKey, addresses are arena offsets)
//	  send slots  [0, qp1Slots)        256 bytes each: one MAD
//	  recv slots  [0, qp1RecvSlots)    40 + 256 bytes: GRH, then the MAD
//
//	SendMAD ──► free send slot ──► sendQ ──► PollSend (worker) ──► link
//	link ──► PollRecv (worker) ──► recv slot ──► PushCQE: source GID from
//	         the GRH, agent by management class, slot reposted
//
// Every hand-over between the daemon's goroutines and the worker goes
// through q.mu (the queues), so a slot's bytes are written before the
// other side may read them. The worker never blocks: the agent takes a
// copy of the MAD into its own inbox without waiting (the communication
// manager's Service.HandleMAD), and the slot is posted again at once.
//
// Received MADs go to the agent registered for their management class
// (RegisterAgent: the communication manager for class 0x07); MADs of any
// other class, and malformed ones, are dropped and counted. QP1 answers
// nothing by itself.
//
// Bursts: a MAD that finds every send slot in use waits in pending. A
// request the CM repeats until answered (REQ, REP, DREQ, SIDR_REQ, and
// any MAD of another class) is dropped and counted (SendDropped) when
// qp1MaxPending wait already: the CM sends it again. A message the CM
// sends once (REJ, MRA, RTU, DREP, SIDR_REP: qp1Answer) always waits,
// past the bound if need be (Overflow counts those): dropping it would
// lose it for good (a REJ for each of thousands of connections closed at
// once). Their number stays bounded: those the CM sends on its own
// (closing, expiring) are bounded by its connections, and those that
// answer a received MAD by the receive path, which hands no more received
// MADs to the agent while the backlog is at its bound (it holds their
// slots until a send completion drains it), so a flood of requests waits
// in QP1's receive slots and, past them, is dropped by the transport, at
// the door.
type QP1 struct {
	eng     *engine.Engine
	resolve func(what string, peer netip.Addr) error
	local   netip.Addr // the device's GID (the AHs' source)

	arena []byte
	ahs   engine.AHTable
	qpc   *engine.QPCounters // the engine's counters of QP1

	mu      sync.Mutex
	free    []uint32         // free send slots
	sendQ   []uint32         // send slots posted, not yet taken by the worker
	sendTo  [qp1Slots]uint32 // AH handle of each send slot
	pending []qp1Pending     // MADs waiting for a free send slot (a burst)
	recvQ   []uint32         // recv slots posted
	ahByGID map[netip.Addr]uint32
	nextAH  uint32
	agents  map[uint8]func(src [16]byte, mad []byte)
	closed  bool

	// held are received MADs not yet handed to their agent: the send
	// backlog was at its bound (see Bursts), they wait for it to drain.
	held []uint32

	Counters QP1Counters
}

// qp1Pending is a MAD that found every send slot in use.
type qp1Pending struct {
	ah  uint32
	mad [qp1MADLen]byte
}

// QP1Counters count QP1's datagrams.
type QP1Counters struct {
	Sent        atomic.Uint64 // MADs handed to the engine
	SendErrors  atomic.Uint64 // MADs that completed with an error
	SendDropped atomic.Uint64 // MADs refused: send slots and backlog full, no route
	Overflow    atomic.Uint64 // answers queued past the backlog's bound (qp1Answer)
	Received    atomic.Uint64 // MADs received and given to an agent
	Dropped     atomic.Uint64 // MADs received and dropped: no agent for the class, malformed
	RecvErrors  atomic.Uint64 // receive completions with an error
}

const (
	qp1Slots = 64
	// qp1RecvSlots is as many receives as Linux posts on its QP1
	// (IB_MAD_QP_RECV_SIZE); a slot is posted again as soon as its MAD
	// was handed to its agent.
	qp1RecvSlots = 512
	qp1MADLen    = 256
	qp1RecvLen   = roce.GRHLen + qp1MADLen
	qp1LKey      = 0x1
	qp1QKey      = 0x80010000
	qp1QPN       = 1
	qp1RecvBase  = qp1Slots * qp1MADLen
	qp1RecvFlag  = 1 << 32 // in a WR ID: a receive slot
	qp1MaxAHs    = 1024    // cached destinations; the cache starts over beyond
	// qp1MaxPending bounds the MADs waiting for a send slot (256 KiB): a
	// burst of connections (a thousand REQs at once) waits for slots
	// rather than being dropped and retried a CM response timeout later.
	qp1MaxPending = 1024
	qp1PD         = 0
)

// ErrQP1Busy: every send slot of QP1 is in use and its backlog is full
// (the MAD is dropped; the CM retransmits).
var ErrQP1Busy = errors.New("dataplane: QP1 send queue full")

// StartQP1 creates QP1 on the engine and brings it to RTS. local is the
// device's GID (index 0). Start the data plane before; Close it with
// QP1.Close before the data plane.
func (dp *DataPlane) StartQP1(local netip.Addr) (*QP1, error) {
	q := &QP1{
		eng: dp.eng, local: local, resolve: dp.resolve,
		arena:   make([]byte, qp1Slots*qp1MADLen+qp1RecvSlots*qp1RecvLen),
		ahByGID: map[netip.Addr]uint32{},
		agents:  map[uint8]func([16]byte, []byte){},
	}
	for i := range uint32(qp1Slots) {
		q.free = append(q.free, i)
	}
	for i := range uint32(qp1RecvSlots) {
		q.recvQ = append(q.recvQ, i)
	}
	src := (*qp1Source)(q)
	var err error
	q.qpc, err = dp.eng.CreateQP(engine.QPConfig{
		QPN: qp1QPN, SQ: src, RQ: (*qp1RecvSource)(q), SendCQ: (*qp1SendSink)(q), RecvCQ: (*qp1RecvSink)(q),
		Mem: (*qp1Memory)(q), SQDepth: qp1Slots, MaxSendSGE: 1, MaxRecvSGE: 1, SigAll: true,
		State: (*qp1State)(q), Type: abi.QPTUD, PD: qp1PD, AHs: &q.ahs, PortMTU: roce.MTU256, GSI: true,
	})
	if err != nil {
		return nil, fmt.Errorf("QP1: %w", err)
	}
	if err := q.up(); err != nil {
		return nil, err
	}
	return q, nil
}

// up moves QP1 through INIT and RTR to RTS.
func (q *QP1) up() error {
	for _, a := range []engine.QPAttr{
		{Mask: abi.QPAttrState | abi.QPAttrQKey, State: abi.QPSInit, QKey: qp1QKey},
		{Mask: abi.QPAttrState, State: abi.QPSRTR},
		{Mask: abi.QPAttrState | abi.QPAttrSQPSN, State: abi.QPSRTS},
	} {
		if err := q.eng.ModifyQP(qp1QPN, a); err != nil {
			return fmt.Errorf("QP1: %w", err)
		}
	}
	return nil
}

// Close removes QP1 from the engine.
func (q *QP1) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	q.Counters.SendDropped.Add(uint64(len(q.pending)))
	q.pending = nil
	q.mu.Unlock()
	<-q.eng.DestroyQP(qp1QPN)
}

// Stats returns QP1's counters.
func (q *QP1) Stats() admin.QP1Stats {
	c := &q.Counters
	return admin.QP1Stats{Sent: c.Sent.Load(), SendErrors: c.SendErrors.Load(), SendDropped: c.SendDropped.Load(),
		Overflow: c.Overflow.Load(), Received: c.Received.Load(), Dropped: c.Dropped.Load(), RecvErrors: c.RecvErrors.Load(),
		NoRecvSlot: q.qpc.Load().NoRecvWQE}
}

// RegisterAgent makes h receive every MAD of management class class, with
// the GID it came from. h runs on the engine worker that owns QP1, one
// MAD at a time: it must not block (take a copy and queue it); mad is
// valid only during the call.
func (q *QP1) RegisterAgent(class uint8, h func(src [16]byte, mad []byte)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.agents[class] = h
}

// SendMAD sends a 256-byte MAD to QP1 of the port with GID dst (UDP link:
// port 4791 of that address). It never waits for the engine; it fails
// when dst cannot be reached, or when every send slot is in use, the
// backlog is full and the MAD is not an answer (qp1Answer).
func (q *QP1) SendMAD(dst [16]byte, mad []byte) error {
	if len(mad) != qp1MADLen {
		q.Counters.SendDropped.Add(1)
		return fmt.Errorf("dataplane: a MAD is %d bytes, not %d", qp1MADLen, len(mad))
	}
	ah, err := q.ah(netip.AddrFrom16(dst))
	if err != nil {
		q.Counters.SendDropped.Add(1)
		return err
	}
	q.mu.Lock()
	if !q.closed && len(q.free) == 0 && (len(q.pending) < qp1MaxPending || qp1Answer(mad)) {
		// Sent when a send completes and frees a slot (qp1SendSink).
		if len(q.pending) >= qp1MaxPending {
			q.Counters.Overflow.Add(1)
		}
		q.pending = append(q.pending, qp1Pending{ah: ah, mad: [qp1MADLen]byte(mad)})
		q.mu.Unlock()
		return nil
	}
	if q.closed || len(q.free) == 0 {
		q.mu.Unlock()
		q.Counters.SendDropped.Add(1)
		if q.closed {
			return engine.ErrClosed
		}
		return ErrQP1Busy
	}
	s := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	copy(q.arena[s*qp1MADLen:(s+1)*qp1MADLen], mad)
	q.sendTo[s] = ah
	q.sendQ = append(q.sendQ, s)
	q.mu.Unlock()
	q.Counters.Sent.Add(1)
	q.eng.Kick(qp1QPN)
	return nil
}

// qp1Answer reports whether mad is a CM message (management class 0x07)
// the CM sends once and never repeats by itself: MRA, REJ, RTU, DREP or
// SIDR_REP (attribute IDs 0x11, 0x12, 0x14, 0x16, 0x18, bytes 16-17 of
// the MAD header). QP1 never drops one for want of room (see QP1).
func qp1Answer(mad []byte) bool {
	if mad[1] != 0x07 {
		return false
	}
	switch uint16(mad[16])<<8 | uint16(mad[17]) {
	case 0x0011, 0x0012, 0x0014, 0x0016, 0x0018:
		return true
	}
	return false
}

// ah returns the handle of QP1's address handle to dst, building it.
func (q *QP1) ah(dst netip.Addr) (uint32, error) {
	dst = dst.Unmap()
	q.mu.Lock()
	h, ok := q.ahByGID[dst]
	q.mu.Unlock()
	if ok {
		return h, nil
	}
	if q.resolve != nil {
		if err := q.resolve("QP1", dst); err != nil {
			return 0, err
		}
	}
	local := q.local.Unmap()
	if local.Is4() != dst.Is4() {
		return 0, fmt.Errorf("dataplane: QP1 cannot reach %v from %v", dst, local)
	}
	a, err := q.eng.NewAH(engine.AHAttr{PD: qp1PD, Local: local, Remote: dst})
	if err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if h, ok := q.ahByGID[dst]; ok {
		return h, nil
	}
	if len(q.ahByGID) >= qp1MaxAHs {
		// Start over. Handles are never reused: a slot still naming
		// an old one fails (the CM retransmits).
		for _, old := range q.ahByGID {
			q.ahs.Delete(old)
		}
		clear(q.ahByGID)
	}
	q.nextAH++
	h = q.nextAH
	q.ahByGID[dst] = h
	q.ahs.Set(h, a)
	return h, nil
}

// grhSource returns the source GID of the GRH a UD receive starts with:
// over IPv4, 20 zero bytes and the IPv4 header (as rdma-core tells them
// apart); else the IPv6 header.
func grhSource(grh []byte) ([16]byte, bool) {
	if grh[20]>>4 == 4 && isZero(grh[:20]) {
		var a [4]byte
		copy(a[:], grh[20+12:20+16])
		return netip.AddrFrom4(a).As16(), true
	}
	if grh[0]>>4 == 6 {
		var a [16]byte
		copy(a[:], grh[8:24])
		return a, true
	}
	return [16]byte{}, false
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// qp1Source is QP1's send queue (engine.SendSource).
type qp1Source QP1

func (s *qp1Source) PollSend(w *engine.SendWork) (bool, error) {
	q := (*QP1)(s)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.sendQ) == 0 {
		return false, nil
	}
	slot := q.sendQ[0]
	q.sendQ = q.sendQ[1:]
	w.SendWQE = abi.SendWQE{WrID: uint64(slot), Opcode: abi.WRSend, Flags: abi.SendSignaled, NumSGE: 1,
		RemoteQPN: qp1QPN, RemoteQKey: qp1QKey, AHHandle: q.sendTo[slot]}
	w.SGEs = append(w.SGEs[:0], abi.SGE{Addr: uint64(slot) * qp1MADLen, Length: qp1MADLen, LKey: qp1LKey})
	w.Inline = w.Inline[:0]
	return true, nil
}

// qp1RecvSource is QP1's receive queue (engine.RecvSource).
type qp1RecvSource QP1

func (s *qp1RecvSource) PollRecv(r *engine.RecvWork) (bool, error) {
	q := (*QP1)(s)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.recvQ) == 0 {
		return false, nil
	}
	slot := q.recvQ[0]
	q.recvQ = q.recvQ[1:]
	r.WrID = qp1RecvFlag | uint64(slot)
	r.SGEs = append(r.SGEs[:0], abi.SGE{Addr: uint64(qp1RecvBase + slot*qp1RecvLen), Length: qp1RecvLen, LKey: qp1LKey})
	return true, nil
}

// qp1SendSink takes QP1's send completions: the slot is free again.
type qp1SendSink QP1

func (s *qp1SendSink) PushCQE(c *abi.CQE, _ bool) error {
	q := (*QP1)(s)
	if c.Status != abi.WCSuccess {
		q.Counters.SendErrors.Add(1)
	}
	if c.WrID&qp1RecvFlag != 0 {
		return nil
	}
	slot := uint32(c.WrID)
	q.mu.Lock()
	if len(q.pending) == 0 || q.closed {
		q.free = append(q.free, slot)
		q.mu.Unlock()
		return nil
	}
	// A MAD of the backlog takes the slot at once.
	p := &q.pending[0]
	copy(q.arena[slot*qp1MADLen:(slot+1)*qp1MADLen], p.mad[:])
	q.sendTo[slot] = p.ah
	q.sendQ = append(q.sendQ, slot)
	q.pending = q.pending[1:]
	if len(q.pending) == 0 {
		q.pending = nil
	}
	var held []uint32
	if len(q.pending) < qp1MaxPending {
		held, q.held = q.held, nil
	}
	q.mu.Unlock()
	q.Counters.Sent.Add(1)
	q.eng.Kick(qp1QPN)
	// The backlog drained below its bound: the MADs received meanwhile
	// go to their agent now (this is QP1's worker, as for a receive).
	for _, r := range held {
		q.deliver(r)
	}
	return nil
}

// qp1RecvSink takes QP1's receive completions: a received MAD goes to its
// agent (or waits in held while the send backlog is at its bound); a
// flushed or failed receive is posted again.
type qp1RecvSink QP1

func (s *qp1RecvSink) PushCQE(c *abi.CQE, _ bool) error {
	q := (*QP1)(s)
	slot := uint32(c.WrID &^ qp1RecvFlag)
	if c.Status != abi.WCSuccess || c.ByteLen != qp1RecvLen {
		if c.Status != abi.WCSuccess {
			q.Counters.RecvErrors.Add(1)
		} else {
			q.Counters.Dropped.Add(1)
		}
		q.repost(slot)
		return nil
	}
	q.mu.Lock()
	if len(q.pending) >= qp1MaxPending && !q.closed {
		// The answers to what came before wait for send slots: this
		// MAD waits for them (qp1SendSink hands it on).
		q.held = append(q.held, slot)
		q.mu.Unlock()
		return nil
	}
	q.mu.Unlock()
	q.deliver(slot)
	return nil
}

// deliver hands the MAD of receive slot slot to the agent of its
// management class, then posts the slot again (the engine takes it at its
// next pass; this runs on QP1's own worker). The agent copies what it
// keeps and never blocks.
func (q *QP1) deliver(slot uint32) {
	b := q.arena[qp1RecvBase+slot*qp1RecvLen : qp1RecvBase+(slot+1)*qp1RecvLen]
	src, ok := grhSource(b[:roce.GRHLen])
	mad := b[roce.GRHLen:]
	q.mu.Lock()
	h := q.agents[mad[1]] // base version, management class, ...
	q.mu.Unlock()
	if ok && h != nil {
		q.Counters.Received.Add(1)
		h(src, mad)
	} else {
		q.Counters.Dropped.Add(1)
	}
	q.repost(slot)
}

func (q *QP1) repost(slot uint32) {
	q.mu.Lock()
	q.recvQ = append(q.recvQ, slot)
	q.mu.Unlock()
}

// qp1State brings QP1 back when the transport moved it: to RTS from SQE
// (a send failed), through RESET from ERR.
type qp1State QP1

// TransportError: QP1 is in ERR; nobody hears of QP1's errors but the
// daemon, which brings it back as from any other move to ERR.
func (s *qp1State) TransportError(abi.EventType) { s.TransportState(abi.QPSErr) }

func (s *qp1State) TransportState(st abi.QPState) {
	q := (*QP1)(s)
	switch st {
	case abi.QPSSQE:
		_ = q.eng.ModifyQP(qp1QPN, engine.QPAttr{Mask: abi.QPAttrState, State: abi.QPSRTS})
	case abi.QPSErr:
		_ = q.eng.ModifyQP(qp1QPN, engine.QPAttr{Mask: abi.QPAttrState, State: abi.QPSReset})
		_ = q.up()
	}
}

// qp1Memory is QP1's memory: the arena, addressed by offset with lkey
// qp1LKey; QP1 has no remote access.
type qp1Memory QP1

func (m *qp1Memory) span(sges []abi.SGE, off uint64, n int) ([]byte, error) {
	// QP1 posts one SGE per WQE.
	if len(sges) != 1 || sges[0].LKey != qp1LKey {
		return nil, engine.ErrMemProtection
	}
	g := sges[0]
	if off+uint64(n) > uint64(g.Length) {
		return nil, engine.ErrMemLength
	}
	start := g.Addr + off
	if start+uint64(n) > uint64(len(m.arena)) {
		return nil, engine.ErrMemBounds
	}
	return m.arena[start : start+uint64(n)], nil
}

func (m *qp1Memory) GatherTo(sges []abi.SGE, off uint64, n int, s engine.Sink) error {
	b, err := m.span(sges, off, n)
	if err == nil {
		s.Put(b)
	}
	return err
}

func (m *qp1Memory) Scatter(sges []abi.SGE, off uint64, src []byte) error {
	b, err := m.span(sges, off, len(src))
	if err == nil {
		copy(b, src)
	}
	return err
}

func (*qp1Memory) WriteRemote(uint32, uint64, []byte) error { return engine.ErrMemProtection }
func (*qp1Memory) ReadRemoteTo(uint32, uint64, int, engine.Sink) error {
	return engine.ErrMemProtection
}
func (*qp1Memory) CheckRemote(uint32, uint64, uint64, uint32) error {
	return engine.ErrMemProtection
}
func (*qp1Memory) Atomic(uint32, uint64, bool, uint64, uint64) (uint64, error) {
	return 0, engine.ErrMemProtection
}
func (*qp1Memory) AtomicWrite(uint32, uint64, uint64) error { return engine.ErrMemProtection }
func (*qp1Memory) Flush(uint32, uint64, uint64, bool, uint32) error {
	return engine.ErrMemProtection
}
func (*qp1Memory) Invalidate(uint32) error { return engine.ErrMemProtection }
func (*qp1Memory) BindMW(abi.BindMW) error { return engine.ErrMemProtection }

var (
	_ engine.SendSource     = (*qp1Source)(nil)
	_ engine.RecvSource     = (*qp1RecvSource)(nil)
	_ engine.CompletionSink = (*qp1SendSink)(nil)
	_ engine.CompletionSink = (*qp1RecvSink)(nil)
	_ engine.StateObserver  = (*qp1State)(nil)
	_ engine.Memory         = (*qp1Memory)(nil)
)
