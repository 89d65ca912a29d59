package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
)

// TestNotifyReady plays the service manager of a Type=notify unit: it
// names a datagram socket in NOTIFY_SOCKET and holds the daemon before
// its control socket is served. No READY=1 arrives while the daemon
// cannot answer (the socket file exists by then); once released, READY=1
// arrives with the daemon's PID and status, and at that moment the
// control socket answers a query. Stopping sends STOPPING=1.
func TestNotifyReady(t *testing.T) {
	dir := t.TempDir()
	nsock := filepath.Join(dir, "notify")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: nsock, Net: "unixgram"})
	require.NoError(t, err)
	defer nl.Close()
	t.Setenv("NOTIFY_SOCKET", nsock)

	held, release := make(chan struct{}), make(chan struct{})
	serveHook = func() {
		close(held)
		<-release
	}
	defer func() { serveHook = nil }()

	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-name", "n0", "-runtime-dir", dir, "-link", "mem", "-workers", "1"}, &syncWriter{w: &logs})
	}()
	<-held
	sock := admin.SocketPath(dir, "n0")
	require.FileExists(t, sock, "the control socket exists before it is served")

	recv := func(d time.Duration) (string, error) {
		buf := make([]byte, 4096)
		require.NoError(t, nl.SetReadDeadline(time.Now().Add(d)))
		n, err := nl.Read(buf)
		return string(buf[:n]), err
	}
	// While held: the readiness check's query waits for an answer; none
	// comes, so nothing is sent. (A bounded wait for a message that must
	// not arrive; the daemon is blocked, not slow.)
	msg, err := recv(300 * time.Millisecond)
	require.Error(t, err, "notification before the daemon answered: %q", msg)
	require.True(t, os.IsTimeout(err), "%v", err)

	close(release)
	msg, err = recv(30 * time.Second)
	require.NoError(t, err, "no READY=1 once the daemon serves:\n%s", &logs)
	fields := map[string]string{}
	for _, line := range strings.Split(msg, "\n") {
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "malformed notification line %q", line)
		fields[k] = v
	}
	assert.Equal(t, "1", fields["READY"])
	assert.Equal(t, strconv.Itoa(os.Getpid()), fields["MAINPID"])
	assert.Contains(t, fields["STATUS"], "n0")
	info, err := admin.Serving(sock)
	require.NoError(t, err, "READY=1 sent, but the control socket does not answer")
	assert.Equal(t, "n0", info.Device)

	cancel()
	msg, err = recv(30 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "STOPPING=1", msg)
	require.NoError(t, <-done, "%s", &logs)
}

// TestNotifyUnset: without NOTIFY_SOCKET nothing is sent and nothing
// fails; with a socket nobody listens on, the error names it.
func TestNotifyUnset(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	named, err := sdNotify("READY=1")
	assert.False(t, named)
	assert.NoError(t, err)
	missing := filepath.Join(t.TempDir(), "none")
	t.Setenv("NOTIFY_SOCKET", missing)
	named, err = sdNotify("READY=1")
	assert.True(t, named)
	require.Error(t, err)
	assert.Contains(t, err.Error(), missing)
}

// TestNotifyAbstract: an abstract notification socket ('@' name), as
// systemd may pass, receives the message.
func TestNotifyAbstract(t *testing.T) {
	name := "@vrnicd-notify-test-" + strconv.Itoa(os.Getpid())
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	require.NoError(t, err)
	defer nl.Close()
	t.Setenv("NOTIFY_SOCKET", name)
	named, err := sdNotify("READY=1")
	require.True(t, named)
	require.NoError(t, err)
	buf := make([]byte, 64)
	require.NoError(t, nl.SetReadDeadline(time.Now().Add(10*time.Second)))
	n, err := nl.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "READY=1", string(buf[:n]))
}
