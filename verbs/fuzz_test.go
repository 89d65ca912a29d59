package verbs

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// FuzzReply feeds arbitrary reply datagrams (and an optional fd) to the
// client's control call: it must return an error or a well-formed result,
// never panic, and close every fd a bad reply carried.
func FuzzReply(f *testing.F) {
	good := func(op abi.Cmd, seq uint32, body []byte, status uint32) []byte {
		b := make([]byte, abi.SizeofMsgHdr+len(body))
		h := abi.MsgHdr{Opcode: op, Flags: abi.MsgFlagReply, Length: uint32(len(b)), Seq: seq, Status: status}
		h.Put(b)
		copy(b[abi.SizeofMsgHdr:], body)
		return b
	}
	f.Add(good(abi.CmdQueryPort, 1, make([]byte, abi.Sizeof(&abi.PortAttr{})), 0), false)
	f.Add(good(abi.CmdQueryPort, 1, []byte("bad\x00"), 22), true)
	f.Add(good(abi.CmdQueryPort, 2, nil, 0), false)
	f.Add(good(abi.CmdQueryDevice, 1, nil, 0), true)
	f.Add([]byte{1, 2, 3}, false)
	f.Add(good(abi.CmdQueryPort, 1, make([]byte, 1000), 0), false)
	f.Add(good(abi.CmdQueryPort, 1, make([]byte, 300), 5), false)
	f.Fuzz(func(t *testing.T, reply []byte, withFd bool) {
		if len(reply) == 0 || len(reply) > abi.MaxMsgSize {
			return
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		cf := os.NewFile(uintptr(fds[0]), "client")
		cc, err := net.FileConn(cf)
		cf.Close()
		require.NoError(t, err)
		k := &ctrl{c: cc.(*net.UnixConn), buf: make([]byte, abi.MaxMsgSize), rbuf: make([]byte, abi.MaxMsgSize+1),
			oob: make([]byte, unix.CmsgSpace(abi.MaxFDs*4))}
		defer k.close()
		srv := fds[1]
		defer unix.Close(srv)
		done := make(chan struct{})
		go func() {
			defer close(done)
			b := make([]byte, 4096)
			if _, _, _, _, err := unix.Recvmsg(srv, b, nil, 0); err != nil {
				return
			}
			var oob []byte
			if withFd {
				efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
				oob = unix.UnixRights(efd)
				defer unix.Close(efd)
			}
			unix.Sendmsg(srv, reply, oob, nil, 0)
		}()
		var pa abi.PortAttr
		rfds, body, err := k.call(abi.CmdQueryPort, &abi.CmdQueryPortReq{PortNum: 1}, nil, nil, &pa)
		<-done
		closeAll(rfds)
		if err == nil {
			require.Len(t, body, abi.Sizeof(&pa))
			require.GreaterOrEqual(t, len(reply), abi.SizeofMsgHdr)
			var h abi.MsgHdr
			require.NoError(t, h.Decode(reply))
			require.Zero(t, h.Status)
			require.Equal(t, uint32(1), h.Seq)
		} else {
			require.Nil(t, rfds)
		}
	})
}
