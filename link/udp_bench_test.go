package link

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
)

// benchBatch frames of 4 KiB payload per SendBatch / RecvBatch.
const benchBatch = 16

// udpPair is a sending and a receiving UDP link on loopback with a batch
// of 4 KiB SEND ONLY frames, their peers, and receive buffers with room
// for the senders.
type udpPair struct {
	a, b   *UDPPort
	frames [][]byte
	to     []netip.AddrPort
	bufs   [][]byte
	from   []netip.AddrPort
}

func newUDPPair(tb testing.TB) *udpPair { return newUDPPairECN(tb, false) }

// newUDPPairECN is newUDPPair with UDPConfig.ECN set to ecn on both links.
func newUDPPairECN(tb testing.TB, ecn bool) *udpPair {
	aAddr, bAddr := loopback4(tb), loopback4(tb)
	mod := func(c *UDPConfig) { c.RecvBuffer, c.SendBuffer, c.ECN = 1<<20, 1<<20, ecn }
	p := &udpPair{
		a:    newTestLink(tb, aAddr, 1, mod).Ports()[0],
		b:    newTestLink(tb, bAddr, 1, mod).Ports()[0],
		bufs: newBufs(benchBatch),
		to:   peersOf(bAddr, benchBatch),
		from: make([]netip.AddrPort, benchBatch),
	}
	path := pathBetween(aAddr, bAddr)
	for i := range benchBatch {
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 5, PSN: uint32(i)}}
		p.frames = append(p.frames, buildFrame(tb, path, &h, 4096))
	}
	return p
}

// round sends the batch and receives it; it returns the frames received
// (fewer only if the kernel dropped some, which a receive buffer of 1 MiB
// for 16 datagrams prevents).
func (p *udpPair) round(tb testing.TB) int {
	frames, to := p.frames, p.to
	for len(frames) > 0 {
		n, err := p.a.SendBatch(frames, to)
		if err != nil {
			tb.Fatal(err)
		}
		frames, to = frames[n:], to[n:]
	}
	got := 0
	for got < benchBatch {
		for i := range p.bufs {
			p.bufs[i] = p.bufs[i][:cap(p.bufs[i])]
		}
		k, err := p.b.RecvBatch(p.bufs[:benchBatch-got], p.from)
		if err != nil {
			tb.Fatal(err)
		}
		if k == 0 {
			return got // loopback delivers within sendmmsg: nothing more is coming
		}
		got += k
	}
	return got
}

// plainPair is the baseline: two plain UDP sockets exchanging datagrams
// of the same size with WriteTo / ReadFrom.
type plainPair struct {
	a, b    *net.UDPConn
	dst     netip.AddrPort
	payload []byte
	buf     []byte
}

func newPlainPair(tb testing.TB) *plainPair {
	a, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback4(tb).Addr(), 0)))
	require.NoError(tb, err)
	tb.Cleanup(func() { a.Close() })
	b, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback4(tb).Addr(), 0)))
	require.NoError(tb, err)
	tb.Cleanup(func() { b.Close() })
	require.NoError(tb, b.SetReadBuffer(1<<20))
	require.NoError(tb, a.SetWriteBuffer(1<<20))
	return &plainPair{
		a: a, b: b, dst: b.LocalAddr().(*net.UDPAddr).AddrPort(),
		payload: bytes.Repeat([]byte{0x5a}, roce.BTHLen+4096+roce.ICRCLen),
		buf:     make([]byte, testFrameCap),
	}
}

func (p *plainPair) round(tb testing.TB) {
	for range benchBatch {
		if _, err := p.a.WriteToUDPAddrPort(p.payload, p.dst); err != nil {
			tb.Fatal(err)
		}
	}
	for range benchBatch {
		if _, _, err := p.b.ReadFromUDPAddrPort(p.buf); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestUDPNoAllocs: SendBatch and RecvBatch allocate nothing in steady
// state, with frames flowing and on an empty socket.
func TestUDPNoAllocs(t *testing.T) {
	p := newUDPPair(t)
	require.Equal(t, benchBatch, p.round(t))
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if p.round(t) != benchBatch {
			t.Error("frames lost on loopback")
		}
	}), "SendBatch + RecvBatch")
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := p.a.SendBatch(p.frames[:1], p.to); err != nil {
			t.Error(err)
		}
	}), "SendBatch")
	recvN(t, p.b, 101) // drain
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if n, err := p.b.RecvBatch(p.bufs, p.from); n != 0 || err != nil {
			t.Error(n, err)
		}
	}), "RecvBatch on an empty socket")
}

// BenchmarkUDP4K: batches of 16 frames of 4 KiB payload over loopback,
// SendBatch then RecvBatch (link), against two plain sockets sending the
// same datagrams with WriteTo / ReadFrom (plain). ns/op is per batch.
func BenchmarkUDP4K(b *testing.B) {
	b.Run("link", func(b *testing.B) {
		p := newUDPPair(b)
		b.SetBytes(benchBatch * 4096)
		b.ReportAllocs()
		for b.Loop() {
			if p.round(b) != benchBatch {
				b.Fatal("frames lost on loopback")
			}
		}
	})
	// ecn: the link with UDPConfig.ECN (ECT(0) sent, a TOS control
	// message read per datagram) against the link without, interleaved
	// batch by batch; cost = ECN time / plain link time.
	b.Run("ecn", func(b *testing.B) {
		off, on := newUDPPair(b), newUDPPairECN(b, true)
		var toff, ton time.Duration
		b.ReportAllocs()
		for b.Loop() {
			t0 := time.Now()
			if off.round(b) != benchBatch {
				b.Fatal("frames lost on loopback")
			}
			t1 := time.Now()
			if on.round(b) != benchBatch {
				b.Fatal("frames lost on loopback")
			}
			toff, ton = toff+t1.Sub(t0), ton+time.Since(t1)
		}
		frames := float64(b.N * benchBatch)
		b.ReportMetric(float64(toff.Nanoseconds())/frames, "off-ns/frame")
		b.ReportMetric(float64(ton.Nanoseconds())/frames, "ecn-ns/frame")
		b.ReportMetric(float64(ton)/float64(toff), "cost")
	})
	b.Run("plain", func(b *testing.B) {
		p := newPlainPair(b)
		b.SetBytes(benchBatch * 4096)
		b.ReportAllocs()
		for b.Loop() {
			p.round(b)
		}
	})
	// ratio: both, interleaved batch by batch so that the load of the
	// shared machine hits them alike; speedup = plain time / link time.
	b.Run("ratio", func(b *testing.B) {
		lp, pp := newUDPPair(b), newPlainPair(b)
		var tl, tp time.Duration
		for b.Loop() {
			t0 := time.Now()
			if lp.round(b) != benchBatch {
				b.Fatal("frames lost on loopback")
			}
			t1 := time.Now()
			pp.round(b)
			tl, tp = tl+t1.Sub(t0), tp+time.Since(t1)
		}
		frames := float64(b.N * benchBatch)
		b.ReportMetric(float64(tl.Nanoseconds())/frames, "link-ns/frame")
		b.ReportMetric(float64(tp.Nanoseconds())/frames, "plain-ns/frame")
		b.ReportMetric(float64(tp)/float64(tl), "speedup")
	})
}
