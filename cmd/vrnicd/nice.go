package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// setNice gives every thread of the process the nice value n. On Linux a
// nice value belongs to a thread (setpriority with PRIO_PROCESS names a
// thread ID), and a new thread starts with its creator's: so every
// thread the process has gets it, and the Go runtime's later threads,
// created by these, inherit it.
//
// One pass over /proc/self/task is not enough: a thread that the runtime
// is creating while the pass runs copies its creator's value when the
// clone starts but joins the list only when it ends, so it can miss the
// pass and keep the old value. setNice therefore repeats the pass, reading
// every thread's value back, until two passes a millisecond apart find
// every thread at n.
func setNice(n int) error {
	clean := 0
	for pass := 0; clean < 2; pass++ {
		if pass == 1000 {
			return fmt.Errorf("nice %d: threads keep appearing with another value", n)
		}
		changed, err := niceThreads(n)
		if err != nil {
			return err
		}
		if changed {
			clean = 0
		} else {
			clean++
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// niceListed, when set (by tests), runs after each pass has listed the
// threads and before it sets them.
var niceListed func()

// niceThreads sets n on every thread of the process whose nice value is
// not n, and reports whether it found any.
func niceThreads(n int) (bool, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return false, fmt.Errorf("list the process's threads: %w", err)
	}
	if niceListed != nil {
		niceListed()
	}
	changed := false
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		// The raw system call returns 20-nice (1..40).
		if prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid); err == nil && 20-prio == n {
			continue
		}
		changed = true
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
			if err == unix.EACCES || err == unix.EPERM {
				return false, fmt.Errorf("nice %d: %w (a value below the one the daemon started with needs CAP_SYS_NICE or a matching RLIMIT_NICE)", n, err)
			}
			return false, fmt.Errorf("nice %d: thread %d: %w", n, tid, err)
		}
	}
	return changed, nil
}
