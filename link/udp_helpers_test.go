package link

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
)

// testFrameCap is the buffer capacity of the UDP link tests: a 4096-byte
// payload with any headers fits.
const testFrameCap = 4096 + 256

// recvTimeout bounds waiting for frames that must arrive (a lost wake-up
// or a lost datagram fails the test instead of hanging it).
const recvTimeout = 10 * time.Second

// loopback4 returns a free IPv4 loopback address (127.0.0.0/8 needs no
// setup on Linux) with port 4791.
func loopback4(t testing.TB) netip.AddrPort {
	t.Helper()
	for range 100 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))})
		ap := netip.AddrPortFrom(a, roce.UDPPort)
		if probeFree(false, sockaddrOf(ap)) == nil {
			return ap
		}
	}
	t.Fatal("no free 127.0.0.0/8 address with port 4791")
	return netip.AddrPort{}
}

// loopback6 returns ::1 with port 4791, or skips when that is taken.
func loopback6(t testing.TB) netip.AddrPort {
	t.Helper()
	ap := netip.AddrPortFrom(netip.IPv6Loopback(), roce.UDPPort)
	if err := probeFree(true, sockaddrOf(ap)); err != nil {
		t.Skipf("[::1]:4791 unavailable (no IPv6 loopback, or another daemon holds it): %v", err)
	}
	return ap
}

// freePort returns a currently free UDP port on a.
func freePort(t testing.TB, a netip.Addr) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	require.NoError(t, err)
	ap := c.LocalAddr().(*net.UDPAddr).AddrPort()
	require.NoError(t, c.Close())
	return netip.AddrPortFrom(a, ap.Port())
}

// newTestLink opens a UDP link closed at the end of the test.
func newTestLink(t testing.TB, local netip.AddrPort, workers int, mod func(*UDPConfig)) *UDPLink {
	t.Helper()
	cfg := UDPConfig{Local: local, Workers: workers, FrameCap: testFrameCap, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	l, err := NewUDP(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// segmentingPort returns a one-worker link's port on a free loopback
// address that segments over IPv4 (SegmentAlways), and the address; it
// skips the test when the kernel has no UDP_SEGMENT.
func segmentingPort(t testing.TB) (netip.AddrPort, *UDPPort) {
	t.Helper()
	addr := loopback4(t)
	p := newTestLink(t, addr, 1, func(c *UDPConfig) { c.SegmentIPv4 = SegmentAlways }).Ports()[0]
	if !p.gso {
		t.Skip("the kernel has no UDP_SEGMENT")
	}
	return addr, p
}

// pathBetween is the path the engine uses in roce.ModeUDP from link a
// to link b: the pseudo header's addresses and ports are the two
// sockets'.
func pathBetween(a, b netip.AddrPort) *roce.Path {
	return &roce.Path{Mode: roce.ModeUDP, Src: a.Addr(), Dst: b.Addr(), SrcPort: a.Port(), DstPort: b.Port()}
}

// buildFrame builds op with an n-byte payload (a pattern) on path p: a
// UDP payload, BTH through ICRC.
func buildFrame(t testing.TB, p *roce.Path, h *roce.Headers, n int) []byte {
	t.Helper()
	buf := make([]byte, testFrameCap)
	off := p.Headroom(h.BTH.Opcode)
	for i := range n {
		buf[off+i] = byte(i*7 + int(h.BTH.PSN))
	}
	f, err := p.Build(buf, off, n, h)
	require.NoError(t, err)
	return f
}

// parseFrom parses a received payload as the engine does: ICRC over the
// pseudo header of the sender beside it and the receiving link's address.
func parseFrom(payload []byte, from, local netip.AddrPort, pkt *roce.Packet) error {
	ps := roce.Pseudo{Src: from.Addr(), SrcPort: from.Port(), Dst: local.Addr(), DstPort: local.Port()}
	return roce.ParseUDP(payload, &ps, pkt)
}

// newBufs returns n empty buffers of the test capacity.
func newBufs(n int) [][]byte {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, testFrameCap)
	}
	return b
}

// datagram is a received payload and its sender.
type datagram struct {
	b    []byte
	from netip.AddrPort
}

// recvN receives exactly n datagrams from p, waiting on Ready in
// between, and returns copies.
func recvN(t testing.TB, p *UDPPort, n int) []datagram {
	t.Helper()
	bufs := newBufs(16)
	peers := make([]netip.AddrPort, len(bufs))
	var out []datagram
	timeout := time.NewTimer(recvTimeout)
	defer timeout.Stop()
	for len(out) < n {
		k, err := p.RecvBatch(bufs, peers)
		require.NoError(t, err)
		for i := range k {
			out = append(out, datagram{bytes.Clone(bufs[i]), peers[i]})
		}
		if k == 0 {
			p.ArmReady()
			select {
			case <-p.Ready():
			case <-timeout.C:
				t.Fatalf("port %d: received %d of %d frames", p.Index(), len(out), n)
			}
		}
	}
	return out
}

// peersOf returns n copies of to: the peers of a batch to one destination.
func peersOf(to netip.AddrPort, n int) []netip.AddrPort {
	ps := make([]netip.AddrPort, n)
	for i := range ps {
		ps[i] = to
	}
	return ps
}

// sendAll sends frames through p to to, retrying on backpressure.
func sendAll(t testing.TB, p *UDPPort, frames [][]byte, to netip.AddrPort) {
	t.Helper()
	peers := peersOf(to, len(frames))
	for len(frames) > 0 {
		n, err := p.SendBatch(frames, peers)
		require.NoError(t, err)
		frames, peers = frames[n:], peers[n:]
	}
}
