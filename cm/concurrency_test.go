package cm

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConcurrentSynchronousNetwork runs many handshakes at once on the
// system clock, over Senders that deliver synchronously into the other
// Manager, whose Handler answers from inside the delivery: the Manager
// must neither deadlock nor race (run with -race).
func TestConcurrentSynchronousNetwork(t *testing.T) {
	const conns = 32
	ipA, ipB := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2")
	var a, b *Manager
	var mu sync.Mutex
	established := map[string]int{}
	count := func(side string) {
		mu.Lock()
		established[side]++
		mu.Unlock()
	}
	var err error
	a, err = NewManager(Config{CAGUID: 1, AckDelay: RXEAckDelay,
		Sender: SenderFunc(func(dst GID, mad []byte) error { return b.HandleMAD(GIDFromIP(ipA), mad) }),
		Handler: func(ev Event) {
			switch ev.Type {
			case EventREPReceived:
				assert.NoError(t, a.RTU(ev.Conn, nil))
			case EventEstablished:
				count("A")
			}
		}})
	require.NoError(t, err)
	b, err = NewManager(Config{CAGUID: 2, AckDelay: RXEAckDelay,
		Sender: SenderFunc(func(dst GID, mad []byte) error { return a.HandleMAD(GIDFromIP(ipB), mad) }),
		Handler: func(ev Event) {
			switch ev.Type {
			case EventConnectRequest:
				assert.NoError(t, b.Accept(ev.Conn, AcceptParams{QPN: ev.REQ.LocalQPN + 0x1000}))
			case EventEstablished:
				count("B")
			}
		}})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	require.NoError(t, b.Listen(ServiceID(PortSpaceTCP, 1), 0))

	src, dst := netip.AddrPortFrom(ipA, 5000), netip.AddrPortFrom(ipB, 1)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			p := ConnectParams{Path: RoCEPath(src, dst, 3, 3, 64, 0), ServiceID: ServiceID(PortSpaceTCP, 1),
				QPN: uint32(0x100 + i), QPType: TransportRC, RemoteCMResponseTimeout: 20,
				LocalCMResponseTimeout: 20, MaxCMRetries: 15}
			_, err := a.Connect(p)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"A": conns, "B": conns}, established)
}
