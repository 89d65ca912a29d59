package dataplane_test

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

// within runs f on a goroutine and reports whether it returned within d
// (f keeps running otherwise; done is closed when it returns).
func within(d time.Duration, f func()) (ok bool, done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		f()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true, ch
	case <-t.C:
		return false, ch
	}
}

// TestHostileCompletionEventFD: a client clears O_NONBLOCK on the
// completion eventfd it shares with the daemon (the flag belongs to the
// open file description both descriptors refer to), saturates its counter
// (0xfffffffffffffffe), arms its CQ and completes an RDMA WRITE. The
// daemon owes it an event it cannot write without blocking. A victim
// client whose QP is on the same (only) engine worker keeps completing
// operations and getting its own completion events within a bound; when
// the hostile client leaves, the control path still answers, and the
// device and data plane close within a bound.
//
// Before the completion eventfd was written off the worker, the worker
// blocked in write(2): the victim stalled, the hostile client's teardown
// waited for the worker under the device lock, and nothing closed. The
// test then reads the hostile counter itself (which lets the write in) so
// that a failing run still ends.
func TestHostileCompletionEventFD(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.7.1", 1, nil) // one worker: every QP of na shares it
	nb := newDPNode(t, nw, "10.0.7.2", 1, nil)
	h, hp := newDPClient(t, na, 16), newDPClient(t, nb, 16)
	v, vp := newDPClient(t, na, 16), newDPClient(t, nb, 16)
	connectRC(t, h, hp, abi.MTU1024)
	connectRC(t, v, vp, abi.MTU1024)

	fd := h.ch.Fd()
	rescue := func() {
		unix.SetNonblock(fd, true)
		var b [8]byte
		unix.Read(fd, b[:])
	}
	defer rescue()

	// The attack.
	require.NoError(t, unix.SetNonblock(fd, false))
	var max [8]byte
	binary.LittleEndian.PutUint64(max[:], 0xfffffffffffffffe)
	_, err := unix.Write(fd, max[:])
	require.NoError(t, err)
	require.NoError(t, h.scq.ReqNotify(false))
	require.NoError(t, h.qp.PostSend(&verbs.SendWR{WrID: 0x4057, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{h.mr.SGE(0, 64)}, RemoteAddr: hp.mr.Addr, RKey: hp.mr.RKey}))
	// The CQE is published before the event is due: once the hostile
	// client sees it, the daemon is at (or past) the eventfd write.
	assert.Equal(t, uint64(0x4057), pollN(t, h.scq, 1)[0].WrID)
	time.Sleep(20 * time.Millisecond)

	// The victim, on the same worker, waits for completion events.
	const ops = 50
	victim := func() {
		wc := make([]abi.CQE, 1)
		for i := range ops {
			if err := v.scq.ReqNotify(false); err != nil {
				t.Errorf("victim arm %d: %v", i, err)
				return
			}
			if err := v.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
				SGL: []abi.SGE{v.mr.SGE(0, 256)}, RemoteAddr: vp.mr.Addr, RKey: vp.mr.RKey}); err != nil {
				t.Errorf("victim post %d: %v", i, err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := v.ch.Wait(ctx)
			cancel()
			if err != nil {
				t.Errorf("victim op %d: no completion event: %v", i, err)
				return
			}
			if n := v.scq.Poll(wc); n != 1 || wc[0].WrID != uint64(i) || wc[0].Status != abi.WCSuccess {
				t.Errorf("victim op %d: polled %d CQEs, %+v", i, n, wc[0])
				return
			}
		}
	}
	start := time.Now()
	ok, done := within(15*time.Second, victim)
	if !ok {
		t.Errorf("the victim on the hostile client's worker made no progress for 15 s")
		rescue()
		<-done
	} else if !t.Failed() {
		t.Logf("victim: %d operations with completion events in %v", ops, time.Since(start))
	}

	// The hostile client leaves; its context's teardown must not wait on
	// its eventfd, and the control path keeps answering.
	require.NoError(t, h.ctx.Close())
	ok, done = within(10*time.Second, func() {
		c, err := verbs.Open(na.sock, verbs.WithClientName("after"))
		if err != nil {
			t.Errorf("open after the hostile client left: %v", err)
			return
		}
		defer c.Close()
		_, err = c.QueryDevice()
		assert.NoError(t, err)
	})
	if !ok {
		t.Errorf("the control socket did not answer within 10 s after the hostile client left")
		rescue()
		<-done
	}

	ok, done = within(10*time.Second, func() {
		na.dev.Close()
		assert.NoError(t, na.dp.Close())
	})
	if !ok {
		t.Errorf("Device.Close and DataPlane.Close did not return within 10 s")
		rescue()
		<-done
	}
}

