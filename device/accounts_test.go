package device_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/verbs"
)

// TestPerUIDContexts: the contexts of one uid (every connection of this
// test is this process's) stop at the per-uid limit with EAGAIN, below
// the device's; closing one makes room again.
func TestPerUIDContexts(t *testing.T) {
	s := startServer(t, device.Limits{PerDevice: device.ResourceCounts{Contexts: 8}})
	assert.Equal(t, 2, s.Device.Limits().PerUID.Contexts, "default: a quarter of the device's contexts")
	assert.Equal(t, 2*2+16, s.Device.Limits().PerUID.Connections, "default: twice the contexts plus 16")
	c1 := open(t, s)
	open(t, s)
	_, err := verbs.Open(s.SocketPath)
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-uid context limit")
	assert.Contains(t, err.Error(), fmt.Sprintf("uid %d holds 2 contexts", os.Geteuid()))
	assert.Equal(t, 2, s.Device.Counts().Contexts)

	require.NoError(t, c1.Close())
	require.Eventually(t, func() bool {
		c, err := verbs.Open(s.SocketPath)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, timeout, tick)
}

// TestPerUIDConnections: the connections of one uid past the limit are
// refused: the first command gets EAGAIN and the connection is closed;
// the uid's connections that were admitted keep working, and closing one
// makes room again.
func TestPerUIDConnections(t *testing.T) {
	s := startServer(t, device.Limits{PerUID: device.UIDLimits{Connections: 3}})
	op, err := admin.Dial(s.SocketPath) // this operator connection counts too
	require.NoError(t, err)
	defer op.Close()
	_, err = op.Info()
	require.NoError(t, err)
	c1 := open(t, s)
	c2, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.SocketPath, Net: "unixpacket"})
	require.NoError(t, err)
	defer c2.Close()
	require.Eventually(t, func() bool {
		i, err := op.Info()
		return err == nil && i.Connections == 3
	}, timeout, tick)

	_, err = verbs.Open(s.SocketPath)
	assert.Equal(t, syscall.EAGAIN, errno(t, err))
	assert.Contains(t, err.Error(), "holds 3 control connections")
	a, err := admin.Dial(s.SocketPath)
	require.NoError(t, err)
	_, err = a.Info()
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "an operator's uid is limited too")
	_, err = a.Info()
	assert.Error(t, err, "the refused connection is closed")
	a.Close()
	// A refused connection that sends nothing is closed all the same.
	idle, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.SocketPath, Net: "unixpacket"})
	require.NoError(t, err)
	idle.SetReadDeadline(time.Now().Add(timeout))
	n, err := idle.Read(make([]byte, 64))
	assert.Zero(t, n)
	assert.Error(t, err)
	idle.Close()

	_, err = c1.AllocPD()
	assert.NoError(t, err, "admitted connections keep working")
	info, err := op.Info()
	require.NoError(t, err)
	assert.Equal(t, int64(3), info.Counters["connections_refused"])
	accts, err := admin.ListAs[admin.AccountInfo](op, admin.AccountsCmd)
	require.NoError(t, err)
	require.Len(t, accts, 1)
	assert.Equal(t, 3, accts[0].Connections)
	assert.Equal(t, uint64(3), accts[0].Refused)

	c2.Close()
	require.Eventually(t, func() bool {
		c, err := verbs.Open(s.SocketPath)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, timeout, tick)
}

