package hostile

// A hostile client and the completion eventfd it shares with vrnicd
// (DESIGN.md section 9): a real daemon, clients in this process.

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// evHelperDaemon is a vrnicd process started by a test of this file.
type evHelperDaemon struct {
	proc   *launch.Proc
	socket string
	logs   *launch.Buffer
}

// evHelperStart builds vrnicd into a temporary directory and runs it with
// the in-memory link (QPs of its clients connect to each other through
// it) and one engine worker, so every QP shares that worker. The test's
// cleanup stops it by PID if it still runs.
func evHelperStart(t *testing.T) *evHelperDaemon {
	t.Helper()
	dir := t.TempDir()
	bin := vrnicdBinary(t)
	var err error
	d := &evHelperDaemon{socket: filepath.Join(dir, "ev.sock"), logs: &launch.Buffer{}}
	d.proc, err = launch.Start(launch.Spec{Name: "vrnicd ev", Bin: bin,
		Args:   []string{"-name", "ev", "-runtime-dir", dir, "-socket", d.socket, "-link", "mem", "-workers", "1"},
		Stderr: d.logs})
	require.NoError(t, err)
	t.Cleanup(func() { d.proc.Stop(0, 2*time.Second) })
	require.NoError(t, launch.WaitReady(context.Background(), d.proc, d.socket, 20*time.Second),
		"vrnicd did not come up; log:\n%s", d.logs.String())
	return d
}

// evHelperClient is one verbs client of the daemon with two RC QPs
// connected to each other through the daemon's in-memory link, sharing
// one CQ with a completion channel, and a registered buffer.
type evHelperClient struct {
	ctx     *verbs.Context
	ch      *verbs.CompChannel
	cq      *verbs.CQ
	qp, qp2 *verbs.QP
	mr      *verbs.MR
}

func evHelperNewClient(t *testing.T, sock, name string) *evHelperClient {
	t.Helper()
	ctx, err := verbs.Open(sock, verbs.WithClientName(name))
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	c := &evHelperClient{ctx: ctx}
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	c.ch, err = verbs.NewCompChannel()
	require.NoError(t, err)
	t.Cleanup(func() { c.ch.Close() })
	c.cq, err = ctx.CreateCQ(64, c.ch)
	require.NoError(t, err)
	buf, err := ctx.Alloc(1<<16, 4096)
	require.NoError(t, err)
	c.mr, err = pd.RegMR(buf, abi.AccessAll)
	require.NoError(t, err)
	gid, err := ctx.QueryGID(1, 0)
	require.NoError(t, err)
	attr := verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	c.qp, err = pd.CreateQP(attr)
	require.NoError(t, err)
	c.qp2, err = pd.CreateQP(attr)
	require.NoError(t, err)
	a, b := rcpair.Local(c.qp, 100, gid.GID, c.mr), rcpair.Local(c.qp2, 200, gid.GID, c.mr)
	require.NoError(t, rcpair.Connect(c.qp, a.PSN, b, rcpair.Attr{MTU: abi.MTU1024, MaxRdAtomic: 1}))
	require.NoError(t, rcpair.Connect(c.qp2, b.PSN, a, rcpair.Attr{MTU: abi.MTU1024, MaxRdAtomic: 1}))
	return c
}

// write posts a signaled 64-byte RDMA WRITE from qp to qp2's side of the
// buffer.
func (c *evHelperClient) write(wrid uint64) error {
	return c.qp.PostSend(&verbs.SendWR{WrID: wrid, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{c.mr.SGE(0, 64)}, RemoteAddr: c.mr.Addr + 4096, RKey: c.mr.RKey})
}

