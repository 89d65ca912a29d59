package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// setNice gives every thread of the process the nice value n. On Linux a
// nice value belongs to a thread (setpriority with PRIO_PROCESS names a
// thread ID), and a new thread starts with its creator's: so every
// thread the process has now gets it, and the Go runtime's later threads,
// created by these, inherit it.
func setNice(n int) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("list the process's threads: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && err != unix.ESRCH {
			if err == unix.EACCES || err == unix.EPERM {
				return fmt.Errorf("nice %d: %w (a value below the one the daemon started with needs CAP_SYS_NICE or a matching RLIMIT_NICE)", n, err)
			}
			return fmt.Errorf("nice %d: thread %d: %w", n, tid, err)
		}
	}
	return nil
}
