package cm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	mrand "math/rand/v2"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Sender carries MADs to QP1 of a peer port. The daemon implements it
// with its QP1: one UD SEND to destination QP 1 with Q_Key QP1QKey and
// P_Key DefaultPKey, addressed (GRH / IP header) to the GID dst. It may
// drop the MAD (the Manager retransmits); it must not block for long.
// It is called from the Manager's owner goroutine and may call back into
// the Manager.
type Sender interface {
	SendMAD(dst GID, mad []byte) error
}

// SenderFunc adapts a function to Sender.
type SenderFunc func(dst GID, mad []byte) error

// SendMAD calls f.
func (f SenderFunc) SendMAD(dst GID, mad []byte) error { return f(dst, mad) }

// Config configures a Manager.
type Config struct {
	// CAGUID is the local CA (node) GUID, sent in REQ and REP and used
	// by peers to tell CMs apart.
	CAGUID uint64
	// AckDelay is the local CA ACK delay exponent (ibv_device_attr
	// local_ca_ack_delay; Linux rxe reports RXEAckDelay = 15). It goes
	// into the REP's target ACK delay and the ACK timeouts.
	AckDelay uint8
	// Sender carries the MADs. Required.
	Sender Sender
	// Clock drives the timers; nil means SystemClock.
	Clock Clock
	// Handler receives the events, in order, on the owner's goroutine,
	// after the call that caused them has done its work (it may call
	// the Manager). It must not block: nothing else of the CM runs
	// meanwhile.
	Handler func(Event)
	// PortMTU is the port's active MTU (ibv_port_attr active_mtu, as the
	// link gives it): a REQ offers at most it, and the passive side's QP
	// uses at most it whatever the REQ offers. 0: no limit.
	PortMTU roce.MTU
	// MaxRdAtomic and MaxInitRdAtomic are the device's max_qp_rd_atom
	// (responder resources) and max_qp_init_rd_atom (initiator depth):
	// QPAttr programs at most these, whatever the peer's REQ or REP
	// offers, as librdmacm clamps what a peer offers to its device
	// instead of refusing it. 0: no limit.
	MaxRdAtomic, MaxInitRdAtomic uint8
	// Seed makes the communication IDs, transaction IDs and the passive
	// side's receive PSNs reproducible (tests); 0 seeds them from the OS
	// random source.
	Seed uint64
	// MaxHalfOpen bounds the half-open connections of the Manager, all
	// listeners together (halfopen.go); 0 means DefaultMaxHalfOpen.
	MaxHalfOpen int
	// MaxHalfOpenTime bounds how long a connection stays half open;
	// 0 means DefaultMaxHalfOpenTime.
	MaxHalfOpenTime time.Duration
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// ECE are the ECE options (abi.ECEOptions bits, ece.go) this CM
	// offers in REQs and takes from them, with vrnic's vendor ID; 0:
	// none, and no REQ or REP carries ECE (vrnicd -ece=false).
	ECE uint32
}

// PathParams is the primary path of a connection as the active side
// resolved it (an rdma_cm route: see RoCEPath).
type PathParams struct {
	SGID, DGID     GID
	FlowLabel      uint32 // 20 bits
	TrafficClass   uint8
	HopLimit       uint8
	SL             uint8 // 4 bits
	PKey           uint16
	MTU            roce.MTU
	Rate           uint8 // enum ib_rate, 6 bits
	PacketLifeTime uint8 // 4.096 µs × 2^t
}

// ConnectParams are what Connect puts into the REQ (struct
// ib_cm_req_param).
type ConnectParams struct {
	// Path is the primary path; the REQ goes to Path.DGID.
	Path      PathParams
	ServiceID uint64
	// QPN is the local QP's number; QPType TransportRC or TransportUC.
	QPN    uint32
	QPType TransportType
	// StartingPSN is the PSN this side expects to receive first: its
	// QP's RQ PSN (QPAttr RTR) and the peer's SQ PSN, as in Linux's
	// ib_cm_req_param (ib_send_cm_req keeps it as rq_psn; rdma_cm fills
	// it from the ID's random seq_num).
	StartingPSN        uint32
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	RetryCount         uint8 // 0..7
	RNRRetryCount      uint8 // 0..7
	// RemoteCMResponseTimeout and LocalCMResponseTimeout (exponents,
	// rdma_cm uses CMAResponseTimeout = 20), MaxCMRetries (0..15,
	// rdma_cm uses CMAMaxCMRetries).
	RemoteCMResponseTimeout uint8
	LocalCMResponseTimeout  uint8
	MaxCMRetries            uint8
	SRQ                     bool
	// PrivateData: at most REQPrivateDataLen bytes (rdma_cm: a cma_hdr
	// then the consumer's bytes, see CMAPrivateData).
	PrivateData []byte
	// ECE are the ECE options the REQ offers with vrnic's vendor ID
	// (ece.go), at most Config.ECE; an RC REQ only. None: the REQ
	// carries no ECE.
	ECE uint32
}

