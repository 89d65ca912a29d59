package device_test

import (
	"math"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/dma"
)

func status(t *testing.T, rep rawReply, want syscall.Errno, what string) {
	t.Helper()
	assert.Equal(t, uint32(want), rep.hdr.Status, "%s: %s (%s)", what, unix.ErrnoName(syscall.Errno(rep.hdr.Status)), rep.errMsg())
}

func (c *memClient) allocDM(t *testing.T, length uint64) (abi.RespAllocDM, []byte) {
	t.Helper()
	c.seq++
	rep, err := c.r.roundTrip(msg(abi.CmdAllocDM, c.seq, encode(t, &abi.CmdAllocDMReq{Length: length, LogAlign: 6})))
	require.NoError(t, err)
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	require.Len(t, rep.fds, 1)
	var r abi.RespAllocDM
	_, err = abi.Unmarshal(rep.body, &r)
	require.NoError(t, err)
	mem, err := unix.Mmap(rep.fds[0], 0, int(r.MapLength), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	unix.Close(rep.fds[0])
	t.Cleanup(func() { unix.Munmap(mem) })
	return r, mem
}

func handle(h uint32) *abi.CmdHandleReq { return &abi.CmdHandleReq{Handle: h} }

// TestDMCommands: ALLOC_DM, REG_DM_MR and FREE_DM, and what they refuse:
// sizes, alignment, flags, ranges beyond the DM, missing ZERO_BASED, the
// DM of another context, a DM with an MR; the device's DM is shared and
// given back when a context with DMs and DM MRs goes.
func TestDMCommands(t *testing.T) {
	s := startServer(t, device.Limits{})
	a := newMemClient(t, s.SocketPath, 1<<20)
	b := newMemClient(t, s.SocketPath, 1<<20)

	rep := a.call(t, abi.CmdQueryDeviceEx, nil)
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var ax abi.DeviceAttrEx
	_, err := abi.Unmarshal(rep.body, &ax)
	require.NoError(t, err)
	assert.Equal(t, abi.DeviceAttrEx{MaxDMSize: device.DefaultDMSize, DMMaxLogAlign: abi.DMMaxLogAlign, ECEOptions: abi.ECEOptions}, ax)

	for _, tc := range []struct {
		name string
		req  abi.CmdAllocDMReq
		want syscall.Errno
	}{
		{"zero length", abi.CmdAllocDMReq{}, syscall.EINVAL},
		{"beyond max_dm_size", abi.CmdAllocDMReq{Length: device.DefaultDMSize + 1}, syscall.EINVAL},
		{"comp_mask", abi.CmdAllocDMReq{Length: 64, Flags: 1}, syscall.EINVAL},
		{"alignment beyond a page", abi.CmdAllocDMReq{Length: 64, LogAlign: 13}, syscall.EINVAL},
	} {
		rep := a.call(t, abi.CmdAllocDM, &tc.req)
		status(t, rep, tc.want, tc.name)
		assert.Empty(t, rep.fds, tc.name)
	}

	dm, mem := a.allocDM(t, 100)
	assert.Equal(t, uint64(4096), dm.MapLength)
	copy(mem, "device memory")
	zb := abi.DMMRZeroBased | abi.AccessLocalWrite
	for _, tc := range []struct {
		name string
		c    *memClient
		req  abi.CmdRegDMMRReq
		want syscall.Errno
	}{
		{"DM of another context", b, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: b.pd, Access: zb}, syscall.ENOENT},
		{"unknown PD", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: 999, Access: zb}, syscall.ENOENT},
		{"PD of another context", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: b.pd + 100, Access: zb}, syscall.ENOENT},
		{"length beyond the DM", a, abi.CmdRegDMMRReq{Length: 101, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb}, syscall.EINVAL},
		{"offset beyond the DM", a, abi.CmdRegDMMRReq{Offset: 101, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb}, syscall.EINVAL},
		{"offset + length beyond", a, abi.CmdRegDMMRReq{Offset: 50, Length: 51, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb}, syscall.EINVAL},
		{"offset wraps", a, abi.CmdRegDMMRReq{Offset: math.MaxUint64, Length: 2, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb}, syscall.EINVAL},
		{"not zero-based", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: abi.AccessLocalWrite}, syscall.EINVAL},
		{"unknown access bit", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb | 1<<10}, syscall.EINVAL},
		{"remote write without local write", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: a.pd,
			Access: abi.DMMRZeroBased | abi.AccessRemoteWrite}, syscall.EINVAL},
		{"reserved", a, abi.CmdRegDMMRReq{Length: 4, DMHandle: dm.DMHandle, PDHandle: a.pd, Access: zb, Reserved: 1}, syscall.EINVAL},
	} {
		status(t, tc.c.call(t, abi.CmdRegDMMR, &tc.req), tc.want, tc.name)
	}
	status(t, b.call(t, abi.CmdFreeDM, handle(dm.DMHandle)), syscall.ENOENT, "free the DM of another context")
	status(t, a.call(t, abi.CmdRemoveHostMem, handle(dm.DMHandle)), syscall.ENOENT, "a DM is no host memory handle")

	rep = a.call(t, abi.CmdRegDMMR, &abi.CmdRegDMMRReq{Offset: 0, Length: 100, DMHandle: dm.DMHandle, PDHandle: a.pd,
		Access: zb | abi.AccessRemoteRead})
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var mr abi.RespRegMR
	_, err = abi.Unmarshal(rep.body, &mr)
	require.NoError(t, err)
	assert.NotZero(t, mr.RKey)
	status(t, a.call(t, abi.CmdFreeDM, handle(dm.DMHandle)), syscall.EBUSY, "free with an MR")
	status(t, a.call(t, abi.CmdReregMR, &abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeAccess,
		Access: abi.AccessLocalWrite}), syscall.EINVAL, "rereg of a DM MR")
	require.Zero(t, a.call(t, abi.CmdDeregMR, handle(mr.MRHandle)).hdr.Status)
	require.Zero(t, a.call(t, abi.CmdFreeDM, handle(dm.DMHandle)).hdr.Status)
	status(t, a.call(t, abi.CmdFreeDM, handle(dm.DMHandle)), syscall.ENOENT, "double free")
	assert.Zero(t, s.Device.DMInUse())

	// The device's memory is shared: b takes it all, a gets none.
	all, _ := b.allocDM(t, device.DefaultDMSize)
	status(t, a.call(t, abi.CmdAllocDM, &abi.CmdAllocDMReq{Length: 4}), syscall.ENOMEM, "none left")
	rep = b.call(t, abi.CmdRegDMMR, &abi.CmdRegDMMRReq{Length: device.DefaultDMSize, DMHandle: all.DMHandle, PDHandle: b.pd, Access: zb})
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	// b goes with its DM and DM MR: everything comes back.
	b.r.c.Close()
	require.Eventually(t, func() bool { return s.Device.Counts().Contexts == 1 }, timeout, tick)
	assert.Zero(t, s.Device.DMInUse())
	a.allocDM(t, device.DefaultDMSize)
	a.r.c.Close()
	waitIdle(t, s)
	assert.Zero(t, s.Device.DMInUse())
	assert.Equal(t, dma.AccountUsage{}, s.Space.AccountUsage(dma.AccountID(os.Getuid())), "nothing left charged")
}

