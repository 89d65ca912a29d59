package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/cm"
	"github.com/vrnic/vrnic/verbs"
)

// cmDaemon runs a daemon with the UDP link on a free loopback address and
// returns its socket and GID; args are added to its command line.
func cmDaemon(t *testing.T, name string, args ...string) (sock string, gid [16]byte) {
	t.Helper()
	local := freeLoopback(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-name", name, "-runtime-dir", dir, "-link", "udp", "-local", local.String(), "-workers", "2"}, args...),
			&syncWriter{w: &logs})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	sock = admin.SocketPath(dir, name)
	require.Eventually(t, func() bool {
		_, err := admin.Serving(sock)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)
	return sock, local.Addr().As16()
}

// cmSide is a client with an RC QP, a buffer and its event socket.
type cmSide struct {
	*rcEnd
	ev *verbs.AsyncEvents
}

func openCMSide(t *testing.T, sock string) *cmSide {
	t.Helper()
	e := openRCEnd(t, sock)
	ev, err := e.c.OpenAsyncEvents()
	require.NoError(t, err)
	t.Cleanup(func() { ev.Close() })
	return &cmSide{rcEnd: e, ev: ev}
}

func nextCM(t *testing.T, s *cmSide, want abi.CMEventType) abi.CMEvent {
	t.Helper()
	ev, err := s.ev.GetCM(10 * time.Second)
	require.NoError(t, err, "waiting for %v", want)
	require.Equal(t, want, ev.Type, "event %v status %d", ev.Type, ev.Status)
	return ev
}

// applyAttr moves qp through each state the event's attributes cover.
func applyAttr(t *testing.T, id *verbs.CMID, qp *verbs.QP, states ...abi.QPState) {
	t.Helper()
	for _, st := range states {
		a, err := id.InitQPAttr(st)
		require.NoError(t, err, "attributes for %v", st)
		require.NoError(t, qp.ApplyQPAttr(&a), "move to %v", st)
	}
}

func cmInfo(t *testing.T, sock string) admin.CMInfo {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Call(admin.CMCmd, nil)
	require.NoError(t, err)
	var info admin.CMInfo
	require.NoError(t, json.Unmarshal(b, &info))
	return info
}

var testService = cm.ServiceID(cm.PortSpaceTCP, 7471)

// TestCMConnectTwoDaemons: a client of one daemon listens, a client of
// another connects over the UDP link; they exchange private data, bring
// their RC QPs up with the CM's attributes, run an RDMA WRITE and a
// SEND, and disconnect. Then a reject with private data, a connect to a
// service nobody listens on, and one to a daemon that never answers.
func TestCMConnectTwoDaemons(t *testing.T) {
	sockA, gidA := cmDaemon(t, "cma")
	sockB, gidB := cmDaemon(t, "cmb")
	srv, cli := openCMSide(t, sockA), openCMSide(t, sockB)

	lid, err := srv.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, lid.Listen(testService, 4))
	assert.ErrorIs(t, lid.Listen(testService, 4), unix.EINVAL)

	cid, err := cli.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, cli.qp.ToInit(abi.AccessAll, 0))
	require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: cli.qp.QPN, StartingPSN: 0x1234, ServiceID: testService, DGID: gidA,
		ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PrivateData: []byte("hello from the client")}))

	req := nextCM(t, srv, abi.CMEventConnectRequest)
	assert.Equal(t, lid.Handle, req.ListenID)
	assert.Equal(t, gidB, req.PeerGID)
	assert.Equal(t, cli.qp.QPN, req.PeerQPN)
	assert.Equal(t, uint32(0x1234), req.PeerPSN)
	assert.Equal(t, testService, req.ServiceID)
	assert.Equal(t, "hello from the client", string(req.Private()[:21]))
	assert.Equal(t, cli.qp.QPN, req.QPAttr.DestQPNum)
	sid := srv.c.CMIDFromEvent(&req)
	// As librdmacm: INIT, RTR and RTS before the REP. As in Linux, the
	// REQ's starting PSN is the PSN the client expects: the server sends
	// from it (RTS); the server expects a PSN of its own (RTR, drawn by
	// the daemon), which its REP announces.
	applyAttr(t, sid, srv.qp, abi.QPSInit)
	rtr, err := sid.InitQPAttr(abi.QPSRTR)
	require.NoError(t, err)
	assert.Equal(t, req.QPAttr.DestQPNum, rtr.DestQPNum)
	assert.Equal(t, req.QPAttr.RQPSN, rtr.RQPSN)
	assert.Equal(t, uint32(0x1234), req.QPAttr.SQPSN)
	require.NoError(t, srv.qp.ApplyQPAttr(&rtr))
	a, err := sid.InitQPAttr(abi.QPSRTS)
	require.NoError(t, err)
	assert.Equal(t, uint32(0x1234), a.SQPSN, "the server sends from the PSN the client expects")
	require.NoError(t, srv.qp.ApplyQPAttr(&a))
	require.NoError(t, sid.Accept(verbs.AcceptParams{QPN: srv.qp.QPN, StartingPSN: rtr.RQPSN, ResponderResources: 1, InitiatorDepth: 1,
		RNRRetryCount: 7, PrivateData: []byte("welcome")}))

	rep := nextCM(t, cli, abi.CMEventConnectResponse)
	assert.Equal(t, srv.qp.QPN, rep.PeerQPN)
	assert.Equal(t, rtr.RQPSN, rep.PeerPSN, "the REP announces the PSN the server expects")
	assert.Equal(t, "welcome", string(rep.Private()[:7]))
	assert.Equal(t, srv.qp.QPN, rep.QPAttr.DestQPNum)
	assert.Equal(t, uint32(0x1234), rep.QPAttr.RQPSN, "the client expects the PSN its REQ announced")
	assert.Equal(t, rtr.RQPSN, rep.QPAttr.SQPSN, "and sends from the one the server expects")
	applyAttr(t, cid, cli.qp, abi.QPSRTR, abi.QPSRTS)
	require.NoError(t, cid.Establish())
	nextCM(t, cli, abi.CMEventEstablished)
	nextCM(t, srv, abi.CMEventEstablished)

	// The connection works: an RDMA WRITE and a SEND.
	copy(cli.buf.Bytes, "written through the CM connection")
	require.NoError(t, cli.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{cli.mr.SGE(0, 33)},
		RemoteAddr: srv.mr.Addr + 100, RKey: srv.mr.RKey}))
	assert.Equal(t, abi.WCSuccess, pollOne(t, cli.cq).Status)
	assert.Equal(t, "written through the CM connection", string(srv.buf.Bytes[100:133]))
	require.NoError(t, srv.qp.PostRecv(&verbs.RecvWR{WrID: 2, SGL: []abi.SGE{srv.mr.SGE(4096, 64)}}))
	require.NoError(t, cli.qp.PostSend(&verbs.SendWR{WrID: 3, Opcode: abi.WRSend, SGL: []abi.SGE{cli.mr.SGE(0, 7)}}))
	assert.Equal(t, abi.WCSuccess, pollOne(t, cli.cq).Status)
	rc := pollOne(t, srv.cq)
	assert.Equal(t, abi.WCSuccess, rc.Status)
	assert.Equal(t, uint32(7), rc.ByteLen)

	info := cmInfo(t, sockA)
	assert.True(t, info.Enabled)
	assert.NotZero(t, info.QP1.Received)
	assert.Len(t, info.IDs, 2)

	// Disconnect.
	require.NoError(t, cid.Disconnect(nil))
	d := nextCM(t, srv, abi.CMEventDisconnected)
	assert.Equal(t, uint32(abi.CMDisconnectRequest), d.Status)
	require.NoError(t, sid.Disconnect(nil))
	d = nextCM(t, cli, abi.CMEventDisconnected)
	assert.Equal(t, uint32(abi.CMDisconnectReply), d.Status)
	nextCM(t, cli, abi.CMEventTimeWaitExit)
	nextCM(t, srv, abi.CMEventTimeWaitExit)
	require.NoError(t, sid.Destroy())
	require.NoError(t, cid.Destroy())

	// A reject with private data.
	cid, err = cli.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: cli.qp.QPN, StartingPSN: 1, ServiceID: testService, DGID: gidA}))
	req = nextCM(t, srv, abi.CMEventConnectRequest)
	rid := srv.c.CMIDFromEvent(&req)
	require.NoError(t, rid.Reject([]byte("go away")))
	require.NoError(t, rid.Destroy())
	rej := nextCM(t, cli, abi.CMEventRejected)
	assert.Equal(t, uint32(cm.RejectConsumerDefined), rej.Status)
	assert.Equal(t, "go away", string(rej.Private()[:7]))
	require.NoError(t, cid.Destroy())

	// Nobody listens: REJ invalid service ID.
	cid, err = cli.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: cli.qp.QPN, ServiceID: testService + 1, DGID: gidA}))
	rej = nextCM(t, cli, abi.CMEventRejected)
	assert.Equal(t, uint32(cm.RejectInvalidServiceID), rej.Status)
	require.NoError(t, cid.Destroy())

	// A peer that never answers (a free loopback address nobody binds):
	// unreachable after the retries, no more than MaxCMRetries of them
	// (counted, not timed: how long they take is up to the scheduler).
	silent := freeLoopback(t).Addr().As16()
	cid, err = cli.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	retxBefore := cmInfo(t, sockB).Retransmissions
	require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: cli.qp.QPN, ServiceID: testService, DGID: silent,
		ResponseTimeout: 8, MaxCMRetries: 2}))
	un := nextCM(t, cli, abi.CMEventUnreachable)
	assert.Equal(t, uint32(unix.ETIMEDOUT), un.Status)
	require.NoError(t, cid.Destroy())
	assert.Equal(t, uint64(2), cmInfo(t, sockB).Retransmissions-retxBefore, "the REQ to the silent peer sent again MaxCMRetries times")

	// Nothing is left but the listener.
	require.NoError(t, lid.Destroy())
	assert.Eventually(t, func() bool {
		a, b := cmInfo(t, sockA), cmInfo(t, sockB)
		return a.Connections == 0 && b.Connections == 0 && a.Total == 0 && b.Total == 0
	}, 5*time.Second, 20*time.Millisecond)
}

