package cm

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// svcNet joins Services in one process: a MAD sent to a GID goes to the
// HandleMAD of the Service that has it.
type svcNet struct {
	mu   sync.Mutex
	svcs map[GID]*Service
	sent atomic.Uint64
}

type svcGSI struct {
	n   *svcNet
	gid GID
}

func (g svcGSI) SendMAD(dst [16]byte, mad []byte) error {
	g.n.mu.Lock()
	to := g.n.svcs[GID(dst)]
	g.n.mu.Unlock()
	if to == nil {
		return errors.New("no route")
	}
	g.n.sent.Add(1)
	to.HandleMAD(g.gid, mad)
	return nil
}

func (svcGSI) Stats() admin.QP1Stats { return admin.QP1Stats{} }

func (n *svcNet) add(t *testing.T, ip string, guid uint64) *Service {
	return n.addECE(t, ip, guid, 0)
}

// svcClient is a context: it counts its uid's IDs and hands each event to
// the waiter of its CM ID.
type svcClient struct {
	handle     uint32
	privileged bool
	limit      int

	mu      sync.Mutex
	ids     int
	waiters map[uint32]chan abi.CMEvent
	backlog map[uint32][]abi.CMEvent // events before a waiter
	conns   chan abi.CMEvent         // connect requests (listeners)
}

func newSvcClient(h uint32) *svcClient {
	return &svcClient{handle: h, limit: 1 << 20, waiters: map[uint32]chan abi.CMEvent{},
		backlog: map[uint32][]abi.CMEvent{}, conns: make(chan abi.CMEvent, 1<<14)}
}

func (c *svcClient) CMContext() uint32         { return c.handle }
func (c *svcClient) CMEventsOpen() bool        { return true }
func (c *svcClient) CMMayBindPrivileged() bool { return c.privileged }

func (c *svcClient) CMChargeID(delta int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if delta > 0 && c.ids+delta > c.limit {
		return errnoErr(unix.EAGAIN, "limit")
	}
	c.ids += delta
	return nil
}

func (c *svcClient) CMPostEvent(b []byte) {
	var ev abi.CMEvent
	if _, err := abi.Unmarshal(b, &ev); err != nil {
		panic(err)
	}
	if ev.Type == abi.CMEventConnectRequest {
		c.conns <- ev
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.waiters[ev.CMID]; w != nil {
		w <- ev
		return
	}
	c.backlog[ev.CMID] = append(c.backlog[ev.CMID], ev)
}

// wait returns the next event of CM ID id.
func (c *svcClient) wait(t *testing.T, id uint32) abi.CMEvent {
	c.mu.Lock()
	if q := c.backlog[id]; len(q) > 0 {
		ev := q[0]
		c.backlog[id] = q[1:]
		c.mu.Unlock()
		return ev
	}
	w := c.waiters[id]
	if w == nil {
		w = make(chan abi.CMEvent, 8)
		c.waiters[id] = w
	}
	c.mu.Unlock()
	select {
	case ev := <-w:
		return ev
	case <-time.After(60 * time.Second):
		t.Errorf("CM ID %d: no event", id)
		return abi.CMEvent{}
	}
}

func (c *svcClient) liveIDs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids
}

func cmd(t *testing.T, s *Service, c Client, op abi.Cmd, req any) (any, error) {
	b := make([]byte, abi.Sizeof(req))
	_, err := abi.Marshal(b, req)
	require.NoError(t, err)
	return s.Command(c, op, b)
}

func createID(t *testing.T, s *Service, c Client, qpt abi.QPType) uint32 {
	r, err := cmd(t, s, c, abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: qpt})
	require.NoError(t, err)
	return r.(*abi.RespCMID).CMID
}

