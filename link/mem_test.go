package link

import (
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

const testCap = 4096 + roce.MaxHeadroom + roce.MaxTailroom

// frame builds a RoCE v2 SEND_ONLY frame from src to dst for qpn with a
// payload whose first byte is tag.
func frame(t testing.TB, src, dst string, qpn uint32, tag byte) []byte {
	p := roce.Path{Mode: roce.ModeEthernet, Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: 1000, TTL: 64}
	buf := make([]byte, testCap)
	off := p.Headroom(roce.OpRCSendOnly)
	buf[off] = tag
	f, err := p.Build(buf, off, 16, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: qpn}})
	require.NoError(t, err)
	require.Equal(t, &buf[0], &f[0])
	return buf[:len(f)]
}

// udpPayload builds the ModeUDP packet (BTH .. ICRC) of frame: from src
// to dst, both on port 4791.
func udpPayload(t testing.TB, src, dst string, qpn uint32, tag byte) []byte {
	p := udpPath(src, dst)
	buf := make([]byte, testCap)
	off := p.Headroom(roce.OpRCSendOnly)
	buf[off] = tag
	f, err := p.Build(buf, off, 16, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: qpn}})
	require.NoError(t, err)
	require.Equal(t, &buf[0], &f[0])
	return buf[:len(f)]
}

func udpPath(src, dst string) roce.Path {
	return roce.Path{Mode: roce.ModeUDP, Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: roce.UDPPort, DstPort: roce.UDPPort}
}

func newNet(t testing.TB, buffers, queue int) *Network {
	return newNetMode(t, roce.ModeEthernet, buffers, queue)
}

func newNetMode(t testing.TB, mode roce.Mode, buffers, queue int) *Network {
	n, err := NewNetwork(Config{Mode: mode, FrameCap: testCap, Buffers: buffers, QueueLen: queue})
	require.NoError(t, err)
	return n
}

func recvAll(t testing.TB, p *Port) [][]byte {
	out, _ := recvAllFrom(t, p)
	return out
}

// recvAllFrom receives everything queued at p with the senders beside.
func recvAllFrom(t testing.TB, p *Port) ([][]byte, []netip.AddrPort) {
	var out [][]byte
	var from []netip.AddrPort
	for {
		slots := [][]byte{make([]byte, testCap)}
		peers := make([]netip.AddrPort, 1)
		n, err := p.RecvBatch(slots, peers)
		require.NoError(t, err)
		if n == 0 {
			return out, from
		}
		out = append(out, slots[0])
		from = append(from, peers[0])
	}
}

// parseAny parses a frame of either mode; ModeUDP needs its sender.
func parseAny(f []byte, from netip.AddrPort, to netip.Addr, pkt *roce.Packet) error {
	if !from.IsValid() {
		return roce.Parse(f, pkt)
	}
	ps := roce.Pseudo{Src: from.Addr(), SrcPort: from.Port(), Dst: to, DstPort: roce.UDPPort}
	return roce.ParseUDP(f, &ps, pkt)
}

func TestRouting(t *testing.T) {
	n := newNet(t, 64, 16)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 4, nil)
	require.NoError(t, err)
	_, err = n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.ErrorIs(t, err, ErrExists)

	var frames [][]byte
	for q := uint32(1); q <= 20; q++ {
		frames = append(frames, frame(t, "10.0.0.1", "10.0.0.2", q, byte(q)))
	}
	frames = append(frames, frame(t, "10.0.0.1", "10.0.0.9", 1, 99)) // nobody there
	sent, err := a[0].SendBatch(frames, nil)
	require.NoError(t, err)
	assert.Equal(t, len(frames), sent)
	assert.Equal(t, uint64(1), a[0].Counters.NoRoute.Load())
	for _, f := range frames {
		assert.Equal(t, testCap, cap(f), "slots keep full-capacity buffers")
	}
	got := 0
	for i, p := range b {
		select {
		case <-p.Ready():
		default:
		}
		for _, f := range recvAll(t, p) {
			var pkt roce.Packet
			require.NoError(t, roce.Parse(f, &pkt))
			q := pkt.BTH.DestQP()
			assert.Equal(t, i, roce.SteerQueue(q, len(b)), "QPN %d steered to port %d", q, i)
			assert.Equal(t, byte(q), pkt.Payload[0])
			got++
		}
	}
	assert.Equal(t, 20, got)
	assert.Equal(t, 64, n.FreeBuffers(), "every buffer is back in the pool or with its owner")
}