// AcceptParams are what Accept puts into the REP (struct
// ib_cm_rep_param).
type AcceptParams struct {
	QPN uint32
	// StartingPSN is the PSN this side expects to receive first: its
	// QP's RQ PSN, the one QPAttr(RTR) gave (ib_send_cm_rep keeps it as
	// rq_psn; rdma_cm's cma_accept_ib sends the ID's seq_num, which
	// rdma_init_qp_attr put in the RTR attributes). The peer sends from
	// it.
	StartingPSN        uint32
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	RNRRetryCount      uint8 // 0..7
	SRQ                bool
	FailoverAccepted   uint8 // 0..3; 0 (accepted) as rdma_cm sends
	PrivateData        []byte
	// ECE are the ECE options this side's QP took (ece.go): the REP
	// answers with those of the REQ's this CM supports among them, or
	// without ECE when none is left.
	ECE uint32
}

// SIDRParams are what SIDRRequest puts into the SIDR_REQ.
type SIDRParams struct {
	// Peer is the GID the SIDR_REQ goes to.
	Peer      GID
	ServiceID uint64
	PKey      uint16
	// Timeout per attempt (rdma_cm: CMASIDRTimeoutMS) and MaxRetries
	// (rdma_cm: CMAMaxCMRetries).
	Timeout     time.Duration
	MaxRetries  uint8
	PrivateData []byte
}

// SIDRReplyParams are what SIDRReply puts into the SIDR_REP.
type SIDRReplyParams struct {
	Status      SIDRStatus
	QPN         uint32
	QKey        uint32
	Info        []byte // additional information, at most ARILen bytes
	PrivateData []byte
	VendorID    uint32
}

// Stats counts MADs by attribute (index: AttrID - AttrREQ, for REQ to
// SIDR_REP).
type Stats struct {
	Sent       [9]uint64 // first transmissions and answers
	Retries    [9]uint64 // retransmissions after a timeout
	Received   [9]uint64 // decoded
	Duplicates [9]uint64 // received and recognised as repeats
	// Invalid counts MADs Decode refused, Unsupported those with an
	// attribute this package does not implement (LAP, APR, ...), and
	// Unmatched messages that named no connection or came in a state
	// that ignores them.
	Invalid, Unsupported, Unmatched uint64
	// SendErrors counts Sender failures.
	SendErrors uint64
	// HalfOpen is the number of half-open connections now; Shed counts
	// those dropped to admit a newer request, Expired those dropped at
	// their deadline (halfopen.go).
	HalfOpen      int
	Shed, Expired uint64
	// RejectsSent and RejectsReceived count REJs by reason (a reason
	// the IBTA does not define counts under RejectReason(0), which it
	// does not define either, so that a peer cannot grow the map).
	RejectsSent, RejectsReceived map[RejectReason]uint64
}

// countREJ counts a REJ of reason r in into (made on first use).
func countREJ(into *map[RejectReason]uint64, r RejectReason) {
	if *into == nil {
		*into = map[RejectReason]uint64{}
	}
	if _, ok := rejectNames[r]; !ok {
		r = 0
	}
	(*into)[r]++
}

func attrIndex(a AttrID) int {
	if a >= AttrREQ && a <= AttrSIDRREP {
		return int(a - AttrREQ)
	}
	return -1
}

// remoteKey names a peer's connection: its communication ID and CA GUID
// (the key of Linux's remote_id table), and the GID its MADs come from:
// a MAD from another address never matches the connection.
type remoteKey struct {
	id   uint32
	guid uint64
	gid  GID
}

// qpKey names a peer's QP: its number, CA GUID (the key of Linux's
// remote_qp table, for stale connection detection) and GID, as remoteKey.
type qpKey struct {
	qpn  uint32
	guid uint64
	gid  GID
}

type sidrKey struct {
	id  uint32
	gid GID
}

type listener struct {
	serviceID, mask uint64
	// backlog bounds the listener's half-open connections, ho.
	backlog int
	ho      halfOpen
}

// action is queued work done after the lock is released: a MAD to send
// or an event to report.
type action struct {
	dst   GID
	mad   []byte
	attr  AttrID
	retry bool
	ev    *Event
}

// Manager runs the CM for one port: it owns the connections by local
// communication ID, demultiplexes received MADs, retransmits, answers
// duplicates, and reports what the owner must do. It never changes a QP:
// the owner does, with the attributes QPAttr returns.
//
// Concurrency: none. A Manager belongs to one goroutine (its owner: the
// Service's, or a test's), which makes every call, feeds it every MAD
// and runs its timers: the Clock's callbacks must reach that goroutine
// (Service does it through its inbox; FakeClock.Advance runs them in the
// caller's goroutine). MADs to send and events to report are queued while
// a call works and handed to the Sender and the Handler when it ends, in
// the order they were queued.
type Manager struct {
	cfg   Config
	clock Clock
	log   *slog.Logger

	closed     bool
	conns      map[uint32]*conn
	byRemote   map[remoteKey]*conn
	byRemoteQP map[qpKey]*conn
	sidr       map[sidrKey]*conn
	listeners  []*listener
	twQPN      map[uint32]int // local QPNs in TimeWait (count of connections)
	rng        *mrand.Rand    // comm IDs, transaction IDs (allocID, formTID), the passive side's receive PSNs
	stats      Stats
	queue      []action
	draining   bool

	// ho: every half-open connection (halfopen.go), at most
	// maxHalfOpen, none older than maxHalfOpenTime.
	ho              halfOpen
	maxHalfOpen     int
	maxHalfOpenTime time.Duration
}

