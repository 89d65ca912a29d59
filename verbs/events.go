package verbs

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// AsyncEvents is a context's asynchronous event channel (OPEN_EVENTS):
// what ibv_get_async_event reads. The daemon sends QP_FATAL,
// QP_LAST_WQE_REACHED, CQ_ERR and SRQ_LIMIT_REACHED on it (see
// abi.EventType); when the daemon goes away, Get returns one
// abi.EventDeviceFatal event and then ErrClosed.
type AsyncEvents struct {
	fd    int
	fatal bool // DEVICE_FATAL delivered
}

// ErrNoEvent: no event arrived before Get's deadline.
var ErrNoEvent = errors.New("verbs: no asynchronous event before the deadline")

// OpenAsyncEvents opens the context's event channel (one per context).
func (c *Context) OpenAsyncEvents() (*AsyncEvents, error) {
	fds, _, err := c.k.call(abi.CmdOpenEvents, nil, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	if len(fds) != 1 {
		closeAll(fds)
		return nil, fmt.Errorf("%w: OPEN_EVENTS reply carried %d fds, want 1", ErrProtocol, len(fds))
	}
	return &AsyncEvents{fd: fds[0]}, nil
}

// Fd returns the descriptor to poll(2) for readability.
func (e *AsyncEvents) Fd() int { return e.fd }

// Get returns the next event, waiting at most timeout (0: do not wait;
// negative: wait without a bound); ErrNoEvent when none came.
func (e *AsyncEvents) Get(timeout time.Duration) (abi.AsyncEvent, error) {
	var ev abi.AsyncEvent
	if e.fd < 0 {
		return ev, ErrClosed
	}
	if e.fatal {
		return ev, ErrClosed
	}
	ms := -1
	if timeout >= 0 {
		ms = int(timeout.Milliseconds())
	}
	pfd := []unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ev, fmt.Errorf("verbs: poll event socket: %w", err)
		}
		if n == 0 {
			return ev, ErrNoEvent
		}
		break
	}
	var b [32]byte
	n, err := unix.Read(e.fd, b[:])
	switch {
	case err == unix.EAGAIN:
		return ev, ErrNoEvent
	case err != nil:
		return ev, fmt.Errorf("verbs: read event socket: %w", err)
	case n == 0: // end of file: the daemon is gone
		e.fatal = true
		ev.Type = abi.EventDeviceFatal
		return ev, nil
	}
	if _, err := abi.Unmarshal(b[:n], &ev); err != nil {
		return ev, fmt.Errorf("%w: event of %d bytes: %v", ErrProtocol, n, err)
	}
	return ev, nil
}

// Close closes the channel.
func (e *AsyncEvents) Close() error {
	if e.fd < 0 {
		return nil
	}
	err := unix.Close(e.fd)
	e.fd = -1
	return err
}
