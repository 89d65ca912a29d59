package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
	"go.uber.org/goleak"
)

var _ linkIface = (*TAPPort)(nil)

// fakeTAPQueue is a TAP queue for unit tests of the port logic: frames
// sent on in are queued (by a feeder goroutine, as the kernel queues
// them) and returned by TryReadBatch; WaitReadable waits until one is
// queued; written frames are copied to out (or refused when refuse says
// so).
type fakeTAPQueue struct {
	in     chan []byte
	closed chan struct{}
	once   sync.Once

	qmu    sync.Mutex
	queued [][]byte
	notify chan struct{}

	mu     sync.Mutex
	out    [][]byte
	refuse func(frame []byte) bool
}

func newFakeTAPQueue() *fakeTAPQueue {
	q := &fakeTAPQueue{in: make(chan []byte, 1024), closed: make(chan struct{}), notify: make(chan struct{}, 1)}
	go q.feed()
	return q
}

func (q *fakeTAPQueue) feed() {
	for {
		select {
		case f := <-q.in:
			q.qmu.Lock()
			q.queued = append(q.queued, f)
			q.qmu.Unlock()
			select {
			case q.notify <- struct{}{}:
			default:
			}
		case <-q.closed:
			return
		}
	}
}

func (q *fakeTAPQueue) TryReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-q.closed:
		return 0, fmt.Errorf("fake queue: %w", os.ErrClosed)
	default:
	}
	q.qmu.Lock()
	defer q.qmu.Unlock()
	n := 0
	for n < len(bufs) && len(q.queued) > 0 {
		sizes[n] = copy(bufs[n][offset:], q.queued[0])
		q.queued = q.queued[1:]
		n++
	}
	return n, nil
}

func (q *fakeTAPQueue) WaitReadable() error {
	for {
		q.qmu.Lock()
		n := len(q.queued)
		q.qmu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-q.notify:
		case <-q.closed:
			return fmt.Errorf("fake queue: %w", os.ErrClosed)
		}
	}
}

func (q *fakeTAPQueue) WriteBatch(bufs [][]byte, offset int) (int, error) {
	select {
	case <-q.closed:
		return 0, fmt.Errorf("fake queue: %w", os.ErrClosed)
	default:
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, b := range bufs {
		if q.refuse != nil && q.refuse(b) {
			return i, errors.New("fake queue: refused")
		}
		q.out = append(q.out, bytes.Clone(b[offset:]))
	}
	return len(bufs), nil
}

func (q *fakeTAPQueue) close() { q.once.Do(func() { close(q.closed) }) }

// fakeNeighbors records the frames handed to the neighbour engine.
type fakeNeighbors struct {
	mu     sync.Mutex
	frames int
}

func (n *fakeNeighbors) HandleFrame(frame []byte) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.frames++
	return true
}

func (n *fakeNeighbors) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.frames
}

func newFakeTAPLink(t *testing.T, queues int, cfg TAPConfig) (*TAPLink, []*fakeTAPQueue, *fakeNeighbors) {
	t.Helper()
	fqs := make([]*fakeTAPQueue, queues)
	qs := make([]tapQueue, queues)
	for i := range fqs {
		fqs[i] = newFakeTAPQueue()
		qs[i] = fqs[i]
	}
	neigh := &fakeNeighbors{}
	if cfg.FrameCap == 0 {
		cfg.FrameCap = testFrameCap
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	l, err := newTAPLink(qs, neigh, cfg, func() error {
		for _, q := range fqs {
			q.close()
		}
		return nil
	})
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l, fqs, neigh
}

// qpnOnQueue returns the n-th QPN (from 0x100) owned by queue q of nq.
func qpnOnQueue(q, nq, n int) uint32 {
	for qpn := uint32(0x100); ; qpn++ {
		if roce.SteerQueue(qpn, nq) == q {
			if n == 0 {
				return qpn
			}
			n--
		}
	}
}

func tapPath(v6 bool) *roce.Path {
	p := &roce.Path{Mode: roce.ModeEthernet, SrcMAC: [6]byte{2, 1, 1, 1, 1, 1}, DstMAC: [6]byte{2, 2, 2, 2, 2, 2},
		Src: netip.MustParseAddr("10.77.0.1"), Dst: netip.MustParseAddr("10.77.0.2"), SrcPort: 0xc000, TTL: 64, DontFragment: true}
	if v6 {
		p.Src, p.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	}
	return p
}

func tapHeaders() roce.Headers {
	return roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff}}
}

func roceFrameFor(t testing.TB, qpn uint32, psn uint32, n int, v6 bool) []byte {
	h := tapHeaders()
	h.BTH.DestQP, h.BTH.PSN = qpn, psn
	return bytes.Clone(buildFrame(t, tapPath(v6), &h, n))
}