// TestServiceConcurrentConnections drives thousands of connections at
// once through two Services, from many goroutines: connects that the
// server accepts (then disconnects from either side) or rejects, and a
// client context released while its requests are in flight. Every
// operation must end as the protocol says, and afterwards the Services
// hold no connection and no CM ID but the listener (run with -race).
func TestServiceConcurrentConnections(t *testing.T) {
	n := &svcNet{svcs: map[GID]*Service{}}
	a := n.add(t, "10.9.0.1", 0xa)
	b := n.add(t, "10.9.0.2", 0xb)
	server := newSvcClient(1)
	sid := ServiceID(PortSpaceTCP, 7000)
	lid := createID(t, b, server, abi.QPTRC)
	_, err := cmd(t, b, server, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: lid, Backlog: 1 << 16, ServiceID: sid})
	require.NoError(t, err)

	const conns = 2000
	// The server: accepts requests from even QPNs, rejects odd ones;
	// answers DREQs.
	var srv sync.WaitGroup
	var accepted, rejected atomic.Int64
	stop := make(chan struct{})
	srv.Go(func() {
		for {
			var ev abi.CMEvent
			select {
			case ev = <-server.conns:
			case <-stop:
				return
			}
			assert.Equal(t, lid, ev.ListenID)
			released := ev.PeerQPN >= 0x800000
			if ev.PeerQPN%2 == 1 {
				_, err := cmd(t, b, server, abi.CmdCMReject, &abi.CmdCMPrivateReq{CMID: ev.CMID})
				assert.NoError(t, err)
				_, err = cmd(t, b, server, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: ev.CMID})
				assert.NoError(t, err)
				rejected.Add(1)
				continue
			}
			_, err := cmd(t, b, server, abi.CmdCMAccept, &abi.CmdCMAcceptReq{CMID: ev.CMID, QPN: ev.PeerQPN + 0x10000})
			if released && err != nil {
				// Its REJ came first: the accept fails, the event
				// follows.
				assert.ErrorIs(t, err, unix.EINVAL)
			} else {
				assert.NoError(t, err)
			}
			if !released {
				accepted.Add(1)
			}
			srv.Go(func() {
				for {
					e := server.wait(t, ev.CMID)
					switch {
					case e.Type == abi.CMEventEstablished:
						if ev.PeerQPN%4 == 2 { // the server disconnects these
							_, err := cmd(t, b, server, abi.CmdCMDisconnect, &abi.CmdCMPrivateReq{CMID: ev.CMID})
							assert.NoError(t, err)
						}
					case e.Type == abi.CMEventDisconnected && e.Status == abi.CMDisconnectRequest:
						_, err := cmd(t, b, server, abi.CmdCMDisconnect, &abi.CmdCMPrivateReq{CMID: ev.CMID})
						assert.NoError(t, err)
					case released && (e.Type == abi.CMEventRejected || e.Type == abi.CMEventUnreachable):
						// The client went before the handshake ended.
						_, err := cmd(t, b, server, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: ev.CMID})
						assert.NoError(t, err)
						return
					case e.Type == abi.CMEventDisconnected || e.Type == abi.CMEventTimeWaitExit:
						if e.Type == abi.CMEventTimeWaitExit {
							_, err := cmd(t, b, server, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: ev.CMID})
							assert.NoError(t, err)
							return
						}
					default:
						t.Errorf("server CM ID %d: unexpected %v", ev.CMID, e.Type)
						return
					}
				}
			})
		}
	})

	clients := []*svcClient{newSvcClient(1), newSvcClient(2), newSvcClient(3), newSvcClient(4)}
	dgid := GIDFromIP(netip.MustParseAddr("10.9.0.2"))
	var wg sync.WaitGroup
	var established, refused atomic.Int64
	for i := range conns {
		wg.Go(func() {
			c := clients[i%len(clients)]
			qpn := uint32(0x100 + i)
			id := createID(t, a, c, abi.QPTRC)
			// A REQ timeout of about 34 s: no REQ is repeated during
			// the test, however slow the machine (a repeat that
			// arrives after the server's TimeWait is a new request).
			_, err := cmd(t, a, c, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id, QPN: qpn, StartingPSN: uint32(i),
				ServiceID: sid, DGID: dgid, RetryCount: 7, RNRRetryCount: 7, CMResponseTimeout: 23})
			if !assert.NoError(t, err) {
				return
			}
			ev := c.wait(t, id)
			switch ev.Type {
			case abi.CMEventRejected:
				assert.Equal(t, uint32(RejectConsumerDefined), ev.Status)
				refused.Add(1)
			case abi.CMEventConnectResponse:
				assert.Equal(t, qpn+0x10000, ev.PeerQPN)
				_, err := cmd(t, a, c, abi.CmdCMEstablish, &abi.CmdHandleReq{Handle: id})
				assert.NoError(t, err)
				assert.Equal(t, abi.CMEventEstablished, c.wait(t, id).Type)
				established.Add(1)
				if qpn%4 != 2 {
					_, err := cmd(t, a, c, abi.CmdCMDisconnect, &abi.CmdCMPrivateReq{CMID: id})
					assert.NoError(t, err)
					assert.Equal(t, abi.CMEventDisconnected, c.wait(t, id).Type)
				} else {
					ev := c.wait(t, id)
					assert.Equal(t, abi.CMEventDisconnected, ev.Type)
					assert.EqualValues(t, abi.CMDisconnectRequest, ev.Status)
					_, err := cmd(t, a, c, abi.CmdCMDisconnect, &abi.CmdCMPrivateReq{CMID: id})
					assert.NoError(t, err)
				}
			default:
				t.Errorf("client CM ID %d: unexpected %v", id, ev.Type)
			}
			_, err = cmd(t, a, c, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: id})
			assert.NoError(t, err)
		})
	}
	// A fifth client connects and is released at once, its requests in
	// every stage of the handshake.
	gone := newSvcClient(5)
	for i := range 200 {
		id := createID(t, a, gone, abi.QPTRC)
		_, err := cmd(t, a, gone, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id, QPN: uint32(0x800000 + 2*i),
			ServiceID: sid, DGID: dgid})
		require.NoError(t, err)
	}
	a.Release(gone)
	wg.Wait()
	assert.EqualValues(t, conns/2, established.Load())
	assert.EqualValues(t, conns/2, refused.Load())
	assert.Zero(t, gone.liveIDs(), "a released client holds no CM ID")
	for _, c := range clients {
		assert.Zero(t, c.liveIDs())
	}
	// The server's side ends with TimeWait; the released client's
	// requests reach it as REJs.
	require.Eventually(t, func() bool {
		return server.liveIDs() == 1 && b.Info().Connections == 0
	}, 30*time.Second, 10*time.Millisecond, "server IDs %d, connections %d", server.liveIDs(), b.Info().Connections)
	close(stop)
	srv.Wait()
	assert.EqualValues(t, conns/2, accepted.Load())
	assert.EqualValues(t, conns/2, rejected.Load())
	info := a.Info()
	assert.Zero(t, info.Total, "client side: no CM ID left")
	assert.Zero(t, info.QP1.Dropped)
}

