package device_test

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"golang.org/x/sys/unix"
)

// rawConn is a control connection that sends arbitrary bytes and fds.
type rawConn struct {
	t   testing.TB
	c   *net.UnixConn
	buf []byte
	oob []byte
}

func dialRaw(t testing.TB, path string) *rawConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	require.NoError(t, err)
	return &rawConn{t: t, c: c, buf: make([]byte, abi.MaxMsgSize+1), oob: make([]byte, unix.CmsgSpace(16*4))}
}

// rawReply is a decoded reply.
type rawReply struct {
	hdr  abi.MsgHdr
	body []byte
	fds  []int
}

func (r rawReply) errMsg() string {
	b := r.body
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// roundTrip sends msg with fds and reads one reply.
func (r *rawConn) roundTrip(msg []byte, fds ...int) (rawReply, error) {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	r.c.SetDeadline(time.Now().Add(timeout))
	if _, _, err := r.c.WriteMsgUnix(msg, oob, nil); err != nil {
		return rawReply{}, err
	}
	n, oobn, _, _, err := r.c.ReadMsgUnix(r.buf, r.oob)
	if err != nil {
		return rawReply{}, err
	}
	var rep rawReply
	if oobn > 0 {
		cms, _ := unix.ParseSocketControlMessage(r.oob[:oobn])
		for _, cm := range cms {
			f, _ := unix.ParseUnixRights(&cm)
			rep.fds = append(rep.fds, f...)
		}
	}
	if err := rep.hdr.Decode(r.buf[:n]); err != nil {
		return rawReply{}, err
	}
	rep.body = append([]byte(nil), r.buf[abi.SizeofMsgHdr:n]...)
	return rep, nil
}

func (r *rawConn) call(msg []byte, fds ...int) rawReply {
	r.t.Helper()
	rep, err := r.roundTrip(msg, fds...)
	require.NoError(r.t, err)
	for _, fd := range rep.fds {
		unix.Close(fd)
	}
	return rep
}

func msg(op abi.Cmd, seq uint32, payload []byte) []byte {
	b := make([]byte, abi.SizeofMsgHdr+len(payload))
	h := abi.MsgHdr{Opcode: op, Length: uint32(len(b)), Seq: seq}
	h.Put(b)
	copy(b[abi.SizeofMsgHdr:], payload)
	return b
}

func encode(t testing.TB, v any) []byte {
	b := make([]byte, abi.Sizeof(v))
	_, err := abi.Marshal(b, v)
	require.NoError(t, err)
	return b
}

func openMsg(t testing.TB) []byte {
	return msg(abi.CmdOpenContext, 1, encode(t, &abi.CmdOpenContextReq{ABIVersion: abi.Version}))
}

func (r *rawConn) open() {
	r.t.Helper()
	rep := r.call(openMsg(r.t))
	require.Zero(r.t, rep.hdr.Status, rep.errMsg())
}

func fdCount(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func newEventfd(t testing.TB) int {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	require.NoError(t, err)
	return fd
}

func newMemfd(t testing.TB, size int, seal bool) int {
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	if seal {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		require.NoError(t, err)
	}
	return fd
}

// waitIdle waits until the device has no connection and no context.
func waitIdle(t testing.TB, s *devicetest.Server) {
	t.Helper()
	require.Eventually(t, func() bool {
		return s.Device.Counters().ConnectionsOpen.Load() == 0 && s.Device.Counts() == device.ResourceCounts{}
	}, timeout, tick)
}

func TestMalformedMessages(t *testing.T) {
	s := startServer(t, device.Limits{})
	baseFds := fdCount(t)
	r := dialRaw(t, s.SocketPath)

	// Before OPEN_CONTEXT.
	rep := r.call(msg(abi.CmdAllocPD, 7, nil))
	assert.Equal(t, uint32(syscall.EINVAL), rep.hdr.Status)
	assert.Equal(t, uint32(7), rep.hdr.Seq)
	assert.Equal(t, abi.MsgFlagReply, int(rep.hdr.Flags))
	assert.Contains(t, rep.errMsg(), "before OPEN_CONTEXT")

	// OPEN_CONTEXT defects.
	bad := abi.CmdOpenContextReq{ABIVersion: 2 << 16}
	rep = r.call(msg(abi.CmdOpenContext, 1, encode(t, &bad)))
	assert.Equal(t, uint32(syscall.EPROTO), rep.hdr.Status, rep.errMsg())
	bad = abi.CmdOpenContextReq{ABIVersion: abi.Version + 1} // newer minor
	rep = r.call(msg(abi.CmdOpenContext, 1, encode(t, &bad)))
	assert.Equal(t, uint32(syscall.EPROTO), rep.hdr.Status, rep.errMsg())
	bad = abi.CmdOpenContextReq{ABIVersion: abi.Version, Flags: 1}
	rep = r.call(msg(abi.CmdOpenContext, 1, encode(t, &bad)))
	assert.Equal(t, uint32(syscall.EINVAL), rep.hdr.Status, rep.errMsg())

	// A good one: two fds, a memfd of the page size and an eventfd.
	rp, err := r.roundTrip(openMsg(t))
	require.NoError(t, err)
	require.Zero(t, rp.hdr.Status, rp.errMsg())
	require.Len(t, rp.fds, 2)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(rp.fds[0], &st))
	assert.Equal(t, int64(abi.DBPageSize), st.Size)
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(rp.fds[1]))
	require.NoError(t, err)
	assert.Equal(t, "anon_inode:[eventfd]", target)
	unix.Close(rp.fds[0])
	unix.Close(rp.fds[1])
	rep = r.call(openMsg(t))
	assert.Equal(t, uint32(syscall.EBUSY), rep.hdr.Status, "second OPEN_CONTEXT")

	hdrOnly := func(mut func(h *abi.MsgHdr)) []byte {
		b := msg(abi.CmdQueryDevice, 3, nil)
		var h abi.MsgHdr
		require.NoError(t, h.Decode(b))
		mut(&h)
		h.Put(b)
		return b
	}
	cases := []struct {
		name  string
		msg   []byte
		fds   func() []int
		errno syscall.Errno
		text  string
	}{
		{"empty datagram", []byte{}, nil, syscall.EMSGSIZE, "shorter than the 16-byte header"},
		{"short header", []byte{2, 0, 0, 0, 8, 0, 0, 0}, nil, syscall.EMSGSIZE, "shorter than the 16-byte header"},
		{"length too big", hdrOnly(func(h *abi.MsgHdr) { h.Length = 17 }), nil, syscall.EMSGSIZE, "header length 17, datagram has 16"},
		{"length too small", hdrOnly(func(h *abi.MsgHdr) { h.Length = 0 }), nil, syscall.EMSGSIZE, "header length 0"},
		{"flags", hdrOnly(func(h *abi.MsgHdr) { h.Flags = abi.MsgFlagReply }), nil, syscall.EINVAL, "flags"},
		{"status", hdrOnly(func(h *abi.MsgHdr) { h.Status = 5 }), nil, syscall.EINVAL, "status"},
		{"unknown opcode", msg(0x55, 4, nil), nil, syscall.ENOSYS, "unknown command opcode 0x55"},
		{"opcode 0", msg(0, 4, nil), nil, syscall.ENOSYS, "unknown"},
		{"fault range", msg(abi.CmdFaultBase, 4, nil), nil, syscall.ENOSYS, "unknown"},
		{"oversized", func() []byte {
			b := make([]byte, abi.MaxMsgSize+100)
			copy(b, msg(abi.CmdQueryDevice, 9, nil))
			return b
		}(), nil, syscall.EMSGSIZE, "MSG_TRUNC"},
		{"payload on QUERY_DEVICE", msg(abi.CmdQueryDevice, 4, []byte{0}), nil, syscall.EMSGSIZE, "payload is 1 bytes, want 0"},
		{"fd on QUERY_DEVICE", msg(abi.CmdQueryDevice, 4, nil), func() []int { return []int{newEventfd(t)} }, syscall.EBADF, "1 fds attached, want 0"},
		{"too many fds", msg(abi.CmdQueryDevice, 4, nil), func() []int {
			var f []int
			for range 20 {
				f = append(f, newEventfd(t))
			}
			return f
		}, syscall.EMSGSIZE, "MSG_CTRUNC"},
		{"ADD_HOST_MEM without fd", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 4096})), nil, syscall.EBADF, "0 fds attached, want 1"},
		{"ADD_HOST_MEM two fds", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 4096})), func() []int { return []int{newMemfd(t, 4096, true), newMemfd(t, 4096, true)} }, syscall.EBADF, "2 fds attached"},
		{"ADD_HOST_MEM eventfd", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 4096})), func() []int { return []int{newEventfd(t)} }, syscall.EBADF, "memfd"},
		{"ADD_HOST_MEM unsealed", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 4096})), func() []int { return []int{newMemfd(t, 4096, false)} }, syscall.EPERM, "sealed"},
		{"ADD_HOST_MEM short memfd", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 8192})), func() []int { return []int{newMemfd(t, 4096, true)} }, syscall.EINVAL, "shorter"},
		{"ADD_HOST_MEM odd length", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 100})), func() []int { return []int{newMemfd(t, 4096, true)} }, syscall.EINVAL, "multiple of 4096"},
		{"ADD_HOST_MEM flags", msg(abi.CmdAddHostMem, 4, encode(t, &abi.CmdAddHostMemReq{Length: 4096, Flags: 1})), func() []int { return []int{newMemfd(t, 4096, true)} }, syscall.EINVAL, "reserved"},
		{"CREATE_CQ pipe as channel", msg(abi.CmdCreateCQ, 4, encode(t, &abi.CmdCreateCQReq{RingPA: 1 << 30, CQECount: 4})), func() []int {
			var p [2]int
			require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
			unix.Close(p[1])
			return []int{p[0]}
		}, syscall.EBADF, "want an eventfd"},
		{"CREATE_CQ flags", msg(abi.CmdCreateCQ, 4, encode(t, &abi.CmdCreateCQReq{RingPA: 1 << 30, CQECount: 4, Flags: 2})), nil, syscall.EINVAL, "unknown bits"},
		{"CREATE_CQ count", msg(abi.CmdCreateCQ, 4, encode(t, &abi.CmdCreateCQReq{RingPA: 1 << 30, CQECount: 3})), nil, syscall.EINVAL, "power of two"},
		{"CREATE_CQ ring outside host memory", msg(abi.CmdCreateCQ, 4, encode(t, &abi.CmdCreateCQReq{RingPA: 1 << 40, CQECount: 4})), nil, syscall.EFAULT, "CQ ring"},
		{"CREATE_CQ unaligned ring", msg(abi.CmdCreateCQ, 4, encode(t, &abi.CmdCreateCQReq{RingPA: 1<<30 + 8, CQECount: 4})), nil, syscall.EINVAL, "aligned"},
		{"handle reserved", msg(abi.CmdDeallocPD, 4, encode(t, &abi.CmdHandleReq{Handle: 1, Reserved: 1})), nil, syscall.EINVAL, "reserved"},
		{"QUERY_PORT reserved", msg(abi.CmdQueryPort, 4, encode(t, &abi.CmdQueryPortReq{PortNum: 1, Reserved: 1})), nil, syscall.EINVAL, "reserved"},
		{"CREATE_AH reserved", msg(abi.CmdCreateAH, 4, encode(t, &abi.CmdCreateAHReq{Reserved: 1})), nil, syscall.EINVAL, "reserved"},
		{"unknown PD", msg(abi.CmdDeallocPD, 4, encode(t, &abi.CmdHandleReq{Handle: 99})), nil, syscall.ENOENT, "PD 99 not found"},
		{"REG_MR short", msg(abi.CmdRegMR, 4, make([]byte, 39)), nil, syscall.EMSGSIZE, "at least 40"},
		{"REG_MR pages missing", msg(abi.CmdRegMR, 4, encode(t, &abi.CmdRegMRReq{Length: 4096, NPages: 1, PageShift: 12})), nil, syscall.ENOENT, "PD 0"},
		{"admin garbage", msg(admin.QPsCmd, 4, []byte("{nope")), nil, syscall.EINVAL, "operator request"},
		{"admin unknown field", msg(admin.QPsCmd, 4, []byte(`{"x":1}`)), nil, syscall.EINVAL, "unknown field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var fds []int
			if c.fds != nil {
				fds = c.fds()
			}
			rep := r.call(c.msg, fds...)
			for _, fd := range fds {
				unix.Close(fd)
			}
			assert.Equal(t, uint32(c.errno), rep.hdr.Status, "errno %v, message %q", syscall.Errno(rep.hdr.Status), rep.errMsg())
			assert.Contains(t, rep.errMsg(), c.text)
			assert.Equal(t, abi.MsgFlagReply, int(rep.hdr.Flags))
			assert.Equal(t, uint32(len(rep.body)+abi.SizeofMsgHdr), rep.hdr.Length)
			assert.LessOrEqual(t, len(rep.body), abi.MaxErrMsg)
		})
	}
	// Every command with a payload one byte too long and one too short.
	for op := abi.CmdOpenContext; op <= abi.CmdQuerySRQ; op++ {
		if op == abi.CmdRegMR {
			continue
		}
		size := cmdSize(op)
		for _, n := range []int{size - 1, size + 1} {
			if n < 0 {
				continue
			}
			rep := r.call(msg(op, 5, make([]byte, n)))
			assert.Equal(t, uint32(syscall.EMSGSIZE), rep.hdr.Status, "%v with %d bytes: %s", op, n, rep.errMsg())
		}
	}
	// The connection still works.
	rep = r.call(msg(abi.CmdQueryDevice, 77, nil))
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	assert.Equal(t, uint32(77), rep.hdr.Seq)
	assert.Len(t, rep.body, abi.Sizeof(&abi.DeviceAttr{}))
	assert.NotZero(t, s.Device.Counters().BadMessages.Load())

	// Every fd the daemon received was closed or released.
	r.c.Close()
	waitIdle(t, s)
	require.Eventually(t, func() bool { return fdCount(t) <= baseFds }, timeout, tick, "fds: %d, baseline %d", fdCount(t), baseFds)
}