// recvTAP receives exactly n frames from p (copies), waiting on Ready.
func recvTAP(t testing.TB, p *TAPPort, n int) [][]byte {
	t.Helper()
	bufs := newBufs(8)
	var out [][]byte
	deadline := time.NewTimer(recvTimeout)
	defer deadline.Stop()
	for len(out) < n {
		var k int
		if out, k = recvCopies(t, p, bufs, out); k > 0 {
			continue
		}
		p.ArmReady()
		select {
		case <-p.Ready():
		case <-deadline.C:
			require.FailNow(t, "timed out", "got %d of %d frames", len(out), n)
		}
	}
	return out
}

// recvCopies makes one RecvBatch on p into bufs (each first stretched to
// its capacity) and appends copies of the k frames it got to out.
func recvCopies(t testing.TB, p *TAPPort, bufs, out [][]byte) ([][]byte, int) {
	t.Helper()
	for i := range bufs {
		bufs[i] = bufs[i][:cap(bufs[i])]
	}
	k, err := p.RecvBatch(bufs, nil)
	require.NoError(t, err)
	for i := range k {
		out = append(out, bytes.Clone(bufs[i]))
	}
	return out, k
}

func TestTAPReceive(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("ipv6=%v", v6), func(t *testing.T) {
			l, fqs, _ := newFakeTAPLink(t, 4, TAPConfig{Batch: 4})
			p := l.Ports()[2]
			var want [][]byte
			for i := range 50 { // more than a batch
				f := roceFrameFor(t, qpnOnQueue(2, 4, i%3), uint32(i), i*37, v6)
				want = append(want, f)
				fqs[2].in <- f
			}
			got := recvTAP(t, p, len(want))
			require.Len(t, got, len(want))
			for i := range want {
				assert.Equal(t, want[i], got[i], "frame %d", i)
			}
			assert.EqualValues(t, 50, p.Counters.RxFrames.Load())
			assert.Zero(t, p.Counters.RxMisqueued.Load())
		})
	}
}

// TestTAPReceiveInPlace: frames land in the caller's own buffers (no
// exchange, no copy after the read); slots of frames that were not RoCE
// keep their buffers at full length; a batch stops at Batch frames.
func TestTAPReceiveInPlace(t *testing.T) {
	l, fqs, neigh := newFakeTAPLink(t, 1, TAPConfig{Batch: 3})
	p := l.Ports()[0]
	mine := newBufs(4)
	ours := map[*byte]bool{}
	for _, b := range mine {
		ours[&b[:1][0]] = true
	}
	arp := make([]byte, 42)
	copy(arp, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 9, 9, 9, 9, 9, 0x08, 0x06})
	f0 := roceFrameFor(t, qpnOnQueue(0, 1, 0), 0, 10, false)
	f1 := roceFrameFor(t, qpnOnQueue(0, 1, 0), 1, 20, false)
	f2 := roceFrameFor(t, qpnOnQueue(0, 1, 0), 2, 30, false)
	for _, f := range [][]byte{f0, arp, f1, f2} {
		fqs[0].in <- f
	}
	require.Eventually(t, func() bool {
		fqs[0].qmu.Lock()
		defer fqs[0].qmu.Unlock()
		return len(fqs[0].queued) == 4
	}, recvTimeout, time.Millisecond)
	k, err := p.RecvBatch(mine, nil)
	require.NoError(t, err)
	require.Equal(t, 2, k, "three frames read (the batch), one of them ARP")
	assert.Equal(t, f0, mine[0])
	assert.Equal(t, f1, mine[1])
	assert.Equal(t, 1, neigh.count())
	for i, b := range mine {
		assert.True(t, ours[&b[:1][0]], "slot %d holds one of the caller's buffers", i)
		if i >= k {
			assert.Equal(t, testFrameCap, len(b), "slot %d back at full length", i)
		}
	}
	for i := range mine {
		mine[i] = mine[i][:cap(mine[i])]
	}
	k, err = p.RecvBatch(mine, nil)
	require.NoError(t, err)
	require.Equal(t, 1, k)
	assert.Equal(t, f2, mine[0])
}

