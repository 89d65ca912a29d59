package tap

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeLink records the frames Neighbors sends and can answer requests like
// a peer would.
type fakeLink struct {
	mu     sync.Mutex
	frames [][]byte
	answer func(frame []byte) // called outside the lock
}

func (l *fakeLink) send(frame []byte) error {
	c := append([]byte(nil), frame...)
	l.mu.Lock()
	l.frames = append(l.frames, c)
	answer := l.answer
	l.mu.Unlock()
	if answer != nil {
		go answer(c)
	}
	return nil
}

func (l *fakeLink) sent() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]byte(nil), l.frames...)
}

func newTestNeighbors(cfg NeighborConfig) (*Neighbors, *fakeLink) {
	l := &fakeLink{}
	n := NewNeighbors(devMAC, []netip.Addr{dev4, dev6}, cfg, l.send)
	return n, l
}

func TestAnswersARPRequestForOwnAddress(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{})
	for _, vlan := range []bool{false, true} {
		req := appendARP(appendEth(nil, ethHeader{dst: broadcastMAC, src: peerMAC, vlan: vlan, tci: 9, etherType: etherTypeARP}),
			arpPacket{op: 1, sha: peerMAC, spa: peer4, tpa: dev4})
		require.True(t, n.HandleFrame(req))
	}
	sent := l.sent()
	require.Len(t, sent, 2)
	for i, fr := range sent {
		eth, err := parseEth(fr)
		require.NoError(t, err)
		assert.Equal(t, peerMAC, eth.dst)
		assert.Equal(t, devMAC, eth.src)
		assert.Equal(t, i == 1, eth.vlan, "reply keeps the VLAN tag")
		p, err := parseARP(fr[eth.hlen:])
		require.NoError(t, err)
		assert.Equal(t, arpPacket{op: 2, sha: devMAC, spa: dev4, tha: peerMAC, tpa: peer4}, p)
	}
	// Learnt from the request addressed to us.
	mac, ok := n.Lookup(peer4)
	assert.True(t, ok)
	assert.Equal(t, peerMAC, mac)

	// A request for another address is not answered.
	other := appendARP(appendEth(nil, ethHeader{dst: broadcastMAC, src: peerMAC, etherType: etherTypeARP}),
		arpPacket{op: 1, sha: peerMAC, spa: peer4, tpa: netip.MustParseAddr("10.9.0.99")})
	require.True(t, n.HandleFrame(other))
	assert.Len(t, l.sent(), 2)
	assert.Equal(t, uint64(2), n.Stats().ARPRepliesOut)
}

func TestAnswersNeighborSolicitation(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{})
	group, gmac := solicitedNode(dev6)
	ns := appendND(appendEth(nil, ethHeader{dst: gmac, src: peerMAC, etherType: etherTypeIPv6}),
		ndMessage{typ: icmpNS, src: peer6, dst: group, target: dev6, ll: peerMAC, hasLL: true})
	require.True(t, n.HandleFrame(ns))
	sent := l.sent()
	require.Len(t, sent, 1)
	eth, err := parseEth(sent[0])
	require.NoError(t, err)
	assert.Equal(t, peerMAC, eth.dst)
	na, err := parseND(sent[0][eth.hlen:])
	require.NoError(t, err)
	assert.Equal(t, ndMessage{typ: icmpNA, src: dev6, dst: peer6, target: dev6, flags: naFlagSolicit | naFlagOverr, ll: devMAC, hasLL: true}, na)
	mac, ok := n.Lookup(peer6)
	assert.True(t, ok)
	assert.Equal(t, peerMAC, mac)

	// DAD probe (unspecified source): answered to all-nodes, not learnt.
	dad := appendND(appendEth(nil, ethHeader{dst: gmac, src: peerMAC, etherType: etherTypeIPv6}),
		ndMessage{typ: icmpNS, src: netip.IPv6Unspecified(), dst: group, target: dev6})
	require.True(t, n.HandleFrame(dad))
	sent = l.sent()
	require.Len(t, sent, 2)
	eth, err = parseEth(sent[1])
	require.NoError(t, err)
	na, err = parseND(sent[1][eth.hlen:])
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("ff02::1"), na.dst)
	assert.Equal(t, uint32(naFlagOverr), na.flags)
}