// TestRoutingUDP: in ModeUDP a payload goes to the device at the
// address beside it, port 4791, and on to the port owning its BTH
// destination QP; the receiver gets the sender's address and port 4791
// beside it, with which the ICRC verifies. Payloads to another port or
// nobody, and ones shorter than a BTH, are dropped and counted.
func TestRoutingUDP(t *testing.T) {
	n := newNetMode(t, roce.ModeUDP, 64, 32)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("::ffff:10.0.0.2"), 4, nil) // unmapped like any address
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.2:4791"), b[3].LocalAddr())
	to := netip.MustParseAddrPort("10.0.0.2:4791")
	var frames [][]byte
	var peers []netip.AddrPort
	for q := uint32(1); q <= 20; q++ {
		frames = append(frames, udpPayload(t, "10.0.0.1", "10.0.0.2", q, byte(q)))
		peers = append(peers, to)
	}
	frames = append(frames, udpPayload(t, "10.0.0.1", "10.0.0.9", 1, 99), udpPayload(t, "10.0.0.1", "10.0.0.2", 1, 98), make([]byte, roce.BTHLen-1))
	peers = append(peers, netip.MustParseAddrPort("10.0.0.9:4791"), netip.MustParseAddrPort("10.0.0.2:4792"), to)
	_, err = a[0].SendBatch(frames, peers[:len(peers)-1])
	require.ErrorIs(t, err, ErrInvalid, "a peer for every frame")
	sent, err := a[0].SendBatch(frames, peers)
	require.NoError(t, err)
	assert.Equal(t, len(frames), sent)
	assert.Equal(t, uint64(2), a[0].Counters.NoRoute.Load())
	assert.Equal(t, uint64(1), a[0].Counters.Malformed.Load())
	got := 0
	for i, p := range b {
		fs, from := recvAllFrom(t, p)
		for k, f := range fs {
			assert.Equal(t, a[0].LocalAddr(), from[k])
			var pkt roce.Packet
			require.NoError(t, parseAny(f, from[k], to.Addr(), &pkt))
			q := pkt.BTH.DestQP()
			assert.Equal(t, i, roce.SteerQueue(q, len(b)), "QPN %d steered to port %d", q, i)
			assert.Equal(t, byte(q), pkt.Payload[0])
			got++
		}
	}
	assert.Equal(t, 20, got)
	_, err = b[0].RecvBatch(make([][]byte, 2), make([]netip.AddrPort, 1))
	assert.ErrorIs(t, err, ErrInvalid, "a peer slot for every frame")
	assert.Equal(t, 64, n.FreeBuffers(), "every buffer is back in the pool or with its owner")
}

func TestBackpressure(t *testing.T) {
	n := newNet(t, 8, 4)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	var frames [][]byte
	for i := range 6 {
		frames = append(frames, frame(t, "10.0.0.1", "10.0.0.2", 5, byte(i)))
	}
	sent, err := a[0].SendBatch(frames, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, sent, "the receive queue holds 4")
	got := recvAll(t, b[0])
	require.Len(t, got, 4)
	sent, err = a[0].SendBatch(frames[4:], nil)
	require.NoError(t, err)
	assert.Equal(t, 2, sent)
	got = recvAll(t, b[0])
	require.Len(t, got, 2)
	var pkt roce.Packet
	require.NoError(t, roce.Parse(got[1], &pkt))
	assert.Equal(t, byte(5), pkt.Payload[0], "order kept across the retry")
}