func TestTAPReceiveClassifies(t *testing.T) {
	arp := make([]byte, 42)
	copy(arp, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 9, 9, 9, 9, 9, 0x08, 0x06})
	tcp := roceFrameFor(t, qpnOnQueue(0, 2, 0), 1, 10, false)
	tcp[14+9] = 6 // IPv4 protocol TCP
	otherPort := roceFrameFor(t, qpnOnQueue(0, 2, 0), 2, 10, false)
	binary.BigEndian.PutUint16(otherPort[14+20+2:], 4792)
	fragment := roceFrameFor(t, qpnOnQueue(0, 2, 0), 3, 10, false)
	binary.BigEndian.PutUint16(fragment[14+6:], 0x2000) // MF
	tagged := roceFrameFor(t, qpnOnQueue(0, 2, 0), 4, 10, false)
	tagged = append(append(bytes.Clone(tagged[:12]), 0x81, 0x00, 0x00, 0x05), tagged[12:]...)

	cases := []struct {
		name                          string
		frame                         []byte
		roce, neigh, other, misqueued int
	}{
		{"roce", roceFrameFor(t, qpnOnQueue(0, 2, 0), 5, 10, false), 1, 0, 0, 0},
		{"roce-vlan", tagged, 1, 0, 0, 0},
		{"roce-ipv6", roceFrameFor(t, qpnOnQueue(0, 2, 1), 6, 10, true), 1, 0, 0, 0},
		{"roce-other-queue", roceFrameFor(t, qpnOnQueue(1, 2, 0), 7, 10, false), 0, 0, 0, 1},
		{"arp", arp, 0, 1, 0, 0},
		{"tcp", tcp, 0, 0, 1, 0},
		{"udp-other-port", otherPort, 0, 0, 1, 0},
		{"ip-fragment", fragment, 0, 0, 1, 0},
		{"truncated", tcp[:20], 0, 0, 1, 0},
		{"empty", nil, 0, 0, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, fqs, neigh := newFakeTAPLink(t, 2, TAPConfig{})
			p := l.Ports()[0]
			fqs[0].in <- tc.frame
			marker := roceFrameFor(t, qpnOnQueue(0, 2, 2), 99, 1, false)
			fqs[0].in <- marker // a frame after the one under test: when it is out, the first was handled
			got := recvTAP(t, p, 1+tc.roce)
			assert.Equal(t, marker, got[len(got)-1])
			if tc.roce == 1 {
				assert.Equal(t, tc.frame, got[0])
			}
			c := &p.Counters
			assert.EqualValues(t, 1+tc.roce, c.RxFrames.Load(), "rx frames")
			assert.EqualValues(t, tc.neigh, c.RxNeighbor.Load(), "neighbour frames")
			assert.Equal(t, tc.neigh, neigh.count(), "frames handed to the neighbour engine")
			assert.EqualValues(t, tc.other, c.RxOther.Load(), "other frames")
			assert.EqualValues(t, tc.misqueued, c.RxMisqueued.Load(), "misqueued frames")
		})
	}
}

// TestTAPReadyNoLostWakeup: a receiver that sleeps on Ready whenever
// RecvBatch finds nothing gets every frame of a producer that sends at
// arbitrary moments.
func TestTAPReadyNoLostWakeup(t *testing.T) {
	l, fqs, _ := newFakeTAPLink(t, 1, TAPConfig{Batch: 4})
	p := l.Ports()[0]
	const n = 2000
	go func() {
		for i := range n {
			fqs[0].in <- roceFrameFor(t, qpnOnQueue(0, 1, 0), uint32(i), 8, false)
			if i%7 == 0 {
				time.Sleep(time.Duration(i%3) * time.Microsecond * 50)
			}
		}
	}()
	got := recvTAP(t, p, n)
	require.Len(t, got, n)
	for i, f := range got {
		var pkt roce.Packet
		require.NoError(t, roce.Parse(f, &pkt))
		assert.Equal(t, uint32(i), pkt.BTH.PSN(), "in order")
	}
}

func TestTAPSend(t *testing.T) {
	l, fqs, _ := newFakeTAPLink(t, 2, TAPConfig{})
	p := l.Ports()[1]
	frames := [][]byte{{1, 1}, {2, 2, 2}, {3}, {4, 4, 4, 4}}
	fqs[1].refuse = func(f []byte) bool { return f[0] == 3 }
	n, err := p.SendBatch(frames, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "a refused frame is dropped, not retried")
	assert.Equal(t, [][]byte{{1, 1}, {2, 2, 2}, {4, 4, 4, 4}}, fqs[1].out)
	assert.EqualValues(t, 3, p.Counters.TxFrames.Load())
	assert.EqualValues(t, 9, p.Counters.TxBytes.Load())
	assert.EqualValues(t, 1, p.Counters.TxErrors.Load())
	assert.Len(t, frames[0], 2, "the caller keeps its buffers")
	assert.Empty(t, fqs[0].out, "queue 0 untouched")

	require.NoError(t, l.Close())
	_, err = p.SendBatch(frames, nil)
	assert.ErrorIs(t, err, ErrTAPClosed)
	k, err := p.RecvBatch(newBufs(2), nil)
	assert.NoError(t, err)
	assert.Zero(t, k)
}