// TestCMSlowListener: 300 connect requests reach a listener whose program
// reads nothing for longer than the clients' CM would wait (response
// timeout 18 and 2 retries: about 2.4 s), and more requests than its event
// socket holds. The listening daemon answers each repeated REQ with an
// MRA, as rdma_cm does, so no client gives up; when the program reads it
// gets all 300 requests (none dropped), and every connection it accepts
// is established.
func TestCMSlowListener(t *testing.T) {
	sockA, gidA := cmDaemon(t, "cma")
	sockB, _ := cmDaemon(t, "cmb")
	srv, cli := openCMSide(t, sockA), openCMSide(t, sockB)
	lid, err := srv.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, lid.Listen(testService, 1024))

	const n = 300
	cids := make(map[uint32]*verbs.CMID, n)
	for i := range n {
		cid, err := cli.c.CreateCMID(abi.QPTRC)
		require.NoError(t, err)
		require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: 0x100 + uint32(i), StartingPSN: uint32(i), ServiceID: testService,
			DGID: gidA, ResponseTimeout: 18, MaxCMRetries: 2}))
		cids[cid.Handle] = cid
	}
	// Each REQ is repeated and each repeat answered with an MRA: the
	// client's daemon receives n MADs while the listener reads nothing.
	if !assert.Eventually(t, func() bool { return cmInfo(t, sockB).MADsReceived >= n }, 15*time.Second, 20*time.Millisecond,
		"MRAs for the repeated REQs") {
		ia, ib := cmInfo(t, sockA), cmInfo(t, sockB)
		ia.IDs, ib.IDs = nil, nil
		t.Fatalf("listener's CM %+v\nclients' CM %+v", ia, ib)
	}
	// Past the time the clients would have waited without them.
	time.Sleep(3 * time.Second)

	seen := map[uint32]bool{}
	for range n {
		req := nextCM(t, srv, abi.CMEventConnectRequest)
		require.False(t, seen[req.PeerQPN], "request from QPN %#x twice", req.PeerQPN)
		seen[req.PeerQPN] = true
		sid := srv.c.CMIDFromEvent(&req)
		require.NoError(t, sid.Accept(verbs.AcceptParams{QPN: 0x800 + req.PeerQPN, StartingPSN: 1, ResponderResources: 1, InitiatorDepth: 1}))
		rep := nextCM(t, cli, abi.CMEventConnectResponse)
		cid := cids[rep.CMID]
		require.NotNil(t, cid, "response for CM ID %d", rep.CMID)
		require.NoError(t, cid.Establish())
		nextCM(t, cli, abi.CMEventEstablished)
	}
	for range n {
		nextCM(t, srv, abi.CMEventEstablished)
	}
	for _, sock := range []string{sockA, sockB} {
		a, err := admin.Dial(sock)
		require.NoError(t, err)
		info, err := a.Info()
		a.Close()
		require.NoError(t, err)
		assert.Zero(t, info.Counters["async_events_dropped"], "%s", sock)
	}
	assert.GreaterOrEqual(t, cmInfo(t, sockB).Retransmissions, uint64(n), "every REQ was repeated")
}

