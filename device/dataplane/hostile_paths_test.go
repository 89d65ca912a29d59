package dataplane_test

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/verbs"
)

// TestHostileCompletionEventFDWriters is TestHostileCompletionEventFD on
// the fallback path, where the kernel cannot signal eventfds for the
// workers and a writer goroutine per context writes them: the hostile
// client's writer blocks in write(2), nobody else does, and its context's
// teardown unsticks it.
func TestHostileCompletionEventFDWriters(t *testing.T) {
	nw := newDPNetwork(t)
	na, _ := newTestNode(t, nw, "10.0.7.1", testNodeOpts{eventWriters: true})
	require.False(t, na.dp.KernelSignals())
	nb := newDPNode(t, nw, "10.0.7.2", 1, nil)
	hostileEventFD(t, na, nb)
}

// TestKernelSignalsByDefault: where the kernel can signal eventfds (this
// kernel can), the data plane uses it.
func TestKernelSignalsByDefault(t *testing.T) {
	n := newDPNode(t, newDPNetwork(t), "10.0.7.3", 1, nil)
	assert.True(t, n.dp.KernelSignals())
}

// wedgeLink wraps a link: while wedged, RecvBatch blocks, so the worker
// that reads the link is stuck (standing in for a worker blocked by a bug:
// the control path must not hang on it).
type wedgeLink struct {
	engine.Link
	wedged  atomic.Bool
	inside  atomic.Bool // the worker is blocked in RecvBatch
	release chan struct{}
}

func (l *wedgeLink) RecvBatch(f [][]byte, peers []netip.AddrPort) (int, error) {
	if l.wedged.Load() {
		l.inside.Store(true)
		<-l.release
		l.inside.Store(false)
	}
	return l.Link.RecvBatch(f, peers)
}

func (l *wedgeLink) ArmReady() {
	if a, ok := l.Link.(engine.ReadyArmer); ok {
		a.ArmReady()
	}
}

// testNodeOpts are the options of newTestNode.
type testNodeOpts struct {
	eventWriters bool // dataplane.Config.EventWriters
}

// newTestNode is newDPNode with one engine worker, over a wedgeLink (not
// wedged until the test says so), with the options o.
func newTestNode(t *testing.T, nw *link.Network, addr string, o testNodeOpts) (*dpNode, *wedgeLink) {
	t.Helper()
	a := netip.MustParseAddr(addr)
	ports, err := nw.Attach(a, 1, nil)
	require.NoError(t, err)
	wl := &wedgeLink{Link: ports[0], release: make(chan struct{})}
	n := startNode(t, nodeSpec{addr: a, links: []engine.Link{wl}, linkType: abi.LinkMem,
		dp: dataplane.Config{EventWriters: o.eventWriters},
		before: func() {
			if wl.wedged.CompareAndSwap(true, false) {
				close(wl.release)
			}
		}})
	return n, wl
}

// TestStuckWorkerControlPath: with the engine worker of a device stuck,
// the control path does not wait for it: CREATE_QP, MODIFY_QP and
// DESTROY_QP answer at once (their changes queue for the worker), a
// client's departure completes (the memory the worker may still touch
// stays pinned), and the device keeps serving other clients. Once the
// worker recovers it applies what was queued, and the device and data
// plane close.
func TestStuckWorkerControlPath(t *testing.T) {
	nw := newDPNetwork(t)
	na, wl := newTestNode(t, nw, "10.0.8.1", testNodeOpts{})
	nb := newDPNode(t, nw, "10.0.8.2", 1, nil)
	a, b := newDPClient(t, na, 16), newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	// A second QP of the same client, in RESET, to modify later.
	q2, err := a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: a.scq, RecvCQ: a.rcq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)

	wl.wedged.Store(true)
	// Wake the worker into its next RecvBatch (a frame or a kick would
	// do; a write to the peer makes one arrive).
	require.NoError(t, b.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{b.mr.SGE(0, 8)}, RemoteAddr: a.mr.Addr, RKey: a.mr.RKey}))
	require.Eventually(t, wl.inside.Load, 10*time.Second, time.Millisecond, "the worker is stuck in RecvBatch")

	timed := func(name string, max time.Duration, f func() error) error {
		t.Helper()
		var err error
		ok, done := within(max, func() { err = f() })
		if !ok {
			t.Errorf("%s did not return within %v", name, max)
			if wl.wedged.CompareAndSwap(true, false) {
				close(wl.release)
			}
			<-done
		}
		return err
	}
	var q3 *verbs.QP
	err = timed("CREATE_QP", 5*time.Second, func() error {
		var err error
		q3, err = a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: a.scq, RecvCQ: a.rcq,
			Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		return err
	})
	require.NoError(t, err, "CREATE_QP on a stuck worker")
	err = timed("MODIFY_QP", 5*time.Second, func() error { return q2.ToInit(abi.AccessAll, 0) })
	assert.NoError(t, err, "MODIFY_QP on a stuck worker")
	requireState(t, q2, abi.QPSInit, "the change is the device's at once")
	err = timed("DESTROY_QP", 5*time.Second, q2.Destroy)
	assert.NoError(t, err, "DESTROY_QP completes; the removal stays queued")
	err = timed("DESTROY_QP", 5*time.Second, q3.Destroy)
	assert.NoError(t, err)
	assert.True(t, wl.inside.Load(), "the worker was stuck all along")

	// The client leaves: its teardown does not wait on the stuck worker,
	// and the device serves another client.
	require.NoError(t, a.ctx.Close())
	err = timed("OPEN_CONTEXT after the client left", 10*time.Second, func() error {
		c, err := verbs.Open(na.sock, verbs.WithClientName("after"))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.QueryDevice()
		return err
	})
	assert.NoError(t, err)

	// Recovery: the worker applies the queued removals; shutdown is clean.
	if wl.wedged.CompareAndSwap(true, false) {
		close(wl.release)
	}
	ok, done := within(10*time.Second, func() {
		na.dev.Close()
		assert.NoError(t, na.dp.Close())
	})
	if !ok {
		t.Errorf("Device.Close and DataPlane.Close did not return within 10 s")
		<-done
	}
}
