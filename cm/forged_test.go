package cm

import (
	"encoding/binary"
	"math/bits"
	mrand "math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

// Forged MADs: what an off-path host can do by sending MADs from an
// address of its own (mallory), knowing what it could guess or learn
// (here more: the victim connection's QPNs and comm IDs).

var mallory = GIDFromIP(netip.MustParseAddr("192.168.1.66"))

// forge delivers msg to nd as if src had sent it, and lets the network
// settle.
func forge(t *testing.T, n *fakeNet, src GID, nd *node, msg Message) {
	t.Helper()
	mad, err := Marshal(0xbad0000000000001, 0, msg)
	require.NoError(t, err)
	n.deliver(packet{from: src, to: nd.gid, mad: mad})
	n.run()
}

// forgedREQ is a REQ as rdma_cm sends it from src to dst for peer QP qpn
// of CA guid.
func forgedREQ(src, dst GID, id, qpn uint32, guid uint64) *REQ {
	return &REQ{
		LocalCommID: id, ServiceID: ServiceID(PortSpaceTCP, 7471), LocalCAGUID: guid, LocalQPN: qpn,
		ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: CMAResponseTimeout,
		TransportServiceType: TransportRC, StartingPSN: 77, LocalCMResponseTimeout: CMAResponseTimeout,
		RetryCount: 7, PKey: DefaultPKey, PathMTU: roce.MTU1024, RNRRetryCount: 7, MaxCMRetries: CMAMaxCMRetries,
		Primary: Path{LocalLID: PermissiveLID, RemoteLID: PermissiveLID, LocalGID: src, RemoteGID: dst,
			HopLimit: 64, LocalACKTimeout: 17},
	}
}

// capture makes n record what it carries to to (a GID no node has).
func capture(n *fakeNet, to GID) *[]Message {
	var got []Message
	n.filter = func(p packet, _ int) int {
		if p.to == to {
			if _, m, err := Decode(p.mad); err == nil {
				got = append(got, m)
			}
		}
		return 1
	}
	return &got
}

func attrs(ms []Message) []AttrID {
	var as []AttrID
	for _, m := range ms {
		as = append(as, m.Attr())
	}
	return as
}

func requireState(t *testing.T, m *Manager, id ConnID, want State) {
	t.Helper()
	st, err := m.State(id)
	require.NoError(t, err)
	require.Equal(t, want, st)
}

// TestForgedREQOtherSource: a REQ naming an established connection's
// peer QP and CA GUID, or its peer comm ID, but from another address is
// not a stale connection or a repeat: the listener takes it as a new
// request (from that address), and the connection stays up (Linux: REJ
// stale connection to the sender, DREQ to the peer).
func TestForgedREQOtherSource(t *testing.T) {
	n, a, b := pair(t, true)
	ca, cb := establish(t, n, a, b, 0x100)
	n.drain()
	got := capture(n, mallory)
	forge(t, n, mallory, b, forgedREQ(mallory, b.gid, uint32(ca), 0x100, guidA))
	assert.Equal(t, []string{"::ffff:192.168.1.66>B REQ", "B>::ffff:192.168.1.66 REP"}, n.drain(), "no REJ, no DREQ to A")
	assert.Equal(t, []AttrID{AttrREP}, attrs(*got))
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventConnectRequest}, types(evs))
	assert.Equal(t, mallory, evs[0].Peer)
	assert.NotEqual(t, cb, evs[0].Conn)
	requireState(t, b.m, cb, StateEstablished)
	requireState(t, a.m, ca, StateEstablished)
	assert.Empty(t, a.takeEvents())

	// To A, which has no listener: rejected, and A's connection stays.
	*got = nil
	forge(t, n, mallory, a, forgedREQ(mallory, a.gid, 0x77, 0x200, guidB))
	require.Equal(t, []AttrID{AttrREJ}, attrs(*got))
	assert.Equal(t, RejectInvalidServiceID, (*got)[0].(*REJ).Reason)
	requireState(t, a.m, ca, StateEstablished)
	requireState(t, b.m, cb, StateEstablished)
	assert.Empty(t, a.takeEvents())

	// From A's own address the same REQ is what Linux takes it for: a
	// stale connection (TestStaleConnection).
	n.drain()
	forge(t, n, a.gid, b, forgedREQ(a.gid, b.gid, 0x78, 0x100, guidA))
	assert.Equal(t, []string{"A>B REQ", "B>A REJ", "B>A DREQ", "A>B DREP"}, n.drain())
}

