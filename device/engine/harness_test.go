package engine

import (
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

type node struct {
	eng   *Engine
	mem   *fakeMem
	addr  netip.Addr // the QPs' GID: IPv4-mapped in ModeUDP, as the daemon's
	ports []*link.Port
}

type tqp struct {
	n        *node
	qpn      uint32
	sq       *fakeSQ
	rq       *fakeRQ
	scq, rcq *fakeCQ
	state    *stateRec
}

// stateRec is a StateObserver: the last state reported and the
// asynchronous events the moves to ERR raised, in order.
type stateRec struct {
	v   atomic.Uint32
	mu  sync.Mutex
	evs []abi.EventType
}

func (s *stateRec) TransportState(st abi.QPState) { s.v.Store(uint32(st)) }

func (s *stateRec) TransportError(ev abi.EventType) {
	s.mu.Lock()
	s.evs = append(s.evs, ev)
	s.mu.Unlock()
	s.v.Store(uint32(abi.QPSErr))
}

func (s *stateRec) load() abi.QPState { return abi.QPState(s.v.Load()) }

// events returns the events raised so far.
func (s *stateRec) events() []abi.EventType {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]abi.EventType(nil), s.evs...)
}

type qpOpts struct {
	mtu       roce.MTU
	timeout   uint8
	retry     uint8
	rnrRetry  uint8
	minRNR    uint8
	rdAtomic  uint8
	sigAll    bool
	sqDepth   int
	noConnect bool
	typ       abi.QPType // 0: RC
	ece       uint32     // ECE options in force (abi.QPAttrECE at RTR)
}

func defaultOpts() qpOpts {
	return qpOpts{mtu: roce.MTU1024, timeout: 12, retry: 7, rnrRetry: 7, minRNR: 1, rdAtomic: 4, sqDepth: 256}
}

// modes are the framings the engine runs in: whole Ethernet frames (TAP)
// and UDP payloads with the peer beside them (the UDP link); the
// in-memory link carries either.
var modes = []roce.Mode{roce.ModeEthernet, roce.ModeUDP}

func newNetwork(t testing.TB) *link.Network { return newNetworkMode(t, roce.ModeEthernet, 4096, 1024) }

// newNetworkMode: an in-memory network in mode; a small pool keeps the
// buffers in cache (benchmarks).
func newNetworkMode(t testing.TB, mode roce.Mode, buffers, queue int) *link.Network {
	nw, err := link.NewNetwork(link.Config{Mode: mode, FrameCap: DefaultFrameCap, QueueLen: queue, Buffers: buffers})
	require.NoError(t, err)
	return nw
}

// newNode attaches an engine at addr to nw, in the network's mode (in
// ModeUDP with the port's address as the links' local address).
func newNode(t testing.TB, nw *link.Network, addr string, workers int, faults *link.Faults) *node {
	return newNodeWrap(t, nw, addr, workers, faults, nil)
}

// newNodeWrap is newNode with every link wrapped by wrap (if not nil).
func newNodeWrap(t testing.TB, nw *link.Network, addr string, workers int, faults *link.Faults, wrap func(Link) Link) *node {
	return newNodeStart(t, nw, addr, workers, faults, wrap, true)
}

// newNodeStart is newNodeWrap; without start the engine's workers do not
// run, and the test drives them, a pass at a time (worker.pass).
func newNodeStart(t testing.TB, nw *link.Network, addr string, workers int, faults *link.Faults, wrap func(Link) Link, start bool) *node {
	a := netip.MustParseAddr(addr)
	ports, err := nw.Attach(a, workers, faults)
	require.NoError(t, err)
	links := make([]Link, len(ports))
	for i, p := range ports {
		links[i] = p
		if wrap != nil {
			links[i] = wrap(p)
		}
	}
	cfg := Config{Links: links, Mode: nw.Mode()}
	if nw.Mode() == roce.ModeUDP {
		cfg.Local = ports[0].LocalAddr()
		a = netip.AddrFrom16(a.As16())
	}
	eng, err := New(cfg)
	require.NoError(t, err)
	if start {
		eng.Start()
	}
	t.Cleanup(func() { _ = eng.Close() })
	return &node{eng: eng, mem: newFakeMem(), addr: a, ports: ports}
}

func (n *node) newQP(t testing.TB, qpn uint32, o qpOpts) *tqp {
	return n.newQPWith(t, qpn, o, nil)
}

// newQPWith is newQP with the engine's send source wrapped by wrap (if
// not nil).
func (n *node) newQPWith(t testing.TB, qpn uint32, o qpOpts, wrap func(SendSource) SendSource) *tqp {
	q := &tqp{n: n, qpn: qpn, sq: newFakeSQ(4096), rq: newFakeRQ(4096), scq: newFakeCQ(8192), rcq: newFakeCQ(8192),
		state: &stateRec{}}
	var sq SendSource = q.sq
	if wrap != nil {
		sq = wrap(sq)
	}
	_, err := n.eng.CreateQP(QPConfig{
		QPN: qpn, SQ: sq, RQ: q.rq, SendCQ: q.scq, RecvCQ: q.rcq, Mem: n.mem,
		SQDepth: int32(o.sqDepth), MaxSendSGE: abi.MaxSGE, MaxRecvSGE: abi.MaxSGE, MaxInline: abi.MaxInline, SigAll: o.sigAll,
		Type: o.typ, State: q.state,
	})
	require.NoError(t, err)
	return q
}