// evHelperWithin runs f and reports whether it returned within d (it
// keeps running otherwise).
func evHelperWithin(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// evHelperAnswers reports whether the daemon's control socket serves a
// new client (OPEN_CONTEXT and QUERY_DEVICE) within d.
func evHelperAnswers(t *testing.T, sock string, d time.Duration) bool {
	return evHelperWithin(d, func() {
		c, err := verbs.Open(sock, verbs.WithClientName("probe"))
		if err != nil {
			t.Errorf("open: %v", err)
			return
		}
		defer c.Close()
		if _, err := c.QueryDevice(); err != nil {
			t.Errorf("query device: %v", err)
		}
	})
}

// TestHostileCompletionEventFDProcess: against a real vrnicd with one
// engine worker, a client clears O_NONBLOCK on the completion eventfd it
// shares with the daemon, saturates the counter (0xfffffffffffffffe),
// arms its CQ and completes an RDMA WRITE, so the daemon owes it an event
// it cannot write without blocking. Then:
//
//   - a victim client (its QPs on the same worker) keeps completing
//     operations and receiving its completion events within a bound;
//   - the daemon's control socket answers, before and after the hostile
//     client leaves;
//   - SIGTERM stops the daemon within a bound with exit status 0.
//
// A daemon whose worker writes the eventfd itself blocks in write(2): the
// victim stalls, the hostile client's teardown waits for the worker under
// the device lock, nothing answers and only SIGKILL ends it.
func TestHostileCompletionEventFDProcess(t *testing.T) {
	d := evHelperStart(t)
	hostile := evHelperNewClient(t, d.socket, "hostile")
	victim := evHelperNewClient(t, d.socket, "victim")

	fd := hostile.ch.Fd()
	require.NoError(t, unix.SetNonblock(fd, false))
	var max [8]byte
	binary.LittleEndian.PutUint64(max[:], 0xfffffffffffffffe)
	_, err := unix.Write(fd, max[:])
	require.NoError(t, err)
	require.NoError(t, hostile.cq.ReqNotify(false))
	require.NoError(t, hostile.write(0xbad))
	wc := make([]abi.CQE, 1)
	require.True(t, evHelperWithin(10*time.Second, func() {
		for hostile.cq.Poll(wc) == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}), "the hostile client's WRITE completes")
	time.Sleep(50 * time.Millisecond) // the daemon is at or past the eventfd write

	const ops = 100
	start := time.Now()
	progressed := evHelperWithin(20*time.Second, func() {
		for i := range ops {
			if err := victim.cq.ReqNotify(false); err != nil {
				t.Errorf("victim arm: %v", err)
				return
			}
			if err := victim.write(uint64(i)); err != nil {
				t.Errorf("victim post: %v", err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := victim.ch.Wait(ctx)
			cancel()
			if err != nil {
				t.Errorf("victim operation %d: no completion event within 5 s: %v", i, err)
				return
			}
			if n := victim.cq.Poll(wc); n != 1 || wc[0].WrID != uint64(i) || wc[0].Status != abi.WCSuccess {
				t.Errorf("victim operation %d: polled %d, %+v", i, n, wc[0])
				return
			}
		}
	})
	if !progressed {
		t.Errorf("the victim made no progress for 20 s")
	} else if !t.Failed() {
		t.Logf("victim: %d RDMA WRITEs with completion events in %v beside the hostile client", ops, time.Since(start))
	}
	assert.True(t, evHelperAnswers(t, d.socket, 10*time.Second), "the control socket answers while the hostile client is connected")

	require.NoError(t, hostile.ctx.Close())
	assert.True(t, evHelperAnswers(t, d.socket, 10*time.Second), "the control socket answers after the hostile client left")

	require.NoError(t, victim.ctx.Close())
	start = time.Now()
	err = d.proc.Stop(0, 10*time.Second)
	if d.proc.Killed() {
		t.Errorf("vrnicd did not exit within 10 s of SIGTERM (killed); log:\n%s", d.logs.String())
	} else {
		var ee interface{ ExitCode() int }
		if errors.As(err, &ee) {
			t.Errorf("vrnicd exit status %d after SIGTERM; log:\n%s", ee.ExitCode(), d.logs.String())
		}
		t.Logf("vrnicd exited %v after SIGTERM", time.Since(start))
	}
}