// TestForgedMessagesOtherSource: with the true comm IDs and QPNs, DREQ,
// REJ, RTU, MRA, REP and DREP from another address act on no connection
// (counted unmatched); a DREQ gets the DREP any unknown connection's
// DREQ gets, so that the answer does not tell which IDs are live.
func TestForgedMessagesOtherSource(t *testing.T) {
	n, a, b := pair(t, true)
	ca, cb := establish(t, n, a, b, 0x100)
	n.drain()
	got := capture(n, mallory)
	before := a.m.Stats().Unmatched
	for _, m := range []Message{
		&DREQ{LocalCommID: uint32(cb), RemoteCommID: uint32(ca), RemoteQPN: 0x100},
		&REJ{LocalCommID: uint32(cb), RemoteCommID: uint32(ca), Reason: RejectConsumerDefined, MessageRejected: MsgOther},
		&REP{LocalCommID: uint32(cb), RemoteCommID: uint32(ca), LocalQPN: 0x999, LocalCAGUID: guidB},
		&RTU{LocalCommID: uint32(cb), RemoteCommID: uint32(ca)},
		&MRA{LocalCommID: uint32(cb), RemoteCommID: uint32(ca), MessageMRAed: MsgREP, ServiceTimeout: 20},
		&DREP{LocalCommID: uint32(cb), RemoteCommID: uint32(ca)},
	} {
		forge(t, n, mallory, a, m)
	}
	assert.Equal(t, []AttrID{AttrDREP}, attrs(*got), "only the DREQ is answered, to the sender")
	assert.Equal(t, before+6, a.m.Stats().Unmatched)
	// And the same towards B.
	*got = nil
	for _, m := range []Message{
		&DREQ{LocalCommID: uint32(ca), RemoteCommID: uint32(cb), RemoteQPN: 0x200},
		&REJ{LocalCommID: uint32(ca), RemoteCommID: uint32(cb), Reason: RejectConsumerDefined, MessageRejected: MsgOther},
		&DREP{LocalCommID: uint32(ca), RemoteCommID: uint32(cb)},
	} {
		forge(t, n, mallory, b, m)
	}
	assert.Equal(t, []AttrID{AttrDREP}, attrs(*got))
	assert.Empty(t, a.takeEvents())
	assert.Empty(t, b.takeEvents())
	requireState(t, a.m, ca, StateEstablished)
	requireState(t, b.m, cb, StateEstablished)

	// During a handshake: a REP and a REJ from another address for A's
	// pending REQ do nothing; B's REP then establishes.
	b.auto = false
	ca2, err := a.m.Connect(connectParams(a, b, 0x101))
	require.NoError(t, err)
	n.run()
	cr := b.takeEvents()
	require.Len(t, cr, 1)
	forge(t, n, mallory, a, &REP{LocalCommID: 0x4444, RemoteCommID: uint32(ca2), LocalQPN: 0x999, LocalCAGUID: guidB})
	forge(t, n, mallory, a, &REJ{RemoteCommID: uint32(ca2), Reason: RejectConsumerDefined, MessageRejected: MsgREQ})
	forge(t, n, mallory, a, &MRA{RemoteCommID: uint32(ca2), MessageMRAed: MsgREQ, ServiceTimeout: 31})
	requireState(t, a.m, ca2, StateREQSent)
	assert.Empty(t, a.takeEvents())
	require.NoError(t, b.m.Accept(cr[0].Conn, AcceptParams{QPN: 0x201}))
	n.run()
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	// A SIDR_REP from another address for A's SIDR request: nothing.
	require.NoError(t, b.m.Listen(ServiceID(PortSpaceUDP, 7174), 0))
	n.filter = func(p packet, _ int) int {
		if p.attr() == AttrSIDRREQ {
			return 0
		}
		return 1
	}
	sid, err := a.m.SIDRRequest(SIDRParams{Peer: b.gid, ServiceID: ServiceID(PortSpaceUDP, 7174), Timeout: time.Second})
	require.NoError(t, err)
	n.run()
	forge(t, n, mallory, a, &SIDRRep{RequestID: uint32(sid), Status: SIDRSuccess, QPN: 0x666, QKey: CMAUDPQKey})
	requireState(t, a.m, sid, StateSIDRREQSent)
	assert.Empty(t, a.takeEvents())
}

