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

// pathBetween is the path the engine would use from link a to b: the
// UDP-link conventions, with masked fields (TOS, TTL, UDP checksum) set
// to values the receiver does not reproduce.
func pathBetween(a, b netip.AddrPort) *roce.Path {
	p := &roce.Path{
		Mode: roce.ModeEthernet, SrcMAC: [6]byte{2, 1, 1, 1, 1, 1}, DstMAC: [6]byte{2, 2, 2, 2, 2, 2},
		Src: a.Addr(), Dst: b.Addr(), SrcPort: a.Port(), TTL: 9, TOS: 0x02,
		DontFragment: true, UDPChecksum: true,
	}
	if b.Port() != roce.UDPPort {
		p.DstPort = b.Port()
	}
	return p
}

// buildFrame builds op with an n-byte payload (a pattern) on path p.
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

// newBufs returns n empty buffers of the test capacity.
func newBufs(n int) [][]byte {
	b := make([][]byte, n)
	for i := range b {
		b[i] = make([]byte, testFrameCap)
	}
	return b
}

// recvN receives exactly n frames from p, waiting on Ready in between,
// and returns copies.
func recvN(t testing.TB, p *UDPPort, n int) [][]byte {
	t.Helper()
	bufs := newBufs(16)
	var out [][]byte
	timeout := time.NewTimer(recvTimeout)
	defer timeout.Stop()
	for len(out) < n {
		k, err := p.RecvBatch(bufs)
		require.NoError(t, err)
		for i := range k {
			out = append(out, bytes.Clone(bufs[i]))
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

// sendAll sends frames through p, retrying on backpressure.
func sendAll(t testing.TB, p *UDPPort, frames [][]byte) {
	t.Helper()
	for len(frames) > 0 {
		n, err := p.SendBatch(frames)
		require.NoError(t, err)
		frames = frames[n:]
	}
}

// coveredHeaders returns the IP and UDP headers of frame with the fields
// the ICRC masks cleared: what must be equal end to end.
func coveredHeaders(t testing.TB, frame []byte) []byte {
	t.Helper()
	var pkt roce.Packet
	require.NoError(t, roce.Parse(frame, &pkt))
	var ip []byte
	if pkt.IPv4 != nil {
		ip = bytes.Clone(pkt.IPv4)
		ip[1], ip[8], ip[10], ip[11] = 0, 0, 0, 0 // TOS, TTL, checksum
	} else {
		ip = bytes.Clone(pkt.IPv6)
		ip[0] &^= 0x0f
		ip[1], ip[2], ip[3], ip[7] = 0, 0, 0, 0 // traffic class, flow label, hop limit
	}
	u := bytes.Clone(pkt.UDP)
	u[6], u[7] = 0, 0
	return append(ip, u...)
}

// transport returns BTH .. ICRC of a whole frame.
func transport(t testing.TB, frame []byte) []byte {
	t.Helper()
	var pkt roce.Packet
	require.NoError(t, roce.Parse(frame, &pkt))
	return frame[len(pkt.Eth)+len(pkt.IPv4)+len(pkt.IPv6)+len(pkt.UDP):]
}
