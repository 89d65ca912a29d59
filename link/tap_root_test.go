package link

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/tap"
)

// newRootTAPPair creates a network namespace with a bridge and two
// multi-queue TAP devices on it, each behind a TAP link (root only).
func newRootTAPPair(t *testing.T, queues int) (*TAPLink, *TAPLink) {
	t.Helper()
	ns, ip, h := rootNetns(t, "vrlink", "TAP link test needs root (network namespace, TAP devices)")
	addBridge(ns, ip)
	var links []*TAPLink
	for i, name := range []string{"lta", "ltb"} {
		mac := tap.MAC{2, 0x4c, 0, 0, 0, byte(i + 1)}
		dev, err := tap.Create(tap.Config{Name: name, Queues: queues, MAC: mac, NetNS: h})
		require.NoError(t, err)
		ip("-n", ns, "link", "set", name, "master", "br0")
		links = append(links, tapLinkOn(t, dev))
	}
	return links[0], links[1]
}

// rootNetns skips t unless root (why says what for) and the ip tool are
// there, then makes a network namespace as testNetns does and returns
// it with a handle of it, closed by t's cleanup.
func rootNetns(t *testing.T, prefix, why string) (string, func(args ...string), netns.NsHandle) {
	t.Helper()
	testenv.NeedRoot(t, why)
	testenv.NeedTool(t, "ip")
	ns, ip := testNetns(t, prefix)
	h, err := netns.GetFromName(ns)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close() })
	return ns, ip, h
}

// addBridge adds bridge br0 to namespace ns, up.
func addBridge(ns string, ip func(args ...string)) {
	ip("-n", ns, "link", "add", "br0", "type", "bridge")
	ip("-n", ns, "link", "set", "br0", "up")
}

// tapLinkOn makes dev a TAP link, closed by t's cleanup (dev is closed
// if the link cannot be made).
func tapLinkOn(t *testing.T, dev *tap.Device) *TAPLink {
	t.Helper()
	l, err := NewTAP(dev, TAPConfig{FrameCap: testFrameCap, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		dev.Close()
	}
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

// rootFrame is a RoCE frame from link a's NIC to link b's NIC.
func rootFrame(t testing.TB, qpn, psn uint32, n int) []byte {
	p := tapPath(false)
	p.SrcMAC, p.DstMAC = [6]byte{2, 0x4c, 0, 0, 0, 1}, [6]byte{2, 0x4c, 0, 0, 0, 2}
	h := &rootHeaders
	h.BTH.DestQP, h.BTH.PSN = qpn, psn
	return buildFrame(t, p, h, n)
}

var rootHeaders = tapHeaders()

// TestTAPRealDevices: frames written on one TAP link's port cross a
// bridge and come out of the other link's port of their QP (no steering
// program: a single queue), byte for byte; the steady state allocates
// nothing.
func TestTAPRealDevices(t *testing.T) {
	a, b := newRootTAPPair(t, 1)
	// The bridge learns b's NIC MAC from one frame b sends.
	back := rootFrame(t, 0x100, 0, 8)
	copy(back[0:6], []byte{2, 0x4c, 0, 0, 0, 1})
	copy(back[6:12], []byte{2, 0x4c, 0, 0, 0, 2})
	_, err := b.Ports()[0].SendBatch([][]byte{back}, nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)

	pa, pb := a.Ports()[0], b.Ports()[0]
	var want [][]byte
	for i := range 20 {
		f := rootFrame(t, 0x100+uint32(i), uint32(i), i*200)
		want = append(want, append([]byte(nil), f...))
		n, err := pa.SendBatch([][]byte{f}, nil)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	got := recvTAP(t, pb, len(want))
	for i := range want {
		assert.Equal(t, want[i], got[i], "frame %d", i)
	}
	assert.EqualValues(t, 20, pa.Counters.TxFrames.Load())

	out := [][]byte{rootFrame(t, 0x200, 1, 1024)}
	bufs := newBufs(1)
	round := func() {
		pa.SendBatch(out, nil)
		for {
			bufs[0] = bufs[0][:cap(bufs[0])]
			if k, _ := pb.RecvBatch(bufs, nil); k == 1 {
				return
			}
			pb.ArmReady()
			<-pb.Ready()
		}
	}
	for range 20 {
		round()
	}
	assert.Zero(t, testing.AllocsPerRun(200, round), "send, bridge, receive: no allocation per frame")
}

// testNetns makes a network namespace named prefix and this process's
// PID for the test, deleted when it ends (a failure to delete fails the
// test), and returns its name and a runner of ip(8) that fails the test
// on an error.
func testNetns(t *testing.T, prefix string) (string, func(args ...string)) {
	t.Helper()
	ns := fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	return ns, ip
}
