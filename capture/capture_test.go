package capture

import (
	"bytes"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// rxeFrames are the RoCE v2 frames of a capture of Linux Soft-RoCE
// (ibv_rc_pingpong), as Ethernet frames.
func rxeFrames(t *testing.T) [][]byte {
	t.Helper()
	f, err := os.Open("../roce/testdata/rxe/rc_pingpong.pcap")
	require.NoError(t, err)
	defer f.Close()
	r, err := roce.NewPcapReader(f)
	require.NoError(t, err)
	var out [][]byte
	for {
		_, b, err := r.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		var p roce.Packet
		if roce.Parse(b, &p) == nil {
			out = append(out, append([]byte(nil), b...))
		}
	}
	require.NotEmpty(t, out)
	return out
}

// buf is an io.WriteCloser into memory.
type buf struct {
	mu     sync.Mutex
	b      bytes.Buffer
	closed bool
}

func (b *buf) Write(p []byte) (int, error) { b.mu.Lock(); defer b.mu.Unlock(); return b.b.Write(p) }
func (b *buf) Close() error                { b.mu.Lock(); defer b.mu.Unlock(); b.closed = true; return nil }

// readPcapng returns the frames of a pcapng stream and their comments.
func readPcapng(t *testing.T, b []byte) (frames [][]byte, comments []string) {
	t.Helper()
	fs, err := ReadFrames(b)
	require.NoError(t, err)
	for _, f := range fs {
		frames = append(frames, f.Data)
		comments = append(comments, f.Comment)
	}
	return frames, comments
}

// TestCaptureEthernet: frames sent and received through a wrapped link
// are captured byte for byte, in order, up to Count, and the file is what
// tshark reads as RoCE v2 with no malformed frame.
func TestCaptureEthernet(t *testing.T) {
	in := rxeFrames(t)
	nw, err := link.NewNetwork(link.Config{Mode: roce.ModeEthernet, FrameCap: 9000, QueueLen: 1024, Buffers: 1024})
	require.NoError(t, err)
	pa, err := nw.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	pb, err := nw.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	tap := New(roce.ModeEthernet, netip.AddrPort{})
	la := tap.Wrap(pa[0])
	_, isArmer := la.(interface{ ArmReady() })
	_, portArms := any(pa[0]).(interface{ ArmReady() })
	assert.Equal(t, portArms, isArmer, "Wrap keeps ArmReady")

	out := &buf{}
	done, err := tap.Start(out, Options{Count: len(in)}, nil)
	require.NoError(t, err)
	_, err = tap.Start(&buf{}, Options{}, nil)
	assert.ErrorIs(t, err, ErrBusy)
	// Send every frame twice (only the first len(in) are captured).
	for range 2 {
		for _, f := range in {
			// The in-memory network routes by destination address: the
			// frames' own addresses do not matter to the capture.
			n, err := la.SendBatch([][]byte{append([]byte(nil), f...)}, []netip.AddrPort{{}})
			require.NoError(t, err)
			require.Equal(t, 1, n)
		}
	}
	select {
	case st := <-done:
		assert.Equal(t, uint64(len(in)), st.Captured)
		assert.Zero(t, st.Dropped)
	case <-time.After(10 * time.Second):
		t.Fatal("the capture did not end after Count frames")
	}
	assert.True(t, out.closed)
	got, _ := readPcapng(t, out.b.Bytes())
	require.Len(t, got, len(in))
	for i := range in {
		require.Equal(t, in[i], got[i], "frame %d", i)
	}
	_ = pb

	testenv.NeedTool(t, "tshark")
	path := filepath.Join(t.TempDir(), "c.pcapng")
	require.NoError(t, os.WriteFile(path, out.b.Bytes(), 0o644))
	tsharkCheck(t, path, len(in))
}

// TestCaptureMovedFrames: a link may hand the buffers it takes on and
// leave empty ones in their slots (the in-memory link moves long frames to
// the receiver); the capture still records the frames it sent, byte for
// byte, short and long.
func TestCaptureMovedFrames(t *testing.T) {
	nw, err := link.NewNetwork(link.Config{Mode: roce.ModeEthernet, FrameCap: 9000, QueueLen: 64, Buffers: 64})
	require.NoError(t, err)
	pa, err := nw.Attach(netip.MustParseAddr("10.0.0.1"), 1, nil)
	require.NoError(t, err)
	pb, err := nw.Attach(netip.MustParseAddr("10.0.0.2"), 1, nil)
	require.NoError(t, err)
	path := roce.Path{Mode: roce.ModeEthernet, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 1000, TTL: 64}
	var want [][]byte
	frames := make([][]byte, 0, 2)
	for i, n := range []int{16, 4000} {
		buf := make([]byte, 9000)
		off := path.Headroom(roce.OpRCSendOnly)
		for j := range n {
			buf[off+j] = byte(i + j)
		}
		f, err := path.Build(buf, off, n, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 7, PSN: uint32(i)}})
		require.NoError(t, err)
		want = append(want, append([]byte(nil), f...))
		frames = append(frames, f)
	}
	tap := New(roce.ModeEthernet, netip.AddrPort{})
	la := tap.Wrap(pa[0])
	out := &buf{}
	done, err := tap.Start(out, Options{Count: len(want)}, nil)
	require.NoError(t, err)
	n, err := la.SendBatch(frames, []netip.AddrPort{{}, {}})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.NotEqual(t, want[1], frames[1], "the link moved the long frame and left another buffer in its slot")
	// One more send: the capture, at its Count, ends on it.
	_, err = la.SendBatch([][]byte{append([]byte(nil), want[0]...)}, []netip.AddrPort{{}})
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the capture did not end after Count frames")
	}
	got, _ := readPcapng(t, out.b.Bytes())
	require.Len(t, got, 2)
	for i := range want {
		require.Equal(t, want[i], got[i], "frame %d", i)
	}
	rx := [][]byte{make([]byte, 9000), make([]byte, 9000), make([]byte, 9000)}
	k, err := pb[0].RecvBatch(rx, nil)
	require.NoError(t, err)
	require.Equal(t, 3, k)
	for i := range want {
		require.Equal(t, want[i], rx[i], "received frame %d", i)
	}
}