// TestAccounts: the account of a uid sums the resources of its contexts.
func TestAccounts(t *testing.T) {
	s := startServer(t, device.Limits{})
	c1 := mustOpenFull(t, s)
	defer c1.Close()
	c2 := open(t, s)
	_, err := c2.AddHostMem(1 << 20)
	require.NoError(t, err)
	ctxs := adminList[admin.ContextInfo](t, s.SocketPath, admin.ContextsCmd)
	require.Len(t, ctxs, 2)
	var sum admin.ResourceCounts
	for _, cx := range ctxs {
		r := cx.Resources
		sum.HostMem += r.HostMem
		sum.PD += r.PD
		sum.MR += r.MR
		sum.CQ += r.CQ
		sum.QP += r.QP
		sum.SRQ += r.SRQ
		sum.AH += r.AH
	}
	sum.Contexts = 2
	var bytes uint64
	for _, m := range adminList[admin.HostMemInfo](t, s.SocketPath, admin.HostMemCmd) {
		bytes += m.Length
	}
	var pages uint64
	for _, m := range adminList[admin.MRInfo](t, s.SocketPath, admin.MRsCmd) {
		pages += uint64(m.Pages)
	}
	op, err := admin.Dial(s.SocketPath)
	require.NoError(t, err)
	defer op.Close()
	var a admin.AccountInfo
	// Two clients and this operator (the earlier listings' connections
	// may take a moment to be noticed as closed).
	require.Eventually(t, func() bool {
		accts, err := admin.ListAs[admin.AccountInfo](op, admin.AccountsCmd)
		require.NoError(t, err)
		require.Len(t, accts, 1)
		a = accts[0]
		return a.Connections == 3
	}, timeout, tick)
	assert.Equal(t, uint32(os.Geteuid()), a.UID)
	assert.Equal(t, sum, a.Resources)
	assert.Equal(t, bytes, a.HostMemBytes)
	assert.Positive(t, a.HostMemBytes)
	assert.Equal(t, pages, a.MRPages)
	assert.Positive(t, a.MRPages)
}

// failingListener fails its first n accepts with err, then accepts.
type failingListener struct {
	*net.UnixListener
	n     atomic.Int32
	err   error
	calls atomic.Int32
}

func (l *failingListener) AcceptUnix() (*net.UnixConn, error) {
	l.calls.Add(1)
	if l.n.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.UnixListener.AcceptUnix()
}

// syncBuffer is a log destination the device writes from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newServeDevice makes a device and a listener for Serve tests.
func newServeDevice(t *testing.T, log *slog.Logger) (*device.Device, *net.UnixListener, string) {
	t.Helper()
	space, err := dma.NewSpace(dma.Config{Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { space.Close() })
	d, err := device.New(device.Config{Name: "serve0", Space: space, Logger: log,
		Link: device.LinkInfo{Type: abi.LinkMem, GIDs: [][16]byte{{10: 0xff, 11: 0xff, 12: 127, 15: 1}}}})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "serve0.sock")
	l, err := admin.Listen(path)
	require.NoError(t, err)
	return d, l, path
}

// TestServeSurvivesAcceptErrors: accept failing with EMFILE, ENFILE or
// another error does not end Serve: it pauses (5 ms, doubling), retries,
// counts the errors, logs the burst once at its start and once at its
// end, and serves the next client.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED} {
		t.Run(e.(syscall.Errno).Error(), func(t *testing.T) {
			var logs syncBuffer
			d, l, path := newServeDevice(t, slog.New(slog.NewTextHandler(&logs, nil)))
			const n = 5
			fl := &failingListener{UnixListener: l, err: &net.OpError{Op: "accept", Net: "unixpacket", Err: os.NewSyscallError("accept4", e)}}
			fl.n.Store(n)
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- d.Serve(fl) }()
			// The pauses: 5+10+20+40+80 ms before the sixth accept.
			c, err := verbs.Open(path)
			require.NoError(t, err)
			_, err = c.AllocPD()
			require.NoError(t, err)
			assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "paused between the failed accepts")
			assert.Equal(t, uint64(n), d.Counters().AcceptErrors.Load())
			assert.GreaterOrEqual(t, fl.calls.Load(), int32(n+1))
			c.Close()
			require.NoError(t, d.Close())
			assert.ErrorIs(t, <-done, device.ErrClosed)
			out := logs.String()
			assert.Equal(t, 1, strings.Count(out, "accept failed"), "%s", out)
			assert.Equal(t, 1, strings.Count(out, "accept works again"), "%s", out)
			assert.Contains(t, out, e.Error())
		})
	}
}