// NewManager returns a Manager for cfg.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Sender == nil {
		return nil, fmt.Errorf("%w: Config.Sender is required", ErrInvalidParam)
	}
	if cfg.AckDelay > 31 {
		return nil, fmt.Errorf("%w: AckDelay %d", ErrInvalidParam, cfg.AckDelay)
	}
	if cfg.PortMTU != 0 && !cfg.PortMTU.Valid() {
		return nil, fmt.Errorf("%w: PortMTU code %d", ErrInvalidParam, cfg.PortMTU)
	}
	m := &Manager{
		cfg: cfg, clock: cfg.Clock, log: cfg.Logger,
		conns: map[uint32]*conn{}, byRemote: map[remoteKey]*conn{},
		byRemoteQP: map[qpKey]*conn{}, sidr: map[sidrKey]*conn{}, twQPN: map[uint32]int{},
	}
	if m.clock == nil {
		m.clock = SystemClock{}
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.maxHalfOpen = cfg.MaxHalfOpen; m.maxHalfOpen <= 0 {
		m.maxHalfOpen = DefaultMaxHalfOpen
	}
	if m.maxHalfOpenTime = cfg.MaxHalfOpenTime; m.maxHalfOpenTime <= 0 {
		m.maxHalfOpenTime = DefaultMaxHalfOpenTime
	}
	// Linux allocates comm IDs cyclically under a random XOR operand
	// (cm_alloc_id_priv), so two IDs allocated one after the other
	// differ in a few low bits, and an off-path host that got one (by
	// connecting) guesses its neighbours. Here every ID is drawn at
	// random: knowing any number of them tells nothing of the others.
	var seed [32]byte
	if cfg.Seed != 0 {
		binary.LittleEndian.PutUint64(seed[:], cfg.Seed)
	} else if _, err := rand.Read(seed[:]); err != nil {
		return nil, err
	}
	m.rng = mrand.New(mrand.NewChaCha8(seed))
	return m, nil
}

// Close stops every timer and refuses further calls; no event is reported
// after it returns.
func (m *Manager) Close() {
	if m.closed {
		return
	}
	m.closed = true
	for _, c := range m.conns {
		m.stopTimers(c)
	}
	m.queue = nil
}

// lock starts a call; it fails after Close.
func (m *Manager) lock() error {
	if m.closed {
		return ErrClosed
	}
	return nil
}

// unlock ends a call: unless an outer call is already at it (a Handler
// that called back), it performs the queued sends and event reports, in
// order, including those that the Handler's calls queue meanwhile.
func (m *Manager) unlock() {
	if m.draining {
		return
	}
	m.draining = true
	for len(m.queue) > 0 && !m.closed {
		q := m.queue
		m.queue = nil
		for i := range q {
			m.perform(&q[i])
		}
	}
	m.draining = false
}

func (m *Manager) perform(a *action) {
	if a.ev != nil {
		if m.cfg.Handler != nil {
			m.cfg.Handler(*a.ev)
		}
		return
	}
	err := m.cfg.Sender.SendMAD(a.dst, a.mad)
	if err != nil {
		m.stats.SendErrors++
		// Counted, logged at debug level only: a flood would make
		// this a line per MAD (the CM repeats what it must).
		m.log.Debug("cm: send failed", "attr", a.attr, "dst", a.dst, "err", err)
	}
}

// Stats returns the counters.
func (m *Manager) Stats() Stats {
	s := m.stats
	s.HalfOpen = m.ho.len()
	s.RejectsSent, s.RejectsReceived = maps.Clone(s.RejectsSent), maps.Clone(s.RejectsReceived)
	return s
}

// emit queues an event for c.
func (m *Manager) emit(c *conn, ev Event) {
	if c != nil {
		if c.destroyed {
			return
		}
		ev.Conn = ConnID(c.id)
		ev.Peer = c.peer
		ev.ServiceID = c.serviceID
	}
	m.queue = append(m.queue, action{ev: &ev})
}

// sendMAD queues mad for dst.
func (m *Manager) sendMAD(dst GID, mad []byte, retry bool) {
	attr := AttrID(binary.BigEndian.Uint16(mad[16:]))
	if i := attrIndex(attr); i >= 0 {
		if retry {
			m.stats.Retries[i]++
		} else {
			m.stats.Sent[i]++
		}
	}
	m.queue = append(m.queue, action{dst: dst, mad: mad, attr: attr, retry: retry})
}