// peerAnswers makes the fake link answer ARP requests and NS like a peer
// at peer4/peer6 with peerMAC.
func peerAnswers(n *Neighbors) func([]byte) {
	return func(fr []byte) {
		eth, err := parseEth(fr)
		if err != nil {
			return
		}
		if eth.etherType == etherTypeARP {
			p, err := parseARP(fr[eth.hlen:])
			if err != nil || p.tpa != peer4 {
				return
			}
			n.HandleFrame(appendARP(appendEth(nil, ethHeader{dst: p.sha, src: peerMAC, etherType: etherTypeARP}),
				arpPacket{op: 2, sha: peerMAC, spa: peer4, tha: p.sha, tpa: p.spa}))
			return
		}
		m, err := parseND(fr[eth.hlen:])
		if err != nil || m.target != peer6 {
			return
		}
		n.HandleFrame(appendND(appendEth(nil, ethHeader{dst: m.ll, src: peerMAC, etherType: etherTypeIPv6}),
			ndMessage{typ: icmpNA, src: peer6, dst: m.src, target: peer6, flags: naFlagSolicit | naFlagOverr, ll: peerMAC, hasLL: true}))
	}
}

func TestResolve(t *testing.T) {
	for _, ip := range []netip.Addr{peer4, peer6} {
		t.Run(ip.String(), func(t *testing.T) {
			n, l := newTestNeighbors(NeighborConfig{RetryInterval: 50 * time.Millisecond, Attempts: 5})
			l.answer = peerAnswers(n)
			mac, err := n.Resolve(context.Background(), ip)
			require.NoError(t, err)
			assert.Equal(t, peerMAC, mac)
			// Cached: no further request.
			before := len(l.sent())
			mac, err = n.Resolve(context.Background(), ip)
			require.NoError(t, err)
			assert.Equal(t, peerMAC, mac)
			assert.Equal(t, before, len(l.sent()))
			n.Close()
		})
	}
}

func TestResolveUnresolvedAfterAttempts(t *testing.T) {
	cfg := NeighborConfig{RetryInterval: 5 * time.Millisecond, Attempts: 3}
	n, l := newTestNeighbors(cfg)
	silent := netip.MustParseAddr("10.9.0.200")
	// The guard deadline is far beyond the configured timeout: getting
	// ErrUnresolved rather than DeadlineExceeded shows Resolve gave up on
	// its own.
	ctx, cancel := context.WithTimeout(context.Background(), 100*cfg.Timeout())
	defer cancel()
	_, err := n.Resolve(ctx, silent)
	require.ErrorIs(t, err, ErrUnresolved)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Len(t, l.sent(), 3, "one request per attempt")
	assert.Equal(t, uint64(1), n.Stats().Unresolved)
	_, ok := n.Lookup(silent)
	assert.False(t, ok)
	n.mu.Lock()
	assert.Empty(t, n.cache, "the unresolved entry is removed")
	n.mu.Unlock()
}