// TestServiceErrors: a command's error keeps its cause and carries the
// errno the client gets.
func TestServiceErrors(t *testing.T) {
	n := &svcNet{svcs: map[GID]*Service{}}
	s := n.add(t, "10.9.1.1", 1)
	c := newSvcClient(1)
	id := createID(t, s, c, abi.QPTRC)

	errnoOf := func(err error) unix.Errno {
		var en unix.Errno
		require.True(t, errors.As(err, &en), "%v carries an errno", err)
		return en
	}
	_, err := cmd(t, s, c, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: id, ServiceID: ServiceID(PortSpaceTCP, 80)})
	assert.Equal(t, unix.EACCES, errnoOf(err), "%v", err)
	assert.Contains(t, err.Error(), "CAP_NET_BIND_SERVICE")
	c.privileged = true
	_, err = cmd(t, s, c, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: id, ServiceID: ServiceID(PortSpaceTCP, 80)})
	assert.NoError(t, err)
	other := createID(t, s, c, abi.QPTRC)
	_, err = cmd(t, s, c, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: other, ServiceID: ServiceID(PortSpaceTCP, 80)})
	assert.Equal(t, unix.EADDRINUSE, errnoOf(err))
	_, err = cmd(t, s, c, abi.CmdCMAccept, &abi.CmdCMAcceptReq{CMID: other})
	assert.Equal(t, unix.EINVAL, errnoOf(err))
	_, err = cmd(t, s, c, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: 999})
	assert.Equal(t, unix.ENOENT, errnoOf(err))
	_, err = s.Command(c, abi.CmdCMConnect, []byte{1, 2, 3})
	assert.Equal(t, unix.EMSGSIZE, errnoOf(err))

	// The uid's CM ID account.
	c.limit = c.liveIDs()
	_, err = cmd(t, s, c, abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: abi.QPTRC})
	assert.Equal(t, unix.EAGAIN, errnoOf(err))

	// A closed CM says so (not "not supported"), with its cause.
	s.Close()
	_, err = cmd(t, s, c, abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: abi.QPTRC})
	assert.Equal(t, unix.ESHUTDOWN, errnoOf(err))
	assert.ErrorIs(t, err, ErrServiceClosed)
}

