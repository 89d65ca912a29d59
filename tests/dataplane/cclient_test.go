package dataplane

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/device"
)

// daemon is a vrnicd process started by a test.
type daemon struct {
	cmd    *exec.Cmd
	socket string
	logs   *syncBuf
	done   chan error
}

// startDaemon runs vrnicd with a private runtime dir and waits until its
// control socket answers; the test's cleanup stops it by PID.
func startDaemon(t *testing.T, name string, args ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	d := &daemon{socket: device.SocketPath(dir, name), logs: &syncBuf{}, done: make(chan error, 1)}
	d.cmd = exec.Command(filepath.Join(bin, "vrnicd"), append([]string{"-name", name, "-runtime-dir", dir}, args...)...)
	d.cmd.Stderr = d.logs
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	require.Eventually(t, func() bool {
		a, err := device.DialAdmin(d.socket)
		if err != nil {
			return false
		}
		a.Close()
		return true
	}, 15*time.Second, 10*time.Millisecond, "vrnicd %s did not come up", name)
	return d
}

// stop sends SIGTERM and expects a clean exit (idempotent).
func (d *daemon) stop(t *testing.T) {
	if d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.done:
		assert.NoError(t, err, "vrnicd exit; log:\n%s", d.logs.String())
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Errorf("vrnicd did not stop on SIGTERM; log:\n%s", d.logs.String())
	}
}

// TestCClientDataPath: a client written in C from vrnic_abi.h and libc
// alone connects two RC QPs of its context through a real vrnicd (2
// workers) and moves data with SEND/RECV and RDMA WRITE, checking
// completions by their owner bit and every byte: over the in-memory link,
// and over the UDP link (the QPs' frames go out of the daemon's socket
// and come back to it).
func TestCClientDataPath(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed: the C client cannot be built")
	}
	cl := filepath.Join(t.TempDir(), "cloop")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Werror", "-O1", "-I", "../../abi", "-o", cl, "testdata/cloop.c").CombinedOutput()
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