// TestPoolBackpressure: a batch stops where the buffer pool runs dry, in
// order, with every buffer accounted for; frames for two receivers in one
// batch each land in their own queue.
func TestPoolBackpressure(t *testing.T) {
	n := newNet(t, 4, 16)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	c, err := n.Attach(netip.MustParseAddr("10.0.0.3"), 1, nil)
	require.NoError(t, err)
	var frames [][]byte
	for i := range 6 {
		dst := "10.0.0.2"
		if i%2 == 1 {
			dst = "10.0.0.3"
		}
		frames = append(frames, frame(t, "10.0.0.1", dst, 5, byte(i)))
	}
	sent, err := a[0].SendBatch(frames, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, sent, "the pool holds 4 empty buffers")
	assert.Zero(t, n.FreeBuffers())
	assert.Equal(t, 2, b[0].Queued())
	assert.Equal(t, 2, c[0].Queued())
	tags := func(fs [][]byte) []byte {
		var out []byte
		for _, f := range fs {
			var pkt roce.Packet
			require.NoError(t, roce.Parse(f, &pkt))
			out = append(out, pkt.Payload[0])
		}
		return out
	}
	assert.Equal(t, []byte{0, 2}, tags(recvAll(t, b[0])))
	assert.Equal(t, []byte{1, 3}, tags(recvAll(t, c[0])))
	assert.Equal(t, 4, n.FreeBuffers(), "the receivers' empty buffers went back to the pool")
	sent, err = a[0].SendBatch(frames[4:], nil)
	require.NoError(t, err)
	assert.Equal(t, 2, sent)
	assert.Equal(t, []byte{4}, tags(recvAll(t, b[0])))
	assert.Equal(t, []byte{5}, tags(recvAll(t, c[0])))
}

// TestParkedSteadyStream: a sender's frames are copied, its buffers stay
// its own; once the receiver parked its empty buffers in its queue, a
// stream between two ports copies into those and leaves the pool alone;
// every buffer stays accounted for.
func TestParkedSteadyStream(t *testing.T) {
	n := newNet(t, 16, 8)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	frames := make([][]byte, 8)
	send := func(round int) {
		for i := range frames {
			frames[i] = frame(t, "10.0.0.1", "10.0.0.2", 5, byte(round*8+i))
		}
		mine := slices.Clone(frames)
		sent, err := a[0].SendBatch(frames, nil)
		require.NoError(t, err)
		require.Equal(t, 8, sent)
		for i := range frames {
			require.Same(t, &mine[i][0], &frames[i][0], "the sender keeps its buffer %d", i)
		}
	}
	send(0)
	assert.Equal(t, 8, n.pool.length(), "the first batch was copied into buffers of the pool")
	require.Len(t, recvAll(t, b[0]), 8)
	assert.Equal(t, 8, b[0].q.parked(), "the receiver's empty buffers are parked in its queue")
	for round := 1; round < 50; round++ {
		send(round)
		assert.Equal(t, 8, n.pool.length(), "round %d: copied into the parked buffers, not the pool's", round)
		got := recvAll(t, b[0])
		require.Len(t, got, 8)
		var pkt roce.Packet
		require.NoError(t, roce.Parse(got[7], &pkt))
		require.Equal(t, byte(round*8+7), pkt.Payload[0])
	}
	assert.Equal(t, 16, n.FreeBuffers())
}

// TestLongFramesMove: a frame longer than copyMax is not copied: its
// buffer reaches the receiver and the sender's slot gets an empty buffer
// of the same capacity.
func TestLongFramesMove(t *testing.T) {
	n := newNet(t, 8, 8)
	a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	p := roce.Path{Mode: roce.ModeEthernet, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 1000, TTL: 64}
	buf := make([]byte, testCap)
	off := p.Headroom(roce.OpRCSendOnly)
	f, err := p.Build(buf, off, 2*copyMax, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 5}})
	require.NoError(t, err)
	require.Greater(t, len(f), copyMax)
	frames := [][]byte{f}
	sent, err := a[0].SendBatch(frames, nil)
	require.NoError(t, err)
	require.Equal(t, 1, sent)
	assert.NotSame(t, &f[0], &frames[0][0], "the slot got another buffer")
	assert.Equal(t, testCap, len(frames[0]), "an empty buffer of the frame capacity")
	got := recvAll(t, b[0])
	require.Len(t, got, 1)
	assert.Same(t, &f[0], &got[0][0], "the frame's own buffer reached the receiver")
	assert.Equal(t, 8, n.FreeBuffers())
}