func TestPrivilegedPort(t *testing.T) {
	for _, tc := range []struct {
		sid  uint64
		want bool
	}{
		{ServiceID(PortSpaceTCP, 80), true},
		{ServiceID(PortSpaceUDP, 1023), true},
		{ServiceID(PortSpaceTCP, 1024), false},
		{ServiceID(PortSpaceTCP, 0), false},
		{0x1234, false}, // not an rdma_cm service ID
	} {
		assert.Equal(t, tc.want, privilegedPort(tc.sid), fmt.Sprintf("%#x", tc.sid))
	}
}

// TestServiceRequestOfGoneClient: a server that creates the QP of a
// connect request whose client has gone meanwhile (killed right after
// rdma_connect: its context's release rejects the request) gets the QP's
// INIT attributes, as it would have a moment earlier; moving it further,
// or accepting, fails with EINVAL, and the server has its REJECTED event.
func TestServiceRequestOfGoneClient(t *testing.T) {
	n := &svcNet{svcs: map[GID]*Service{}}
	a := n.add(t, "10.9.2.1", 0xa)
	b := n.add(t, "10.9.2.2", 0xb)
	server, client := newSvcClient(1), newSvcClient(2)
	sid := ServiceID(PortSpaceTCP, 7001)
	lid := createID(t, b, server, abi.QPTRC)
	_, err := cmd(t, b, server, abi.CmdCMListen, &abi.CmdCMListenReq{CMID: lid, ServiceID: sid})
	require.NoError(t, err)
	id := createID(t, a, client, abi.QPTRC)
	_, err = cmd(t, a, client, abi.CmdCMConnect, &abi.CmdCMConnectReq{CMID: id, QPN: 0x42, ServiceID: sid,
		DGID: GIDFromIP(netip.MustParseAddr("10.9.2.2")), ResponderResources: 1, InitiatorDepth: 1})
	require.NoError(t, err)
	var req abi.CMEvent
	select {
	case req = <-server.conns:
	case <-time.After(10 * time.Second):
		t.Fatal("no connect request")
	}
	a.Release(client) // the client is killed
	ev := server.wait(t, req.CMID)
	require.Equal(t, abi.CMEventRejected, ev.Type)
	assert.EqualValues(t, RejectTimeout, ev.Status)

	r, err := cmd(t, b, server, abi.CmdCMInitQPAttr, &abi.CmdCMInitQPAttrReq{CMID: req.CMID, QPState: abi.QPSInit})
	require.NoError(t, err, "rdma_create_qp on the request's ID")
	init := r.(*abi.CMQPAttr)
	assert.Equal(t, abi.QPSInit, init.QPState)
	assert.Equal(t, req.QPAttr.QPAccessFlags, init.QPAccessFlags)
	assert.NotZero(t, init.QPAccessFlags&abi.AccessRemoteRead, "the REQ offered responder resources")
	_, err = cmd(t, b, server, abi.CmdCMInitQPAttr, &abi.CmdCMInitQPAttrReq{CMID: req.CMID, QPState: abi.QPSRTR})
	assert.ErrorIs(t, err, unix.EINVAL)
	_, err = cmd(t, b, server, abi.CmdCMAccept, &abi.CmdCMAcceptReq{CMID: req.CMID, QPN: 0x99})
	assert.ErrorIs(t, err, unix.EINVAL)
	_, err = cmd(t, b, server, abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: req.CMID})
	assert.NoError(t, err)
	assert.Equal(t, 1, server.liveIDs())
}