func TestTAPConfigErrors(t *testing.T) {
	q := []tapQueue{newFakeTAPQueue()}
	cases := []struct {
		name string
		qs   []tapQueue
		cfg  TAPConfig
	}{
		{"no-queues", nil, TAPConfig{FrameCap: testFrameCap}},
		{"small-frames", q, TAPConfig{FrameCap: 64}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTAPLink(tc.qs, nil, tc.cfg, func() error { return nil })
			assert.ErrorIs(t, err, ErrInvalid)
		})
	}
	_, err := NewTAP(nil, TAPConfig{FrameCap: testFrameCap})
	assert.ErrorIs(t, err, ErrInvalid)

	l, _, _ := newFakeTAPLink(t, 1, TAPConfig{})
	_, err = l.Ports()[0].RecvBatch([][]byte{make([]byte, 10)}, nil)
	assert.ErrorIs(t, err, ErrInvalid, "a receive buffer smaller than the frame capacity")
}

func TestTAPCloseStopsReaders(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	fq := newFakeTAPQueue()
	l, err := newTAPLink([]tapQueue{fq, fq, fq}, nil, TAPConfig{FrameCap: testFrameCap, Logger: slog.New(slog.DiscardHandler)}, func() error {
		fq.close()
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "idempotent")
	goleak.VerifyNone(t, ignore)
	assert.Len(t, l.Stats(), 3)
}

// allocQueue queues one prepared frame per tick without allocating.
type allocQueue struct {
	frame []byte
	tick  chan struct{}
	done  chan struct{}
}

func (q *allocQueue) TryReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-q.tick:
		sizes[0] = copy(bufs[0][offset:], q.frame)
		return 1, nil
	default:
		return 0, nil
	}
}

func (q *allocQueue) WaitReadable() error {
	<-q.done
	return os.ErrClosed
}

func (q *allocQueue) WriteBatch(bufs [][]byte, offset int) (int, error) { return len(bufs), nil }

// TestTAPNoAllocation: a steady-state receive and send allocate nothing.
func TestTAPNoAllocation(t *testing.T) {
	q := &allocQueue{frame: roceFrameFor(t, 0x100, 1, 1024, false), tick: make(chan struct{}, 1), done: make(chan struct{})}
	l, err := newTAPLink([]tapQueue{q}, nil, TAPConfig{FrameCap: testFrameCap, Logger: slog.New(slog.DiscardHandler)}, func() error {
		close(q.done)
		return nil
	})
	require.NoError(t, err)
	defer l.Close()
	p := l.Ports()[0]
	bufs := newBufs(4)
	round := func() {
		q.tick <- struct{}{}
		k, _ := p.RecvBatch(bufs[:1], nil)
		if k != 1 {
			panic("no frame")
		}
		bufs[0] = bufs[0][:cap(bufs[0])]
		p.SendBatch(bufs[1:], nil)
	}
	for range 10 {
		round()
	}
	allocs := testing.AllocsPerRun(200, round)
	assert.Zero(t, allocs)
}

// TestTAPLoopback: frames to the device's own MAC never reach the kernel;
// they are delivered, in order and intact, to the port owning their
// destination QP (whose worker Ready wakes), between the frames that do
// go out; a full loopback queue drops and counts.
func TestTAPLoopback(t *testing.T) {
	l, fqs, _ := newFakeTAPLink(t, 2, TAPConfig{})
	l.mac, l.hasMAC = tap.MAC(tapPath(false).DstMAC), true
	toSelf := func(qpn, psn uint32) []byte { return roceFrameFor(t, qpn, psn, 64, false) }
	away := roceFrameFor(t, qpnOnQueue(0, 2, 0), 9, 64, false)
	away[5] = 0x77 // another host's MAC
	q1a, q1b, q0 := toSelf(qpnOnQueue(1, 2, 0), 1), toSelf(qpnOnQueue(1, 2, 1), 2), toSelf(qpnOnQueue(0, 2, 0), 3)
	require.NotEqual(t, l.mac, tap.MAC(away[:6]))

	p0 := l.Ports()[0]
	n, err := p0.SendBatch([][]byte{q1a, away, q0, q1b}, nil)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	assert.Equal(t, [][]byte{away}, fqs[0].out, "only the frame to another MAC reaches the kernel")
	assert.EqualValues(t, 3, p0.Counters.LoopFrames.Load())
	assert.Equal(t, [][]byte{q1a, q1b}, recvTAP(t, l.Ports()[1], 2), "port 1 gets its QPs' frames, in order")
	assert.Equal(t, [][]byte{q0}, recvTAP(t, p0, 1), "port 0 its own")

	// Nobody reads port 1: its queue holds loopCap frames, then drops.
	for i := range loopCap + 3 {
		_, err := p0.SendBatch([][]byte{toSelf(qpnOnQueue(1, 2, 0), uint32(i))}, nil)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 3, p0.Counters.LoopDropped.Load())
	got := recvTAP(t, l.Ports()[1], loopCap)
	assert.Equal(t, toSelf(qpnOnQueue(1, 2, 0), loopCap-1), got[loopCap-1], "the first loopCap frames, in order")
}
