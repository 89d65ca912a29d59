package cm

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vrnic/vrnic/roce"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// packet is a MAD on the fake network.
type packet struct {
	from, to GID
	mad      []byte
}

func (p packet) attr() AttrID { return AttrID(binary.BigEndian.Uint16(p.mad[16:])) }

// fakeNet connects Managers. Sends are queued; run delivers them (and
// whatever they cause) until the network is quiet. filter decides how
// many copies of each packet arrive (0 drops it).
type fakeNet struct {
	t      *testing.T
	clock  *FakeClock
	mu     sync.Mutex
	queue  []packet
	nodes  map[GID]*node
	filter func(p packet, seq int) int
	// trace lists "A>B ATTR" for every packet sent, and a "-" suffix
	// for those the filter dropped.
	trace []string
	sent  int
}

type node struct {
	name   string
	gid    GID
	m      *Manager
	net    *fakeNet
	mu     sync.Mutex
	events []Event
	// auto answers like rdma_cm: accept a connect request, send the RTU
	// after a REP, answer a DREQ.
	auto bool
	// accept is what auto accepts with.
	accept AcceptParams
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newNet(t *testing.T) *fakeNet {
	return &fakeNet{t: t, clock: NewFakeClock(t0), nodes: map[GID]*node{}}
}

func (n *fakeNet) add(name, ip string, guid uint64, auto bool) *node {
	return n.addWith(name, ip, guid, auto, nil)
}

// addWith is add with the Manager's configuration changed by cfg.
func (n *fakeNet) addWith(name, ip string, guid uint64, auto bool, cfg func(*Config)) *node {
	nd := &node{name: name, gid: GIDFromIP(netip.MustParseAddr(ip)), net: n, auto: auto,
		accept: AcceptParams{QPN: 0x200, StartingPSN: 0x222222, ResponderResources: 4, InitiatorDepth: 4,
			RNRRetryCount: 7}}
	c := Config{
		CAGUID: guid, AckDelay: RXEAckDelay, Clock: n.clock, Seed: guid,
		Sender:  SenderFunc(func(dst GID, mad []byte) error { n.send(nd.gid, dst, mad); return nil }),
		Handler: nd.handle,
	}
	if cfg != nil {
		cfg(&c)
	}
	m, err := NewManager(c)
	require.NoError(n.t, err)
	nd.m = m
	n.nodes[nd.gid] = nd
	n.t.Cleanup(m.Close)
	return nd
}

func (n *fakeNet) send(from, to GID, mad []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue = append(n.queue, packet{from: from, to: to, mad: append([]byte(nil), mad...)})
}

func (n *fakeNet) name(g GID) string {
	if nd := n.nodes[g]; nd != nil {
		return nd.name
	}
	return g.String()
}

// run delivers queued packets in order until none is left.
func (n *fakeNet) run() {
	for {
		n.mu.Lock()
		if len(n.queue) == 0 {
			n.mu.Unlock()
			return
		}
		p := n.queue[0]
		n.queue = n.queue[1:]
		seq := n.sent
		n.sent++
		copies := 1
		if n.filter != nil {
			copies = n.filter(p, seq)
		}
		tr := fmt.Sprintf("%s>%s %v", n.name(p.from), n.name(p.to), p.attr())
		if copies == 0 {
			tr += "-"
		}
		n.trace = append(n.trace, tr)
		n.mu.Unlock()
		for range copies {
			if nd := n.nodes[p.to]; nd != nil {
				_ = nd.m.HandleMAD(p.from, p.mad)
			}
		}
	}
}

// take returns the queued packets without delivering them.
func (n *fakeNet) take() []packet {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.queue
	n.queue = nil
	return q
}

func (n *fakeNet) deliver(p packet) {
	n.mu.Lock()
	n.trace = append(n.trace, fmt.Sprintf("%s>%s %v", n.name(p.from), n.name(p.to), p.attr()))
	n.mu.Unlock()
	_ = n.nodes[p.to].m.HandleMAD(p.from, p.mad)
}

// advance moves the clock by d and lets the network settle.
func (n *fakeNet) advance(d time.Duration) {
	n.clock.Advance(d)
	n.run()
}

// drain returns the trace so far and clears it.
func (n *fakeNet) drain() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	tr := n.trace
	n.trace = nil
	return tr
}

// dropFirst returns a filter dropping the first packet of attr.
func dropFirst(attr AttrID) func(packet, int) int {
	done := false
	return func(p packet, _ int) int {
		if p.attr() == attr && !done {
			done = true
			return 0
		}
		return 1
	}
}

func (nd *node) handle(ev Event) {
	nd.mu.Lock()
	nd.events = append(nd.events, ev)
	nd.mu.Unlock()
	if !nd.auto {
		return
	}
	var err error
	switch ev.Type {
	case EventConnectRequest:
		err = nd.m.Accept(ev.Conn, nd.accept)
	case EventREPReceived:
		err = nd.m.RTU(ev.Conn, nil)
	case EventDisconnectRequest:
		err = nd.m.Disconnect(ev.Conn, nil)
	}
	require.NoError(nd.net.t, err, "%s: auto answer to %v", nd.name, ev.Type)
}

// takeEvents returns the events so far and clears them.
func (nd *node) takeEvents() []Event {
	nd.mu.Lock()
	defer nd.mu.Unlock()
	ev := nd.events
	nd.events = nil
	return ev
}

func types(evs []Event) []EventType {
	var ts []EventType
	for _, e := range evs {
		ts = append(ts, e.Type)
	}
	return ts
}

// connectParams are what rdma_cm sends from a to b over RoCE v2 IPv4.
func connectParams(a, b *node, qpn uint32) ConnectParams {
	src := netip.AddrPortFrom(a.gid.IP(), 43000)
	dst := netip.AddrPortFrom(b.gid.IP(), 7471)
	h := CMAHeader{Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port()}
	pd, err := CMAPrivateData(h, []byte("hello"))
	if err != nil {
		panic(err)
	}
	return ConnectParams{
		Path:      RoCEPath(src, dst, roce.MTU1024, 3, 64, 0),
		ServiceID: ServiceID(PortSpaceTCP, dst.Port()), QPN: qpn, QPType: TransportRC,
		StartingPSN: 0x111111, ResponderResources: 2, InitiatorDepth: 3, FlowControl: true,
		RetryCount: 7, RNRRetryCount: 7,
		RemoteCMResponseTimeout: CMAResponseTimeout, LocalCMResponseTimeout: CMAResponseTimeout,
		MaxCMRetries: CMAMaxCMRetries, PrivateData: pd,
	}
}

const (
	reqTO = 4608 * time.Millisecond // 2 × 2^(16-8) + 2^(20-8) ms
	repTO = 4096 * time.Millisecond // 2^(20-8) ms
	twTO  = 512 * time.Millisecond  // 2^(17-8) ms
)
