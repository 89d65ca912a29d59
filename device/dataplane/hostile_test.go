package dataplane_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
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
// When the worker wrote the eventfd itself it blocked in write(2): the
// victim stalled, the hostile client's teardown waited for the worker
// under the device lock, and nothing closed. The test then reads the
// hostile counter itself (which lets the write in) so that a failing run
// still ends.
//
// The daemon's default signals eventfds through the kernel (never a
// write); TestHostileCompletionEventFDWriters runs the same with the
// writer goroutines of the fallback path.
func TestHostileCompletionEventFD(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.7.1", 1, nil) // one worker: every QP of na shares it
	nb := newDPNode(t, nw, "10.0.7.2", 1, nil)
	hostileEventFD(t, na, nb)
}

// hostileEventFD is the scenario of TestHostileCompletionEventFD between
// na (one engine worker, attacked) and nb.
func hostileEventFD(t *testing.T, na, nb *dpNode) {
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
