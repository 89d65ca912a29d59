package abi

import (
	"bytes"
	"errors"
	"fmt"
	"syscall"
)

// ControlError is a failed control command as a client sees it: the errno
// value of the reply's status and the daemon's message. It unwraps to the
// syscall.Errno, so errors.Is(err, syscall.EINVAL) works.
type ControlError struct {
	Op    Cmd
	Errno syscall.Errno
	Msg   string
}

func (e *ControlError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("vrnic %s: %v", e.Op, e.Errno)
	}
	return fmt.Sprintf("vrnic %s: %v: %s", e.Op, e.Errno, e.Msg)
}

func (e *ControlError) Unwrap() error { return e.Errno }

// ErrnoOf maps a daemon-side error to the errno value a reply carries: the
// syscall.Errno found in err's chain (a ControlError's included), 0 for nil,
// EIO for an error that carries no errno.
func ErrnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var en syscall.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return syscall.EIO
}

// PutErrorReply encodes the error reply to the request req into b: the
// header (opcode and seq echoed, VRNIC_MSG_F_REPLY, status = errno) and the
// NUL-terminated message, truncated to MaxErrMsg bytes including the NUL.
// It returns the datagram length. b must hold SizeofMsgHdr+MaxErrMsg bytes.
func PutErrorReply(b []byte, req *MsgHdr, errno syscall.Errno, msg string) (int, error) {
	if len(b) < SizeofMsgHdr+MaxErrMsg {
		return 0, fmt.Errorf("%w: error reply needs %d bytes", ErrShort, SizeofMsgHdr+MaxErrMsg)
	}
	if errno == 0 {
		errno = syscall.EIO
	}
	if len(msg) > MaxErrMsg-1 {
		msg = msg[:MaxErrMsg-1]
	}
	n := SizeofMsgHdr + copy(b[SizeofMsgHdr:], msg)
	b[n] = 0
	n++
	h := MsgHdr{Opcode: req.Opcode, Flags: MsgFlagReply, Length: uint32(n), Seq: req.Seq, Status: uint32(errno)}
	h.Put(b)
	return n, nil
}

// ReplyError turns a decoded reply header and its payload (the bytes after
// the header) into nil for status 0, or a *ControlError carrying the errno
// and the message (up to the first NUL, at most MaxErrMsg bytes).
func ReplyError(h *MsgHdr, payload []byte) error {
	if h.Status == 0 {
		return nil
	}
	if len(payload) > MaxErrMsg {
		payload = payload[:MaxErrMsg]
	}
	if i := bytes.IndexByte(payload, 0); i >= 0 {
		payload = payload[:i]
	}
	return &ControlError{Op: h.Opcode, Errno: syscall.Errno(h.Status), Msg: string(payload)}
}
