package cm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

const (
	guidA = 0x0002c90300000a0a
	guidB = 0x0002c90300000b0b
)

func pair(t *testing.T, autoB bool) (*fakeNet, *node, *node) {
	n := newNet(t)
	a := n.add("A", "192.168.1.1", guidA, true)
	b := n.add("B", "192.168.1.2", guidB, autoB)
	require.NoError(t, b.m.Listen(ServiceID(PortSpaceTCP, 7471), 0))
	return n, a, b
}

// establish connects a to b (both automatic) and returns both ends.
func establish(t *testing.T, n *fakeNet, a, b *node, qpn uint32) (ConnID, ConnID) {
	ca, err := a.m.Connect(connectParams(a, b, qpn))
	require.NoError(t, err)
	n.run()
	evA, evB := a.takeEvents(), b.takeEvents()
	require.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(evA))
	require.Equal(t, []EventType{EventConnectRequest, EventEstablished}, types(evB))
	return ca, evB[0].Conn
}

func TestConnectAcceptEstablishDisconnect(t *testing.T) {
	n, a, b := pair(t, false)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	st, _ := a.m.State(ca)
	assert.Equal(t, StateREQSent, st)
	n.run()
	assert.Equal(t, []string{"A>B REQ"}, n.drain())

	// B got the REQ as Linux formats it for RoCE v2.
	evB := b.takeEvents()
	require.Equal(t, []EventType{EventConnectRequest}, types(evB))
	cr := evB[0]
	cb := cr.Conn
	req := cr.REQ
	assert.Equal(t, a.gid, cr.Peer)
	assert.Equal(t, uint32(ca), req.LocalCommID)
	assert.Equal(t, uint64(0x0000000001061d2f), req.ServiceID)
	assert.Equal(t, uint64(guidA), req.LocalCAGUID)
	assert.Equal(t, uint32(0x100), req.LocalQPN)
	assert.Equal(t, uint16(PermissiveLID), req.Primary.LocalLID)
	assert.Equal(t, uint16(PermissiveLID), req.Primary.RemoteLID)
	assert.False(t, req.Primary.SubnetLocal)
	assert.Equal(t, uint8(17), req.Primary.LocalACKTimeout)
	assert.Equal(t, uint8(64), req.Primary.HopLimit)
	assert.Equal(t, uint32(43000*31+7471)&0xfffff, req.Primary.FlowLabel)
	assert.Equal(t, a.gid, req.Primary.LocalGID)
	assert.Equal(t, b.gid, req.Primary.RemoteGID)
	hdr, err := ParseCMAHeader(cr.PrivateData)
	require.NoError(t, err)
	assert.Equal(t, uint16(43000), hdr.SrcPort)
	assert.Equal(t, a.gid.IP(), hdr.Src)
	assert.Equal(t, "hello", string(cr.PrivateData[CMAHeaderLen:CMAHeaderLen+5]))
	assert.Len(t, cr.PrivateData, REQPrivateDataLen)
	st, _ = b.m.State(cb)
	assert.Equal(t, StateREQRcvd, st)

	// B's QP attributes, before it accepts (rdma_accept moves the QP to
	// RTR and RTS first).
	rtr, err := b.m.QPAttr(cb, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x100), rtr.DestQPN)
	assert.Equal(t, roce.MTU1024, rtr.PathMTU)
	assert.Equal(t, uint8(3), rtr.MaxDestRdAtomic, "B's responder resources = A's initiator depth")
	assert.Equal(t, a.gid, rtr.AH.DGID)
	assert.Equal(t, b.gid, rtr.AH.SGID)
	assert.Equal(t, uint8(64), rtr.AH.HopLimit)
	assert.NotEqual(t, uint32(0x111111), rtr.RQPSN, "B expects a PSN of its own, not the one A expects")
	bPSN := rtr.RQPSN
	rts, err := b.m.QPAttr(cb, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x111111), rts.SQPSN, "B sends from the PSN A's REQ says A expects (cm_req_handler)")
	assert.Equal(t, uint8(17), rts.Timeout)
	assert.Equal(t, uint8(2), rts.MaxRdAtomic, "B's initiator depth = A's responder resources")
	assert.Equal(t, uint8(7), rts.RetryCount)

	require.NoError(t, b.m.Accept(cb, AcceptParams{QPN: 0x200, StartingPSN: bPSN, ResponderResources: 3,
		InitiatorDepth: 2, RNRRetryCount: 6, PrivateData: []byte("rep")}))
	n.run()
	assert.Equal(t, []string{"B>A REP", "A>B RTU"}, n.drain())
	evA := a.takeEvents()
	require.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(evA))
	assert.Equal(t, "rep", string(evA[0].PrivateData[:3]))
	assert.Equal(t, uint32(0x200), evA[0].REP.LocalQPN)
	assert.Equal(t, uint8(RXEAckDelay), evA[0].REP.TargetACKDelay)
	assert.Equal(t, bPSN, evA[0].REP.StartingPSN, "the REP announces the PSN B's RTR expects")
	evB = b.takeEvents()
	require.Equal(t, []EventType{EventEstablished}, types(evB))
	assert.Equal(t, cb, evB[0].Conn)
	rts, err = b.m.QPAttr(cb, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x111111), rts.SQPSN, "B still sends from the REQ's PSN")
	rtr, err = b.m.QPAttr(cb, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, bPSN, rtr.RQPSN, "B expects the PSN its REP announced")

	// A's QP attributes after the REP.
	rtr, err = a.m.QPAttr(ca, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x200), rtr.DestQPN)
	assert.Equal(t, uint32(0x111111), rtr.RQPSN, "A expects the PSN its REQ announced (ib_send_cm_req: rq_psn)")
	assert.Equal(t, uint8(2), rtr.MaxDestRdAtomic, "A's responder resources = B's initiator depth")
	rts, err = a.m.QPAttr(ca, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, bPSN, rts.SQPSN, "A sends from the PSN B's REP says B expects (cm_rep_handler)")
	assert.Equal(t, uint8(17), rts.Timeout, "cm_ack_timeout(15, 16)")
	assert.Equal(t, uint8(6), rts.RNRRetry)
	assert.Equal(t, uint8(3), rts.MaxRdAtomic, "A's initiator depth = B's responder resources")
	init, err := a.m.QPAttr(ca, QPStateInit)
	require.NoError(t, err)
	assert.Equal(t, AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic, init.AccessFlags)
	for _, x := range []struct {
		m  *Manager
		id ConnID
	}{{a.m, ca}, {b.m, cb}} {
		st, _ := x.m.State(x.id)
		assert.Equal(t, StateEstablished, st)
	}

	// A disconnects; B answers.
	require.NoError(t, a.m.Disconnect(ca, []byte("bye")))
	n.run()
	assert.Equal(t, []string{"A>B DREQ"}, n.drain())
	evB = b.takeEvents()
	require.Equal(t, []EventType{EventDisconnectRequest}, types(evB))
	assert.Equal(t, "bye", string(evB[0].PrivateData[:3]))
	require.NoError(t, b.m.Disconnect(cb, nil))
	n.run()
	assert.Equal(t, []string{"B>A DREP"}, n.drain())
	assert.Equal(t, []EventType{EventDisconnected}, types(a.takeEvents()))
	st, _ = a.m.State(ca)
	assert.Equal(t, StateTimeWait, st)
	st, _ = b.m.State(cb)
	assert.Equal(t, StateTimeWait, st)

	// TimeWait lasts 2^(17-8) ms on both sides.
	n.advance(twTO - time.Millisecond)
	assert.Empty(t, a.takeEvents())
	assert.Empty(t, b.takeEvents())
	n.advance(time.Millisecond)
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(b.takeEvents()))
	_, err = a.m.State(ca)
	assert.ErrorIs(t, err, ErrUnknownConn)
	assert.Zero(t, n.clock.Pending())
	assert.Empty(t, n.drain())

	s := a.m.Stats()
	assert.Equal(t, uint64(1), s.Sent[AttrREQ-AttrREQ])
	assert.Equal(t, uint64(1), s.Sent[AttrRTU-AttrREQ])
	assert.Equal(t, uint64(1), s.Received[AttrREP-AttrREQ])
	assert.Zero(t, s.Retries)
}