// send encodes msg and queues it for dst; it returns the MAD.
func (m *Manager) send(dst GID, tid uint64, msg Message) []byte { return m.sendMod(dst, tid, 0, msg) }

// sendMod is send with the MAD header's attribute modifier attrMod (a
// REQ's or REP's ECE options).
func (m *Manager) sendMod(dst GID, tid uint64, attrMod uint32, msg Message) []byte {
	if rej, ok := msg.(*REJ); ok {
		countREJ(&m.stats.RejectsSent, rej.Reason)
	}
	mad, err := Marshal(tid, attrMod, msg)
	if err != nil {
		// The API checks every value before it builds a message, so
		// this is a bug; it is logged, not fatal.
		m.log.Error("cm: cannot encode", "attr", msg.Attr(), "err", err)
		return nil
	}
	m.sendMAD(dst, mad, false)
	return mad
}

// allocID returns a random nonzero local communication ID that no
// connection holds, TimeWait included (a connection keeps its ID in
// m.conns until TimeWait ends).
func (m *Manager) allocID() uint32 {
	for {
		if id := uint32(m.rng.Uint64()); id != 0 && m.conns[id] == nil {
			return id
		}
	}
}

// formTID returns a new transaction ID for a request sent by c: a random
// high word and the local comm ID (Linux cm_form_tid puts the MAD
// agent's number, a small counter, in the high word).
func (m *Manager) formTID(c *conn) uint64 { return m.rng.Uint64()<<32 | uint64(c.id) }

// withConn runs f on connection id under the lock, then performs what f
// queued.
func (m *Manager) withConn(id ConnID, f func(c *conn) error) error {
	if err := m.lock(); err != nil {
		return err
	}
	defer m.unlock()
	c, err := m.get(id)
	if err != nil {
		return err
	}
	return f(c)
}

func (m *Manager) get(id ConnID) (*conn, error) {
	c := m.conns[uint32(id)]
	if c == nil || c.destroyed {
		return nil, fmt.Errorf("%w: %d", ErrUnknownConn, id)
	}
	return c, nil
}

// State returns the state of a connection.
func (m *Manager) State(id ConnID) (State, error) {
	c := m.conns[uint32(id)]
	if c == nil {
		return StateIdle, fmt.Errorf("%w: %d", ErrUnknownConn, id)
	}
	return c.state, nil
}

// QPNInTimeWait reports whether a connection in TimeWait still holds the
// local QPN qpn: the owner must not give that number to a new QP yet.
func (m *Manager) QPNInTimeWait(qpn uint32) bool {
	return m.twQPN[qpn] > 0
}

// Listen makes REQs and SIDR_REQs whose service ID matches serviceID
// under mask (0 means all bits) raise EventConnectRequest and
// EventSIDRRequest instead of a reject. The listener holds at most
// DefaultBacklog half-open connections (see ListenBacklog).
func (m *Manager) Listen(serviceID, mask uint64) error {
	return m.ListenBacklog(serviceID, mask, DefaultBacklog)
}

// ListenBacklog is Listen with a bound on the listener's half-open
// connections (halfopen.go): a request that finds backlog of them sheds
// the oldest (REP sent and no RTU first, then unanswered) and is
// admitted. backlog ≤ 0 means DefaultBacklog.
func (m *Manager) ListenBacklog(serviceID, mask uint64, backlog int) error {
	if mask == 0 {
		mask = ^uint64(0)
	}
	if backlog <= 0 {
		backlog = DefaultBacklog
	}
	if err := m.lock(); err != nil {
		return err
	}
	defer m.unlock()
	for _, l := range m.listeners {
		if l.mask&serviceID == mask&l.serviceID {
			return fmt.Errorf("%w: %#x", ErrListening, serviceID)
		}
	}
	m.listeners = append(m.listeners, &listener{serviceID: serviceID & mask, mask: mask, backlog: backlog})
	return nil
}

