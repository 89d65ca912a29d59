// Package fdwait waits, on the Go poller, until a non-blocking fd has data
// to read, without reading it: a TAP queue or a UDP socket that its owner
// drains itself with non-blocking reads, and watches only while it sleeps.
//
// The Go poller registers fds edge-triggered, and RawConn.Read resets the
// fd's readiness when it starts, so an edge raised before the wait would
// be forgotten. Wait therefore asks the kernel first, with poll(2) and a
// zero timeout, after the reset; only when nothing is queued does it park
// on the poller, and anything queued after that check raises an edge the
// wait sees. No wake-up is lost.
package fdwait

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Waiter waits for one fd. Wait must not run concurrently with itself or
// with a RawConn.Read of the same fd; non-blocking reads under
// RawConn.Control and writes may.
type Waiter struct {
	rc  syscall.RawConn
	pfd [1]unix.PollFd
	fn  func(fd uintptr) bool // readable, built once: Wait allocates nothing
}

// New returns a Waiter for the fd of rc.
func New(rc syscall.RawConn) *Waiter {
	w := &Waiter{rc: rc}
	w.fn = w.readable
	return w
}

// Wait blocks until data is queued on the fd (it may also return when the
// data has been read meanwhile: callers re-check). After the fd is
// closed it returns an error matching os.ErrClosed.
func (w *Waiter) Wait() error { return w.rc.Read(w.fn) }

// readable is Wait's callback: RawConn.Read calls it after resetting the
// poller's readiness, and again after each wake-up; false parks until the
// next edge. An error counts as readable: the caller's read reports it.
func (w *Waiter) readable(fd uintptr) bool {
	w.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	for {
		n, err := unix.Poll(w.pfd[:], 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}