func TestLossFirstREQ(t *testing.T) {
	n, a, b := pair(t, true)
	n.filter = dropFirst(AttrREQ)
	_, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	assert.Equal(t, []string{"A>B REQ-"}, n.drain())
	n.advance(reqTO - time.Millisecond)
	assert.Empty(t, n.drain())
	n.advance(time.Millisecond)
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "A>B RTU"}, n.drain())
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventConnectRequest, EventEstablished}, types(b.takeEvents()))
	assert.Equal(t, uint64(1), a.m.Stats().Retries[0])
}

func TestLossFirstREPRetransmitted(t *testing.T) {
	// B's REP timer (2^(20-8) ms) fires before A repeats its REQ.
	n, a, b := pair(t, true)
	n.filter = dropFirst(AttrREP)
	_, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REP-"}, n.drain())
	n.advance(repTO)
	assert.Equal(t, []string{"B>A REP", "A>B RTU"}, n.drain())
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventConnectRequest, EventEstablished}, types(b.takeEvents()))
	n.advance(time.Minute)
	assert.Empty(t, n.drain(), "nothing left to repeat")
}

func TestLossFirstREPAnsweredOnRepeatedREQ(t *testing.T) {
	// With a long REP timeout at B, A's repeated REQ comes first and B
	// answers it with the REP again.
	n, a, b := pair(t, true)
	n.filter = dropFirst(AttrREP)
	p := connectParams(a, b, 0x100)
	p.LocalCMResponseTimeout = 23 // B waits 2^15 ms for the RTU
	_, err := a.m.Connect(p)
	require.NoError(t, err)
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REP-"}, n.drain())
	n.advance(reqTO)
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "A>B RTU"}, n.drain())
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventConnectRequest, EventEstablished}, types(b.takeEvents()))
	assert.Equal(t, uint64(1), b.m.Stats().Duplicates[0], "the repeated REQ")
}

