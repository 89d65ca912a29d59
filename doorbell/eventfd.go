package doorbell

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// EventFD is a non-blocking eventfd used as a doorbell kick or a
// completion event. Signal may be called from any goroutine; Drain from
// one goroutine at a time.
type EventFD struct {
	fd  int
	buf [8]byte // Drain's read buffer
}

// one is the 8-byte little-endian value 1 every kick writes (read only).
var one = [8]byte{1}

// NewEventFD creates an eventfd with EFD_NONBLOCK|EFD_CLOEXEC.
func NewEventFD() (*EventFD, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("doorbell: eventfd: %w", err)
	}
	return &EventFD{fd: fd}, nil
}

// EventFDFrom wraps an eventfd received from elsewhere (SCM_RIGHTS). It
// checks fd is an eventfd (its /proc/self/fd link is anon_inode:[eventfd])
// and sets it non-blocking. On success the EventFD owns fd; on error the
// caller still does.
func EventFDFrom(fd int) (*EventFD, error) {
	if err := checkEventFD(fd); err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("doorbell: eventfd %d: %w", fd, err)
	}
	return &EventFD{fd: fd}, nil
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
// (EAGAIN) already means "signalled" and is not an error.
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

// Drain reads and resets the counter, returning its value (0 when it was
// not signalled).
func (e *EventFD) Drain() (uint64, error) {
	for {
		_, err := unix.Read(e.fd, e.buf[:])
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