// TestCommIDsRandom: comm IDs are drawn at random: consecutive ones are
// unrelated, no live one is handed out again, and two Managers seeded
// from the OS draw different ones. Transaction IDs have a random high
// word.
func TestCommIDsRandom(t *testing.T) {
	n := newNet(t)
	a := n.add("A", "192.168.1.1", guidA, true)
	m := a.m
	const count = 20000
	var ones [32]int
	prev := m.allocID()
	for range count {
		id := m.allocID()
		require.NotZero(t, id)
		d := min(id-prev, prev-id)
		require.False(t, d < 1<<10 || bits.OnesCount32(id^prev) <= 2, "consecutive IDs %#x, %#x", prev, id)
		for b := range 32 {
			ones[b] += int(id >> b & 1)
		}
		prev = id
	}
	for b, c := range ones {
		assert.InDelta(t, count/2, c, 5*71, "bit %d", b) // σ = √(20000/4) ≈ 71
	}

	// A live ID (TimeWait included: the connection is still in conns)
	// is not handed out: take the generator's next value and hold it.
	seed := [32]byte{}
	binary.LittleEndian.PutUint64(seed[:], 42)
	m2, err := NewManager(Config{Sender: SenderFunc(func(GID, []byte) error { return nil }), Seed: 42, Clock: n.clock})
	require.NoError(t, err)
	defer m2.Close()
	twin := mrand.NewChaCha8(seed)
	next := uint32(twin.Uint64())
	m2.conns[next] = &conn{id: next, state: StateTimeWait}
	assert.NotEqual(t, next, m2.allocID())

	// Seeded from the OS: two Managers differ.
	first := func() uint32 {
		m, err := NewManager(Config{Sender: SenderFunc(func(GID, []byte) error { return nil })})
		require.NoError(t, err)
		defer m.Close()
		return m.allocID()
	}
	assert.NotEqual(t, first(), first())

	c := &conn{id: 5}
	t1, t2 := m.formTID(c), m.formTID(c)
	assert.Equal(t, uint64(5), t1&0xffffffff)
	assert.NotEqual(t, t1>>32, t2>>32)
}

// TestHalfOpenExpires: a connect request the owner never answers is
// dropped once its active side has given up (REJ to the peer,
// EventRejected with RejectTimeout and the peer's CA GUID to the owner);
// after an MRA, at most MaxHalfOpenTime after it arrived.
func TestHalfOpenExpires(t *testing.T) {
	n, a, b := pair(t, false)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	cb := b.takeEvents()[0].Conn
	assert.Equal(t, 1, b.m.Stats().HalfOpen)
	// A gives up after 16 × 4.608 s; B keeps the request a round trip
	// (2^(17-8) ms) longer.
	wait := (CMAMaxCMRetries+1)*reqTO + twTO
	n.advance((CMAMaxCMRetries + 1) * reqTO)
	assert.Equal(t, []EventType{EventUnreachable}, types(a.takeEvents()))
	n.advance(wait - (CMAMaxCMRetries+1)*reqTO - time.Millisecond)
	assert.Empty(t, b.takeEvents())
	n.drain()
	n.advance(time.Millisecond)
	assert.Equal(t, []string{"B>A REJ"}, n.drain())
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, cb, evs[0].Conn)
	assert.Equal(t, RejectTimeout, evs[0].Reason)
	assert.Equal(t, uint64(guidA), binary.BigEndian.Uint64(evs[0].ARI))
	_, err = b.m.State(cb)
	assert.ErrorIs(t, err, ErrUnknownConn)
	s := b.m.Stats()
	assert.Zero(t, s.HalfOpen)
	assert.Equal(t, uint64(1), s.Expired)
	_, err = a.m.State(ca)
	assert.ErrorIs(t, err, ErrUnknownConn)

	// With an MRA (rdma_cm's, delayed) A waits 2^(24-8) ms per REQ after
	// the first repeat: B keeps the request MaxHalfOpenTime, then rejects
	// it, and A hears of it.
	ca, err = a.m.Connect(connectParams(a, b, 0x101))
	require.NoError(t, err)
	n.run()
	cb = b.takeEvents()[0].Conn
	require.NoError(t, b.m.MRA(cb, CMAMRAServiceTimeout, true, nil))
	n.advance(reqTO) // A repeats its REQ, B answers with the MRA
	requireState(t, a.m, ca, StateMRAREQRcvd)
	n.advance(DefaultMaxHalfOpenTime - reqTO - time.Millisecond)
	assert.Empty(t, b.takeEvents())
	requireState(t, a.m, ca, StateMRAREQRcvd)
	n.advance(time.Millisecond)
	evs = b.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, RejectTimeout, evs[0].Reason)
	evs = a.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, RejectNoResources, evs[0].Reason)
	assert.Zero(t, b.m.Stats().HalfOpen)

	// An MRA the owner asked for but that never went out (A's repeats
	// are lost) changes nothing: A gives up on its own schedule.
	n.filter = func(p packet, seq int) int {
		if p.from == a.gid && p.attr() == AttrREQ && seq > 0 {
			return 0
		}
		return 1
	}
	n.sent = 0
	_, err = a.m.Connect(connectParams(a, b, 0x102))
	require.NoError(t, err)
	n.run()
	cb = b.takeEvents()[0].Conn
	require.NoError(t, b.m.MRA(cb, CMAMRAServiceTimeout, true, nil))
	n.advance(wait - time.Millisecond)
	assert.Empty(t, b.takeEvents())
	n.advance(time.Millisecond)
	assert.Equal(t, []EventType{EventRejected}, types(b.takeEvents()))
}

