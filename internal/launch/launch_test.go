package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/vrnic/vrnic/admin"
)

// helperEnv makes the test binary a parent that starts `sleep 60` with
// Start, prints its PID and blocks (TestPdeathsig).
const helperEnv = "VRNIC_LAUNCH_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		p, err := Start(Spec{Name: "sleep", Bin: "sleep", Args: []string{"60"}})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(p.Pid())
		<-p.Done()
		os.Exit(0)
	}
	// Every Proc's wait goroutine ends with its process: none may be left.
	goleak.VerifyTestMain(m)
}

// gone reports whether no process has this PID (a Proc is reaped by its
// own Wait goroutine, so no zombie remains).
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

func TestStartOutput(t *testing.T) {
	script := `echo "out $V"; echo err >&2; exit 3`
	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		p, err := Start(Spec{Name: "p", Bin: "sh", Args: []string{"-c", script}, Env: []string{"V=x"}, Dir: dir, SplitStdout: true})
		require.NoError(t, err)
		<-p.Done()
		var ee *exec.ExitError
		require.ErrorAs(t, p.Err(), &ee)
		assert.Equal(t, 3, ee.ExitCode())
		assert.False(t, p.Running())
		assert.Equal(t, filepath.Join(dir, "p.out"), p.Out)
		assert.Equal(t, filepath.Join(dir, "p.log"), p.Log)
		out, err := os.ReadFile(p.Out)
		require.NoError(t, err)
		assert.Equal(t, "out x\n", string(out))
		assert.Equal(t, "err", p.Tail(5))
	})
	t.Run("one log file", func(t *testing.T) {
		p, err := Start(Spec{Name: "p", Bin: "sh", Args: []string{"-c", script}, Env: []string{"V=y"}, Dir: t.TempDir()})
		require.NoError(t, err)
		<-p.Done()
		assert.Empty(t, p.Out)
		assert.Equal(t, "out y\nerr", p.Tail(5))
		assert.Equal(t, "err", p.Tail(1))
	})
	t.Run("writers", func(t *testing.T) {
		var o, e bytes.Buffer
		p, err := Start(Spec{Name: "p", Bin: "sh", Args: []string{"-c", script}, Env: []string{"V=z"}, Stdout: &o, Stderr: &e})
		require.NoError(t, err)
		<-p.Done()
		assert.Equal(t, "out z\n", o.String())
		assert.Equal(t, "err\n", e.String())
		assert.Empty(t, p.Log)
		assert.Empty(t, p.Tail(5))
	})
	t.Run("no binary", func(t *testing.T) {
		_, err := Start(Spec{Name: "nope", Bin: filepath.Join(t.TempDir(), "nope")})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "start nope")
	})
	t.Run("no directory", func(t *testing.T) {
		_, err := Start(Spec{Name: "p", Bin: "true", Dir: filepath.Join(t.TempDir(), "missing")})
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
}

func TestStop(t *testing.T) {
	t.Run("exits by itself within wait", func(t *testing.T) {
		p, err := Start(Spec{Name: "p", Bin: "sleep", Args: []string{"0.2"}})
		require.NoError(t, err)
		assert.True(t, p.Running())
		assert.NoError(t, p.Stop(10*time.Second, time.Second), "exit status 0: no signal was sent")
		assert.False(t, p.Killed())
		assert.True(t, gone(p.Pid()))
	})
	t.Run("SIGTERM", func(t *testing.T) {
		p, err := Start(Spec{Name: "p", Bin: "sleep", Args: []string{"60"}})
		require.NoError(t, err)
		assert.False(t, p.Wait(0))
		err = p.Stop(0, 10*time.Second)
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, syscall.SIGTERM, ee.Sys().(syscall.WaitStatus).Signal())
		assert.False(t, p.Killed())
		assert.True(t, gone(p.Pid()))
		assert.Equal(t, err, p.Stop(0, time.Second), "stopping again returns the same status")
	})
	t.Run("SIGKILL after grace", func(t *testing.T) {
		p, err := Start(Spec{Name: "p", Bin: "sh", Args: []string{"-c", `trap "" TERM; echo ready; exec sleep 60`}, Dir: t.TempDir(), SplitStdout: true})
		require.NoError(t, err)
		require.Eventually(t, func() bool { b, _ := os.ReadFile(p.Out); return string(b) == "ready\n" }, 10*time.Second, 5*time.Millisecond)
		err = p.Stop(0, 100*time.Millisecond)
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		assert.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
		assert.True(t, p.Killed())
		assert.True(t, gone(p.Pid()))
	})
}

func TestGroup(t *testing.T) {
	g := &Group{Dir: t.TempDir()}
	var pids []int
	for i := range 3 {
		p, err := g.Start(Spec{Name: "sleep" + strconv.Itoa(i), Bin: "sleep", Args: []string{"60"}})
		require.NoError(t, err)
		assert.Equal(t, filepath.Join(g.Dir, p.Name+".log"), p.Log)
		pids = append(pids, p.Pid())
	}
	_, err := g.Start(Spec{Name: "bad", Bin: filepath.Join(g.Dir, "nope")})
	require.Error(t, err)
	require.Len(t, g.Procs, 3, "a process that did not start is not in the group")
	g.StopAll(5 * time.Second)
	for i, p := range g.Procs {
		assert.False(t, p.Running(), "process %d", i)
		assert.True(t, gone(pids[i]), "process %d", i)
	}
}