func cmdSize(op abi.Cmd) int {
	switch op {
	case abi.CmdOpenContext:
		return abi.Sizeof(&abi.CmdOpenContextReq{})
	case abi.CmdQueryDevice, abi.CmdAllocPD:
		return 0
	case abi.CmdQueryPort:
		return abi.Sizeof(&abi.CmdQueryPortReq{})
	case abi.CmdQueryGID:
		return abi.Sizeof(&abi.CmdQueryGIDReq{})
	case abi.CmdAddHostMem:
		return abi.Sizeof(&abi.CmdAddHostMemReq{})
	case abi.CmdCreateCQ:
		return abi.Sizeof(&abi.CmdCreateCQReq{})
	case abi.CmdCreateQP:
		return abi.Sizeof(&abi.CmdCreateQPReq{})
	case abi.CmdModifyQP:
		return abi.Sizeof(&abi.CmdModifyQPReq{})
	case abi.CmdCreateSRQ:
		return abi.Sizeof(&abi.CmdCreateSRQReq{})
	case abi.CmdModifySRQ:
		return abi.Sizeof(&abi.CmdModifySRQReq{})
	case abi.CmdCreateAH:
		return abi.Sizeof(&abi.CmdCreateAHReq{})
	}
	return abi.Sizeof(&abi.CmdHandleReq{})
}

// TestClientCloseReleasesEverything closes a client holding one of every
// object and checks the device is back to zero and its fds to the
// baseline.
func TestClientCloseReleasesEverything(t *testing.T) {
	s := startServer(t, device.Limits{})
	base := fdCount(t)
	goroutines := runtime.NumGoroutine()
	for range 3 {
		c := mustOpenFull(t, s)
		require.NotZero(t, s.Device.Counts().QP)
		require.NoError(t, c.Close())
		waitIdle(t, s)
	}
	require.Eventually(t, func() bool { return fdCount(t) <= base }, timeout, tick)
	require.True(t, waitFor(func() bool { return runtime.NumGoroutine() <= goroutines }), "goroutines: %d, baseline %d", runtime.NumGoroutine(), goroutines)
}