func TestLossRTU(t *testing.T) {
	n, a, b := pair(t, true)
	n.filter = dropFirst(AttrRTU)
	_, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "A>B RTU-"}, n.drain())
	assert.Equal(t, []EventType{EventConnectRequest}, types(b.takeEvents()))
	n.advance(repTO)
	// A, established, answers the repeated REP with the RTU again.
	assert.Equal(t, []string{"B>A REP", "A>B RTU"}, n.drain())
	assert.Equal(t, []EventType{EventEstablished}, types(b.takeEvents()))
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	assert.Equal(t, uint64(1), a.m.Stats().Duplicates[AttrREP-AttrREQ])
}

func TestDuplicateEverything(t *testing.T) {
	n, a, b := pair(t, true)
	n.filter = func(packet, int) int { return 2 }
	ca, cb := establish(t, n, a, b, 0x100)
	require.NoError(t, a.m.Disconnect(ca, nil))
	n.run()
	assert.Equal(t, []EventType{EventDisconnected}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventDisconnectRequest}, types(b.takeEvents()))
	// Every MAD arrived twice; the repeats were answered as the state
	// asks (B: the REP again; A: the RTU again; B in TimeWait: the DREP
	// again) and raised no event.
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "B>A REP", "A>B RTU", "A>B RTU", "A>B RTU", "A>B RTU",
		"A>B DREQ", "B>A DREP", "B>A DREP"}, n.drain())
	sa, sb := a.m.Stats(), b.m.Stats()
	assert.Equal(t, uint64(1), sb.Duplicates[AttrREQ-AttrREQ])
	assert.Equal(t, uint64(3), sa.Duplicates[AttrREP-AttrREQ])
	assert.Equal(t, uint64(7), sb.Duplicates[AttrRTU-AttrREQ])
	assert.Equal(t, uint64(1), sb.Duplicates[AttrDREQ-AttrREQ])
	n.advance(twTO)
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(b.takeEvents()))
	_, err := b.m.State(cb)
	assert.ErrorIs(t, err, ErrUnknownConn)
}

func TestReorderDREQBeforeRTU(t *testing.T) {
	n, a, b := pair(t, true)
	a.auto = false
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	require.NoError(t, a.m.RTU(ca, nil))
	require.NoError(t, a.m.Disconnect(ca, nil))
	q := n.take()
	require.Len(t, q, 2)
	n.deliver(q[1]) // DREQ first
	n.deliver(q[0]) // then the RTU
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "A>B DREQ", "A>B RTU", "B>A DREP"}, n.drain())
	assert.Equal(t, []EventType{EventConnectRequest, EventDisconnectRequest}, types(b.takeEvents()),
		"the late RTU changes nothing")
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished, EventDisconnected}, types(a.takeEvents()))
}

func TestReorderLateREQ(t *testing.T) {
	// A repeated REQ that arrives after the connection is established is
	// ignored.
	n, a, b := pair(t, true)
	n.filter = dropFirst(AttrREQ)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	n.filter = nil
	n.clock.Advance(reqTO) // A repeats the REQ; hold it back
	late := n.take()
	require.Len(t, late, 1)
	// Meanwhile the first REQ turns up after all.
	first := packet{from: a.gid, to: b.gid, mad: late[0].mad}
	n.deliver(first)
	n.run()
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	n.drain()
	n.deliver(late[0])
	n.run()
	assert.Equal(t, []string{"A>B REQ"}, n.drain(), "no answer to a REQ of an established connection")
	assert.Equal(t, []EventType{EventConnectRequest, EventEstablished}, types(b.takeEvents()))
	st, _ := a.m.State(ca)
	assert.Equal(t, StateEstablished, st)
}

func TestPeerGoneREQTimeout(t *testing.T) {
	n, a, b := pair(t, true)
	n.filter = func(packet, int) int { return 0 }
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	// The REQ is sent once and repeated CMAMaxCMRetries times, each
	// after reqTO; the last one gets reqTO too.
	n.advance(CMAMaxCMRetries*reqTO + reqTO - time.Millisecond)
	assert.Empty(t, a.takeEvents())
	n.advance(time.Millisecond)
	evs := a.takeEvents()
	require.Equal(t, []EventType{EventUnreachable}, types(evs))
	assert.Equal(t, AttrREQ, evs[0].Attr)
	assert.Equal(t, ca, evs[0].Conn)
	assert.Len(t, n.drain(), 1+CMAMaxCMRetries)
	s := a.m.Stats()
	assert.Equal(t, uint64(1), s.Sent[0])
	assert.Equal(t, uint64(CMAMaxCMRetries), s.Retries[0])
	_, err = a.m.State(ca)
	assert.ErrorIs(t, err, ErrUnknownConn)
	assert.Zero(t, n.clock.Pending())
}