// TestReregResizeCommands: REREG_MR and RESIZE_CQ refuse objects of
// another context, bad flags, fields without their flag, rings outside the
// context's memory and sizes that are no power of two; what they accept
// changes the objects, and nothing stays behind.
func TestReregResizeCommands(t *testing.T) {
	s := startServer(t, device.Limits{})
	a := newMemClient(t, s.SocketPath, 1<<20)
	b := newMemClient(t, s.SocketPath, 1<<20)

	page := func(c *memClient, off uint64) []byte {
		var b [8]byte
		for k := range 8 {
			b[k] = byte((c.pa + off) >> (8 * k))
		}
		return b[:]
	}
	a.seq++
	p := encode(t, &abi.CmdRegMRReq{Length: 8192, PDHandle: a.pd, Access: abi.AccessLocalWrite, PageShift: abi.PageShift4K, NPages: 2})
	p = append(append(p, page(a, 64<<10)...), page(a, 68<<10)...)
	rep := a.r.call(msg(abi.CmdRegMR, a.seq, p))
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var mr abi.RespRegMR
	_, err := abi.Unmarshal(rep.body, &mr)
	require.NoError(t, err)
	rep = a.call(t, abi.CmdAllocPD, nil)
	require.Zero(t, rep.hdr.Status)
	var pd2 abi.RespAllocPD
	_, err = abi.Unmarshal(rep.body, &pd2)
	require.NoError(t, err)

	rereg := func(c *memClient, req abi.CmdReregMRReq, pages ...[]byte) rawReply {
		c.seq++
		p := encode(t, &req)
		for _, pg := range pages {
			p = append(p, pg...)
		}
		return c.r.call(msg(abi.CmdReregMR, c.seq, p))
	}
	for _, tc := range []struct {
		name  string
		c     *memClient
		req   abi.CmdReregMRReq
		pages [][]byte
		want  syscall.Errno
	}{
		{"MR of another context", b, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangePD, PDHandle: b.pd}, nil, syscall.ENOENT},
		{"no flag", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle}, nil, syscall.EINVAL},
		{"unknown flag", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: 8}, nil, syscall.EINVAL},
		{"PD of another context", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangePD, PDHandle: b.pd + 100}, nil, syscall.ENOENT},
		{"pd_handle without CHANGE_PD", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeAccess, PDHandle: pd2.PDHandle}, nil, syscall.EINVAL},
		{"access without CHANGE_ACCESS", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangePD, PDHandle: pd2.PDHandle, Access: 1}, nil, syscall.EINVAL},
		{"remote atomic without local write", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeAccess, Access: abi.AccessRemoteAtomic}, nil, syscall.EINVAL},
		{"unknown access bit", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeAccess, Access: abi.DMMRZeroBased}, nil, syscall.EINVAL},
		{"translation fields without the flag", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangePD, PDHandle: pd2.PDHandle, Length: 4096}, nil, syscall.EINVAL},
		{"pages without the flag", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangePD, PDHandle: pd2.PDHandle}, [][]byte{page(a, 0)}, syscall.EINVAL},
		{"page in another context's memory", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeTranslation, Length: 4096,
			PageShift: abi.PageShift4K, NPages: 1}, [][]byte{page(b, 0)}, syscall.EACCES},
		{"page count", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeTranslation, Length: 8192,
			PageShift: abi.PageShift4K, NPages: 1}, [][]byte{page(a, 0)}, syscall.EINVAL},
		{"inline pages short", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeTranslation, Length: 4096,
			PageShift: abi.PageShift4K, NPages: 1}, nil, syscall.EMSGSIZE},
		{"page shift", a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregChangeTranslation, Length: 4096,
			PageShift: 13, NPages: 1}, [][]byte{page(a, 0)}, syscall.EINVAL},
	} {
		status(t, rereg(tc.c, tc.req, tc.pages...), tc.want, tc.name)
	}
	// All three at once.
	rep = rereg(a, abi.CmdReregMRReq{MRHandle: mr.MRHandle, Flags: abi.ReregAll, IOVA: 0x1000, Length: 4096, PageShift: abi.PageShift4K,
		NPages: 1, PDHandle: pd2.PDHandle, Access: abi.AccessLocalWrite | abi.AccessRemoteWrite}, page(a, 128<<10))
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var got abi.RespRegMR
	_, err = abi.Unmarshal(rep.body, &got)
	require.NoError(t, err)
	assert.Equal(t, mr, got, "the keys stay")
	status(t, a.call(t, abi.CmdDeallocPD, handle(pd2.PDHandle)), syscall.EBUSY, "the MR is in the new PD")
	status(t, a.call(t, abi.CmdDeallocPD, handle(a.pd)), 0, "and no longer in the old one")

	// RESIZE_CQ.
	rep = a.call(t, abi.CmdCreateCQ, &abi.CmdCreateCQReq{RingPA: a.pa + 256<<10, CQECount: 4})
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var cq abi.RespCreateCQ
	_, err = abi.Unmarshal(rep.body, &cq)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		c    *memClient
		req  abi.CmdResizeCQReq
		want syscall.Errno
	}{
		{"CQ of another context", b, abi.CmdResizeCQReq{RingPA: b.pa, CQHandle: cq.CQHandle, CQECount: 8}, syscall.ENOENT},
		{"not a power of two", a, abi.CmdResizeCQReq{RingPA: a.pa + 300<<10, CQHandle: cq.CQHandle, CQECount: 6}, syscall.EINVAL},
		{"one entry", a, abi.CmdResizeCQReq{RingPA: a.pa + 300<<10, CQHandle: cq.CQHandle, CQECount: 1}, syscall.EINVAL},
		{"beyond the maximum", a, abi.CmdResizeCQReq{RingPA: a.pa + 300<<10, CQHandle: cq.CQHandle, CQECount: abi.MaxCQE * 2}, syscall.EINVAL},
		{"ring in another context's memory", a, abi.CmdResizeCQReq{RingPA: b.pa, CQHandle: cq.CQHandle, CQECount: 8}, syscall.EACCES},
		{"ring outside host memory", a, abi.CmdResizeCQReq{RingPA: a.pa + 1<<20 - 64, CQHandle: cq.CQHandle, CQECount: 8}, syscall.EFAULT},
		{"ring not aligned", a, abi.CmdResizeCQReq{RingPA: a.pa + 300<<10 + 8, CQHandle: cq.CQHandle, CQECount: 8}, syscall.EINVAL},
	} {
		status(t, tc.c.call(t, abi.CmdResizeCQ, &tc.req), tc.want, tc.name)
	}
	rep = a.call(t, abi.CmdResizeCQ, &abi.CmdResizeCQReq{RingPA: a.pa + 300<<10, CQHandle: cq.CQHandle, CQECount: 8})
	require.Zero(t, rep.hdr.Status, rep.errMsg())
	var rr abi.RespResizeCQ
	_, err = abi.Unmarshal(rep.body, &rr)
	require.NoError(t, err)
	assert.Equal(t, abi.RespResizeCQ{CQECount: 8}, rr)
	// The old ring is no longer pinned: its memory could go; the new is.
	a.r.c.Close()
	b.r.c.Close()
	waitIdle(t, s)
	assert.Equal(t, dma.AccountUsage{}, s.Space.AccountUsage(dma.AccountID(os.Getuid())), "nothing left charged")
}
