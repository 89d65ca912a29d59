package main

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
)

// fakeServer plays the server role on a real device but lets the test
// spoil what it tells the client: tamper edits its hello, perSize answers
// each start message.
func fakeServer(t *testing.T, dev string, tamper func([]rcpair.Info), perSize func(e *endpoint, cc *ctrlConn, size int) error) (addr string, errc chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctrl.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	errc = make(chan error, 1)
	go func() {
		errc <- func() error {
			defer ln.Close()
			ln.(*net.UnixListener).SetDeadline(time.Now().Add(30 * time.Second))
			nc, err := ln.Accept()
			if err != nil {
				return err
			}
			defer nc.Close()
			cc := newCtrlConn(nc)
			hello, err := cc.recv("hello", 30*time.Second)
			if err != nil {
				return err
			}
			e, err := newEndpoint(dev, hello.Options, "fake-server")
			if err != nil {
				return err
			}
			defer e.close()
			if err := e.connect(hello.QPs, 0); err != nil {
				return err
			}
			infos, err := e.infos()
			if err != nil {
				return err
			}
			tamper(infos)
			if err := cc.send(message{Kind: "hello", QPs: infos}); err != nil {
				return err
			}
			m, err := cc.recv("start", 30*time.Second)
			if err != nil {
				return err
			}
			return perSize(e, cc, m.Size)
		}()
	}()
	return "unix:" + path, errc
}

func clientOptions(t *testing.T, o options) *options {
	t.Helper()
	o.Verify = true
	o.Atomic = atomicFetchAdd
	o.QPs, o.Depth, o.MTU = 1, 16, 4096
	require.NoError(t, o.finish())
	return &o
}

// TestCompletionErrorFailsRun: a WRITE with an rkey the server never
// issued completes with a remote access error; the client stops with that
// status and tells the server.
func TestCompletionErrorFailsRun(t *testing.T) {
	d := startDaemon(t, "perf-err", "-link", "mem")
	addr, errc := fakeServer(t, d.sock, func(q []rcpair.Info) { q[0].RKey ^= 0x5a00 }, func(e *endpoint, cc *ctrlConn, size int) error {
		if err := cc.send(message{Kind: "started", Size: size}); err != nil {
			return err
		}
		_, err := cc.recv("done", 60*time.Second)
		return err // the client's error message
	})
	o := clientOptions(t, options{Test: writeBW, Size: 4096, Iters: 50})
	rs, err := runClientRole(d.sock, addr, o)
	require.Error(t, err)
	assert.Empty(t, rs)
	assert.ErrorIs(t, err, errCompletion)
	assert.Contains(t, err.Error(), "REM_ACCESS_ERR")
	assert.Contains(t, err.Error(), "RDMA_WRITE")
	serverErr := <-errc
	require.Error(t, serverErr, "the server hears of the failure")
	assert.Contains(t, serverErr.Error(), "REM_ACCESS_ERR")
}

// TestVerificationFailureFailsRun: when the data read differs from what
// the server says it holds, the run fails; likewise when the server's
// verdict reports a mismatch.
func TestVerificationFailureFailsRun(t *testing.T) {
	d := startDaemon(t, "perf-verify", "-link", "mem")
	t.Run("client side", func(t *testing.T) {
		addr, errc := fakeServer(t, d.sock, func([]rcpair.Info) {}, func(e *endpoint, cc *ctrlConn, size int) error {
			fillPattern(e.qps[0].buf.Bytes[:size], size, 0)
			if err := cc.send(message{Kind: "started", Size: size, Checksum: e.checksumAll(0, size) ^ 1}); err != nil {
				return err
			}
			if _, err := cc.recv("done", 60*time.Second); err != nil {
				return err
			}
			return cc.send(message{Kind: "verdict", Size: size, Counters: &counters{}})
		})
		o := clientOptions(t, options{Test: readBW, Size: 4096, Iters: 20})
		_, err := runClientRole(d.sock, addr, o)
		assert.ErrorIs(t, err, errVerify)
		assert.Contains(t, err.Error(), "checksum of the data read")
		<-errc
	})
	t.Run("server verdict", func(t *testing.T) {
		addr, errc := fakeServer(t, d.sock, func([]rcpair.Info) {}, func(e *endpoint, cc *ctrlConn, size int) error {
			if err := cc.send(message{Kind: "started", Size: size}); err != nil {
				return err
			}
			if _, err := cc.recv("done", 60*time.Second); err != nil {
				return err
			}
			return cc.send(message{Kind: "verdict", Size: size, Error: "checksum of the server's memory differs"})
		})
		o := clientOptions(t, options{Test: writeBW, Size: 4096, Iters: 20})
		_, err := runClientRole(d.sock, addr, o)
		assert.ErrorIs(t, err, errVerify)
		assert.Contains(t, err.Error(), "server's memory differs")
		<-errc
	})
}

// TestServerRejectsBadStart: a start message outside the sizes agreed in
// the hello is refused with an error message.
func TestServerRejectsBadStart(t *testing.T) {
	d := startDaemon(t, "perf-proto", "-link", "mem")
	path := filepath.Join(t.TempDir(), "ctrl.sock")
	errc := make(chan error, 1)
	go func() { errc <- serve(d.sock, "unix:"+path, 0, &launch.Buffer{}) }()
	nc, err := dial("unix:" + path)
	require.NoError(t, err)
	defer nc.Close()
	cc := newCtrlConn(nc)
	e, err := newEndpoint(d.sock, clientOptions(t, options{Test: writeBW, Size: 4096, Iters: 1}), "proto-test")
	require.NoError(t, err)
	defer e.close()
	infos, err := e.infos()
	require.NoError(t, err)
	require.NoError(t, cc.send(message{Kind: "hello", Options: e.opt, QPs: infos}))
	_, err = cc.recv("hello", 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, cc.send(message{Kind: "start", Size: 8192}))
	_, err = cc.recv("", 30*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "size 8192 out of range")
	assert.ErrorIs(t, <-errc, errProtocol)
}