func TestResolveContextAndClose(t *testing.T) {
	n, _ := newTestNeighbors(NeighborConfig{RetryInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := n.Resolve(ctx, peer4)
	assert.ErrorIs(t, err, context.Canceled)

	errc := make(chan error)
	go func() {
		_, err := n.Resolve(context.Background(), peer6)
		errc <- err
	}()
	// Close ends a resolution that would otherwise wait an hour.
	for n.Stats().NSOut == 0 {
		time.Sleep(time.Millisecond)
	}
	n.Close()
	assert.ErrorIs(t, <-errc, ErrClosed)
	_, err = n.Resolve(context.Background(), peer4)
	assert.ErrorIs(t, err, ErrClosed)
}

func TestResolveRejectsBadAddressesAndMissingFamily(t *testing.T) {
	n := NewNeighbors(devMAC, []netip.Addr{dev4}, NeighborConfig{}, func([]byte) error { return nil })
	for _, a := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.MustParseAddr("224.0.0.1")} {
		_, err := n.Resolve(context.Background(), a)
		assert.ErrorIs(t, err, ErrConfig, "%v", a)
	}
	_, err := n.Resolve(context.Background(), peer6) // no IPv6 source address
	assert.ErrorIs(t, err, ErrConfig)
}

func TestSendErrorIsReported(t *testing.T) {
	boom := errors.New("link down")
	n := NewNeighbors(devMAC, []netip.Addr{dev4}, NeighborConfig{}, func([]byte) error { return boom })
	_, err := n.Resolve(context.Background(), peer4)
	assert.ErrorIs(t, err, boom)
}

func TestConcurrentResolvesShareRequests(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{RetryInterval: 200 * time.Millisecond})
	l.answer = func(fr []byte) {
		time.Sleep(20 * time.Millisecond) // let every caller join
		peerAnswers(n)(fr)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mac, err := n.Resolve(context.Background(), peer4)
			assert.NoError(t, err)
			assert.Equal(t, peerMAC, mac)
		}()
	}
	wg.Wait()
	assert.Len(t, l.sent(), 1, "one ARP request for eight callers")
}

func TestEntriesExpire(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{Expiry: 20 * time.Millisecond, RetryInterval: 50 * time.Millisecond})
	l.answer = peerAnswers(n)
	_, err := n.Resolve(context.Background(), peer4)
	require.NoError(t, err)
	_, ok := n.Lookup(peer4)
	require.True(t, ok)
	time.Sleep(40 * time.Millisecond)
	_, ok = n.Lookup(peer4)
	assert.False(t, ok, "expired")
	_, err = n.Resolve(context.Background(), peer4)
	require.NoError(t, err)
	assert.Len(t, l.sent(), 2, "re-resolved after expiry")
}

func TestUnsolicitedReplyIsNotLearnt(t *testing.T) {
	n, _ := newTestNeighbors(NeighborConfig{})
	reply := appendARP(appendEth(nil, ethHeader{dst: devMAC, src: peerMAC, etherType: etherTypeARP}),
		arpPacket{op: 2, sha: peerMAC, spa: peer4, tha: devMAC, tpa: dev4})
	require.True(t, n.HandleFrame(reply))
	_, ok := n.Lookup(peer4)
	assert.False(t, ok)
	assert.Equal(t, uint64(1), n.Stats().Ignored)
}

func TestLookupDoesNotAllocate(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{})
	l.answer = peerAnswers(n)
	_, err := n.Resolve(context.Background(), peer4)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, ok := n.Lookup(peer4); !ok {
			t.Fatal("not cached")
		}
	})
	assert.Zero(t, allocs)
	frame := l.sent()[0]
	assert.Zero(t, testing.AllocsPerRun(1000, func() { IsNeighborFrame(frame) }))
}

// TestOwnAddressIsOwnMAC: the device's own addresses resolve to its own
// MAC at once, with no request sent (a QP addressing a QP of the same
// device; the link loops such frames back).
func TestOwnAddressIsOwnMAC(t *testing.T) {
	n, l := newTestNeighbors(NeighborConfig{})
	for _, a := range []netip.Addr{dev4, dev6, netip.AddrFrom16(dev4.As16())} {
		mac, ok := n.Lookup(a)
		assert.True(t, ok, "%v", a)
		assert.Equal(t, devMAC, mac)
		mac, err := n.Resolve(context.Background(), a)
		require.NoError(t, err, "%v", a)
		assert.Equal(t, devMAC, mac)
	}
	assert.Empty(t, l.sent(), "nothing sent for our own addresses")
}