func TestPeerGoneREPTimeout(t *testing.T) {
	n, a, b := pair(t, true)
	p := connectParams(a, b, 0x100)
	p.MaxCMRetries = 3
	_, err := a.m.Connect(p)
	require.NoError(t, err)
	// A vanishes once its REQ is out.
	n.filter = func(p packet, _ int) int {
		if p.from == b.gid {
			return 0
		}
		return 1
	}
	a.m.Close()
	n.run()
	n.advance(4*repTO - time.Millisecond)
	assert.Equal(t, []EventType{EventConnectRequest}, types(b.takeEvents()))
	n.advance(time.Millisecond)
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventUnreachable}, types(evs))
	assert.Equal(t, AttrREP, evs[0].Attr)
	assert.Equal(t, []string{"A>B REQ", "B>A REP-", "B>A REP-", "B>A REP-", "B>A REP-"}, n.drain())
}

func TestRejectNoListener(t *testing.T) {
	n, a, b := pair(t, true)
	p := connectParams(a, b, 0x100)
	p.ServiceID = ServiceID(PortSpaceTCP, 9999)
	ca, err := a.m.Connect(p)
	require.NoError(t, err)
	var rej *REJ
	n.filter = func(p packet, _ int) int {
		if p.attr() == AttrREJ {
			_, m, err := Decode(p.mad)
			require.NoError(t, err)
			rej = m.(*REJ)
		}
		return 1
	}
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REJ"}, n.drain())
	require.NotNil(t, rej)
	assert.Equal(t, RejectInvalidServiceID, rej.Reason)
	assert.Equal(t, MsgREQ, rej.MessageRejected)
	assert.Equal(t, uint32(0), rej.LocalCommID)
	assert.Equal(t, uint32(ca), rej.RemoteCommID)
	evs := a.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, RejectInvalidServiceID, evs[0].Reason)
	assert.Empty(t, b.takeEvents())
	_, err = a.m.State(ca)
	assert.ErrorIs(t, err, ErrUnknownConn)
	assert.Zero(t, n.clock.Pending(), "no REQ timer left")
	// The REJ counted by reason on both sides.
	assert.Equal(t, map[RejectReason]uint64{RejectInvalidServiceID: 1}, b.m.Stats().RejectsSent)
	assert.Equal(t, map[RejectReason]uint64{RejectInvalidServiceID: 1}, a.m.Stats().RejectsReceived)
	assert.Empty(t, a.m.Stats().RejectsSent)
	assert.Empty(t, b.m.Stats().RejectsReceived)
}

// TestRejectCountsBoundedReasons: a REJ with a reason the IBTA does not
// define counts under one key (0), so a peer cannot grow the map; the
// operator's view names it "other".
func TestRejectCountsBoundedReasons(t *testing.T) {
	var m map[RejectReason]uint64
	for r := RejectReason(100); r < 200; r++ {
		countREJ(&m, r)
	}
	countREJ(&m, RejectStaleConn)
	assert.Equal(t, map[RejectReason]uint64{0: 100, RejectStaleConn: 1}, m)
	assert.Equal(t, map[string]uint64{"other": 100, RejectStaleConn.String(): 1}, rejectNamesOf(m))
	assert.Nil(t, rejectNamesOf(nil))
}

func TestRejectConsumer(t *testing.T) {
	n, a, b := pair(t, false)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	cb := b.takeEvents()[0].Conn
	require.NoError(t, b.m.Reject(cb, RejectConsumerDefined, nil, []byte("go away")))
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REJ"}, n.drain())
	evs := a.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, RejectConsumerDefined, evs[0].Reason)
	assert.Equal(t, "go away", string(evs[0].PrivateData[:7]))
	assert.Len(t, evs[0].PrivateData, REJPrivateDataLen)
	for _, x := range []struct {
		m  *Manager
		id ConnID
	}{{a.m, ca}, {b.m, cb}} {
		_, err := x.m.State(x.id)
		assert.ErrorIs(t, err, ErrUnknownConn)
	}
	assert.Zero(t, n.clock.Pending())
	assert.ErrorIs(t, b.m.Accept(cb, AcceptParams{}), ErrUnknownConn)
	assert.Equal(t, map[RejectReason]uint64{RejectConsumerDefined: 1}, b.m.Stats().RejectsSent)
	assert.Equal(t, map[RejectReason]uint64{RejectConsumerDefined: 1}, a.m.Stats().RejectsReceived)
}