// Unlisten removes the listener Listen(serviceID, mask) added.
func (m *Manager) Unlisten(serviceID, mask uint64) error {
	if mask == 0 {
		mask = ^uint64(0)
	}
	if err := m.lock(); err != nil {
		return err
	}
	defer m.unlock()
	for i, l := range m.listeners {
		if l.serviceID == serviceID&mask && l.mask == mask {
			m.listeners = append(m.listeners[:i], m.listeners[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("%w: no listener on %#x", ErrInvalidParam, serviceID)
}

// listenerFor returns the listener of serviceID, nil if none.
func (m *Manager) listenerFor(serviceID uint64) *listener {
	for _, l := range m.listeners {
		if serviceID&l.mask == l.serviceID {
			return l
		}
	}
	return nil
}

func checkBits(name string, v uint64, width int) error {
	if v>>width != 0 {
		return fmt.Errorf("%w: %s %d does not fit %d bits", ErrInvalidParam, name, v, width)
	}
	return nil
}

func checkAll(errs ...error) error { return errors.Join(errs...) }

// portMTU returns mtu, at most Config.PortMTU.
func (m *Manager) portMTU(mtu roce.MTU) roce.MTU {
	if m.cfg.PortMTU != 0 && mtu > m.cfg.PortMTU {
		return m.cfg.PortMTU
	}
	return mtu
}

// randPSN draws a 24-bit PSN (mu held), as rdma_cm draws an ID's seq_num
// (__rdma_create_id: get_random_bytes, masked to 24 bits).
func (m *Manager) randPSN() uint32 { return m.rng.Uint32() & roce.PSNMask }

func checkPrivate(pd []byte, max int) error {
	if len(pd) > max {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrPrivateDataLen, len(pd), max)
	}
	return nil
}

// Connect sends a REQ and returns the new connection, in REQ_SENT. The
// REQ is formatted as Linux cm_format_req does: permissive LIDs and
// subnet local 0 when the hop limit exceeds 1 (RoCE v2), the local ACK
// timeout from Config.AckDelay and the path's packet life time. Its path
// MTU is the smaller of the path's and Config.PortMTU (rdma_cm's route
// carries the net device's MTU, iboe_get_mtu). Its Starting PSN is
// p.StartingPSN, the PSN this side expects to receive (Linux
// ib_send_cm_req keeps it as the RQ PSN).
func (m *Manager) Connect(p ConnectParams) (ConnID, error) {
	pa := &p.Path
	err := checkAll(
		checkBits("QPN", uint64(p.QPN), 24), checkBits("StartingPSN", uint64(p.StartingPSN), 24),
		checkBits("RetryCount", uint64(p.RetryCount), 3), checkBits("RNRRetryCount", uint64(p.RNRRetryCount), 3),
		checkBits("RemoteCMResponseTimeout", uint64(p.RemoteCMResponseTimeout), 5),
		checkBits("LocalCMResponseTimeout", uint64(p.LocalCMResponseTimeout), 5),
		checkBits("MaxCMRetries", uint64(p.MaxCMRetries), 4),
		checkBits("FlowLabel", uint64(pa.FlowLabel), 20), checkBits("SL", uint64(pa.SL), 4),
		checkBits("Rate", uint64(pa.Rate), 6), checkBits("PacketLifeTime", uint64(pa.PacketLifeTime), 5),
		checkPrivate(p.PrivateData, REQPrivateDataLen),
	)
	if err != nil {
		return 0, err
	}
	if p.QPType != TransportRC && p.QPType != TransportUC {
		return 0, fmt.Errorf("%w: QP type %v", ErrInvalidParam, p.QPType)
	}
	if !pa.MTU.Valid() {
		return 0, fmt.Errorf("%w: MTU code %d", ErrInvalidParam, pa.MTU)
	}
	mtu := m.portMTU(pa.MTU)
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.unlock()
	if m.twQPN[p.QPN] > 0 {
		return 0, fmt.Errorf("%w: %#x", ErrQPNInTimeWait, p.QPN)
	}
	c := &conn{
		id: m.allocID(), state: StateREQSent, active: true, peer: pa.DGID,
		serviceID: p.ServiceID, qpType: p.QPType, localQPN: p.QPN,
		rqPSN: p.StartingPSN, pathMTU: mtu, pkey: pa.PKey,
		responderResources: p.ResponderResources, initiatorDepth: p.InitiatorDepth,
		retryCount: p.RetryCount, rnrRetryCount: p.RNRRetryCount,
		path: *pa, ackTimeout: pa.PacketLifeTime + 1, maxRetries: p.MaxCMRetries,
		timeout: reqTimeout(pa.PacketLifeTime, p.RemoteCMResponseTimeout),
	}
	c.tid = m.formTID(c)
	if p.QPType == TransportRC {
		c.eceOffer = p.ECE & m.cfg.ECE & abi.ECEOptions
	}
	req := &REQ{
		LocalCommID: c.id, ServiceID: p.ServiceID, LocalCAGUID: m.cfg.CAGUID,
		LocalQPN: p.QPN, ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RemoteCMResponseTimeout: p.RemoteCMResponseTimeout, TransportServiceType: p.QPType,
		EndToEndFlowControl: p.FlowControl, StartingPSN: p.StartingPSN,
		LocalCMResponseTimeout: p.LocalCMResponseTimeout, RetryCount: p.RetryCount,
		PKey: pa.PKey, PathMTU: mtu, RNRRetryCount: p.RNRRetryCount,
		MaxCMRetries: p.MaxCMRetries, SRQ: p.SRQ,
		Primary: Path{
			LocalGID: pa.SGID, RemoteGID: pa.DGID, FlowLabel: pa.FlowLabel, PacketRate: pa.Rate,
			TrafficClass: pa.TrafficClass, HopLimit: pa.HopLimit, SL: pa.SL,
			SubnetLocal: pa.HopLimit <= 1, LocalACKTimeout: AckTimeout(m.cfg.AckDelay, pa.PacketLifeTime),
		},
	}
	if pa.HopLimit > 1 {
		// Routed (every RoCE v2 path): the remote LID is unknown, so
		// Linux sends the permissive LID both ways.
		req.Primary.LocalLID, req.Primary.RemoteLID = PermissiveLID, PermissiveLID
	}
	copy(req.PrivateData[:], p.PrivateData)
	if c.eceOffer != 0 {
		req.VendorID = abi.ECEVendorID
	}
	c.path.MTU = mtu
	m.conns[c.id] = c
	m.startOut(c, m.sendMod(c.peer, c.tid, c.eceOffer, req), c.timeout)
	m.log.Debug("cm: REQ sent", "conn", c.id, "service", p.ServiceID, "peer", c.peer)
	return ConnID(c.id), nil
}

// Accept sends the REP answering a connect request (REQ_RCVD or
// MRA_REQ_SENT → REP_SENT). Move the QP to RTR and RTS first, with
// QPAttr, as rdma_accept does, and pass the RQ PSN of the RTR attributes
// as p.StartingPSN: the REP announces the PSN this side expects to
// receive (Linux ib_send_cm_rep keeps the REP's Starting PSN as rq_psn).
func (m *Manager) Accept(id ConnID, p AcceptParams) error {
	err := checkAll(
		checkBits("QPN", uint64(p.QPN), 24), checkBits("StartingPSN", uint64(p.StartingPSN), 24),
		checkBits("RNRRetryCount", uint64(p.RNRRetryCount), 3), checkBits("FailoverAccepted", uint64(p.FailoverAccepted), 2),
		checkPrivate(p.PrivateData, REPPrivateDataLen),
	)
	if err != nil {
		return err
	}
	return m.withConn(id, func(c *conn) error {
		if c.state != StateREQRcvd && c.state != StateMRAREQSent {
			return fmt.Errorf("%w: Accept in %v", ErrState, c.state)
		}
		if m.twQPN[p.QPN] > 0 {
			return fmt.Errorf("%w: %#x", ErrQPNInTimeWait, p.QPN)
		}
		// The options agreed: those of the REQ this CM supports that the
		// QP took. None: the REP carries no ECE (ece.go).
		c.ece &= p.ECE
		rep := &REP{
			LocalCommID: c.id, RemoteCommID: c.remoteID, LocalQPN: p.QPN,
			StartingPSN: p.StartingPSN, ResponderResources: p.ResponderResources,
			InitiatorDepth: p.InitiatorDepth, TargetACKDelay: m.cfg.AckDelay,
			FailoverAccepted: p.FailoverAccepted, EndToEndFlowControl: p.FlowControl,
			RNRRetryCount: p.RNRRetryCount, SRQ: p.SRQ, LocalCAGUID: m.cfg.CAGUID,
		}
		copy(rep.PrivateData[:], p.PrivateData)
		if c.ece != 0 {
			rep.VendorID = abi.ECEVendorID
		}
		c.state = StateREPSent
		c.localQPN = p.QPN
		c.rqPSN = p.StartingPSN
		c.initiatorDepth = p.InitiatorDepth
		c.responderResources = p.ResponderResources
		m.startOut(c, m.sendMod(c.peer, c.tid, c.ece, rep), c.timeout)
		m.hoUpdate(c)
		return nil
	})
}

// Reject sends a REJ. From REQ_SENT, MRA_REQ_RCVD, REQ_RCVD, MRA_REQ_SENT,
// REP_RCVD and MRA_REP_SENT the connection is then forgotten; from
// REP_SENT and MRA_REP_RCVD it enters TimeWait (Linux ib_send_cm_rej).
// ari is the additional reject information (at most ARILen bytes).
func (m *Manager) Reject(id ConnID, reason RejectReason, ari, privateData []byte) error {
	if err := checkAll(checkPrivate(privateData, REJPrivateDataLen), checkPrivate(ari, ARILen)); err != nil {
		return err
	}
	if reason == 0 {
		return fmt.Errorf("%w: reject reason 0", ErrInvalidParam)
	}
	return m.withConn(id, func(c *conn) error { return m.reject(c, reason, ari, privateData) })
}

func (m *Manager) reject(c *conn, reason RejectReason, ari, privateData []byte) error {
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent:
		m.sendREJ(c, reason, ari, privateData)
		m.toIdle(c)
	case StateREPSent, StateMRAREPRcvd:
		m.sendREJ(c, reason, ari, privateData)
		m.enterTimeWait(c)
	default:
		return fmt.Errorf("%w: Reject in %v", ErrState, c.state)
	}
	return nil
}

// sendREJ formats a REJ as Linux cm_format_rej does: before this side has
// answered a REQ its local comm ID is not yet known to the peer (0), and
// the rejected message follows the state.
func (m *Manager) sendREJ(c *conn, reason RejectReason, ari, privateData []byte) {
	rej := &REJ{LocalCommID: c.id, RemoteCommID: c.remoteID, Reason: reason, MessageRejected: MsgOther}
	switch c.state {
	case StateREQRcvd:
		rej.LocalCommID = 0
		rej.MessageRejected = MsgREQ
	case StateMRAREQSent:
		rej.MessageRejected = MsgREQ
	case StateREPRcvd, StateMRAREPSent:
		rej.MessageRejected = MsgREP
	}
	rej.RejectInfoLen = uint8(copy(rej.ARI[:], ari))
	copy(rej.PrivateData[:], privateData)
	m.send(c.peer, c.tid, rej)
}

// MRA acknowledges the REQ (REQ_RCVD → MRA_REQ_SENT) or the REP (REP_RCVD
// → MRA_REP_SENT) and asks the peer to wait 4.096 µs × 2^serviceTimeout
// more for the answer. With delayed, nothing is sent now: the MRA only
// answers a repeated REQ or REP, as rdma_cm does for a connect request it
// has not decided on (IB_CM_MRA_FLAG_DELAY).
func (m *Manager) MRA(id ConnID, serviceTimeout uint8, delayed bool, privateData []byte) error {
	if err := checkAll(checkBits("serviceTimeout", uint64(serviceTimeout), 5), checkPrivate(privateData, MRAPrivateDataLen)); err != nil {
		return err
	}
	return m.withConn(id, func(c *conn) error {
		switch c.state {
		case StateREQRcvd:
			c.state, c.mraMsg = StateMRAREQSent, MsgREQ
		case StateREPRcvd:
			c.state, c.mraMsg = StateMRAREPSent, MsgREP
		default:
			return fmt.Errorf("%w: MRA in %v", ErrState, c.state)
		}
		c.serviceTimeout = serviceTimeout
		c.privateData = append([]byte(nil), privateData...)
		if !delayed {
			m.sendMRA(c)
		}
		return nil
	})
}

func (m *Manager) sendMRA(c *conn) {
	mra := &MRA{LocalCommID: c.id, RemoteCommID: c.remoteID, MessageMRAed: c.mraMsg, ServiceTimeout: c.serviceTimeout}
	copy(mra.PrivateData[:], c.privateData)
	m.send(c.peer, c.tid, mra)
	if c.ho == hoUnanswered && !c.mraSent {
		// The active side now waits longer: so does the request.
		c.mraSent = true
		m.hoArm(c)
	}
}

// RTU sends the RTU after the REP (REP_RCVD or MRA_REP_SENT →
// ESTABLISHED) and reports EventEstablished. Move the QP to RTR and RTS
// first.
func (m *Manager) RTU(id ConnID, privateData []byte) error {
	if err := checkPrivate(privateData, RTUPrivateDataLen); err != nil {
		return err
	}
	return m.withConn(id, func(c *conn) error {
		if c.state != StateREPRcvd && c.state != StateMRAREPSent {
			return fmt.Errorf("%w: RTU in %v", ErrState, c.state)
		}
		c.privateData = append([]byte(nil), privateData...)
		m.sendRTU(c)
		c.state = StateEstablished
		m.emit(c, Event{Type: EventEstablished})
		return nil
	})
}

func (m *Manager) sendRTU(c *conn) {
	rtu := &RTU{LocalCommID: c.id, RemoteCommID: c.remoteID}
	copy(rtu.PrivateData[:], c.privateData)
	m.send(c.peer, c.tid, rtu)
}

// NotifyEstablished tells the CM that the QP received a packet before the
// RTU (the IB_EVENT_COMM_EST a passive QP raises): REP_SENT or
// MRA_REP_RCVD → ESTABLISHED, reported by EventEstablished.
func (m *Manager) NotifyEstablished(id ConnID) error {
	return m.withConn(id, func(c *conn) error {
		if c.state != StateREPSent && c.state != StateMRAREPRcvd {
			return fmt.Errorf("%w: NotifyEstablished in %v", ErrState, c.state)
		}
		m.cancelOut(c)
		c.state = StateEstablished
		m.hoUpdate(c)
		m.emit(c, Event{Type: EventEstablished})
		return nil
	})
}

// Disconnect starts or answers a disconnection, as rdma_disconnect does:
// from ESTABLISHED it sends a DREQ (→ DREQ_SENT; EventDisconnected follows
// the DREP or the timeout), from DREQ_RCVD it sends the DREP and enters
// TimeWait. Move the QP to ERROR first.
func (m *Manager) Disconnect(id ConnID, privateData []byte) error {
	if err := checkPrivate(privateData, DREQPrivateDataLen); err != nil {
		return err
	}
	return m.withConn(id, func(c *conn) error {
		switch c.state {
		case StateEstablished:
			m.sendDREQ(c, privateData)
		case StateDREQRcvd:
			if len(privateData) > DREPPrivateDataLen {
				return fmt.Errorf("%w: %d bytes for a DREP", ErrPrivateDataLen, len(privateData))
			}
			c.privateData = append([]byte(nil), privateData...)
			m.enterTimeWait(c)
			m.sendDREP(c)
		default:
			return fmt.Errorf("%w: Disconnect in %v", ErrState, c.state)
		}
		return nil
	})
}

func (m *Manager) sendDREQ(c *conn, privateData []byte) {
	dreq := &DREQ{LocalCommID: c.id, RemoteCommID: c.remoteID, RemoteQPN: c.remoteQPN}
	copy(dreq.PrivateData[:], privateData)
	c.state = StateDREQSent
	m.startOut(c, m.send(c.peer, m.formTID(c), dreq), c.timeout)
}

func (m *Manager) sendDREP(c *conn) {
	drep := &DREP{LocalCommID: c.id, RemoteCommID: c.remoteID}
	copy(drep.PrivateData[:], c.privateData)
	m.send(c.peer, c.tid, drep)
}

// Destroy ends a connection whatever its state, as Linux cm_destroy_id
// does: a pending REQ is cancelled with a REJ (timeout, with this CA's
// GUID as ARI), an undecided or unfinished handshake is rejected
// (consumer defined), an established connection gets a DREQ (sent once)
// and enters TimeWait, a received DREQ is answered, a SIDR request is
// rejected. No event is reported for the connection afterwards; it stays
// known (holding its ID and QPN) until its TimeWait ends.
func (m *Manager) Destroy(id ConnID) error {
	return m.withConn(id, func(c *conn) error {
		c.destroyed = true
		switch c.state {
		case StateREQSent, StateMRAREQRcvd:
			var guid [8]byte
			binary.BigEndian.PutUint64(guid[:], m.cfg.CAGUID)
			m.sendREJ(c, RejectTimeout, guid[:], nil)
			m.toIdle(c)
		case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent, StateREPSent, StateMRAREPRcvd:
			m.sendREJ(c, RejectConsumerDefined, nil, nil)
			m.toIdle(c)
		case StateEstablished:
			m.sendDREQ(c, nil)
			m.enterTimeWait(c)
		case StateDREQSent:
			m.enterTimeWait(c)
		case StateDREQRcvd:
			c.privateData = nil
			m.enterTimeWait(c)
			m.sendDREP(c)
		case StateSIDRREQRcvd:
			m.sendSIDRRep(c, &SIDRRep{Status: SIDRReject})
			m.toIdle(c)
		case StateSIDRREQSent:
			m.toIdle(c)
		case StateTimeWait:
		}
		return nil
	})
}

// SIDRRequest sends a SIDR_REQ and returns the request, in SIDR_REQ_SENT;
// EventSIDRReply or EventUnreachable ends it.
func (m *Manager) SIDRRequest(p SIDRParams) (ConnID, error) {
	if err := checkAll(checkBits("MaxRetries", uint64(p.MaxRetries), 4), checkPrivate(p.PrivateData, SIDRReqPrivateDataLen)); err != nil {
		return 0, err
	}
	if p.Timeout <= 0 {
		return 0, fmt.Errorf("%w: SIDR timeout %v", ErrInvalidParam, p.Timeout)
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.unlock()
	c := &conn{id: m.allocID(), state: StateSIDRREQSent, active: true, peer: p.Peer,
		serviceID: p.ServiceID, pkey: p.PKey, timeout: p.Timeout, maxRetries: p.MaxRetries}
	c.tid = m.formTID(c)
	req := &SIDRReq{RequestID: c.id, PKey: p.PKey, ServiceID: p.ServiceID}
	copy(req.PrivateData[:], p.PrivateData)
	m.conns[c.id] = c
	m.startOut(c, m.send(c.peer, c.tid, req), c.timeout)
	return ConnID(c.id), nil
}

// SIDRReply answers a SIDR request (SIDR_REQ_RCVD); the request is then
// forgotten.
func (m *Manager) SIDRReply(id ConnID, p SIDRReplyParams) error {
	err := checkAll(checkBits("QPN", uint64(p.QPN), 24), checkBits("VendorID", uint64(p.VendorID), 24),
		checkPrivate(p.Info, ARILen), checkPrivate(p.PrivateData, SIDRRepPrivateDataLen))
	if err != nil {
		return err
	}
	if p.Status > SIDRUnsupportedVersion {
		return fmt.Errorf("%w: SIDR status %d", ErrInvalidParam, p.Status)
	}
	return m.withConn(id, func(c *conn) error {
		if c.state != StateSIDRREQRcvd {
			return fmt.Errorf("%w: SIDRReply in %v", ErrState, c.state)
		}
		rep := &SIDRRep{Status: p.Status, QPN: p.QPN, QKey: p.QKey, VendorID: p.VendorID}
		rep.InfoLen = uint8(copy(rep.Info[:], p.Info))
		copy(rep.PrivateData[:], p.PrivateData)
		m.sendSIDRRep(c, rep)
		m.toIdle(c)
		return nil
	})
}

func (m *Manager) sendSIDRRep(c *conn, rep *SIDRRep) {
	rep.RequestID = c.remoteID
	rep.ServiceID = c.serviceID
	m.send(c.peer, c.tid, rep)
}