// TestHalfOpenBacklogSheds: a listener at its backlog admits a new
// request by shedding the oldest REP_SENT (no RTU) connection, with a REJ,
// else the oldest unanswered request, silently (its peer repeats its REQ);
// the owner hears of either (EventRejected, no resources). A genuine
// client connects through a flood.
func TestHalfOpenBacklogSheds(t *testing.T) {
	n := newNet(t)
	a := n.add("A", "192.168.1.1", guidA, true)
	b := n.add("B", "192.168.1.2", guidB, false)
	svc := ServiceID(PortSpaceTCP, 7471)
	require.NoError(t, b.m.ListenBacklog(svc, 0, 3))
	got := capture(n, mallory)

	// Three forged requests; the owner accepts the first two.
	for i := range 3 {
		forge(t, n, mallory, b, forgedREQ(mallory, b.gid, uint32(0x10+i), uint32(0x500+i), 0x1234))
	}
	evs := b.takeEvents()
	require.Len(t, evs, 3)
	forged := []ConnID{evs[0].Conn, evs[1].Conn, evs[2].Conn}
	require.NoError(t, b.m.Accept(forged[1], AcceptParams{QPN: 0x601}))
	require.NoError(t, b.m.Accept(forged[0], AcceptParams{QPN: 0x600}))
	n.run()
	assert.Equal(t, 3, b.m.Stats().HalfOpen)

	// A genuine request sheds the oldest REP_SENT one (forged[1],
	// accepted first), not the older unanswered forged[2]... nor the
	// newcomer.
	*got = nil
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	require.Equal(t, []AttrID{AttrREJ}, attrs(*got))
	rej := (*got)[0].(*REJ)
	assert.Equal(t, RejectNoResources, rej.Reason)
	assert.Equal(t, uint32(forged[1]), rej.LocalCommID)
	evs = b.takeEvents()
	require.Equal(t, []EventType{EventRejected, EventConnectRequest}, types(evs))
	assert.Equal(t, forged[1], evs[0].Conn)
	assert.Equal(t, RejectNoResources, evs[0].Reason)
	requireState(t, b.m, forged[1], StateTimeWait)
	genuine := evs[1].Conn
	assert.Equal(t, 3, b.m.Stats().HalfOpen)

	// Another forged request sheds forged[0] (REP_SENT); the next the
	// oldest unanswered one, forged[2], without a REJ.
	*got = nil
	forge(t, n, mallory, b, forgedREQ(mallory, b.gid, 0x20, 0x700, 0x1234))
	forge(t, n, mallory, b, forgedREQ(mallory, b.gid, 0x21, 0x701, 0x1234))
	assert.Equal(t, []AttrID{AttrREJ}, attrs(*got), "a REJ for the REP_SENT one only")
	evs = b.takeEvents()
	require.Equal(t, []EventType{EventRejected, EventConnectRequest, EventRejected, EventConnectRequest}, types(evs))
	assert.Equal(t, []ConnID{forged[0], forged[2]}, []ConnID{evs[0].Conn, evs[2].Conn})
	_, err = b.m.State(forged[2])
	assert.ErrorIs(t, err, ErrUnknownConn)

	// The genuine request is now the oldest: the owner accepts it, A
	// answers with the RTU at once, and it is established whatever
	// comes next.
	require.NoError(t, b.m.Accept(genuine, AcceptParams{QPN: 0x200}))
	n.run()
	assert.Equal(t, []EventType{EventEstablished}, types(b.takeEvents()))
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	requireState(t, a.m, ca, StateEstablished)
	for i := range 10 {
		forge(t, n, mallory, b, forgedREQ(mallory, b.gid, uint32(0x30+i), uint32(0x800+i), 0x1234))
		assert.LessOrEqual(t, b.m.Stats().HalfOpen, 3)
	}
	requireState(t, b.m, genuine, StateEstablished)
	s := b.m.Stats()
	assert.Equal(t, 3, s.HalfOpen)
	assert.Equal(t, uint64(3+9), s.Shed, "the first of the ten took the genuine one's place")
}