// TestPdeathsig: a child started with Start dies with its parent even
// when the parent is SIGKILLed and cannot stop it.
func TestPdeathsig(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	var out Buffer
	parent, err := Start(Spec{Name: "parent", Bin: exe, Args: []string{"-test.run=^$"}, Env: []string{helperEnv + "=1"}, Stdout: &out, Stderr: &out})
	require.NoError(t, err)
	t.Cleanup(func() { parent.Stop(0, time.Second) })
	var child int
	require.Eventually(t, func() bool {
		child, err = strconv.Atoi(strings.TrimSpace(out.String()))
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "child PID; output %q", &out)
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	require.False(t, gone(child))
	require.NoError(t, parent.Cmd.Process.Kill())
	<-parent.Done()
	assert.Eventually(t, func() bool { return gone(child) }, 10*time.Second, 5*time.Millisecond, "child %d outlived its parent", child)
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("a\nb\nc\n"), 0o600))
	for _, c := range []struct {
		n    int
		want string
	}{{0, ""}, {1, "c"}, {2, "b\nc"}, {3, "a\nb\nc"}, {10, "a\nb\nc"}} {
		t.Run(strconv.Itoa(c.n), func(t *testing.T) { assert.Equal(t, c.want, Tail(path, c.n)) })
	}
	assert.Empty(t, Tail(filepath.Join(t.TempDir(), "missing"), 3))
}

func TestGoBuild(t *testing.T) {
	var out bytes.Buffer
	_, err := GoBuild("github.com/vrnic/vrnic/no/such/package", t.TempDir(), "x", &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "build github.com/vrnic/vrnic/no/such/package")
	assert.NotEmpty(t, out.String(), "the go tool's message")
}

func TestFindVrnicd(t *testing.T) {
	t.Run("explicit", func(t *testing.T) {
		var out bytes.Buffer
		bin, err := FindVrnicd("/some/vrnicd", t.TempDir(), &out)
		require.NoError(t, err)
		assert.Equal(t, "/some/vrnicd", bin)
		assert.Empty(t, out.String())
	})
}

// TestVrnicd is the daemon's whole start-up as the commands do it: the
// test binary has no vrnicd beside it, so FindVrnicd builds one; it is
// started, WaitReady sees its control socket answer, and SIGTERM stops it
// cleanly.
func TestVrnicd(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	bin, err := FindVrnicd("", dir, &out)
	require.NoError(t, err, "%s", out.String())
	assert.Equal(t, filepath.Join(dir, "vrnicd"), bin)
	assert.Contains(t, out.String(), "building vrnicd ...")
	p, err := Start(Spec{Name: "vrnicd", Bin: bin, Args: []string{"-name", "l0", "-runtime-dir", dir, "-link", "mem", "-workers", "1"}, Dir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { p.Stop(0, time.Second) })
	require.NoError(t, WaitReady(context.Background(), p, admin.SocketPath(dir, "l0"), 20*time.Second), "log:\n%s", p.Tail(20))
	assert.NoError(t, p.Stop(0, 10*time.Second), "log:\n%s", p.Tail(20))
	assert.False(t, p.Killed())
}

func TestWaitReadyFailures(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	t.Run("exited", func(t *testing.T) {
		p, err := Start(Spec{Name: "d", Bin: "sh", Args: []string{"-c", "echo bad flag >&2; exit 2"}, Dir: t.TempDir()})
		require.NoError(t, err)
		err = WaitReady(context.Background(), p, sock, 10*time.Second)
		require.ErrorIs(t, err, ErrExited)
		assert.Contains(t, err.Error(), "bad flag", "the end of the log")
	})
	t.Run("timeout", func(t *testing.T) {
		// A process that stays up and never serves: WaitReady ends at
		// its timeout, with the process still running (one that ignored
		// its timeout would wait for the process, an hour).
		p, err := Start(Spec{Name: "d", Bin: "sleep", Args: []string{"3600"}})
		require.NoError(t, err)
		defer p.Stop(0, time.Second)
		err = WaitReady(context.Background(), p, sock, 100*time.Millisecond)
		require.ErrorIs(t, err, ErrNotReady)
		assert.Contains(t, err.Error(), sock)
		assert.True(t, p.Running(), "WaitReady gave up at its timeout, the process still running")
	})
	t.Run("cancelled", func(t *testing.T) {
		p, err := Start(Spec{Name: "d", Bin: "sleep", Args: []string{"60"}})
		require.NoError(t, err)
		defer p.Stop(0, time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, WaitReady(ctx, p, sock, time.Hour), ErrNotReady)
	})
}
