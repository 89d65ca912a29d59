package admin

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// Client is an operator connection to a device's control socket (used by
// vrnicctl, the launchers and tests). It opens no context.
type Client struct {
	c   *net.UnixConn
	seq uint32
	buf []byte
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
	a.c.SetDeadline(time.Now().Add(10 * time.Second))
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