func TestStaleConnection(t *testing.T) {
	n, a, b := pair(t, true)
	_, cb := establish(t, n, a, b, 0x100)
	n.drain()
	// A restarts: a new CM with the same GUID and address, which knows
	// nothing of the connection, connects again from the same QPN.
	a.m.Close()
	a2 := n.add("A", "192.168.1.1", guidA, true)
	a2.m.allocID() // the same seed: skip the ID A had
	ca2, err := a2.m.Connect(connectParams(a2, b, 0x100))
	require.NoError(t, err)
	n.run()
	// B rejects the REQ (stale connection) and tears the old connection
	// down with a DREQ, which the new CM answers though it knows nothing.
	assert.Equal(t, []string{"A>B REQ", "B>A REJ", "B>A DREQ", "A>B DREP"}, n.drain())
	evs := a2.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, RejectStaleConn, evs[0].Reason)
	st, _ := a2.m.State(ca2)
	assert.Equal(t, StateTimeWait, st, "a stale connection reject leads to TimeWait")
	assert.Equal(t, []EventType{EventDisconnected}, types(b.takeEvents()))
	st, _ = b.m.State(cb)
	assert.Equal(t, StateTimeWait, st)
	// Once both TimeWaits are over, the same QP connects.
	n.advance(twTO)
	a2.takeEvents()
	b.takeEvents()
	assert.False(t, a2.m.QPNInTimeWait(0x100))
	establish(t, n, a2, b, 0x100)
}

func TestDREQRepeatedWhenDREPLost(t *testing.T) {
	for _, c := range []struct {
		name string
		// A's ACK delay sets the REQ's local ACK timeout, so B's
		// TimeWait: 2^(25-8) ms outlasts A's DREQ timeout, 2^(17-8)
		// ms does not. B still in TimeWait answers from the connection;
		// B past TimeWait answers from the DREQ alone.
		ackDelay   uint8
		inTimeWait bool
	}{{"peer in TimeWait", 25, true}, {"peer forgot", RXEAckDelay, false}} {
		t.Run(c.name, func(t *testing.T) {
			n, a, b := pair(t, true)
			a.m.cfg.AckDelay = c.ackDelay
			ca, err := a.m.Connect(connectParams(a, b, 0x100))
			require.NoError(t, err)
			n.run()
			a.takeEvents()
			b.takeEvents()
			n.drain()
			n.filter = dropFirst(AttrDREP)
			require.NoError(t, a.m.Disconnect(ca, nil))
			n.run()
			assert.Equal(t, []string{"A>B DREQ", "B>A DREP-"}, n.drain())
			assert.Equal(t, []EventType{EventDisconnectRequest}, types(b.takeEvents()))
			n.advance(reqTO - time.Millisecond)
			assert.Empty(t, a.takeEvents())
			n.advance(time.Millisecond)
			assert.Equal(t, []string{"A>B DREQ", "B>A DREP"}, n.drain())
			assert.Equal(t, []EventType{EventDisconnected}, types(a.takeEvents()))
			if c.inTimeWait {
				assert.Empty(t, b.takeEvents())
			} else {
				assert.Equal(t, []EventType{EventTimeWaitExit}, types(b.takeEvents()))
			}
			assert.Equal(t, uint64(1), b.m.Stats().Duplicates[AttrDREQ-AttrREQ])
		})
	}
}

func TestDREQTimeout(t *testing.T) {
	n, a, b := pair(t, true)
	ca, _ := establish(t, n, a, b, 0x100)
	n.filter = func(packet, int) int { return 0 }
	require.NoError(t, a.m.Disconnect(ca, nil))
	n.run()
	n.advance((CMAMaxCMRetries + 1) * reqTO)
	evs := a.takeEvents()
	require.Equal(t, []EventType{EventDisconnected}, types(evs))
	assert.True(t, evs[0].TimedOut)
	st, _ := a.m.State(ca)
	assert.Equal(t, StateTimeWait, st)
	n.advance(twTO)
	assert.Equal(t, []EventType{EventTimeWaitExit}, types(a.takeEvents()))
}

func TestTimeWaitHoldsIDAndQPN(t *testing.T) {
	n, a, b := pair(t, true)
	ca, cb := establish(t, n, a, b, 0x100)
	require.NoError(t, a.m.Disconnect(ca, nil))
	n.run()
	a.takeEvents()
	b.takeEvents()
	n.drain()
	assert.True(t, a.m.QPNInTimeWait(0x100))
	assert.True(t, b.m.QPNInTimeWait(0x200))
	_, err := a.m.Connect(connectParams(a, b, 0x100))
	assert.ErrorIs(t, err, ErrQPNInTimeWait)
	// A new connection gets another comm ID; B refuses to accept on its
	// QPN in TimeWait.
	b.auto = false
	ca2, err := a.m.Connect(connectParams(a, b, 0x101))
	require.NoError(t, err)
	assert.NotEqual(t, ca, ca2)
	n.run()
	cr := b.takeEvents()
	require.Len(t, cr, 1)
	assert.NotEqual(t, cb, cr[0].Conn)
	assert.ErrorIs(t, b.m.Accept(cr[0].Conn, AcceptParams{QPN: 0x200}), ErrQPNInTimeWait)
	require.NoError(t, b.m.Accept(cr[0].Conn, AcceptParams{QPN: 0x201}))
	n.run()
	n.drain()
	// A repeat of the old REQ during TimeWait: REJ stale connection.
	old := connectParams(a, b, 0x100)
	req := &REQ{LocalCommID: uint32(ca), ServiceID: old.ServiceID, LocalCAGUID: guidA, LocalQPN: 0x100, PathMTU: roce.MTU1024}
	mad, err := Marshal(1, 0, req)
	require.NoError(t, err)
	require.NoError(t, b.m.HandleMAD(a.gid, mad))
	n.run()
	assert.Equal(t, []string{"B>A REJ"}, n.drain())

	n.advance(twTO)
	assert.False(t, a.m.QPNInTimeWait(0x100))
	assert.False(t, b.m.QPNInTimeWait(0x200))
	_, err = a.m.State(ca)
	assert.ErrorIs(t, err, ErrUnknownConn)
	ca3, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	assert.NotEqual(t, ca, ca3, "IDs are not reused soon after TimeWait either")
}