// TestParkedReclaim: empty buffers parked in the queue of a port nobody
// sends to any more are not lost to the others. A sender that finds no
// empty buffer in its receiver's queue nor in the pool takes them back
// into the pool, on the perfect path and through faults.
func TestParkedReclaim(t *testing.T) {
	for _, faulty := range []bool{false, true} {
		t.Run(map[bool]string{false: "perfect", true: "faults"}[faulty], func(t *testing.T) {
			n := newNet(t, 4, 8)
			var f *Faults
			if faulty {
				f = &Faults{Seed: 1, Corrupt: 1e-9} // a lossy port that loses nothing
			}
			a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, f)
			require.NoError(t, err)
			b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
			require.NoError(t, err)
			c, err := n.Attach(netip.MustParseAddr("10.0.0.3"), 1, nil)
			require.NoError(t, err)
			batch := func(dst string) [][]byte {
				var fs [][]byte
				for i := range 4 {
					fs = append(fs, frame(t, "10.0.0.1", dst, 5, byte(i)))
				}
				return fs
			}
			sent, err := a[0].SendBatch(batch("10.0.0.2"), nil)
			require.NoError(t, err)
			require.Equal(t, 4, sent)
			require.Len(t, recvAll(t, b[0]), 4)
			require.Zero(t, n.pool.length())
			require.Equal(t, 4, b[0].q.parked(), "every empty buffer is parked in b's queue")
			sent, err = a[0].SendBatch(batch("10.0.0.3"), nil)
			require.NoError(t, err)
			assert.Equal(t, 4, sent, "c's frames got b's parked buffers")
			assert.Len(t, recvAll(t, c[0]), 4)
			assert.Equal(t, 4, n.FreeBuffers())
		})
	}
}

// TestFaultsReplay: the same seed makes the same decisions for the same
// frames; the counters add up and no buffer is lost. In ModeUDP every
// frame, held back or duplicated, arrives with its sender beside it.
func TestFaultsReplay(t *testing.T) {
	for _, mode := range []roce.Mode{roce.ModeEthernet, roce.ModeUDP} {
		t.Run(mode.String(), func(t *testing.T) { testFaultsReplay(t, mode) })
	}
}

func testFaultsReplay(t *testing.T, mode roce.Mode) {
	dst := netip.MustParseAddrPort("10.0.0.2:4791")
	run := func(seed uint64) (tags []byte, c *PortCounters, n *Network) {
		n = newNetMode(t, mode, 256, 256)
		f := &Faults{Seed: seed, Drop: 0.2, Duplicate: 0.1, Reorder: 0.1, Corrupt: 0.05}
		a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, f)
		require.NoError(t, err)
		b, err := n.Attach(dst.Addr(), 1, nil)
		require.NoError(t, err)
		for i := range 100 {
			fr := [][]byte{frame(t, "10.0.0.1", "10.0.0.2", 3, byte(i))}
			if mode == roce.ModeUDP {
				fr[0] = udpPayload(t, "10.0.0.1", "10.0.0.2", 3, byte(i))
			}
			sent, err := a[0].SendBatch(fr, []netip.AddrPort{dst})
			require.NoError(t, err)
			require.Equal(t, 1, sent)
		}
		a[0].releaseHeld(true)
		frames, from := recvAllFrom(t, b[0])
		for i, fr := range frames {
			var pkt roce.Packet
			if mode == roce.ModeUDP {
				require.Equal(t, a[0].LocalAddr(), from[i], "the sender beside frame %d", i)
			} else {
				require.False(t, from[i].IsValid(), "nothing beside an Ethernet frame")
			}
			if parseAny(fr, from[i], dst.Addr(), &pkt) == nil {
				tags = append(tags, pkt.Payload[0])
			} else {
				tags = append(tags, 0xff)
			}
		}
		return tags, &a[0].Counters, n
	}
	t1, c, n := run(42)
	t2, _, _ := run(42)
	t3, _, _ := run(43)
	// The decisions replay exactly; when a held frame is released also
	// depends on the clock (reorder age limit, delay), so compare the
	// delivered frames as a multiset.
	slices.Sort(t1)
	slices.Sort(t2)
	slices.Sort(t3)
	assert.Equal(t, t1, t2, "same seed, same frames: same outcome")
	assert.NotEqual(t, t1, t3)
	assert.NotZero(t, c.Dropped.Load())
	assert.NotZero(t, c.Duplicated.Load())
	assert.NotZero(t, c.Reordered.Load())
	assert.NotZero(t, c.Corrupted.Load())
	assert.Contains(t, t1, byte(0xff), "a corrupted frame fails its ICRC")
	assert.Equal(t, 100-int(c.Dropped.Load())+int(c.Duplicated.Load()), len(t1))
	assert.Equal(t, 256, n.FreeBuffers())
}