// tsharkCheck has tshark read path (with extra options): n frames, each
// decoded as InfiniBand (RoCE v2), none malformed.
func tsharkCheck(t *testing.T, path string, n int, extra ...string) {
	t.Helper()
	args := append([]string{"-r", path, "-T", "fields", "-e", "frame.protocols", "-e", "_ws.malformed", "-e", "_ws.expert.severity"}, extra...)
	b, err := exec.Command("tshark", args...).Output()
	require.NoError(t, err, "%s", b)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	require.Len(t, lines, n, "%s", b)
	for i, l := range lines {
		col := strings.Split(l, "\t")
		assert.Contains(t, col[0], "infiniband", "frame %d: %s", i+1, l)
		assert.Empty(t, col[1], "frame %d malformed: %s", i+1, l)
	}
}

// udpParts splits an Ethernet/IPv4/UDP frame into its addresses and the
// UDP payload.
func udpParts(t *testing.T, f []byte) (src, dst netip.AddrPort, payload []byte) {
	t.Helper()
	require.Equal(t, byte(0x45), f[14], "IPv4 without options")
	ip := f[14:]
	u := ip[20:]
	sa, _ := netip.AddrFromSlice(ip[12:16])
	da, _ := netip.AddrFromSlice(ip[16:20])
	src = netip.AddrPortFrom(sa, uint16(u[0])<<8|uint16(u[1]))
	dst = netip.AddrPortFrom(da, uint16(u[2])<<8|uint16(u[3]))
	return src, dst, u[8:]
}

// udpPacket builds a ModeUDP RC SEND_ONLY from src to dst, as the engine
// sends it: the ICRC covers the pseudo header of src and dst.
func udpPacket(t *testing.T, src, dst netip.AddrPort, psn uint32) []byte {
	t.Helper()
	p := roce.Path{Mode: roce.ModeUDP, Src: src.Addr(), Dst: dst.Addr(), SrcPort: src.Port(), DstPort: dst.Port()}
	const n = 100
	buf := make([]byte, roce.MaxHeadroom+n+roce.MaxTailroom)
	for i := range n {
		buf[roce.MaxHeadroom+i] = byte(psn + uint32(i))
	}
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x11, PSN: psn}}
	pkt, err := p.Build(buf, roce.MaxHeadroom, n, &h)
	require.NoError(t, err)
	return append([]byte(nil), pkt...)
}

