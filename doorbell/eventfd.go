package doorbell

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// EventFD is an eventfd used as a doorbell kick or a completion event.
// Signal may be called from any goroutine; Drain and Add from one
// goroutine at a time.
//
// A descriptor received from a client shares its open file description,
// and so its O_NONBLOCK flag, with the client, which can clear it at any
// time (kernel-notes/eventfd.md). Of the operations here only Drain is
// non-blocking whatever that flag says (a read with RWF_NOWAIT); Signal
// and Add are plain writes, which block on a saturated counter when the
// flag is clear. The daemon therefore never calls Signal or Add on a
// client's eventfd from a goroutine that serves anybody else (see
// EventWriter).
type EventFD struct {
	fd  int
	buf [8]byte    // Drain's read buffer
	out [8]byte    // Add's value
	iov unix.Iovec // Drain's iovec over buf (set up once: Drain allocates nothing)
}

// one is the 8-byte little-endian value 1 every kick writes (read only).
var one = [8]byte{1}

// NewEventFD creates an eventfd with EFD_NONBLOCK|EFD_CLOEXEC.
func NewEventFD() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("doorbell: eventfd: %w", err)
	}
	return newEventFD(fd), nil
}

func newEventFD(fd int) *EventFD {
	e := &EventFD{fd: fd}
	e.iov.Base = &e.buf[0]
	e.iov.SetLen(len(e.buf))
	return e
}

// EventFDFrom wraps an eventfd received from elsewhere (SCM_RIGHTS). It
// checks fd is an eventfd (its /proc/self/fd link is anon_inode:[eventfd])
// and sets it non-blocking (which the sender can undo: see the type's
// doc). On success the EventFD owns fd; on error the caller still does.
func EventFDFrom(fd int) (*EventFD, error) {
	if err := checkEventFD(fd); err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("doorbell: eventfd %d: %w", fd, err)
	}
	return newEventFD(fd), nil
}

// ErrNotEventFD: a descriptor passed as an eventfd is something else.
var ErrNotEventFD = errors.New("doorbell: not an eventfd")

func checkEventFD(fd int) error {
	target, err := readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return fmt.Errorf("doorbell: fd %d: %w", fd, err)
	}
	if target != "anon_inode:[eventfd]" {
		return fmt.Errorf("%w: fd %d is %q", ErrNotEventFD, fd, target)
	}
	return nil
}

func readlink(p string) (string, error) {
	var b [128]byte
	n, err := unix.Readlink(p, b[:])
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// Fd is the descriptor (still owned by e).
func (e *EventFD) Fd() int { return e.fd }

// Signal adds 1 to the counter (write(2) of 8 bytes). A saturated counter
// (EAGAIN) already means "signalled" and is not an error. It blocks on a
// saturated counter if the file is not O_NONBLOCK.
func (e *EventFD) Signal() error {
	for {
		_, err := unix.Write(e.fd, one[:])
		switch err {
		case nil, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("doorbell: signal eventfd: %w", err)
	}
}

// Add adds v (1 ≤ v < 2^64-1) to the counter with one write(2), like
// Signal: EAGAIN (no room) is not an error, and it blocks while there is
// no room if the file is not O_NONBLOCK.
func (e *EventFD) Add(v uint64) error {
	binary.LittleEndian.PutUint64(e.out[:], v)
	for {
		_, err := unix.Write(e.fd, e.out[:])
		switch err {
		case nil, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("doorbell: signal eventfd: %w", err)
	}
}

// noNowaitRead is set once a kernel refused a RWF_NOWAIT read of an
// eventfd (kernels whose eventfd has no read_iter); Drain then uses
// read(2).
var noNowaitRead atomic.Bool

// Drain reads and resets the counter, returning its value (0 when it was
// not signalled). It never blocks, whatever the file's O_NONBLOCK flag:
// it reads with preadv2(RWF_NOWAIT), which an eventfd honours per call
// (eventfd_read returns EAGAIN on a zero counter under IOCB_NOWAIT).
// On a kernel that refuses that (EOPNOTSUPP) it falls back to read(2),
// which blocks on a zero counter if a client cleared O_NONBLOCK.
func (e *EventFD) Drain() (uint64, error) {
	for {
		var err error
		if !noNowaitRead.Load() {
			err = readNowait(e.fd, &e.iov)
			if err == unix.EOPNOTSUPP || err == unix.ENOSYS {
				noNowaitRead.Store(true)
				continue
			}
		} else {
			_, err = unix.Read(e.fd, e.buf[:])
		}
		switch err {
		case nil:
			return binary.LittleEndian.Uint64(e.buf[:]), nil
		case unix.EAGAIN:
			return 0, nil
		case unix.EINTR:
			continue
		}
		return 0, fmt.Errorf("doorbell: drain eventfd: %w", err)
	}
}

// Close closes the descriptor.
func (e *EventFD) Close() error {
	if e.fd < 0 {
		return nil
	}
	err := unix.Close(e.fd)
	e.fd = -1
	return err
}
