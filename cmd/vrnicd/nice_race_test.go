package main

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSetNiceThreadsBornDuringPass forces the interleaving that a single
// pass over the process's threads loses: threads created, by threads not
// yet set, after the pass has listed the threads. setNice must still leave
// every thread at the value. It runs in a child process, so that the test
// binary keeps its own priority.
func TestSetNiceThreadsBornDuringPass(t *testing.T) {
	if os.Getenv("VRNIC_NICE_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSetNiceThreadsBornDuringPass$", "-test.v")
		cmd.Env = append(os.Environ(), "VRNIC_NICE_CHILD=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestSetNiceThreadsBornDuringPass")
		return
	}
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	require.NoError(t, err)
	n := 20 - prio + 3
	if n > 19 {
		t.Skipf("the process already runs at nice %d", 20-prio)
	}
	// Each goroutine locks itself to a thread and blocks in a read, so
	// the runtime needs a new thread for every one of them.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	const blocked = 8
	done := make(chan struct{}, blocked)
	born := 0
	niceListed = func() {
		if born > 0 {
			return
		}
		before := threadCount(t)
		for i := 0; i < blocked; i++ {
			go func() {
				runtime.LockOSThread()
				var b [1]byte
				unix.Read(int(r.Fd()), b[:])
				done <- struct{}{}
			}()
		}
		// Until the runtime has made threads for half of them (the
		// assertion below says if it never does).
		deadline := time.Now().Add(10 * time.Second)
		for born = threadCount(t) - before; born < blocked/2 && time.Now().Before(deadline); born = threadCount(t) - before {
			runtime.Gosched()
		}
	}
	defer func() { niceListed = nil }()
	require.NoError(t, setNice(n))
	require.GreaterOrEqual(t, born, blocked/2, "threads created during the first pass")
	for tid, got := range threadNices(t, os.Getpid()) {
		assert.Equal(t, n, got, "thread %d", tid)
	}
	_, err = w.Write(make([]byte, blocked))
	require.NoError(t, err)
	w.Close()
	for i := 0; i < blocked; i++ {
		<-done
	}
}

func threadCount(t *testing.T) int {
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	return len(tasks)
}
