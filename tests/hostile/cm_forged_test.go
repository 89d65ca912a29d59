package hostile

// CM probes: forged communication-manager MADs against a daemon's QP1.
//
// An off-path host can send UDP datagrams to a daemon's RoCE port from
// its own address (or, where nobody filters, from any address): here a
// plain UDP socket on another loopback address, sending RoCE v2 UD SEND
// ONLY packets to QP1 with a valid ICRC (the UDP link checks it over the
// real addresses and ports). It knows what anyone can learn: the
// daemons' addresses, a device's CA GUID (a hash of its name, and
// QUERY_DEVICE tells it), and here, to make the probes strict, even the
// QPNs and communication IDs of the victim connection, which it could
// only guess. It must not be able to tear the connection down, to learn
// one comm ID from another, or to fill a listener so that genuine clients
// are turned away.
//
// No root needed: two daemons with UDP links on loopback addresses.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/cm"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

var cmfService = cm.ServiceID(cm.PortSpaceTCP, 7471)

// cmfSide is a client of a daemon with an RC QP and its event socket.
type cmfSide struct {
	*rcEnd
	ev   *verbs.AsyncEvents
	guid uint64 // the device's CA GUID
}

func newCMFSide(t *testing.T, socket, name string) *cmfSide {
	t.Helper()
	e := newRCEnd(t, socket, name)
	ev, err := e.c.OpenAsyncEvents()
	require.NoError(t, err)
	t.Cleanup(func() { ev.Close() })
	attr, err := e.c.QueryDevice()
	require.NoError(t, err)
	return &cmfSide{rcEnd: e, ev: ev, guid: attr.NodeGUID}
}

// next returns the next CM event, which must be want.
func (s *cmfSide) next(t *testing.T, want abi.CMEventType) abi.CMEvent {
	t.Helper()
	ev, err := s.ev.GetCM(10 * time.Second)
	require.NoError(t, err, "waiting for %v", want)
	require.Equal(t, want, ev.Type, "event %v status %d", ev.Type, ev.Status)
	return ev
}

// quiet collects the CM events of the next d.
func (s *cmfSide) quiet(t *testing.T, d time.Duration) []abi.CMEvent {
	t.Helper()
	var evs []abi.CMEvent
	for end := time.Now().Add(d); ; {
		left := time.Until(end)
		if left <= 0 {
			return evs
		}
		ev, err := s.ev.GetCM(left)
		if errors.Is(err, verbs.ErrNoEvent) {
			return evs
		}
		require.NoError(t, err)
		evs = append(evs, ev)
	}
}

func cmfApply(t *testing.T, id *verbs.CMID, qp *verbs.QP, states ...abi.QPState) {
	t.Helper()
	for _, st := range states {
		a, err := id.InitQPAttr(st)
		require.NoError(t, err, "attributes for %v", st)
		require.NoError(t, qp.ApplyQPAttr(&a), "move to %v", st)
	}
}

// cmfConnect connects cli to srv's listener at dgid as a librdmacm
// program does and returns both CM IDs.
func cmfConnect(t *testing.T, srv, cli *cmfSide, dgid [16]byte) (sid, cid *verbs.CMID) {
	t.Helper()
	cid, err := cli.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, cli.qp.ToInit(abi.AccessAll, 0))
	require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: cli.qp.QPN, StartingPSN: 0x1234, ServiceID: cmfService,
		DGID: dgid, ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}))
	req := srv.next(t, abi.CMEventConnectRequest)
	sid = srv.c.CMIDFromEvent(&req)
	cmfApply(t, sid, srv.qp, abi.QPSInit, abi.QPSRTR)
	// As rdma_accept: the REP announces the PSN the QP expects (its RTR
	// rq_psn, drawn by the daemon when the REQ came).
	rtr, err := sid.InitQPAttr(abi.QPSRTR)
	require.NoError(t, err)
	require.NoError(t, sid.Accept(verbs.AcceptParams{QPN: srv.qp.QPN, StartingPSN: rtr.RQPSN, ResponderResources: 1,
		InitiatorDepth: 1, RNRRetryCount: 7}))
	cmfApply(t, sid, srv.qp, abi.QPSRTS)
	cli.next(t, abi.CMEventConnectResponse)
	cmfApply(t, cid, cli.qp, abi.QPSRTR, abi.QPSRTS)
	require.NoError(t, cid.Establish())
	cli.next(t, abi.CMEventEstablished)
	srv.next(t, abi.CMEventEstablished)
	return sid, cid
}

