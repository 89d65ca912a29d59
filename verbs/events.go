package verbs

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// AsyncEvents is a context's asynchronous event channel (OPEN_EVENTS):
// what ibv_get_async_event reads. The daemon sends QP_FATAL, QP_REQ_ERR,
// QP_ACCESS_ERR, QP_LAST_WQE_REACHED, CQ_ERR, SRQ_LIMIT_REACHED,
// PORT_ERR and PORT_ACTIVE on it (see abi.EventType); when the daemon goes
// away, Get returns one abi.EventDeviceFatal event and then ErrClosed.
type AsyncEvents struct {
	fd    int
	fatal bool // DEVICE_FATAL delivered
	// Events read while waiting for the other kind (GetCM, Get).
	asyncQ []abi.AsyncEvent
	cmQ    []abi.CMEvent
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
	if len(e.asyncQ) > 0 {
		ev := e.asyncQ[0]
		e.asyncQ = e.asyncQ[1:]
		return ev, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		ev, cmev, isCM, err := e.readBy(deadline, timeout)
		if err != nil || !isCM {
			return ev, err
		}
		// A CM event (ABI 1.2) read on the way is kept for GetCM.
		e.cmQ = append(e.cmQ, cmev)
	}
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
