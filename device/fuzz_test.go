package device_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/devicetest"
	"golang.org/x/sys/unix"
)

// FuzzControlMessage sends arbitrary datagrams, with or without an open
// context and with 0..5 attached fds of several kinds, to a live device.
// Invariants: the daemon answers every datagram (with a reply whose
// header echoes opcode and seq), never panics, keeps serving the
// connection, and after the connection closes holds no resource, no extra
// fd and no extra goroutine.
func FuzzControlMessage(f *testing.F) {
	s, err := devicetest.Start(devicetest.Options{})
	require.NoError(f, err)
	f.Cleanup(func() { s.Close() })

	enc := func(v any) []byte { return encode(f, v) }
	seeds := [][]byte{
		msg(abi.CmdQueryDevice, 1, nil),
		msg(abi.CmdQueryPort, 1, enc(&abi.CmdQueryPortReq{PortNum: 1})),
		msg(abi.CmdQueryGID, 1, enc(&abi.CmdQueryGIDReq{PortNum: 1})),
		msg(abi.CmdAddHostMem, 1, enc(&abi.CmdAddHostMemReq{Length: 8192})),
		msg(abi.CmdRemoveHostMem, 1, enc(&abi.CmdHandleReq{Handle: 1})),
		msg(abi.CmdAllocPD, 1, nil),
		msg(abi.CmdDeallocPD, 1, enc(&abi.CmdHandleReq{Handle: 1})),
		append(msg(abi.CmdRegMR, 1, enc(&abi.CmdRegMRReq{IOVA: 4096, Length: 4096, PDHandle: 1, PageShift: 12, NPages: 1})), make([]byte, 8)...),
		msg(abi.CmdRegMR, 1, enc(&abi.CmdRegMRReq{IOVA: 0, Length: 1 << 30, PBLPA: 1 << 30, PDHandle: 1, PageShift: 12, NPages: 1 << 18})),
		msg(abi.CmdCreateCQ, 1, enc(&abi.CmdCreateCQReq{RingPA: 1 << 30, CQECount: 4})),
		msg(abi.CmdCreateQP, 1, enc(&abi.CmdCreateQPReq{SQPA: 1 << 30, RQPA: 1<<30 + 4096, QPType: abi.QPTRC, PDHandle: 1, SendCQ: 2, RecvCQ: 2, SRQHandle: abi.NoSRQ, Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})),
		msg(abi.CmdModifyQP, 1, enc(&abi.CmdModifyQPReq{QPN: 2, AttrMask: 0x1fffff, Attr: abi.QPAttr{QPState: abi.QPSInit}})),
		msg(abi.CmdQueryQP, 1, enc(&abi.CmdHandleReq{Handle: 2})),
		msg(abi.CmdDestroyQP, 1, enc(&abi.CmdHandleReq{Handle: 2})),
		msg(abi.CmdCreateSRQ, 1, enc(&abi.CmdCreateSRQReq{RingPA: 1 << 30, PDHandle: 1, MaxWR: 4, MaxSGE: 1})),
		msg(abi.CmdModifySRQ, 1, enc(&abi.CmdModifySRQReq{SRQHandle: 1, SRQLimit: 1})),
		msg(abi.CmdCreateAH, 1, enc(&abi.CmdCreateAHReq{PDHandle: 1, Attr: testAV()})),
		msg(admin.QPsCmd, 1, []byte(`{"start":1}`)),
		msg(admin.InfoCmd, 1, nil),
		{},
		{1, 0},
		msg(0xffff, 0xffffffff, []byte{1, 2, 3}),
	}
	for i, sd := range seeds {
		f.Add(sd, i%2 == 0, uint8(i%6))
	}
	// Warm up lazily created runtime state (netpoller, timers) before the
	// baselines are taken.
	r0 := dialRaw(f, s.SocketPath)
	r0.call(openMsg(f))
	r0.c.Close()
	waitIdle(f, s)
	baseFds := fdCount(f)
	baseG := -1

	f.Fuzz(func(t *testing.T, data []byte, withCtx bool, nfds uint8) {
		if baseG < 0 {
			// Taken inside the fuzz function: seeds run as subtests, each
			// in a goroutine of its own.
			baseG = runtime.NumGoroutine()
		}
		if len(data) > abi.MaxMsgSize+64 {
			data = data[:abi.MaxMsgSize+64]
		}
		r := dialRaw(t, s.SocketPath)
		if withCtx {
			r.open()
		}
		var fds []int
		for i := range int(nfds % 6) {
			switch i % 3 {
			case 0:
				fds = append(fds, newMemfd(t, 8192, true))
			case 1:
				fds = append(fds, newEventfd(t))
			default:
				var p [2]int
				require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
				unix.Close(p[1])
				fds = append(fds, p[0])
			}
		}
		rep, err := r.roundTrip(data, fds...)
		for _, fd := range fds {
			unix.Close(fd)
		}
		require.NoError(t, err, "the daemon must answer every datagram")
		for _, fd := range rep.fds {
			unix.Close(fd)
		}
		require.NotZero(t, rep.hdr.Flags&abi.MsgFlagReply)
		if len(data) >= abi.SizeofMsgHdr {
			var h abi.MsgHdr
			require.NoError(t, h.Decode(data))
			require.Equal(t, h.Seq, rep.hdr.Seq)
			require.Equal(t, h.Opcode, rep.hdr.Opcode)
		}
		// Still serving.
		ok := r.call(msg(abi.CmdQueryDevice, 2, nil))
		if withCtx || ok.hdr.Status == 0 {
			require.Zero(t, ok.hdr.Status, ok.errMsg())
		}
		r.c.Close()
		waitIdle(t, s)
		require.True(t, waitFor(func() bool { return fdCount(t) <= baseFds }), "fds %d > baseline %d", fdCount(t), baseFds)
		require.True(t, waitFor(func() bool { return runtime.NumGoroutine() <= baseG }), "goroutines %d > baseline %d", runtime.NumGoroutine(), baseG)
	})
}