// cmfAcceptWith accepts the connect request of id with qp, as
// rdma_accept does (INIT and RTR, the REP, RTS).
func cmfAcceptWith(id *verbs.CMID, qp *verbs.QP) error {
	var rqPSN uint32
	for _, st := range []abi.QPState{abi.QPSInit, abi.QPSRTR} {
		a, err := id.InitQPAttr(st)
		if err != nil {
			return err
		}
		if err := qp.ApplyQPAttr(&a); err != nil {
			return err
		}
		rqPSN = a.RQPSN
	}
	if err := id.Accept(verbs.AcceptParams{QPN: qp.QPN, StartingPSN: rqPSN, ResponderResources: 1, InitiatorDepth: 1,
		RNRRetryCount: 7}); err != nil {
		return err
	}
	a, err := id.InitQPAttr(abi.QPSRTS)
	if err != nil {
		return err
	}
	return qp.ApplyQPAttr(&a)
}

// cmfWrite checks the connection carries data: an RDMA WRITE from cli
// into srv's MR.
func cmfWrite(t *testing.T, srv, cli *cmfSide, round int) {
	t.Helper()
	src := cli.buf.Bytes[:4096]
	for i := range src {
		src[i] = byte(round*13 + i)
	}
	st, err := cli.post(verbs.SendWR{Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{cli.mr.SGE(0, 4096)},
		RemoteAddr: srv.mr.Addr, RKey: srv.mr.RKey}, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, abi.WCSuccess, st, "RDMA WRITE over the connection, round %d", round)
	require.True(t, bytes.Equal(srv.buf.Bytes[:4096], src), "round %d: the server's MR holds other bytes", round)
}

func cmfInfo(t testing.TB, socket string) admin.CMInfo {
	t.Helper()
	a, err := admin.Dial(socket)
	require.NoError(t, err)
	defer a.Close()
	var info admin.CMInfo
	for start := 0; ; {
		b, err := a.Call(admin.CMCmd, admin.Request{Start: start})
		require.NoError(t, err)
		var page admin.CMInfo
		require.NoError(t, json.Unmarshal(b, &page))
		ids := append(info.IDs, page.IDs...)
		info, info.IDs = page, ids
		if page.Next == 0 {
			return info
		}
		start = page.Next
	}
}

// cmfCounters returns the CM's counters without its IDs (one page past
// them all: cheap however many IDs the daemon holds).
func cmfCounters(t testing.TB, socket string) admin.CMInfo {
	t.Helper()
	a, err := admin.Dial(socket)
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Call(admin.CMCmd, admin.Request{Start: math.MaxInt32})
	require.NoError(t, err)
	var info admin.CMInfo
	require.NoError(t, json.Unmarshal(b, &info))
	return info
}

// cmfConn returns the CM ID of the connection of role ("active",
// "passive") in the daemon's operator view.
func cmfConn(t *testing.T, socket, role string) admin.CMIDInfo {
	t.Helper()
	for _, id := range cmfInfo(t, socket).IDs {
		if id.Role == role && id.Conn != 0 {
			return id
		}
	}
	t.Fatalf("no %s connection in %s", role, socket)
	return admin.CMIDInfo{}
}

// forger sends CM MADs to daemons' QP1 from a UDP socket of its own, as
// RoCE v2 UD SEND ONLY packets with a valid ICRC, and reads what comes
// back to that socket.
type forger struct {
	conn  *net.UDPConn
	local netip.AddrPort
	psn   uint32
	buf   []byte
	rng   *rand.Rand
	sent  int
}

func newForger(t testing.TB, addr netip.Addr, seed uint64) *forger {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, launch.RoCEPort)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetWriteBuffer(4<<20))
	require.NoError(t, c.SetReadBuffer(4<<20))
	return &forger{conn: c, local: netip.AddrPortFrom(addr, launch.RoCEPort),
		buf: make([]byte, roce.MaxHeadroom+cm.MADLen+roce.MaxTailroom), rng: rand.New(rand.NewPCG(seed, 7))}
}

