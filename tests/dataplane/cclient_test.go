package dataplane

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/device"
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
	d := &daemon{socket: device.SocketPath(dir, name), logs: &launch.Buffer{}}
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

// TestCClientDataPath: a client written in C from vrnic_abi.h and libc
// alone connects two RC QPs of its context through a real vrnicd (2
// workers) and moves data with SEND/RECV and RDMA WRITE, checking
// completions by their owner bit and every byte: over the in-memory link,
// and over the UDP link (the QPs' frames go out of the daemon's socket
// and come back to it).
func TestCClientDataPath(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	cl := filepath.Join(t.TempDir(), "cloop")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Werror", "-O1", "-I", "../../abi", "-I", "../testdata", "-o", cl, "testdata/cloop.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	for _, link := range []string{"mem", "udp"} {
		t.Run(link, func(t *testing.T) {
			args := []string{"-link", link, "-workers", "2"}
			if link == "udp" {
				args = append(args, "-local", freeLoopback(t).String()+":4791")
			}
			d := startDaemon(t, "c0", args...)
			out, err := exec.Command(cl, d.socket).CombinedOutput()
			require.NoError(t, err, "C client: %s\nvrnicd log:\n%s", out, d.logs.String())
			assert.Equal(t, "OK 3000 5000\n", string(out))
		})
	}
}