// TestHeldFrameWakesOwner: a frame a lossy port holds back (delayed, or
// reordered behind later frames that never come) must not wait for the
// owner's next send or receive. An engine worker with nothing to do sleeps
// until Ready or its next timer (an ACK timeout), so the port signals Ready
// when the frame is due; the owner's next call releases it. Before this, a
// quiet sender's held frame went out only with its next retransmission, and
// the fault "delay" acted as a loss.
func TestHeldFrameWakesOwner(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults Faults
	}{
		{"delay", Faults{Seed: 7, Delay: 1, DelayFor: 5 * time.Millisecond}},
		// No later frames: the age limit.
		{"reorder", Faults{Seed: 7, Reorder: 1, ReorderMaxAge: 5 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNet(t, 16, 16)
			a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, &tc.faults)
			require.NoError(t, err)
			b, err := n.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
			require.NoError(t, err)
			// The port's clock stands still until the wake-up came, so a
			// preempted SendBatch cannot find the frame due and release it
			// itself; the wake-up timer still runs on real time.
			var clock atomic.Int64
			a[0].f.now = clock.Load
			sent, err := a[0].SendBatch([][]byte{frame(t, "10.0.0.1", "10.0.0.2", 3, 9)}, nil)
			require.NoError(t, err)
			require.Equal(t, 1, sent)
			require.Equal(t, 1, a[0].Held(), "the fault holds the frame back")
			require.Zero(t, b[0].Queued())
			select {
			case <-a[0].Ready():
			case <-time.After(10 * time.Second):
				t.Fatal("the sending port never signalled Ready for its held frame")
			}
			clock.Store(int64(tc.faults.DelayFor + tc.faults.ReorderMaxAge))
			// The owner's reaction to Ready: a receive (nothing for it).
			got, err := a[0].RecvBatch([][]byte{make([]byte, testCap)}, nil)
			require.NoError(t, err)
			assert.Zero(t, got)
			assert.Zero(t, a[0].Held(), "released by the owner's call after the wake-up")
			require.Len(t, recvAll(t, b[0]), 1)
			assert.Equal(t, 16, n.FreeBuffers(), "buffers conserved (the receiver exchanged one for the frame)")
		})
	}
}

// FuzzSendBatch: whatever bytes and destination a sender hands the link,
// in either mode, routing never panics and buffers are conserved.
func FuzzSendBatch(f *testing.F) {
	f.Add(frame(f, "10.0.0.1", "10.0.0.2", 7, 1), false, []byte{10, 0, 0, 2}, uint16(4791))
	f.Add(udpPayload(f, "10.0.0.1", "10.0.0.2", 7, 1), true, []byte{10, 0, 0, 2}, uint16(4791))
	f.Add(udpPayload(f, "10.0.0.1", "::2", 7, 1), true, netip.MustParseAddr("::2").AsSlice(), uint16(4791))
	f.Add([]byte{}, true, []byte{}, uint16(0))
	f.Add(make([]byte, 40), false, []byte{}, uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, udp bool, to []byte, port uint16) {
		mode := roce.ModeEthernet
		if udp {
			mode = roce.ModeUDP
		}
		n := newNetMode(t, mode, 4, 4)
		a, err := n.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
		require.NoError(t, err)
		_, err = n.Attach(netip.MustParseAddr("::2"), 2, nil)
		require.NoError(t, err)
		_, err = n.Attach(netip.MustParseAddr("10.0.0.2"), 2, nil)
		require.NoError(t, err)
		addr, _ := netip.AddrFromSlice(to)
		buf := make([]byte, testCap)
		m := copy(buf, b)
		_, err = a[0].SendBatch([][]byte{buf[:m]}, []netip.AddrPort{netip.AddrPortFrom(addr, port)})
		require.NoError(t, err)
		c := &a[0].Counters
		require.Equal(t, uint64(1), c.Sent.Load())
		delivered := int(c.Sent.Load() - c.NoRoute.Load() - c.Malformed.Load())
		require.Equal(t, 4, n.FreeBuffers()+delivered, "buffers conserved: a delivered frame waits in a queue")
	})
}