// frame builds the UDP payload carrying mad from f to QP1 at dst.
func (f *forger) frame(dst netip.Addr, mad []byte) []byte {
	p := roce.Path{Mode: roce.ModeUDP, Src: f.local.Addr(), Dst: dst, SrcPort: f.local.Port(), DstPort: launch.RoCEPort}
	h := roce.Headers{
		BTH:  roce.BTHFields{Opcode: roce.OpUDSendOnly, PKey: cm.DefaultPKey, DestQP: cm.QP1, PSN: f.psn & 0xffffff},
		DETH: roce.DETHFields{QKey: cm.QP1QKey, SrcQP: cm.QP1},
	}
	f.psn++
	hr := p.Headroom(h.BTH.Opcode)
	copy(f.buf[hr:], mad)
	b, err := p.Build(f.buf, hr, len(mad), &h)
	if err != nil {
		panic(err)
	}
	return b
}

// send sends msg to QP1 at dst, with a transaction ID of its own.
func (f *forger) send(t testing.TB, dst netip.Addr, msg cm.Message) {
	t.Helper()
	mad, err := cm.Marshal(f.rng.Uint64(), 0, msg)
	require.NoError(t, err)
	_, err = f.conn.WriteToUDPAddrPort(f.frame(dst, mad), netip.AddrPortFrom(dst, launch.RoCEPort))
	require.NoError(t, err)
	if f.sent++; f.sent%200 == 0 {
		// QP1 holds 512 received MADs: let it take them, so that no
		// probe is lost to a full receive queue.
		time.Sleep(5 * time.Millisecond)
	}
}

