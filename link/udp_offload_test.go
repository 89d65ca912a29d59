package link

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/roce"
)

// offloadBatch is a send batch that exercises every grouping rule of
// buildTx: a run of equal frames longer than gsoMaxSegs, a shorter frame
// ending a message, frames of another length, frames to two peers
// interleaved, and a run too long in bytes for one datagram. It returns
// the frames and their destinations (to[0] or to[1]).
func offloadBatch(t *testing.T, from netip.AddrPort, to [2]netip.AddrPort) ([][]byte, []netip.AddrPort) {
	var frames [][]byte
	var peers []netip.AddrPort
	psn := uint32(0)
	add := func(dst int, n int) {
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 7, PSN: psn}}
		psn++
		frames = append(frames, buildFrame(t, pathBetween(from, to[dst]), &h, n))
		peers = append(peers, to[dst])
	}
	for range gsoMaxSegs + 6 {
		add(0, 8) // 24-byte frames: more than one message's worth
	}
	add(0, 4) // shorter: ends the message
	for range 3 {
		add(0, 1000)
	}
	for i := range 10 {
		add(i%2, 100) // two peers interleaved: no grouping across them
	}
	for range 20 {
		add(0, 4096) // 20 x 4112 bytes: more than one datagram holds
	}
	return frames, peers
}

// TestIPv4SegmentPolicy: an IPv4 link segments by default only on a
// loopback address (off loopback, segment k would be cut where a checker
// reads its IPv4 identification k, which its ICRC does not cover), always
// when asked, never when told not to; an IPv6 link segments whatever the
// IPv4 policy.
func TestIPv4SegmentPolicy(t *testing.T) {
	for _, tc := range []struct {
		p    SegmentPolicy
		addr string
		want bool
	}{
		{SegmentLoopback, "127.0.0.1", true},
		{SegmentLoopback, "127.9.8.7", true},
		{SegmentLoopback, "::ffff:127.0.0.1", true},
		{SegmentLoopback, "10.0.0.1", false},
		{SegmentLoopback, "192.168.1.1", false},
		{SegmentAlways, "10.0.0.1", true},
		{SegmentNever, "127.0.0.1", false},
	} {
		assert.Equal(t, tc.want, tc.p.segments(netip.MustParseAddr(tc.addr)), "%v on %s", tc.p, tc.addr)
	}
	probe := newTestLink(t, loopback4(t), 1, func(c *UDPConfig) { c.SegmentIPv4 = SegmentAlways }).Ports()[0]
	if !probe.gso {
		t.Skip("the kernel has no UDP_SEGMENT")
	}
	assert.True(t, newTestLink(t, loopback4(t), 1, nil).Ports()[0].gso, "IPv4 loopback by default")
	assert.False(t, newTestLink(t, loopback4(t), 1, func(c *UDPConfig) { c.SegmentIPv4 = SegmentNever }).Ports()[0].gso,
		"IPv4 loopback, SegmentNever")
	assert.True(t, newTestLink(t, freePort(t, loopback6(t).Addr()), 1, func(c *UDPConfig) { c.SegmentIPv4 = SegmentNever }).Ports()[0].gso,
		"IPv6, SegmentNever (an IPv4 policy)")
	_, err := NewUDP(UDPConfig{Local: loopback4(t), FrameCap: 4200, SegmentIPv4: SegmentNever + 1})
	assert.ErrorIs(t, err, ErrInvalid, "an unknown policy")
}

// TestUDPOffload: over IPv4 and IPv6, a batch sent with UDP_SEGMENT
// reaches a receiver with UDP_GRO and one without it (the kernel cuts the
// datagrams for that one) frame for frame, in order, each frame with its
// own ICRC intact under the pseudo header of the receiver's socket pair,
// and through caller batches smaller than a coalesced datagram.
func TestUDPOffload(t *testing.T) {
	for _, fam := range []struct {
		name string
		addr func(testing.TB) netip.AddrPort
	}{{"IPv4", loopback4}, {"IPv6", func(tb testing.TB) netip.AddrPort { return freePort(tb, loopback6(t).Addr()) }}} {
		t.Run(fam.name, func(t *testing.T) {
			aAddr, bAddr, cAddr := fam.addr(t), fam.addr(t), fam.addr(t)
			big := func(c *UDPConfig) { c.RecvBuffer, c.SendBuffer, c.SegmentIPv4 = 1<<20, 1<<20, SegmentAlways }
			a := newTestLink(t, aAddr, 1, big).Ports()[0]
			b := newTestLink(t, bAddr, 1, big).Ports()[0]
			c := newTestLink(t, cAddr, 1, func(c *UDPConfig) { big(c); c.NoOffload = true }).Ports()[0]
			if !a.gso || b.groRx == nil {
				t.Skip("the kernel has no UDP_SEGMENT or UDP_GRO")
			}
			require.Nil(t, c.groRx)
			frames, peers := offloadBatch(t, aAddr, [2]netip.AddrPort{bAddr, cAddr})
			want := map[netip.AddrPort][][]byte{}
			for i, f := range frames {
				want[peers[i]] = append(want[peers[i]], bytes.Clone(f))
			}
			for len(frames) > 0 {
				n, err := a.SendBatch(frames, peers)
				require.NoError(t, err)
				frames, peers = frames[n:], peers[n:]
			}
			assert.NotZero(t, a.Counters.TxGSO.Load(), "segmented sends")
			assert.Less(t, a.Counters.TxGSO.Load(), a.Counters.TxFrames.Load())

			for _, r := range []struct {
				p     *UDPPort
				local netip.AddrPort
				batch int
			}{{b, bAddr, 5}, {c, cAddr, 16}} {
				got := recvBatches(t, r.p, len(want[r.local]), r.batch)
				require.Len(t, got, len(want[r.local]))
				var pkt roce.Packet
				for i, d := range got {
					require.Equal(t, aAddr, d.from, "frame %d: sender", i)
					require.Equal(t, want[r.local][i], d.b, "frame %d", i)
					require.NoError(t, parseFrom(d.b, d.from, r.local, &pkt), "frame %d: ICRC under the pseudo header", i)
				}
			}
			assert.NotZero(t, b.Counters.RxGRO.Load(), "coalesced datagrams received whole")
			assert.Zero(t, c.Counters.RxGRO.Load())
			assert.Zero(t, b.Counters.RxTruncated.Load()+c.Counters.RxTruncated.Load())
		})
	}
}