func TestMRA(t *testing.T) {
	n, a, b := pair(t, false)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	cb := b.takeEvents()[0].Conn
	// rdma_cm's answer while the consumer has not decided: an MRA sent
	// only when the REQ is repeated.
	require.NoError(t, b.m.MRA(cb, CMAMRAServiceTimeout, true, nil))
	n.run()
	assert.Equal(t, []string{"A>B REQ"}, n.drain())
	n.advance(reqTO)
	assert.Equal(t, []string{"A>B REQ", "B>A MRA"}, n.drain())
	st, _ := a.m.State(ca)
	assert.Equal(t, StateMRAREQRcvd, st)
	// A now waits 2^(24-8) + 2^(17-8) ms before repeating.
	mraTO := IBADuration(CMAMRAServiceTimeout) + IBADuration(17)
	n.advance(mraTO - time.Millisecond)
	assert.Empty(t, n.drain())
	n.advance(time.Millisecond)
	assert.Equal(t, []string{"A>B REQ", "B>A MRA"}, n.drain())
	assert.Equal(t, uint64(1), a.m.Stats().Duplicates[AttrMRA-AttrREQ], "a second MRA does not extend again")
	require.NoError(t, b.m.Accept(cb, AcceptParams{QPN: 0x200}))
	n.run()
	assert.Equal(t, []string{"B>A REP", "A>B RTU"}, n.drain())
	assert.Equal(t, []EventType{EventREPReceived, EventEstablished}, types(a.takeEvents()))
	assert.Equal(t, []EventType{EventEstablished}, types(b.takeEvents()))
}

func TestMRAForREP(t *testing.T) {
	n, a, b := pair(t, true)
	a.auto = false
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	require.NoError(t, a.m.MRA(ca, 22, false, nil))
	n.run()
	assert.Equal(t, []string{"A>B REQ", "B>A REP", "A>B MRA"}, n.drain())
	cb := b.takeEvents()[0].Conn
	st, _ := b.m.State(cb)
	assert.Equal(t, StateMRAREPRcvd, st)
	n.advance(IBADuration(22) + twTO - time.Millisecond)
	assert.Empty(t, n.drain())
	n.advance(time.Millisecond)
	assert.Equal(t, []string{"B>A REP", "A>B MRA"}, n.drain(), "the repeated REP gets the MRA again")
	require.NoError(t, a.m.RTU(ca, nil))
	n.run()
	assert.Equal(t, []EventType{EventEstablished}, types(b.takeEvents()))
}

func TestDestroyPendingREQ(t *testing.T) {
	n, a, b := pair(t, false)
	ca, err := a.m.Connect(connectParams(a, b, 0x100))
	require.NoError(t, err)
	n.run()
	cb := b.takeEvents()[0].Conn
	require.NoError(t, a.m.Destroy(ca))
	var rej *REJ
	n.filter = func(p packet, _ int) int {
		_, m, err := Decode(p.mad)
		require.NoError(t, err)
		rej, _ = m.(*REJ)
		return 1
	}
	n.run()
	require.NotNil(t, rej)
	assert.Equal(t, RejectTimeout, rej.Reason)
	assert.Equal(t, uint8(8), rej.RejectInfoLen)
	assert.Equal(t, uint64(guidA), binary.BigEndian.Uint64(rej.ARI[:]))
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventRejected}, types(evs))
	assert.Equal(t, cb, evs[0].Conn)
	assert.Empty(t, a.takeEvents(), "no events after Destroy")
	assert.Zero(t, n.clock.Pending())
}