// TestHalfOpenManagerBound: Config.MaxHalfOpen bounds all listeners
// together; the oldest half-open connection of any listener is shed.
func TestHalfOpenManagerBound(t *testing.T) {
	n := newNet(t)
	b := n.add("B", "192.168.1.2", guidB, false)
	b.m.maxHalfOpen = 4
	require.NoError(t, b.m.Listen(1, 0))
	require.NoError(t, b.m.Listen(2, 0))
	var first ConnID
	for i := range 10 {
		req := forgedREQ(mallory, b.gid, uint32(0x10+i), uint32(0x500+i), 0x1234)
		req.ServiceID = uint64(1 + i%2)
		forge(t, n, mallory, b, req)
		if i == 0 {
			first = b.takeEvents()[0].Conn
		}
		assert.LessOrEqual(t, b.m.Stats().HalfOpen, 4)
	}
	_, err := b.m.State(first)
	assert.ErrorIs(t, err, ErrUnknownConn)
	assert.Equal(t, uint64(6), b.m.Stats().Shed)
}

// TestPeerTimeoutsClamped: what a REQ or MRA asks of this side's timers is
// clamped: a REQ with response timeout 31 and 15 retries gets its REP
// repeated every 2^15 ms, twice (not every 2^23 ms, 15 times); an MRA's
// service timeout counts as at most 24; TimeWait lasts at most 2^(21-8)
// ms; and a REP stretched by MRAs is given up MaxHalfOpenTime after it
// was sent.
func TestPeerTimeoutsClamped(t *testing.T) {
	n, a, b := pair(t, true)
	got := capture(n, mallory)
	req := forgedREQ(mallory, b.gid, 0x10, 0x500, 0x1234)
	req.LocalCMResponseTimeout, req.MaxCMRetries = 31, 15
	forge(t, n, mallory, b, req)
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventConnectRequest}, types(evs))
	per := IBADuration(MaxPeerResponseTimeout)
	n.advance(3*per - time.Millisecond)
	assert.Equal(t, []AttrID{AttrREP, AttrREP, AttrREP}, attrs(*got))
	assert.Empty(t, b.takeEvents())
	n.advance(time.Millisecond)
	evs = b.takeEvents()
	require.Equal(t, []EventType{EventUnreachable}, types(evs))
	assert.Equal(t, AttrREP, evs[0].Attr)

	// An MRA from the REQ's sender stretches the REP's wait to 2^(24-8)
	// + 2^(17-8) ms per attempt, 15 times: given up after
	// MaxHalfOpenTime all the same.
	*got = nil
	forge(t, n, mallory, b, forgedREQ(mallory, b.gid, 0x11, 0x501, 0x1234))
	require.Equal(t, []AttrID{AttrREP}, attrs(*got))
	rep := (*got)[0].(*REP)
	b.takeEvents()
	forge(t, n, mallory, b, &MRA{LocalCommID: 0x11, RemoteCommID: rep.LocalCommID, MessageMRAed: MsgREP, ServiceTimeout: 31})
	requireState(t, b.m, ConnID(rep.LocalCommID), StateMRAREPRcvd)
	n.advance(mraWait(31, 17) - time.Millisecond)
	assert.Len(t, *got, 1, "an MRA with service timeout 31 counts as 24")
	n.advance(time.Millisecond)
	assert.Len(t, *got, 2)
	n.advance(DefaultMaxHalfOpenTime - mraWait(31, 17) - time.Millisecond)
	assert.Empty(t, b.takeEvents())
	n.advance(time.Millisecond)
	evs = b.takeEvents()
	require.Equal(t, []EventType{EventUnreachable}, types(evs))
	assert.Zero(t, b.m.Stats().HalfOpen)

	// TimeWait: A's ACK delay 31 makes the REQ's local ACK timeout 31;
	// B's TimeWait lasts 2^(21-8) ms, not 2^(31-8).
	a.m.cfg.AckDelay = 31
	ca, cb := establish(t, n, a, b, 0x100)
	require.NoError(t, a.m.Disconnect(ca, nil))
	n.run()
	requireState(t, b.m, cb, StateTimeWait)
	b.takeEvents()
	n.advance(IBADuration(MaxPeerACKTimeout) - time.Millisecond)
	assert.Empty(t, b.takeEvents())
	n.advance(time.Millisecond)
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(b.takeEvents()))
}
