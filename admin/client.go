package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// Client is an operator connection to a device's control socket (used by
// vrnicctl, the launchers and tests). It opens no context.
type Client struct {
	c       *net.UnixConn
	seq     uint32
	buf     []byte
	timeout time.Duration // per call; 0: DefaultCallTimeout
}

// DefaultCallTimeout bounds a call (its request and its reply) unless
// SetTimeout sets another bound.
const DefaultCallTimeout = 10 * time.Second

// SetTimeout bounds each later call to d (0: DefaultCallTimeout).
func (a *Client) SetTimeout(d time.Duration) { a.timeout = d }

// WaitClosed waits up to d for the daemon to close the connection (it
// exited, or it dropped this client) and reports whether it did: true
// with a nil error on end of file or a reset. A message the daemon sends
// unasked is an error, as is any other failure to read; after either,
// or after true, the Client is of no further use. It returns false, nil
// when d passes with the connection open and quiet.
func (a *Client) WaitClosed(d time.Duration) (bool, error) {
	a.c.SetReadDeadline(time.Now().Add(d))
	n, err := a.c.Read(a.buf)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return true, nil
	case err != nil:
		return false, err
	case n == 0:
		// A zero-length read on a SOCK_SEQPACKET socket is its end.
		return true, nil
	}
	return false, fmt.Errorf("unexpected %d-byte message from the daemon", n)
}

// Dial connects to the control socket at path.
func Dial(path string) (*Client, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return &Client{c: c, buf: make([]byte, abi.MaxMsgSize+1)}, nil
}

// Close closes the connection.
func (a *Client) Close() error { return a.c.Close() }

// Call sends an operator command with a JSON request (nil for none) and
// returns the JSON reply payload.
func (a *Client) Call(op abi.Cmd, req any) ([]byte, error) {
	body, fds, err := a.call(op, req)
	for _, fd := range fds {
		syscall.Close(fd)
	}
	return body, err
}

// Capture starts a packet capture (CaptureCmd) and returns the stream the
// daemon writes it to as pcapng; read it to its end (the capture's count
// or duration reached) or close it to end the capture.
func (a *Client) Capture(req CaptureRequest) (*os.File, error) {
	_, fds, err := a.call(CaptureCmd, req)
	if err != nil {
		return nil, err
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, fmt.Errorf("capture reply carried %d descriptors, want 1", len(fds))
	}
	return os.NewFile(uintptr(fds[0]), "capture"), nil
}

// call sends op and returns the reply's payload and the descriptors that
// came with it (the caller's to close).
func (a *Client) call(op abi.Cmd, req any) ([]byte, []int, error) {
	var payload []byte
	if req != nil {
		var err error
		if payload, err = json.Marshal(req); err != nil {
			return nil, nil, err
		}
	}
	msg := make([]byte, abi.SizeofMsgHdr+len(payload))
	a.seq++
	h := abi.MsgHdr{Opcode: op, Length: uint32(len(msg)), Seq: a.seq}
	h.Put(msg)
	copy(msg[abi.SizeofMsgHdr:], payload)
	to := a.timeout
	if to <= 0 {
		to = DefaultCallTimeout
	}
	a.c.SetDeadline(time.Now().Add(to))
	if _, err := a.c.Write(msg); err != nil {
		return nil, nil, err
	}
	oob := make([]byte, syscall.CmsgSpace(4*abi.MaxFDs))
	n, oobn, _, _, err := a.c.ReadMsgUnix(a.buf, oob)
	if err != nil {
		return nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		if cms, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for i := range cms {
				if f, err := syscall.ParseUnixRights(&cms[i]); err == nil {
					fds = append(fds, f...)
				}
			}
		}
	}
	fail := func(err error) ([]byte, []int, error) {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, nil, err
	}
	var rh abi.MsgHdr
	if err := rh.Decode(a.buf[:n]); err != nil {
		return fail(err)
	}
	if rh.Opcode != op || rh.Seq != a.seq || int(rh.Length) != n {
		return fail(fmt.Errorf("operator reply does not match the request (opcode %#x seq %d)", uint16(rh.Opcode), rh.Seq))
	}
	body := a.buf[abi.SizeofMsgHdr:n]
	if rh.Status != 0 {
		for i, b := range body {
			if b == 0 {
				body = body[:i]
				break
			}
		}
		return fail(&abi.ControlError{Op: op, Errno: syscall.Errno(rh.Status), Msg: string(body)})
	}
	return append([]byte(nil), body...), fds, nil
}

// Info returns the device summary.
func (a *Client) Info() (Info, error) {
	var info Info
	b, err := a.Call(InfoCmd, nil)
	if err != nil {
		return info, err
	}
	return info, json.Unmarshal(b, &info)
}

// Serving asks the daemon at path for its summary on a connection of its
// own. A daemon listens on its control socket before its link is up (a
// name clash is reported before the link is touched), so a connect alone
// does not say the device is ready; an answer does.
func Serving(path string) (Info, error) {
	a, err := Dial(path)
	if err != nil {
		return Info{}, err
	}
	defer a.Close()
	return a.Info()
}

// List fetches every page of an operator list command and returns the raw
// JSON items.
func (a *Client) List(op abi.Cmd) ([]json.RawMessage, error) {
	var all []json.RawMessage
	req := Request{}
	for {
		b, err := a.Call(op, &req)
		if err != nil {
			return nil, err
		}
		var l ListReply
		if err := json.Unmarshal(b, &l); err != nil {
			return nil, err
		}
		all = append(all, l.Items...)
		if l.Next == 0 || l.Next <= req.Start {
			return all, nil
		}
		req.Start = l.Next
	}
}

// ListAs fetches a list and decodes its items as T.
func ListAs[T any](a *Client, op abi.Cmd) ([]T, error) {
	raw, err := a.List(op)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