// recvBatches receives n datagrams from p with RecvBatch calls of batch
// buffers, waiting on Ready when one finds nothing.
func recvBatches(t *testing.T, p *UDPPort, n, batch int) []datagram {
	t.Helper()
	bufs := newBufs(batch)
	peers := make([]netip.AddrPort, batch)
	var out []datagram
	for len(out) < n {
		for i := range bufs {
			bufs[i] = bufs[i][:cap(bufs[i])]
		}
		k, err := p.RecvBatch(bufs, peers)
		require.NoError(t, err)
		for i := range k {
			out = append(out, datagram{bytes.Clone(bufs[i]), peers[i]})
		}
		if k == 0 {
			before := len(out)
			got := recvN(t, p, 1) // waits on Ready
			out = append(out, got...)
			require.Greater(t, len(out), before)
		}
	}
	return out
}

// TestUDPOffloadRefused: when the kernel refuses a segmented send (here:
// SO_NO_CHECK, with which IPv4 UDP_SEGMENT fails with EINVAL), the port
// turns segmentation off and sends the same frames one datagram each;
// nothing is lost or counted as an error.
func TestUDPOffloadRefused(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	big := func(c *UDPConfig) { c.RecvBuffer, c.SendBuffer, c.SegmentIPv4 = 1<<20, 1<<20, SegmentAlways }
	a := newTestLink(t, aAddr, 1, big).Ports()[0]
	b := newTestLink(t, bAddr, 1, big).Ports()[0]
	if !a.gso {
		t.Skip("the kernel has no UDP_SEGMENT")
	}
	require.NoError(t, a.rc.Control(func(fd uintptr) {
		require.NoError(t, unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1))
	}))
	frames, _ := offloadBatch(t, aAddr, [2]netip.AddrPort{bAddr, bAddr})
	want := make([][]byte, len(frames))
	for i, f := range frames {
		want[i] = bytes.Clone(f)
	}
	sendAll(t, a, frames, bAddr)
	assert.Equal(t, uint64(1), a.Counters.GSOOff.Load())
	assert.False(t, a.gso)
	assert.Zero(t, a.Counters.TxGSO.Load())
	assert.Zero(t, a.Counters.SendErrors.Load())
	assert.Equal(t, uint64(len(want)), a.Counters.TxFrames.Load())
	got := recvN(t, b, len(want))
	for i := range want {
		require.Equal(t, want[i], got[i].b, "frame %d", i)
	}
}

// TestUDPSteeringSegmented: a batch of equal frames for QPs of both
// workers of a two-worker receiver, in runs per QP, sent with
// segmentation: every frame reaches the worker that owns its QP (a
// segmented datagram is steered whole by its first frame, so it must not
// mix QPs).
func TestUDPSteeringSegmented(t *testing.T) {
	aAddr, a := segmentingPort(t)
	bAddr := loopback4(t)
	lb := newTestLink(t, bAddr, 2, nil)
	for _, p := range lb.Ports() {
		assert.Nil(t, p.groRx, "no receive coalescing with several workers")
	}
	path := pathBetween(aAddr, bAddr)
	var frames [][]byte
	want := make([]int, 2)
	for q := uint32(1); q <= 16; q++ {
		for i := range 3 {
			h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: q, PSN: uint32(i)}}
			frames = append(frames, buildFrame(t, path, &h, 64))
			want[roce.SteerQueue(q, 2)]++
		}
	}
	sendAll(t, a, frames, bAddr)
	assert.Equal(t, uint64(16), a.Counters.TxGSO.Load(), "one segmented datagram per QP")
	for i, p := range lb.Ports() {
		for _, f := range recvN(t, p, want[i]) {
			var pkt roce.Packet
			require.NoError(t, parseFrom(f.b, f.from, bAddr, &pkt))
			assert.Equal(t, i, roce.SteerQueue(pkt.BTH.DestQP(), 2), "QP %#x on worker %d", pkt.BTH.DestQP(), i)
		}
	}
}