func TestSIDR(t *testing.T) {
	n, a, b := pair(t, false)
	sid := ServiceID(PortSpaceUDP, 7174)
	require.NoError(t, b.m.Listen(sid, 0))
	n.filter = dropFirst(AttrSIDRREQ)
	id, err := a.m.SIDRRequest(SIDRParams{Peer: b.gid, ServiceID: sid, PKey: DefaultPKey,
		Timeout: CMASIDRTimeoutMS * time.Millisecond, MaxRetries: CMAMaxCMRetries, PrivateData: []byte("udp")})
	require.NoError(t, err)
	n.run()
	n.advance(CMASIDRTimeoutMS * time.Millisecond)
	evs := b.takeEvents()
	require.Equal(t, []EventType{EventSIDRRequest}, types(evs))
	assert.Equal(t, sid, evs[0].SIDRReq.ServiceID)
	assert.Equal(t, "udp", string(evs[0].PrivateData[:3]))
	// A repeat while B decides is dropped.
	n.advance(CMASIDRTimeoutMS * time.Millisecond)
	assert.Empty(t, b.takeEvents())
	require.NoError(t, b.m.SIDRReply(evs[0].Conn, SIDRReplyParams{Status: SIDRSuccess, QPN: 0x345, QKey: CMAUDPQKey}))
	n.run()
	assert.Equal(t, []string{"A>B SIDR_REQ-", "A>B SIDR_REQ", "A>B SIDR_REQ", "B>A SIDR_REP"}, n.drain())
	evs = a.takeEvents()
	require.Equal(t, []EventType{EventSIDRReply}, types(evs))
	assert.Equal(t, id, evs[0].Conn)
	assert.Equal(t, SIDRSuccess, evs[0].SIDRRep.Status)
	assert.Equal(t, uint32(0x345), evs[0].SIDRRep.QPN)
	assert.Equal(t, uint32(CMAUDPQKey), evs[0].SIDRRep.QKey)
	assert.Equal(t, sid, evs[0].SIDRRep.ServiceID)
	assert.Zero(t, n.clock.Pending())

	// No listener: status "unsupported".
	_, err = a.m.SIDRRequest(SIDRParams{Peer: b.gid, ServiceID: ServiceID(PortSpaceUDP, 1), Timeout: time.Second})
	require.NoError(t, err)
	n.run()
	evs = a.takeEvents()
	require.Equal(t, []EventType{EventSIDRReply}, types(evs))
	assert.Equal(t, SIDRUnsupported, evs[0].SIDRRep.Status)

	// Nobody answers: unreachable after the retries.
	n.filter = func(packet, int) int { return 0 }
	_, err = a.m.SIDRRequest(SIDRParams{Peer: b.gid, ServiceID: sid, Timeout: time.Second, MaxRetries: 2})
	require.NoError(t, err)
	n.run()
	n.advance(3 * time.Second)
	evs = a.takeEvents()
	require.Equal(t, []EventType{EventUnreachable}, types(evs))
	assert.Equal(t, AttrSIDRREQ, evs[0].Attr)
}

func TestBadMADs(t *testing.T) {
	_, a, b := pair(t, true)
	assert.ErrorIs(t, b.m.HandleMAD(a.gid, []byte{1, 2, 3}), ErrShortMAD)
	lap := make([]byte, MADLen)
	lap[0], lap[1], lap[2], lap[3], lap[17] = 1, 7, 2, 3, 0x19
	assert.ErrorIs(t, b.m.HandleMAD(a.gid, lap), ErrUnsupportedAttribute)
	s := b.m.Stats()
	assert.Equal(t, uint64(1), s.Invalid)
	assert.Equal(t, uint64(1), s.Unsupported)
	// Messages for no connection are counted, not answered.
	for _, m := range []Message{&REP{RemoteCommID: 5, LocalCommID: 6}, &RTU{RemoteCommID: 5}, &MRA{RemoteCommID: 5},
		&REJ{RemoteCommID: 5, Reason: RejectNoQP}, &DREP{RemoteCommID: 5}, &SIDRRep{RequestID: 5}} {
		mad, err := Marshal(1, 0, m)
		require.NoError(t, err)
		require.NoError(t, b.m.HandleMAD(a.gid, mad))
	}
	assert.Equal(t, uint64(6), b.m.Stats().Unmatched)
}

func TestAPIChecks(t *testing.T) {
	n, a, b := pair(t, false)
	p := connectParams(a, b, 1<<24)
	_, err := a.m.Connect(p)
	assert.ErrorIs(t, err, ErrInvalidParam)
	p = connectParams(a, b, 1)
	p.PrivateData = make([]byte, REQPrivateDataLen+1)
	_, err = a.m.Connect(p)
	assert.ErrorIs(t, err, ErrPrivateDataLen)
	p = connectParams(a, b, 1)
	p.QPType = TransportRD
	_, err = a.m.Connect(p)
	assert.ErrorIs(t, err, ErrInvalidParam)
	ca, err := a.m.Connect(connectParams(a, b, 1))
	require.NoError(t, err)
	assert.ErrorIs(t, a.m.RTU(ca, nil), ErrState)
	assert.ErrorIs(t, a.m.Disconnect(ca, nil), ErrState)
	assert.ErrorIs(t, a.m.Accept(ca, AcceptParams{}), ErrState)
	_, err = a.m.QPAttr(ca, QPStateRTR)
	assert.ErrorIs(t, err, ErrState, "the peer's QPN is not known yet")
	_, err = a.m.QPAttr(ca, QPStateInit)
	assert.NoError(t, err)
	assert.ErrorIs(t, b.m.Listen(ServiceID(PortSpaceTCP, 7471), 0), ErrListening)
	require.NoError(t, b.m.Listen(ServiceIDMask&ServiceID(PortSpaceUDP, 0), ServiceIDMask))
	assert.ErrorIs(t, b.m.Listen(ServiceID(PortSpaceUDP, 5), 0), ErrListening)
	require.NoError(t, b.m.Unlisten(ServiceID(PortSpaceTCP, 7471), 0))
	n.run()
	a.m.Close()
	_, err = a.m.Connect(connectParams(a, b, 2))
	assert.ErrorIs(t, err, ErrClosed)
}