// cmTraffic runs a SEND, an RDMA WRITE and an RDMA READ of size bytes
// from one side to the other and checks the bytes that arrive. Each
// side's buffer: the data to send at 0, what arrives at 4096.
func cmTraffic(t *testing.T, from, to *cmSide, size uint32, tag byte) {
	t.Helper()
	fill := func(b []byte, seed byte) {
		for i := range b {
			b[i] = seed + byte(i*7)
		}
	}
	want := make([]byte, size)
	fill(want, tag)
	copy(from.buf.Bytes[:size], want)

	clear(to.buf.Bytes[4096:])
	require.NoError(t, to.qp.PostRecv(&verbs.RecvWR{WrID: 10, SGL: []abi.SGE{to.mr.SGE(4096, size)}}))
	require.NoError(t, from.qp.PostSend(&verbs.SendWR{WrID: 11, Opcode: abi.WRSend, SGL: []abi.SGE{from.mr.SGE(0, size)}}))
	require.Equal(t, abi.WCSuccess, pollOne(t, from.cq).Status, "SEND of %d bytes", size)
	rc := pollOne(t, to.cq)
	require.Equal(t, abi.WCSuccess, rc.Status)
	require.Equal(t, size, rc.ByteLen)
	require.Equal(t, want, to.buf.Bytes[4096:4096+size], "SEND")

	clear(to.buf.Bytes[4096:])
	require.NoError(t, from.qp.PostSend(&verbs.SendWR{WrID: 12, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{from.mr.SGE(0, size)},
		RemoteAddr: to.mr.Addr + 4096, RKey: to.mr.RKey}))
	require.Equal(t, abi.WCSuccess, pollOne(t, from.cq).Status, "WRITE of %d bytes", size)
	require.Equal(t, want, to.buf.Bytes[4096:4096+size], "WRITE")

	fill(want, tag+1)
	copy(to.buf.Bytes[:size], want)
	clear(from.buf.Bytes[4096:])
	require.NoError(t, from.qp.PostSend(&verbs.SendWR{WrID: 13, Opcode: abi.WRRDMARead, SGL: []abi.SGE{from.mr.SGE(4096, size)},
		RemoteAddr: to.mr.Addr, RKey: to.mr.RKey}))
	require.Equal(t, abi.WCSuccess, pollOne(t, from.cq).Status, "READ of %d bytes", size)
	require.Equal(t, want, from.buf.Bytes[4096:4096+size], "READ")
}