// TestServeCloseDuringPause: Close ends a Serve that is pausing after
// accept errors, without waiting out the pause; a listener closed by
// someone else ends Serve with its error.
func TestServeCloseDuringPause(t *testing.T) {
	// A pause of an hour from the first error: a Close that waited it
	// out would not return within the test's time.
	restore := device.SetAcceptPause(time.Hour, time.Hour)
	t.Cleanup(restore)
	d, l, _ := newServeDevice(t, slog.New(slog.DiscardHandler))
	fl := &failingListener{UnixListener: l, err: syscall.EMFILE}
	fl.n.Store(1 << 30)
	done := make(chan error, 1)
	go func() { done <- d.Serve(fl) }()
	require.Eventually(t, func() bool { return fl.calls.Load() >= 1 }, timeout, tick, "Serve met the error and pauses")
	start := time.Now()
	require.NoError(t, d.Close())
	select {
	case err := <-done:
		assert.ErrorIs(t, err, device.ErrClosed)
	case <-time.After(time.Minute):
		t.Fatal("Close waited out Serve's pause")
	}
	t.Logf("Serve ended %v after Close began", time.Since(start))
	assert.Equal(t, int32(1), fl.calls.Load(), "no accept after the pause began")
	restore() // the default pauses for the rest

	d2, l2, _ := newServeDevice(t, slog.New(slog.DiscardHandler))
	defer d2.Close()
	go func() { done <- d2.Serve(l2) }()
	time.Sleep(20 * time.Millisecond)
	l2.Close()
	err := <-done
	require.Error(t, err)
	assert.True(t, errors.Is(err, net.ErrClosed), "%v", err)
}

// TestPerUIDFDs: the descriptors the daemon holds for a uid (connections,
// two per context, host memory memfds, completion eventfds) stop at
// limits.per_uid.fds: ADD_HOST_MEM and CREATE_CQ with a completion channel
// fail with EMFILE and say why; a CQ without one (no descriptor) is still
// created, and removing a region makes room again.
func TestPerUIDFDs(t *testing.T) {
	s := startServer(t, device.Limits{PerUID: admin.UIDLimits{FDs: 6}})
	c := open(t, s) // 1 connection + 2 for the context: 3
	// The library's first region (4), which holds the rings below.
	cq0, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	var mems []*verbs.HostMem
	for range 2 { // 5, 6
		m, err := c.AddHostMem(1 << 16)
		require.NoError(t, err)
		mems = append(mems, m)
	}
	_, err = c.AddHostMem(1 << 16)
	assert.Equal(t, syscall.EMFILE, errno(t, err), "host memory past the uid's descriptors")
	assert.Contains(t, err.Error(), fmt.Sprintf("uid %d holds 6 descriptors in the daemon, its limit (limits.per_uid.fds)", os.Geteuid()))
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	defer ch.Close()
	_, err = c.CreateCQ(16, ch)
	assert.Equal(t, syscall.EMFILE, errno(t, err), "a completion channel past the uid's descriptors")
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err, "a CQ without a completion channel holds no descriptor")
	require.NoError(t, cq.Destroy())

	require.NoError(t, mems[1].Remove())
	cq, err = c.CreateCQ(16, ch)
	require.NoError(t, err, "room again after a region is removed")
	_, err = c.AddHostMem(1 << 16)
	assert.Equal(t, syscall.EMFILE, errno(t, err), "the CQ's eventfd counts")
	require.NoError(t, cq.Destroy())
	m, err := c.AddHostMem(1 << 16)
	require.NoError(t, err, "and the destroyed CQ's eventfd no longer does")
	require.NoError(t, m.Remove())
	require.NoError(t, cq0.Destroy())
}