// TestCaptureUDP: in ModeUDP the capture writes the datagrams as the
// frames a tap on the wire would see: Ethernet/IP/UDP with the link's and
// the peer's addresses and ports, whose ICRC verifies, sent and received.
func TestCaptureUDP(t *testing.T) {
	local := netip.MustParseAddrPort("127.0.0.1:4791")
	peer := netip.MustParseAddrPort("127.0.0.2:4791")
	var tx, rx [][]byte
	var peers []netip.AddrPort
	for i := range 8 {
		tx = append(tx, udpPacket(t, local, peer, uint32(i)))
		rx = append(rx, udpPacket(t, peer, local, uint32(100+i)))
		peers = append(peers, peer)
	}
	fl := &fakeLink{rx: rx, peers: peers}
	tap := New(roce.ModeUDP, local)
	l := tap.Wrap(fl)
	out := &buf{}
	stop := make(chan struct{})
	done, err := tap.Start(out, Options{}, stop)
	require.NoError(t, err)
	_, err = l.SendBatch(tx, peers)
	require.NoError(t, err)
	n, err := l.RecvBatch(make([][]byte, len(rx)), make([]netip.AddrPort, len(rx)))
	require.NoError(t, err)
	require.Equal(t, len(rx), n)
	require.Eventually(t, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		f, _ := readPcapng(t, out.b.Bytes())
		return len(f) == len(tx)+len(rx)
	}, 10*time.Second, time.Millisecond)
	close(stop)
	st := <-done
	assert.Equal(t, uint64(len(tx)+len(rx)), st.Captured)
	got, _ := readPcapng(t, out.b.Bytes())
	for i, f := range got {
		var p roce.Packet
		require.NoError(t, roce.Parse(f, &p), "frame %d: the ICRC verifies over the synthesized headers", i)
		src, dst, pl := udpParts(t, f)
		if i < len(tx) {
			assert.Equal(t, local, src, "sent: from the link")
			assert.Equal(t, peer, dst)
			assert.Equal(t, tx[i], pl)
		} else {
			assert.Equal(t, peer, src, "received: from the peer")
			assert.Equal(t, local, dst)
			assert.Equal(t, rx[i-len(tx)], pl)
		}
	}
	testenv.NeedTool(t, "tshark")
	path := filepath.Join(t.TempDir(), "u.pcapng")
	require.NoError(t, os.WriteFile(path, out.b.Bytes(), 0o644))
	tsharkCheck(t, path, len(got))
}

// fakeLink takes every frame sent and returns rx (from peers) once.
type fakeLink struct {
	rx    [][]byte
	peers []netip.AddrPort
}

func (f *fakeLink) SendBatch(frames [][]byte, _ []netip.AddrPort) (int, error) {
	return len(frames), nil
}
func (f *fakeLink) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	n := copy(frames, f.rx)
	copy(peers, f.peers)
	f.rx, f.peers = f.rx[n:], f.peers[n:]
	return n, nil
}
func (f *fakeLink) Ready() <-chan struct{} { return nil }

// blockingWriter blocks every Write once armed, until block is closed.
type blockingWriter struct {
	armed atomic.Bool
	block chan struct{}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	if w.armed.Load() {
		<-w.block
	}
	return len(p), nil
}
func (w *blockingWriter) Close() error { return nil }

// TestCaptureNeverBlocks: a writer that never returns does not stop the
// link: frames beyond the queue are counted as dropped.
func TestCaptureNeverBlocks(t *testing.T) {
	in := rxeFrames(t)
	block := make(chan struct{})
	w := &blockingWriter{block: block}
	tap := New(roce.ModeEthernet, netip.AddrPort{})
	l := tap.Wrap(&fakeLink{})
	stop := make(chan struct{})
	done, err := tap.Start(w, Options{Queue: 8}, stop)
	require.NoError(t, err)
	w.armed.Store(true) // headers written: block from now on
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for range 100 {
			l.SendBatch([][]byte{in[0]}, []netip.AddrPort{{}})
		}
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the link waited for the capture's writer")
	}
	close(stop)
	close(block)
	st := <-done
	assert.NotZero(t, st.Dropped)
	assert.LessOrEqual(t, st.Captured+st.Dropped, uint64(100))
}

// TestCaptureComments: frames observed with notes (the fault layer's)
// carry them as pcapng comments, which tshark shows; frames without a
// note have none.
func TestCaptureComments(t *testing.T) {
	local := netip.MustParseAddrPort("127.0.0.1:4791")
	peer := netip.MustParseAddrPort("127.0.0.2:4791")
	tap := New(roce.ModeUDP, local)
	assert.False(t, tap.Capturing())
	out := &buf{}
	stop := make(chan struct{})
	done, err := tap.Start(out, Options{}, stop)
	require.NoError(t, err)
	assert.True(t, tap.Capturing())
	frames := [][]byte{udpPacket(t, local, peer, 1), udpPacket(t, local, peer, 2)}
	tap.Observe(frames, []netip.AddrPort{peer, peer}, []string{"", "fault rule 3: drop"}, true)
	tap.Observe(frames[:1], []netip.AddrPort{peer}, nil, false)
	close(stop)
	st := <-done
	assert.Equal(t, uint64(3), st.Captured)
	got, comments := readPcapng(t, out.b.Bytes())
	require.Len(t, got, 3)
	assert.Equal(t, []string{"", "fault rule 3: drop", ""}, comments)

	testenv.NeedTool(t, "tshark")
	path := filepath.Join(t.TempDir(), "c.pcapng")
	require.NoError(t, os.WriteFile(path, out.b.Bytes(), 0o644))
	b, err := exec.Command("tshark", "-r", path, "-T", "fields", "-e", "frame.comment").Output()
	require.NoError(t, err)
	assert.Equal(t, "\nfault rule 3: drop\n\n", string(b))
}