// recv returns the next CM message that reaches f's socket within d
// (nil when none does).
func (f *forger) recv(t testing.TB, d time.Duration) cm.Message {
	t.Helper()
	b := make([]byte, 2048)
	require.NoError(t, f.conn.SetReadDeadline(time.Now().Add(d)))
	for {
		n, _, err := f.conn.ReadFromUDPAddrPort(b)
		if isTimeout(err) {
			return nil
		}
		require.NoError(t, err)
		// BTH (12) and DETH (8), the MAD, the ICRC.
		if n != roce.BTHLen+8+cm.MADLen+roce.ICRCLen {
			continue
		}
		_, m, err := cm.Decode(b[roce.BTHLen+8 : roce.BTHLen+8+cm.MADLen])
		if err == nil {
			return m
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// forgedREQ is a REQ as rdma_cm sends it, from the forger's address, for
// the peer QP qpn of the CA guid.
func forgedREQ(f *forger, commID, qpn uint32, guid uint64, dst netip.Addr) *cm.REQ {
	return &cm.REQ{
		LocalCommID: commID, ServiceID: cmfService, LocalCAGUID: guid, LocalQPN: qpn,
		ResponderResources: 1, InitiatorDepth: 1, RemoteCMResponseTimeout: 20, TransportServiceType: cm.TransportRC,
		StartingPSN: 77, LocalCMResponseTimeout: 20, RetryCount: 7, PKey: cm.DefaultPKey, PathMTU: roce.MTU1024,
		RNRRetryCount: 7, MaxCMRetries: 15,
		Primary: cm.Path{LocalLID: cm.PermissiveLID, RemoteLID: cm.PermissiveLID,
			LocalGID: cm.GIDFromIP(f.local.Addr()), RemoteGID: cm.GIDFromIP(dst), HopLimit: 64, LocalACKTimeout: 17},
	}
}

// cmfPair is a victim connection between a client of daemon C and a
// listener's client of daemon S, and a forger on a third address.
type cmfPair struct {
	dS, dC   *udpDaemon
	srv, cli *cmfSide
	lid      *verbs.CMID
	sid, cid *verbs.CMID
	f        *forger
	round    int
}

func newCMFPair(t *testing.T) *cmfPair {
	rundir := t.TempDir()
	var addrs [3]netip.Addr
	for i := range addrs {
		a, err := launch.FreeLoopback()
		require.NoError(t, err)
		addrs[i] = a
	}
	p := &cmfPair{}
	p.dS = startUDPDaemon(t, rundir, "cmfS", netip.AddrPortFrom(addrs[0], launch.RoCEPort))
	p.dC = startUDPDaemon(t, rundir, "cmfC", netip.AddrPortFrom(addrs[1], launch.RoCEPort))
	p.srv, p.cli = newCMFSide(t, p.dS.socket, "server"), newCMFSide(t, p.dC.socket, "client")
	var err error
	p.lid, err = p.srv.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	require.NoError(t, p.lid.Listen(cmfService, 128))
	p.sid, p.cid = cmfConnect(t, p.srv, p.cli, p.dS.local.Addr().As16())
	p.f = newForger(t, addrs[2], hostileSeed(t))
	p.check(t, "the handshake")
	return p
}

// check: the victim connection is ESTABLISHED on both daemons, no CM
// event reached either program for it, and data still flows. Connect
// requests for the listener (from the forger) are rejected; events of
// other CM IDs (a flood's) are not the victim's.
func (p *cmfPair) check(t *testing.T, after string) {
	t.Helper()
	for _, s := range []*cmfSide{p.srv, p.cli} {
		for _, ev := range s.quiet(t, time.Second) {
			switch {
			case ev.CMID == p.sid.Handle || ev.CMID == p.cid.Handle:
				t.Errorf("after %s: the victim got CM event %v (status %d)", after, ev.Type, ev.Status)
			case ev.Type == abi.CMEventConnectRequest:
				id := s.c.CMIDFromEvent(&ev)
				_ = id.Reject(nil)
				_ = id.Destroy()
			}
		}
	}
	assert.Equal(t, "ESTABLISHED", cmfConn(t, p.dS.socket, "passive").State, "after %s: the server's connection", after)
	assert.Equal(t, "ESTABLISHED", cmfConn(t, p.dC.socket, "active").State, "after %s: the client's connection", after)
	p.round++
	cmfWrite(t, p.srv, p.cli, p.round)
}

// TestCMForgedREQStaleConnection: a REQ naming the victim's QPN and CA
// GUID, as a restarted peer's would (Linux: REJ stale connection and a
// DREQ for the old connection), but from another address, leaves the
// connection up; sent to the listening daemon it is a new connect
// request from that address, sent to the client's daemon (no listener)
// it is rejected.
func TestCMForgedREQStaleConnection(t *testing.T) {
	p := newCMFPair(t)
	sAddr, cAddr := p.dS.local.Addr(), p.dC.local.Addr()
	p.f.send(t, sAddr, forgedREQ(p.f, 0x1000, p.cli.qp.QPN, p.cli.guid, sAddr))
	p.check(t, "a forged REQ to the server naming the client's QP")
	p.f.send(t, cAddr, forgedREQ(p.f, 0x2000, p.srv.qp.QPN, p.srv.guid, cAddr))
	p.check(t, "a forged REQ to the client naming the server's QP")
	// A forged REP and REJ for the active side's comm ID from the
	// forger's address: nothing either.
	c := cmfConn(t, p.dC.socket, "active")
	s := cmfConn(t, p.dS.socket, "passive")
	p.f.send(t, cAddr, &cm.REP{LocalCommID: s.Conn, RemoteCommID: c.Conn, LocalQPN: 0x4444, LocalCAGUID: p.srv.guid})
	p.f.send(t, cAddr, &cm.REJ{LocalCommID: s.Conn, RemoteCommID: c.Conn, Reason: cm.RejectConsumerDefined,
		MessageRejected: cm.MsgOther})
	p.f.send(t, sAddr, &cm.REJ{LocalCommID: c.Conn, RemoteCommID: s.Conn, Reason: cm.RejectConsumerDefined,
		MessageRejected: cm.MsgOther})
	p.check(t, "a forged REP and REJs with the right comm IDs")
}

// TestCMForgedDREQ: DREQs with guessed comm IDs do nothing: 10,000 random
// pairs, the neighbours of a comm ID the forger got for a connection of
// its own just after the victim's (comm IDs are not sequential), and the
// victim's true comm IDs and QPN from the forger's address.
func TestCMForgedDREQ(t *testing.T) {
	p := newCMFPair(t)
	sAddr := p.dS.local.Addr()
	c := cmfConn(t, p.dC.socket, "active")
	s := cmfConn(t, p.dS.socket, "passive")

	// The forger's own connection to the listener: the REP tells it the
	// server's comm ID for it; it rejects the REP.
	p.f.send(t, sAddr, forgedREQ(p.f, 0x3000, 0x5555, 0x1111, sAddr))
	req := p.srv.next(t, abi.CMEventConnectRequest)
	fid := p.srv.c.CMIDFromEvent(&req)
	require.NoError(t, fid.Accept(verbs.AcceptParams{QPN: 0x6666, StartingPSN: 1}))
	var own uint32
	for own == 0 {
		m := p.f.recv(t, 5*time.Second)
		require.NotNil(t, m, "no REP for the forger's own REQ")
		if rep, ok := m.(*cm.REP); ok {
			own = rep.LocalCommID
		}
	}
	p.f.send(t, sAddr, &cm.REJ{LocalCommID: 0x3000, RemoteCommID: own, Reason: cm.RejectConsumerDefined, MessageRejected: cm.MsgREP})
	rej := p.srv.next(t, abi.CMEventRejected)
	require.Equal(t, fid.Handle, rej.CMID)
	require.NoError(t, fid.Destroy())
	t.Logf("victim comm IDs: client %#x, server %#x; the forger's connection got %#x", c.Conn, s.Conn, own)

	dreq := func(server uint32) {
		p.f.send(t, sAddr, &cm.DREQ{LocalCommID: c.Conn, RemoteCommID: server, RemoteQPN: p.srv.qp.QPN})
	}
	// Neighbours: ±1024, and the IDs a counter under an XOR gives
	// (n ^ (n+1) is a run of low ones).
	for d := uint32(1); d <= 1024; d++ {
		dreq(own + d)
		dreq(own - d)
	}
	for b := 1; b <= 32; b++ {
		dreq(own ^ uint32(1<<b-1))
	}
	p.check(t, "DREQs for the neighbours of another connection's comm ID")
	rng := rand.New(rand.NewPCG(hostileSeed(t), 9))
	for range 10000 {
		p.f.send(t, sAddr, &cm.DREQ{LocalCommID: rng.Uint32(), RemoteCommID: rng.Uint32(), RemoteQPN: p.srv.qp.QPN})
	}
	p.check(t, "10,000 DREQs with random comm IDs")
	// Even the true comm IDs and QPN from another address do nothing.
	dreq(s.Conn)
	p.f.send(t, p.dC.local.Addr(), &cm.DREQ{LocalCommID: s.Conn, RemoteCommID: c.Conn, RemoteQPN: p.cli.qp.QPN})
	p.check(t, "DREQs with the victim's comm IDs from another address")
}

// TestCMCommIDsNotSequential: the comm IDs of 1,000 consecutive
// connections to one listener (learned from the REPs) are not related:
// no two consecutive ones differ by less than 256 or in fewer than 3
// bits, and every bit is set in about half of them.
func TestCMCommIDsNotSequential(t *testing.T) {
	p := newCMFPair(t)
	sAddr := p.dS.local.Addr()
	const n = 1000
	ids := make([]uint32, 0, n)
	for i := range n {
		p.f.send(t, sAddr, forgedREQ(p.f, uint32(0x10000+i), uint32(0x7000+i), 0x2222, sAddr))
		req := p.srv.next(t, abi.CMEventConnectRequest)
		id := p.srv.c.CMIDFromEvent(&req)
		require.NoError(t, id.Accept(verbs.AcceptParams{QPN: uint32(0x8000 + i), StartingPSN: 1}))
		var rep *cm.REP
		for rep == nil {
			m := p.f.recv(t, 5*time.Second)
			require.NotNil(t, m, "no REP for REQ %d", i)
			rep, _ = m.(*cm.REP)
		}
		ids = append(ids, rep.LocalCommID)
		p.f.send(t, sAddr, &cm.REJ{LocalCommID: uint32(0x10000 + i), RemoteCommID: rep.LocalCommID,
			Reason: cm.RejectConsumerDefined, MessageRejected: cm.MsgREP})
		p.srv.next(t, abi.CMEventRejected)
		require.NoError(t, id.Destroy())
	}
	var ones [32]int
	var close []string
	for i, id := range ids {
		for b := range 32 {
			ones[b] += int(id >> b & 1)
		}
		if i == 0 {
			continue
		}
		a, b := ids[i-1], id
		if min(a-b, b-a) < 256 || bits.OnesCount32(a^b) <= 2 {
			close = append(close, fmt.Sprintf("%#x→%#x", a, b))
		}
	}
	assert.Zero(t, len(close), "%d of %d consecutive comm IDs are close (first: %v)", len(close), n-1, close[:min(len(close), 5)])
	var skewed []string
	for b, c := range ones {
		// 1,000 fair coins: 500 ± 5 standard deviations.
		if c < n/2-80 || c > n/2+80 {
			skewed = append(skewed, fmt.Sprintf("bit %d: %d", b, c))
		}
	}
	assert.Zero(t, len(skewed), "bits set in far from half of %d comm IDs: %v", n, skewed)
}

// cmfServer is a listening program that accepts every request, as a
// server does: the genuine client's (from gen's address) with its QP
// qp, the others with made-up QPNs (as if it created a QP for each); it
// destroys the IDs the CM gives up on.
type cmfServer struct {
	accepted, refused, ended atomic.Int64
	genuineUp                atomic.Bool
	stop                     chan struct{}
	wg                       sync.WaitGroup
}

func startCMFServer(t *testing.T, srv *cmfSide, gen netip.Addr, qp *verbs.QP) *cmfServer {
	s := &cmfServer{stop: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		qpn := uint32(0x100000)
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			ev, err := srv.ev.GetCM(50 * time.Millisecond)
			if errors.Is(err, verbs.ErrNoEvent) {
				continue
			}
			if err != nil {
				t.Errorf("server program: %v", err)
				return
			}
			id := srv.c.CMIDFromEvent(&ev)
			switch ev.Type {
			case abi.CMEventConnectRequest:
				var err error
				if netip.AddrFrom16(ev.PeerGID).Unmap() == gen {
					err = cmfAcceptWith(id, qp)
				} else {
					qpn++
					err = id.Accept(verbs.AcceptParams{QPN: qpn, StartingPSN: 1})
				}
				if err != nil {
					// Shed before the program got to it: the
					// REJECTED event follows.
					s.refused.Add(1)
				} else {
					s.accepted.Add(1)
				}
			case abi.CMEventEstablished:
				if netip.AddrFrom16(ev.PeerGID).Unmap() == gen {
					s.genuineUp.Store(true)
				}
			case abi.CMEventRejected, abi.CMEventUnreachable:
				s.ended.Add(1)
				_ = id.Destroy()
			}
		}
	}()
	t.Cleanup(func() { close(s.stop); s.wg.Wait() })
	return s
}

// cmfFlooders are UDP sockets on n loopback addresses nobody answers on.
func cmfFlooders(t *testing.T, n int) []*forger {
	var fs []*forger
	for i := range n {
		a, err := launch.FreeLoopback()
		require.NoError(t, err)
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
		fs = append(fs, &forger{conn: c, local: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()),
			buf: make([]byte, roce.MaxHeadroom+cm.MADLen+roce.MaxTailroom), rng: rand.New(rand.NewPCG(uint64(i), 3))})
	}
	return fs
}

// flood sends n forged REQs for service to dst, round robin from fs, in
// bursts of burst every gap, with short timeouts (their REPs are given up
// on within about a second).
func cmfFlood(fs []*forger, dst netip.Addr, service uint64, first, n, burst int, gap time.Duration) {
	for i := range n {
		f := fs[i%len(fs)]
		req := forgedREQ(f, uint32(first+i), uint32(0x9000+first+i), 0x3333, dst)
		req.ServiceID = service
		req.LocalCMResponseTimeout, req.MaxCMRetries = 16, 3 // 256 ms, 4 REPs
		mad, err := cm.Marshal(uint64(i), 0, req)
		if err != nil {
			panic(err)
		}
		_, _ = f.conn.WriteToUDPAddrPort(f.frame(dst, mad), netip.AddrPortFrom(dst, launch.RoCEPort))
		if i%burst == burst-1 {
			time.Sleep(gap)
		}
	}
}

// TestCMForgedREQFlood: forged REQs from 64 loopback addresses nobody
// answers on, to a listener (backlog 128) whose program accepts every
// request, as a server does, while a genuine client connects with
// rdma_cm's timeouts (4.6 s per REQ, 73.7 s in all). The daemon never
// holds more half-open connections than the backlog and holds none once
// the flood's REPs have gone unanswered.
//
//   - 10,000 REQs as fast as the socket sends them: the program falls
//     far behind, the daemon sheds the oldest unanswered requests, the
//     genuine one among them if the program is too slow for it, silently;
//     the genuine client's repeated REQ gets through: it is established
//     within its normal timeout, never rejected.
//   - 6,000 REQs at 2,000 a second, a pace the program keeps up with on
//     a quiet machine: it accepts forged requests, and the daemon sheds
//     the oldest of those REP_SENT connections (no RTU ever comes); the
//     genuine client is established (at its first REQ when the program
//     keeps up; on a loaded machine at a later one, within its normal
//     timeout all the same).
func TestCMForgedREQFlood(t *testing.T) {
	p := newCMFPair(t)
	sAddr := p.dS.local.Addr()
	const backlog = 128
	lid, err := p.srv.c.CreateCMID(abi.QPTRC)
	require.NoError(t, err)
	const service = 0x0000000001060000 | 9000
	require.NoError(t, lid.Listen(service, backlog))
	fs := cmfFlooders(t, 64)

	var maxHalfOpen atomic.Int64
	watch := make(chan struct{})
	var wgw sync.WaitGroup
	wgw.Add(1)
	go func() {
		defer wgw.Done()
		for {
			if h := int64(cmfCounters(t, p.dS.socket).HalfOpen); h > maxHalfOpen.Load() {
				maxHalfOpen.Store(h)
			}
			select {
			case <-watch:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	defer func() { close(watch); wgw.Wait() }()

	for i, c := range []struct {
		name          string
		n, burst      int
		gap, within   time.Duration
		wantAcccepted bool
	}{
		{"as fast as it goes", 10000, 256, time.Millisecond, 74 * time.Second, false},
		{"2,000 a second", 6000, 20, 10 * time.Millisecond, 74 * time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			gSrv := newRCEnd(t, p.dS.socket, "server-genuine")
			gCli := newCMFSide(t, p.dC.socket, "client-genuine")
			srv := startCMFServer(t, p.srv, p.dC.local.Addr(), gSrv.qp)
			before := cmfInfo(t, p.dS.socket)
			floodDone := make(chan struct{})
			go func() {
				defer close(floodDone)
				cmfFlood(fs, sAddr, service, 0x100000*(i+1), c.n, c.burst, c.gap)
			}()
			time.Sleep(time.Duration(c.n/c.burst) * c.gap / 3)

			start := time.Now()
			cid, err := gCli.c.CreateCMID(abi.QPTRC)
			require.NoError(t, err)
			require.NoError(t, cid.Connect(verbs.ConnectParams{QPN: gCli.qp.QPN, StartingPSN: 0x4321, ServiceID: service,
				DGID: sAddr.As16(), ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}))
			ev, err := gCli.ev.GetCM(80 * time.Second)
			require.NoError(t, err)
			require.Equal(t, abi.CMEventConnectResponse, ev.Type, "the genuine client got %v (status %d)", ev.Type, ev.Status)
			took := time.Since(start)
			cmfApply(t, cid, gCli.qp, abi.QPSInit, abi.QPSRTR, abi.QPSRTS)
			require.NoError(t, cid.Establish())
			gCli.next(t, abi.CMEventEstablished)
			require.Eventually(t, srv.genuineUp.Load, 10*time.Second, 10*time.Millisecond, "the server never saw the genuine client established")
			t.Logf("the genuine client connected in %v", took)
			assert.Less(t, took, c.within)
			cmfWrite(t, &cmfSide{rcEnd: gSrv}, gCli, 1)
			<-floodDone

			// Every forged connection ends: its REP goes unanswered (4 ×
			// 256 ms) or it was shed.
			require.Eventually(t, func() bool { return cmfCounters(t, p.dS.socket).HalfOpen == 0 }, 30*time.Second, 50*time.Millisecond,
				"half-open connections left: %d", cmfCounters(t, p.dS.socket).HalfOpen)
			info := cmfInfo(t, p.dS.socket)
			t.Logf("%d forged REQs: the program accepted %d, was too late for %d, saw %d end; most half-open %d, shed %d, expired %d; QP1: received %d, no receive slot %d, sent %d, send dropped %d, overflow %d",
				c.n, srv.accepted.Load(), srv.refused.Load(), srv.ended.Load(), maxHalfOpen.Load(), info.Shed-before.Shed,
				info.Expired-before.Expired, info.QP1.Received-before.QP1.Received, info.QP1.NoRecvSlot-before.QP1.NoRecvSlot,
				info.QP1.Sent-before.QP1.Sent, info.QP1.SendDropped-before.QP1.SendDropped, info.QP1.Overflow-before.QP1.Overflow)
			assert.LessOrEqual(t, maxHalfOpen.Load(), int64(backlog), "half-open connections above the listener's bound")
			assert.NotZero(t, info.Shed-before.Shed, "the flood shed nothing")
			if c.wantAcccepted {
				// How many depends on how much CPU the program gets
				// (all of them on a quiet machine, a few hundred next
				// to two CPU hogs); none would mean it never got to
				// answer a forged request before it was shed.
				assert.NotZero(t, srv.accepted.Load(), "the program accepted no forged request")
			}
			require.NoError(t, cid.Destroy())
		})
	}
	p.check(t, "the floods")
}

// TestCMCloseBurstREJs: eight programs each with 4,096 connect requests
// pending (REQ_SENT, to a peer that never answers) exit at once: the
// daemon sends a REJ for every one of the 32,768 connections, far more
// than QP1's send slots and backlog hold, and the peer receives every
// one (QP1 used to drop those past its backlog: they are never sent
// again).
func TestCMCloseBurstREJs(t *testing.T) {
	rundir := t.TempDir()
	var addrs [2]netip.Addr
	for i := range addrs {
		a, err := launch.FreeLoopback()
		require.NoError(t, err)
		addrs[i] = a
	}
	d := startUDPDaemon(t, rundir, "cmfB", netip.AddrPortFrom(addrs[0], launch.RoCEPort))
	f := newForger(t, addrs[1], 1)
	if raw, err := f.conn.SyscallConn(); err == nil {
		// As root, a receive buffer that holds the whole burst.
		_ = raw.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, 256<<20)
		})
	}
	var reqs, rejs atomic.Int64
	ids := make(chan uint32, 1<<16)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			switch m := f.recv(t, 100*time.Millisecond).(type) {
			case *cm.REQ:
				reqs.Add(1)
			case *cm.REJ:
				if rejs.Add(1); m.Reason == cm.RejectTimeout {
					ids <- m.LocalCommID
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()

	const programs, perProgram = 8, 4096
	ctxs := make([]*verbs.Context, programs)
	for i := range ctxs {
		c, err := verbs.Open(d.socket, verbs.WithClientName(fmt.Sprintf("closer-%d", i)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		ev, err := c.OpenAsyncEvents()
		require.NoError(t, err)
		t.Cleanup(func() { ev.Close() })
		for j := range perProgram {
			id, err := c.CreateCMID(abi.QPTRC)
			require.NoError(t, err)
			// A REQ timeout of about 17 minutes: none is repeated
			// during the test, however slow the machine (a repeat may
			// be dropped by QP1's bounded backlog, which the test
			// checks never happens to a MAD of the close).
			require.NoError(t, id.Connect(verbs.ConnectParams{QPN: uint32(0x10000 + i*perProgram + j), ServiceID: cmfService,
				DGID: addrs[1].As16(), ResponseTimeout: 28, MaxCMRetries: 1}))
		}
		ctxs[i] = c
	}
	require.Eventually(t, func() bool { return cmfCounters(t, d.socket).Connections == programs*perProgram },
		60*time.Second, 100*time.Millisecond)
	before := cmfCounters(t, d.socket).QP1
	var wg sync.WaitGroup
	for _, c := range ctxs {
		wg.Add(1)
		go func() { defer wg.Done(); c.Close() }()
	}
	wg.Wait()
	assert.Eventually(t, func() bool { return rejs.Load() == programs*perProgram }, 60*time.Second, 10*time.Millisecond)
	require.Equal(t, int64(programs*perProgram), rejs.Load(), "REJs the peer received")
	after := cmfCounters(t, d.socket).QP1
	close(ids)
	seen := map[uint32]bool{}
	for id := range ids {
		seen[id] = true
	}
	assert.Len(t, seen, programs*perProgram, "a REJ (timeout) for every connection")
	assert.Equal(t, before.SendDropped, after.SendDropped, "QP1 dropped MADs of the close")
	t.Logf("REQs received %d (QP1 refused %d of the connect burst, to be sent again); REJs received %d; QP1 queued %d past its bound",
		reqs.Load(), before.SendDropped, rejs.Load(), after.Overflow-before.Overflow)
}
