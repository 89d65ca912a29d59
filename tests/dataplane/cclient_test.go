package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// daemon is a vrnicd process started by a test.
type daemon struct {
	proc   *launch.Proc
	socket string
	logs   *launch.Buffer
}

// startDaemon runs vrnicd with a private runtime dir and waits until its
// control socket answers; the test's cleanup stops it by PID.
func startDaemon(t *testing.T, name string, args ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	d := &daemon{socket: admin.SocketPath(dir, name), logs: &launch.Buffer{}}
	var err error
	d.proc, err = launch.Start(launch.Spec{Name: "vrnicd " + name, Bin: filepath.Join(bin, "vrnicd"),
		Args: append([]string{"-name", name, "-runtime-dir", dir}, args...), Stderr: d.logs})
	require.NoError(t, err)
	t.Cleanup(func() { d.stop(t) })
	require.NoError(t, launch.WaitReady(context.Background(), d.proc, d.socket, 15*time.Second),
		"vrnicd %s did not come up; log:\n%s", name, d.logs.String())
	return d
}

// stop sends SIGTERM and expects a clean exit.
func (d *daemon) stop(t *testing.T) {
	err := d.proc.Stop(0, 10*time.Second)
	if d.proc.Killed() {
		t.Errorf("vrnicd did not stop on SIGTERM; log:\n%s", d.logs.String())
		return
	}
	assert.NoError(t, err, "vrnicd exit; log:\n%s", d.logs.String())
}

// TestCClientDataPath builds examples/rc_ops.c, a client written in C
// from abi/vrnic_abi.h and libc alone, and runs it: it opens a context on
// each of two devices, connects an RC QP of one to an RC QP of the other,
// and does an RDMA WRITE, a SEND into a posted RECV, an RDMA READ, a
// FETCH_AND_ADD and a CMP_AND_SWP, checking every completion field by
// field and every byte. Over the UDP link between two vrnicd daemons (the
// README's set-up), and with both contexts on one daemon over its UDP
// link (the frames leave through its socket and come back) and over its
// in-memory link.
func TestCClientDataPath(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	cl := filepath.Join(t.TempDir(), "rc_ops")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I", "../../abi", "-o", cl, "../../examples/rc_ops.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	const want = "OK write 5000 send 3000 read 6000 fetch_add 1000->1023 cmp_swap 1023->77\n"
	udp := func(t *testing.T) []string {
		return []string{"-link", "udp", "-workers", "2", "-local", freeLoopback(t).String() + ":4791"}
	}
	for _, tc := range []struct {
		name  string
		links []func(t *testing.T) []string
	}{
		{"udp_two_daemons", []func(t *testing.T) []string{udp, udp}},
		{"udp_one_daemon", []func(t *testing.T) []string{udp}},
		{"mem_one_daemon", []func(t *testing.T) []string{func(*testing.T) []string { return []string{"-link", "mem", "-workers", "2"} }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var socks, logs []string
			var ds []*daemon
			for i, args := range tc.links {
				d := startDaemon(t, fmt.Sprintf("c%d", i), args(t)...)
				ds = append(ds, d)
				socks = append(socks, d.socket)
			}
			cmd := exec.Command(cl, socks...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			for _, d := range ds {
				logs = append(logs, d.logs.String())
			}
			require.NoError(t, err, "rc_ops: %s%s\nvrnicd logs:\n%s", stdout.String(), stderr.String(), strings.Join(logs, "\n"))
			assert.Equal(t, want, stdout.String())
			assert.Empty(t, stderr.String())
		})
	}
}

// TestCClientUsage: rc_ops without a socket says how to run it (status 2);
// with a socket nobody listens on it fails with status 1 and an ERROR line.
func TestCClientUsage(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	cl := filepath.Join(t.TempDir(), "rc_ops")
	out, err := exec.Command(gcc, "-std=c11", "-O1", "-I", "../../abi", "-o", cl, "../../examples/rc_ops.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	var ee *exec.ExitError
	out, err = exec.Command(cl).CombinedOutput()
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), "usage:")
	out, err = exec.Command(cl, filepath.Join(t.TempDir(), "none.sock")).CombinedOutput()
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Regexp(t, `^ERROR connect: `, string(out))
}
