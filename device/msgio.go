package device

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// maxOOBFds is how many descriptors the control-message buffer has room
// for. It is larger than the ABI limit so that a client sending a few too
// many is told "too many fds" (and the extra descriptors are closed) rather
// than having them silently truncated; a client sending even more gets
// MSG_CTRUNC, which is also an error.
const maxOOBFds = 16

// errFdKind is the sentinel for a descriptor of the wrong kind.
var errFdKind = errors.New("wrong kind of file descriptor")

// rawMsg is one received datagram: its bytes and the descriptors that came
// with it. The receiver owns fds and must close every one it does not keep.
type rawMsg struct {
	data []byte
	fds  []int
}

// closeFds closes every descriptor still held by m.
func (m *rawMsg) closeFds() {
	for i, fd := range m.fds {
		if fd >= 0 {
			unix.Close(fd)
			m.fds[i] = -1
		}
	}
	m.fds = m.fds[:0]
}

// takeFd hands descriptor i over to the caller: m no longer closes it.
func (m *rawMsg) takeFd(i int) int {
	fd := m.fds[i]
	m.fds[i] = -1
	return fd
}

// recvError is a defect of one datagram that is reported to the client in
// an error reply; the connection stays open.
type recvError struct{ err error }

func (e *recvError) Error() string { return e.err.Error() }
func (e *recvError) Unwrap() error { return e.err }

// readMsg reads one datagram into buf (which must be larger than the
// largest legal message so that an oversized one is seen as MSG_TRUNC) and
// its descriptors. Every control message is checked: only SCM_RIGHTS is
// accepted; anything else, MSG_CTRUNC or MSG_TRUNC yields a *recvError
// after closing all descriptors that did arrive (the returned rawMsg still
// holds the bytes, without fds). Other errors (EOF, socket
// errors) end the connection.
func readMsg(c *net.UnixConn, buf, oob []byte) (rawMsg, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		// The net package reports a zero-length read on SOCK_SEQPACKET as
		// io.EOF; so does an empty datagram from a live peer (possibly
		// carrying fds). Ask poll whether the peer is really gone.
		if !errors.Is(err, io.EOF) || n != 0 || (oobn == 0 && peerHungUp(c)) {
			return rawMsg{}, err
		}
	}
	m := rawMsg{data: buf[:n]}
	var cerr error
	if oobn > 0 {
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			cerr = fmt.Errorf("malformed control message: %w", err)
		}
		for _, cm := range cmsgs {
			if cm.Header.Level == unix.SOL_SOCKET && cm.Header.Type == unix.SCM_RIGHTS {
				fds, err := unix.ParseUnixRights(&cm)
				if err != nil {
					if cerr == nil {
						cerr = fmt.Errorf("malformed SCM_RIGHTS: %w", err)
					}
					continue
				}
				m.fds = append(m.fds, fds...)
				continue
			}
			if cerr == nil {
				cerr = fmt.Errorf("unexpected control message level %d type %d", cm.Header.Level, cm.Header.Type)
			}
		}
	}
	switch {
	case flags&unix.MSG_CTRUNC != 0:
		cerr = fmt.Errorf("control data truncated (MSG_CTRUNC): more than %d fds", maxOOBFds)
	case flags&unix.MSG_TRUNC != 0:
		cerr = fmt.Errorf("datagram larger than %d bytes (MSG_TRUNC)", len(buf)-1)
	}
	if cerr != nil {
		// Keep the bytes so the error reply can echo opcode and seq.
		m.closeFds()
		return m, &recvError{cerr}
	}
	return m, nil
}

// peerHungUp reports whether the peer of c has closed or shut down its
// side (POLLHUP/POLLRDHUP).
func peerHungUp(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return true
	}
	hup := true
	raw.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(p, 0); err == nil {
			hup = n > 0 && p[0].Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) != 0
		}
	})
	return hup
}

// fdIsEventfd reports whether fd refers to an eventfd. The kernel names the
// anonymous inode of an eventfd "anon_inode:[eventfd]" in /proc/self/fd.
func fdIsEventfd(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat fd: %w", err)
	}
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return fmt.Errorf("inspect fd: %w", err)
	}
	if target != "anon_inode:[eventfd]" {
		return fmt.Errorf("%w: want an eventfd, got %q", errFdKind, target)
	}
	return nil
}

// peerCred returns the credentials of the process at the other end of c
// (SO_PEERCRED): who the client is, for the per-uid accounting, the
// operator check and the operator listing.
func peerCred(c *net.UnixConn) (peer, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peer{}, err
	}
	if cerr != nil {
		return peer{}, cerr
	}
	return peer{pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}