// TestCMPeerOffersMore: a daemon offering what Soft-RoCE offers (128
// outstanding READs and atomics each way; its loopback port carries path
// MTU 4096) and one of vrnic's defaults on a port of MTU 1024 (16 each
// way) connect through the CM, each side once the active one. The REQ and
// REP carry Starting PSNs, depths and an MTU the other side did not
// choose; each side takes the PSNs as Linux does (it sends from the PSN
// the peer's message announced and expects the PSN its own announced),
// and programs its QP with at most its own port's MTU and device's
// depths, not refusing what the peer offers. SENDs, WRITEs and READs then
// cross both ways.
func TestCMPeerOffersMore(t *testing.T) {
	sockBig, gidBig := cmDaemon(t, "cmbig", "-max-rd-atomic", "128")
	sockSmall, gidSmall := cmDaemon(t, "cmsmall", "-mtu", "1024")
	big, small := openCMSide(t, sockBig), openCMSide(t, sockSmall)
	for _, s := range []struct {
		side *cmSide
		rd   uint32
	}{{big, 128}, {small, 16}} {
		a, err := s.side.c.QueryDevice()
		require.NoError(t, err)
		require.Equal(t, s.rd, a.MaxQPRdAtom)
		require.Equal(t, s.rd, a.MaxQPInitRdAtom)
	}

	// connect runs the handshake from act to pas (listening on svc) as
	// librdmacm would with the given Starting PSN, depths and path MTU
	// on the active side and depths on the passive side; it returns the
	// attributes each side moved its QP with.
	type attrs struct{ rtr, rts abi.CMQPAttr }
	connect := func(act, pas *cmSide, svc uint64, dgid [16]byte, psn uint32, rr, id uint8, mtu abi.MTU, accRR, accID uint8) (a, p attrs) {
		lid, err := pas.c.CreateCMID(abi.QPTRC)
		require.NoError(t, err)
		t.Cleanup(func() { lid.Destroy() })
		require.NoError(t, lid.Listen(svc, 4))
		cid, err := act.c.CreateCMID(abi.QPTRC)
		require.NoError(t, err)
		t.Cleanup(func() { cid.Destroy() })
		require.NoError(t, act.qp.ToInit(abi.AccessAll, 0))
		require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: act.qp.QPN, StartingPSN: psn, ServiceID: svc, DGID: dgid,
			ResponderResources: rr, InitiatorDepth: id, RetryCount: 7, RNRRetryCount: 7, PathMTU: mtu}))

		req := nextCM(t, pas, abi.CMEventConnectRequest)
		assert.Equal(t, psn, req.PeerPSN)
		assert.Equal(t, rr, req.ResponderResources)
		assert.Equal(t, id, req.InitiatorDepth)
		sid := pas.c.CMIDFromEvent(&req)
		t.Cleanup(func() { sid.Destroy() })
		applyAttr(t, sid, pas.qp, abi.QPSInit)
		var err2 error
		// As librdmacm's rdma_accept (ucma_modify_qp_rtr,
		// ucma_modify_qp_rts): the CM's attributes, with the depths the
		// program accepts with.
		p.rtr, err2 = sid.InitQPAttr(abi.QPSRTR)
		require.NoError(t, err2)
		rtr := p.rtr
		rtr.MaxDestRdAtomic = accRR
		require.NoError(t, pas.qp.ApplyQPAttr(&rtr), "the passive side's RTR")
		p.rts, err2 = sid.InitQPAttr(abi.QPSRTS)
		require.NoError(t, err2)
		rts := p.rts
		rts.MaxRdAtomic = accID
		require.NoError(t, pas.qp.ApplyQPAttr(&rts), "the passive side's RTS")
		assert.Equal(t, p.rtr.RQPSN, req.QPAttr.RQPSN, "the event's RTR attributes")
		assert.Equal(t, psn, p.rts.SQPSN, "the passive side sends from the PSN the REQ announced")
		assert.NotEqual(t, psn, p.rtr.RQPSN, "and expects one of its own")
		require.NoError(t, sid.Accept(verbs.AcceptParams{QPN: pas.qp.QPN, StartingPSN: p.rtr.RQPSN,
			ResponderResources: accRR, InitiatorDepth: accID, RNRRetryCount: 7}))

		rep := nextCM(t, act, abi.CMEventConnectResponse)
		assert.Equal(t, p.rtr.RQPSN, rep.PeerPSN, "the REP announces the PSN the passive side expects")
		assert.Equal(t, accRR, rep.ResponderResources)
		assert.Equal(t, accID, rep.InitiatorDepth)
		applyAttr(t, cid, act.qp, abi.QPSInit)
		a.rtr, err2 = cid.InitQPAttr(abi.QPSRTR)
		require.NoError(t, err2)
		require.NoError(t, act.qp.ApplyQPAttr(&a.rtr), "the active side's RTR")
		a.rts, err2 = cid.InitQPAttr(abi.QPSRTS)
		require.NoError(t, err2)
		require.NoError(t, act.qp.ApplyQPAttr(&a.rts), "the active side's RTS")
		assert.Equal(t, psn, a.rtr.RQPSN, "the active side expects the PSN its REQ announced")
		assert.Equal(t, p.rtr.RQPSN, a.rts.SQPSN, "and sends from the one the REP announced")
		require.NoError(t, cid.Establish())
		nextCM(t, act, abi.CMEventEstablished)
		nextCM(t, pas, abi.CMEventEstablished)
		return a, p
	}

	// The big side connects, offering path MTU 4096 and 128/128; the
	// small side's QP gets 1024 and 16/16, and it accepts with 16/16
	// (what librdmacm's rdma_accept gives without a choice of the
	// program: the offer, at most the device's).
	a, p := connect(big, small, testService, gidSmall, 0xabcdef, 128, 128, abi.MTU4096, 16, 16)
	assert.Equal(t, abi.MTU1024, p.rtr.PathMTU, "the smaller of the REQ's MTU and the port's")
	assert.Equal(t, uint8(16), p.rtr.MaxDestRdAtomic, "128 offered, 16 supported")
	assert.Equal(t, uint8(16), p.rts.MaxRdAtomic, "128 offered, 16 supported")
	assert.Equal(t, abi.MTU4096, a.rtr.PathMTU, "the active side keeps the MTU it offered")
	assert.Equal(t, uint8(16), a.rtr.MaxDestRdAtomic)
	assert.Equal(t, uint8(16), a.rts.MaxRdAtomic)
	// The two QPs' MTUs differ: messages of one packet cross both ways.
	cmTraffic(t, big, small, 1000, 0x10)
	cmTraffic(t, small, big, 1000, 0x20)

	// The small side connects with its defaults (MTU 0: its port's, 1024)
	// and 16/16; the big side accepts with 128/128, as perftest does on
	// Soft-RoCE. The small side's QP gets 16/16 from the REP's 128/128
	// instead of a MODIFY_QP the device refuses. (New QPs: a REQ from a
	// QP the peer holds a connection with is a stale connection.)
	big, small = openCMSide(t, sockBig), openCMSide(t, sockSmall)
	a, p = connect(small, big, testService+1, gidBig, 0x000102, 16, 16, 0, 128, 128)
	assert.Equal(t, abi.MTU1024, p.rtr.PathMTU, "the REQ offered the small port's 1024")
	assert.Equal(t, abi.MTU1024, a.rtr.PathMTU)
	assert.Equal(t, uint8(16), a.rtr.MaxDestRdAtomic, "the REP's initiator depth 128, at most 16")
	assert.Equal(t, uint8(16), a.rts.MaxRdAtomic, "the REP's responder resources 128, at most 16")
	assert.Equal(t, uint8(16), p.rtr.MaxDestRdAtomic, "before the REP: the REQ's initiator depth")
	// Multi-packet messages at MTU 1024, both ways.
	cmTraffic(t, small, big, 4000, 0x30)
	cmTraffic(t, big, small, 4000, 0x40)
}
