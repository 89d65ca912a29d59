package verbs

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// ErrClosed is returned by calls on a closed Context.
var ErrClosed = errors.New("verbs: context closed")

// ErrProtocol is returned when the daemon's reply does not match the
// request (wrong opcode or seq, bad length): the connection is unusable.
var ErrProtocol = errors.New("verbs: control protocol error")

// ctrl is the control connection: one command at a time, each answered by
// one reply.
type ctrl struct {
	mu   sync.Mutex
	c    *net.UnixConn
	seq  uint32
	buf  []byte
	rbuf []byte
	oob  []byte
}

func dialCtrl(path string) (*ctrl, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return &ctrl{
		c:    c,
		buf:  make([]byte, abi.MaxMsgSize),
		rbuf: make([]byte, abi.MaxMsgSize+1),
		oob:  make([]byte, unix.CmsgSpace(abi.MaxFDs*4)),
	}, nil
}

// callTimeout bounds one command's round trip.
const callTimeout = 30 * time.Second

// call sends op with the encoded request (nil for none) plus extra bytes
// and fds, and decodes the reply into resp (nil for none). It returns the
// fds of the reply (the caller owns them) and the reply payload bytes
// (valid until the next call).
func (k *ctrl) call(op abi.Cmd, req any, extra []byte, fds []int, resp any) ([]int, []byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c == nil {
		return nil, nil, ErrClosed
	}
	n := abi.SizeofMsgHdr
	if req != nil {
		m, err := abi.Marshal(k.buf[n:], req)
		if err != nil {
			return nil, nil, err
		}
		n += m
	}
	if len(extra) > len(k.buf)-n {
		return nil, nil, fmt.Errorf("verbs: %v: message too large", op)
	}
	n += copy(k.buf[n:], extra)
	k.seq++
	h := abi.MsgHdr{Opcode: op, Length: uint32(n), Seq: k.seq}
	h.Put(k.buf)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	k.c.SetDeadline(time.Now().Add(callTimeout))
	if _, _, err := k.c.WriteMsgUnix(k.buf[:n], oob, nil); err != nil {
		return nil, nil, fmt.Errorf("verbs: %v: send: %w", op, err)
	}
	rn, oobn, flags, _, err := k.c.ReadMsgUnix(k.rbuf, k.oob)
	if err != nil {
		return nil, nil, fmt.Errorf("verbs: %v: receive: %w", op, err)
	}
	var rfds []int
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(k.oob[:oobn])
		if perr == nil {
			for _, cm := range cmsgs {
				if f, err := unix.ParseUnixRights(&cm); err == nil {
					rfds = append(rfds, f...)
				}
			}
		}
	}
	fail := func(err error) ([]int, []byte, error) {
		closeAll(rfds)
		return nil, nil, err
	}
	if rn == 0 {
		return fail(fmt.Errorf("verbs: %v: daemon closed the connection", op))
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(fmt.Errorf("%w: %v: truncated reply", ErrProtocol, op))
	}
	var rh abi.MsgHdr
	if err := rh.Decode(k.rbuf[:rn]); err != nil {
		return fail(fmt.Errorf("%w: %v: %v", ErrProtocol, op, err))
	}
	if rh.Opcode != op || rh.Seq != k.seq || rh.Flags&abi.MsgFlagReply == 0 || int(rh.Length) != rn {
		return fail(fmt.Errorf("%w: %v: reply opcode %v seq %d length %d", ErrProtocol, op, rh.Opcode, rh.Seq, rh.Length))
	}
	body := k.rbuf[abi.SizeofMsgHdr:rn]
	if rh.Status != 0 {
		msg := body
		for i, b := range msg {
			if b == 0 {
				msg = msg[:i]
				break
			}
		}
		return fail(&abi.ControlError{Op: op, Errno: syscall.Errno(rh.Status), Msg: string(msg)})
	}
	if resp != nil {
		if want := abi.Sizeof(resp); len(body) != want {
			return fail(fmt.Errorf("%w: %v: reply payload %d bytes, want %d", ErrProtocol, op, len(body), want))
		}
		if _, err := abi.Unmarshal(body, resp); err != nil {
			return fail(fmt.Errorf("%w: %v: %v", ErrProtocol, op, err))
		}
	}
	return rfds, body, nil
}

func (k *ctrl) close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.c == nil {
		return nil
	}
	err := k.c.Close()
	k.c = nil
	return err
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
