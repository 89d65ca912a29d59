package engine

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sharedCPUChild marks the re-executed test binary of
// TestShortAckTimeoutSharedCPU.
const sharedCPUChild = "VRNIC_ENGINE_SHARED_CPU_CHILD"

// TestShortAckTimeoutSharedCPU: the two workers of a pair on one CPU, as
// the kernel often places a thread woken by another. The test binary runs
// again pinned to one CPU, with GOMAXPROCS 2 (two Ps, so each worker keeps
// a thread of its own). The requester's ACK timeout is code 4 (65 µs) and
// the first transmission of every WRITE is dropped, so the requester polls
// toward its deadline while the responder must run to answer the
// retransmission: 200 WRITEs must all complete successfully. A requester
// that polled without yielding the CPU kept the responder off it until
// the kernel preempted it, a time slice later, and a WRITE ended in
// RETRY_EXC_ERR within the first few.
func TestShortAckTimeoutSharedCPU(t *testing.T) {
	if os.Getenv(sharedCPUChild) != "" {
		require.Equal(t, 2, runtime.GOMAXPROCS(0))
		var set unix.CPUSet
		require.NoError(t, unix.SchedGetaffinity(0, &set))
		require.Equal(t, 1, set.Count(), "pinned to one CPU")
		ackTimerRun(t, 4, 200)
		return
	}
	// Pin this thread, then start the child from it: the child and
	// every thread it makes inherit the one CPU. The thread stays locked
	// and ends with the test's goroutine.
	runtime.LockOSThread()
	var all, one unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &all))
	for c := range 1024 {
		if all.IsSet(c) {
			one.Set(c)
			break
		}
	}
	require.NoError(t, unix.SchedSetaffinity(0, &one))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestShortAckTimeoutSharedCPU$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), sharedCPUChild+"=1", "GOMAXPROCS=2")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: TestShortAckTimeoutSharedCPU")
}