// connect brings a and b to RTS, connected to each other.
func connect(t testing.TB, a, b *tqp, o qpOpts) {
	bringUp(t, a, b, o, abi.QPSRTS)
	bringUp(t, b, a, o, abi.QPSRTS)
}

// bringUp moves l through INIT, RTR (connected to r) and RTS, stopping at
// upTo.
func bringUp(t testing.TB, l, r *tqp, o qpOpts, upTo abi.QPState) {
	require.NoError(t, l.n.eng.ModifyQP(l.qpn, QPAttr{Mask: abi.QPAttrState | abi.QPAttrAccessFlags, State: abi.QPSInit, AccessFlags: abi.AccessAll}))
	if upTo == abi.QPSInit {
		return
	}
	require.NoError(t, l.n.eng.ModifyQP(l.qpn, rtrAttr(l, r, o)))
	if upTo == abi.QPSRTR {
		return
	}
	require.NoError(t, l.n.eng.ModifyQP(l.qpn, QPAttr{
		Mask:  abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic,
		State: abi.QPSRTS, SQPSN: l.qpn * 1000 & 0xffffff, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnrRetry, MaxRdAtomic: o.rdAtomic,
	}))
}

// rtrAttr moves l from INIT to RTR, connected to r.
func rtrAttr(l, r *tqp, o qpOpts) QPAttr {
	a := QPAttr{
		Mask:  abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer,
		State: abi.QPSRTR, LocalAddr: l.n.addr, RemoteAddr: r.n.addr, PathMTU: o.mtu, DestQPN: r.qpn,
		RQPSN: r.qpn * 1000 & 0xffffff, MaxDestRdAtomic: o.rdAtomic, MinRNRTimer: o.minRNR,
	}
	if o.ece != 0 {
		a.Mask |= abi.QPAttrECE
		a.ECE = o.ece
	}
	return a
}

// pair builds two nodes with one connected QP each (Ethernet frames).
func pair(t testing.TB, workers int, fa, fb *link.Faults, o qpOpts) (*tqp, *tqp) {
	return pairOn(t, newNetwork(t), workers, fa, fb, o)
}

// pairMode is pair in mode.
func pairMode(t testing.TB, mode roce.Mode, workers int, fa, fb *link.Faults, o qpOpts) (*tqp, *tqp) {
	return pairOn(t, newNetworkMode(t, mode, 4096, 1024), workers, fa, fb, o)
}

func pairOn(t testing.TB, nw *link.Network, workers int, fa, fb *link.Faults, o qpOpts) (*tqp, *tqp) {
	na := newNode(t, nw, "10.0.0.1", workers, fa)
	nb := newNode(t, nw, "10.0.0.2", workers, fb)
	a := na.newQP(t, 0x11, o)
	b := nb.newQP(t, 0x22, o)
	if !o.noConnect {
		connect(t, a, b, o)
	}
	return a, b
}

func (q *tqp) send(t testing.TB, w abi.SendWQE, sges ...abi.SGE) {
	require.NoError(t, q.sq.post(w, sges, nil))
	q.n.eng.Kick(q.qpn)
}

func (q *tqp) recv(t testing.TB, wrid uint64, sges ...abi.SGE) {
	require.NoError(t, q.rq.post(wrid, sges...))
	q.n.eng.Kick(q.qpn)
}

// wantErrEvents waits until q is in ERR (a receive it posts now completes
// flushed, which happens only after the move to ERR and the events it
// raised) and checks the asynchronous events its move raised, in order:
// none (want empty) when a completion reported the error.
func wantErrEvents(t testing.TB, q *tqp, want ...abi.EventType) {
	t.Helper()
	n := int(q.rcq.count.Load())
	q.recv(t, 0xe77, abi.SGE{})
	require.True(t, q.rcq.wait(n+1, waitFor), "QP %#x goes to ERR", q.qpn)
	c := q.rcq.all()[n]
	require.Equal(t, [2]uint64{0xe77, uint64(abi.WCWRFlushErr)}, [2]uint64{c.WrID, uint64(c.Status)}, "QP %#x is in ERR", q.qpn)
	assert.Equal(t, want, q.state.events(), "asynchronous events of QP %#x", q.qpn)
	assert.Equal(t, abi.QPSErr, q.state.load())
}

// buffer is a registered buffer of n bytes filled with seeded random data.
type buffer struct {
	b   []byte
	va  uint64
	key uint32
}

func (n *node) buffer(size int, va uint64, access uint32, seed uint64) *buffer {
	b := make([]byte, size)
	fill(b, seed)
	return &buffer{b: b, va: va, key: n.mem.reg(b, va, access)}
}

func (b *buffer) sge(off, n int) abi.SGE {
	return abi.SGE{Addr: b.va + uint64(off), Length: uint32(n), LKey: b.key}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed+1))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func sum(b []byte) uint32 { return crc32.ChecksumIEEE(b) }

const waitFor = 60 * time.Second