// TestQPAttrPortLimits: a peer whose port and device are bigger offers
// path MTU 4096 and 128 outstanding reads each way; the side of MTU 1024
// and 16 resources gives its QP at most its own (the REQ it answers and
// the REP it gets are not refused), and its own REQ offers at most its
// port's MTU.
func TestQPAttrPortLimits(t *testing.T) {
	n := newNet(t)
	big := n.addWith("A", "10.0.0.1", guidA, false, func(c *Config) {
		c.PortMTU, c.MaxRdAtomic, c.MaxInitRdAtomic = roce.MTU4096, 128, 128
	})
	small := n.addWith("B", "10.0.0.2", guidB, false, func(c *Config) {
		c.PortMTU, c.MaxRdAtomic, c.MaxInitRdAtomic = roce.MTU1024, 16, 16
	})
	require.NoError(t, small.m.Listen(ServiceID(PortSpaceTCP, 7471), 0))
	require.NoError(t, big.m.Listen(ServiceID(PortSpaceTCP, 7472), 0))

	// The big side connects: MTU 4096, 128/128.
	p := connectParams(big, small, 0x100)
	p.Path.MTU, p.ResponderResources, p.InitiatorDepth = roce.MTU4096, 128, 128
	cb, err := big.m.Connect(p)
	require.NoError(t, err)
	pkts := n.take()
	require.Len(t, pkts, 1)
	_, msg, err := Decode(pkts[0].mad)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU4096, msg.(*REQ).PathMTU)
	n.deliver(pkts[0])
	evs := small.takeEvents()
	require.Len(t, evs, 1)
	cs := evs[0].Conn
	rtr, err := small.m.QPAttr(cs, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU1024, rtr.PathMTU, "the smaller of the REQ's MTU and the port's")
	assert.Equal(t, uint8(16), rtr.MaxDestRdAtomic)
	rts, err := small.m.QPAttr(cs, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, uint8(16), rts.MaxRdAtomic)
	// It accepts offering 128 back (a responder may offer more than the
	// requester asked); the big side keeps 128 for its own QP.
	require.NoError(t, small.m.Accept(cs, AcceptParams{QPN: 0x200, StartingPSN: rtr.RQPSN, ResponderResources: 16,
		InitiatorDepth: 16, RNRRetryCount: 7}))
	n.run()
	rtr, err = big.m.QPAttr(cb, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU4096, rtr.PathMTU, "the active side uses the MTU it offered")
	assert.Equal(t, uint8(16), rtr.MaxDestRdAtomic)
	require.Equal(t, []EventType{EventREPReceived}, types(big.takeEvents()))

	// The small side connects to the big one: its REQ offers its port's
	// 1024 whatever the route says; the big side answers 128/128 and the
	// small side's QP gets 16.
	p = connectParams(small, big, 0x300)
	p.ServiceID = ServiceID(PortSpaceTCP, 7472)
	p.Path.MTU, p.ResponderResources, p.InitiatorDepth = roce.MTU4096, 16, 16
	cs, err = small.m.Connect(p)
	require.NoError(t, err)
	pkts = n.take()
	require.Len(t, pkts, 1)
	_, msg, err = Decode(pkts[0].mad)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU1024, msg.(*REQ).PathMTU, "a REQ offers at most the port's active MTU")
	n.deliver(pkts[0])
	evs = big.takeEvents()
	require.Len(t, evs, 1)
	cb = evs[0].Conn
	rtr, err = big.m.QPAttr(cb, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU1024, rtr.PathMTU)
	require.NoError(t, big.m.Accept(cb, AcceptParams{QPN: 0x400, StartingPSN: rtr.RQPSN, ResponderResources: 128,
		InitiatorDepth: 128, RNRRetryCount: 7}))
	n.run()
	evs = small.takeEvents()
	require.Len(t, evs, 1)
	require.Equal(t, EventREPReceived, evs[0].Type)
	assert.Equal(t, uint8(128), evs[0].REP.ResponderResources)
	rtr, err = small.m.QPAttr(cs, QPStateRTR)
	require.NoError(t, err)
	assert.Equal(t, roce.MTU1024, rtr.PathMTU)
	assert.Equal(t, uint8(16), rtr.MaxDestRdAtomic, "the REP's initiator depth 128, clamped")
	rts, err = small.m.QPAttr(cs, QPStateRTS)
	require.NoError(t, err)
	assert.Equal(t, uint8(16), rts.MaxRdAtomic, "the REP's responder resources 128, clamped")
	assert.Equal(t, rtr.RQPSN, uint32(0x111111), "the PSN its REQ announced")
}
