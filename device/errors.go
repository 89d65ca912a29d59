package device

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Sentinel errors of the control path. Each maps to the errno value sent in
// the reply's status field (errnoOf); handlers wrap them with a message that
// names the offending field, and the message travels to the client.
var (
	errInval     = errors.New("invalid argument")              // EINVAL
	errBusy      = errors.New("resource busy")                 // EBUSY
	errNoEnt     = errors.New("no such object")                // ENOENT
	errAgain     = errors.New("resource limit reached")        // EAGAIN
	errNoMem     = errors.New("device resource limit reached") // ENOMEM
	errProto     = errors.New("ABI version mismatch")          // EPROTO
	errNotSup    = errors.New("operation not supported")       // EOPNOTSUPP
	errBadFd     = errors.New("bad file descriptor")           // EBADF
	errMsgSize   = errors.New("bad message length")            // EMSGSIZE
	errBadOpcode = errors.New("unknown command")               // ENOSYS
	errAddrInUse = errors.New("address in use")                // EADDRINUSE
	errPerm      = errors.New("operation not permitted")       // EPERM
	errExist     = errors.New("object exists")                 // EEXIST
)

// errnoTable is the one mapping from control-path sentinels to errno.
var errnoTable = []struct {
	err   error
	errno unix.Errno
}{
	{errInval, unix.EINVAL},
	{errBusy, unix.EBUSY},
	{errNoEnt, unix.ENOENT},
	{errAgain, unix.EAGAIN},
	{errNoMem, unix.ENOMEM},
	{errProto, unix.EPROTO},
	{errNotSup, unix.EOPNOTSUPP},
	{errBadFd, unix.EBADF},
	{errFdKind, unix.EBADF},
	{errMsgSize, unix.EMSGSIZE},
	{errBadOpcode, unix.ENOSYS},
	{errAddrInUse, unix.EADDRINUSE},
	{errPerm, unix.EPERM},
	{errExist, unix.EEXIST},
}

// errnoOf returns the errno a reply carries for err: the first sentinel in
// errnoTable that err wraps, or a unix.Errno err wraps, or EIO.
func errnoOf(err error) unix.Errno {
	for _, e := range errnoTable {
		if errors.Is(err, e.err) {
			return e.errno
		}
	}
	var en unix.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return unix.EIO
}

// errorf wraps sentinel with a formatted message; the message (not the
// sentinel's text) is what the client sees.
func errorf(sentinel error, format string, args ...any) error {
	return &cmdError{sentinel: sentinel, msg: fmt.Sprintf(format, args...)}
}

// cmdError is an error with a client-facing message and a sentinel that
// selects the errno.
type cmdError struct {
	sentinel error
	msg      string
}

func (e *cmdError) Error() string { return e.msg }
func (e *cmdError) Unwrap() error { return e.sentinel }
