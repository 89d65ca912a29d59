// Package osyield gives the calling thread's CPU to another runnable
// thread, for the busy-polling loops of vrnic (the engine's idle workers,
// vrnic-perf's waits).
//
// On a machine with fewer cores than busy threads (clients polling their
// CQs, the workers and pollers of two daemons) a loop that polls with
// runtime.Gosched alone never gives its CPU away: Gosched only lets the
// goroutines of its own P run. A thread the kernel placed on the same CPU
// (often the one the poller's own traffic woke) then waits until the
// kernel preempts the poller, a whole time slice (1 to 3 ms), and a
// ping-pong's hop or a short ACK timeout's answer waits with it.
package osyield

import "golang.org/x/sys/unix"

// Yield is sched_yield(2): it returns at once when no other thread is
// runnable on this CPU. It is a raw system call, so the Go scheduler does
// not hand the P to another thread meanwhile (which would start a new M).
func Yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