// wedgeLink wraps a link: while wedged, RecvBatch blocks, so the worker
// that reads the link is stuck (standing in for a worker blocked by a bug:
// the control path must not hang on it).
type wedgeLink struct {
	engine.Link
	wedged  atomic.Bool
	release chan struct{}
}

func (l *wedgeLink) RecvBatch(f [][]byte) (int, error) {
	if l.wedged.Load() {
		<-l.release
	}
	return l.Link.RecvBatch(f)
}

func (l *wedgeLink) ArmReady() {
	if a, ok := l.Link.(engine.ReadyArmer); ok {
		a.ArmReady()
	}
}

// newWedgeNode is newDPNode with one engine worker over a wedgeLink and
// the given engine CallTimeout.
func newWedgeNode(t *testing.T, nw *link.Network, addr string, callTimeout time.Duration) (*dpNode, *wedgeLink) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	a := netip.MustParseAddr(addr)
	ports, err := nw.Attach(a, 1, nil)
	require.NoError(t, err)
	wl := &wedgeLink{Link: ports[0], release: make(chan struct{})}
	eng, err := engine.New(engine.Config{Links: []engine.Link{wl}, Mode: roce.ModeEthernet, Logger: log, CallTimeout: callTimeout})
	require.NoError(t, err)
	space, err := dma.NewSpace(dma.Config{Logger: log})
	require.NoError(t, err)
	dp, err := dataplane.New(dataplane.Config{Engine: eng, Space: space, Logger: log})
	require.NoError(t, err)
	n := &dpNode{addr: a, gid: a.As16(), dp: dp}
	n.dev, err = device.New(device.Config{
		Name:      "wedge-" + addr,
		Link:      device.LinkInfo{Type: abi.LinkMem, MaxMTU: abi.MTU4096, GIDs: [][16]byte{n.gid}, SpeedMbps: 10000},
		Space:     space,
		DataPlane: dp,
		Logger:    log,
	})
	require.NoError(t, err)
	dp.Start()
	n.sock = filepath.Join(t.TempDir(), "dev"+admin.SocketSuffix)
	l, err := admin.Listen(n.sock)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- n.dev.Serve(l) }()
	t.Cleanup(func() {
		if wl.wedged.CompareAndSwap(true, false) {
			close(wl.release)
		}
		n.dev.Close()
		<-done
		assert.NoError(t, dp.Close())
		space.Close()
	})
	return n, wl
}

// TestStuckWorkerControlPath: with the engine worker of a device stuck,
// the control path answers within the engine's CallTimeout instead of
// hanging under the device lock: CREATE_QP fails with ETIMEDOUT (no QP is
// left behind), MODIFY_QP fails with ETIMEDOUT and the QP is in ERR,
// DESTROY_QP and a client's departure complete (the memory the worker may
// still touch stays pinned), and the device keeps serving other clients.
// Once the worker recovers it applies what was queued, and the device
// and data plane close.
func TestStuckWorkerControlPath(t *testing.T) {
	const bound = 200 * time.Millisecond
	nw := newDPNetwork(t)
	na, wl := newWedgeNode(t, nw, "10.0.8.1", bound)
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
	time.Sleep(50 * time.Millisecond)

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
	err = timed("CREATE_QP", 5*time.Second, func() error {
		_, err := a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: a.scq, RecvCQ: a.rcq,
			Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		return err
	})
	assert.ErrorIs(t, err, syscall.ETIMEDOUT, "CREATE_QP on a stuck worker")
	err = timed("MODIFY_QP", 5*time.Second, func() error { return q2.ToInit(abi.AccessAll, 0) })
	assert.ErrorIs(t, err, syscall.ETIMEDOUT, "MODIFY_QP on a stuck worker")
	requireState(t, q2, abi.QPSErr, "a change the worker did not take leaves the QP in ERR")
	err = timed("DESTROY_QP", 5*time.Second, q2.Destroy)
	assert.NoError(t, err, "DESTROY_QP completes; the removal stays queued")

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
