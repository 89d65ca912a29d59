package dataplane_test

import (
	"bytes"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// TestVerbsODPTraffic: on-demand paging through the Go client between two
// devices. b registers an ODP MR over a fresh anonymous mapping nothing
// has touched; a WRITE lands in it byte-exact and a READ brings it back;
// an implicit ODP MR (the whole address space) takes a WRITE at a plain
// virtual address; AdviseMR prefetches and refuses what the kernel
// refuses; a page unmapped under the MR completes a WRITE with
// REM_ACCESS_ERR.
func TestVerbsODPTraffic(t *testing.T) {
	a, b := rcClients(t, "10.0.7.13", "10.0.7.14", 16)
	qa := a.qp.QPN
	caps, err := b.ctx.ODPCaps()
	require.NoError(t, err)
	require.NotZero(t, caps.GeneralCaps&abi.ODPSupport)
	for _, bit := range []uint32{abi.ODPSupportSend, abi.ODPSupportRecv, abi.ODPSupportWrite, abi.ODPSupportRead} {
		assert.NotZero(t, caps.RCODPCaps&bit, "rc_odp_caps %#x", bit)
	}

	const n = 3 * 4096
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	addr := uintptr(unsafe.Pointer(&mem[0]))
	access := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead
	mr, err := b.pd.RegMRODP(addr, n, access)
	require.NoError(t, err)
	assert.Equal(t, uint64(addr), mr.Addr)

	// A WRITE spanning the first two pages, never touched before.
	pat := bytes.Repeat([]byte{0x5c, 0xa7, 0x19}, 2000) // 6000 bytes
	copy(a.buf.Bytes, pat)
	require.NoError(t, a.qp.PostSend(writeWR(1, abi.WRRDMAWrite, a.mr.SGE(0, uint32(len(pat))), mr.Addr+100, mr.RKey)))
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, pat, mem[100:100+len(pat)])
	assert.Equal(t, make([]byte, 100), mem[:100], "before it untouched")
	// Read back.
	require.NoError(t, a.qp.PostSend(writeWR(2, abi.WRRDMARead, a.mr.SGE(8192, uint32(len(pat))), mr.Addr+100, mr.RKey)))
	assert.Equal(t, abi.CQE{WrID: 2, Status: abi.WCSuccess, Opcode: abi.WCRDMARead, QPNum: qa, ByteLen: uint32(len(pat))}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, pat, a.buf.Bytes[8192:8192+len(pat)])

	// Advice: a prefetch of the third page; then what the kernel refuses.
	require.NoError(t, b.pd.AdviseMR(abi.AdvicePrefetchW, abi.AdviseMRFlagFlush, []abi.SGE{{Addr: mr.Addr + 8192, Length: 4096, LKey: mr.LKey}}))
	assert.ErrorIs(t, b.pd.AdviseMR(abi.AdvicePrefetch, 0, nil), syscall.EINVAL, "no SGE")
	sync := uint32(abi.AdviseMRFlagFlush)
	assert.ErrorIs(t, b.pd.AdviseMR(7, 0, []abi.SGE{{Addr: mr.Addr, Length: 8, LKey: mr.LKey}}), syscall.EOPNOTSUPP, "bad advice")
	assert.ErrorIs(t, b.pd.AdviseMR(abi.AdvicePrefetch, 2, []abi.SGE{{Addr: mr.Addr, Length: 8, LKey: mr.LKey}}), syscall.EINVAL, "bad flags")
	assert.ErrorIs(t, b.pd.AdviseMR(abi.AdvicePrefetch, sync, []abi.SGE{{Addr: mr.Addr + n - 8, Length: 64, LKey: mr.LKey}}), syscall.EFAULT, "past the MR")
	assert.ErrorIs(t, b.pd.AdviseMR(abi.AdvicePrefetch, sync, []abi.SGE{{Addr: b.mr.Addr, Length: 8, LKey: b.mr.LKey}}), syscall.ENOENT, "not an ODP MR")
	assert.ErrorIs(t, a.pd.AdviseMR(abi.AdvicePrefetch, sync, []abi.SGE{{Addr: mr.Addr, Length: 8, LKey: mr.LKey}}), syscall.ENOENT, "another context's MR")

	// Implicit ODP: the whole address space, addressed by virtual address.
	imr, err := b.pd.RegMRImplicitODP(access)
	require.NoError(t, err)
	target := make([]byte, 64)
	copy(a.buf.Bytes[16384:], "implicit on-demand paging")
	require.NoError(t, a.qp.PostSend(writeWR(3, abi.WRRDMAWrite, a.mr.SGE(16384, 25), uint64(uintptr(unsafe.Pointer(&target[0]))), imr.RKey)))
	assert.Equal(t, abi.CQE{WrID: 3, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, "implicit on-demand paging", string(target[:25]))

	// A page unmapped under the explicit MR: REM_ACCESS_ERR.
	require.NoError(t, unix.MunmapPtr(unsafe.Pointer(&mem[8192]), 4096))
	require.NoError(t, a.qp.PostSend(writeWR(4, abi.WRRDMAWrite, a.mr.SGE(0, 64), mr.Addr+8192, mr.RKey)))
	assert.Equal(t, remAccessErr(4, qa), pollN(t, a.scq, 1)[0])
	assert.Equal(t, pat, mem[100:100+len(pat)], "the mapped pages unchanged")
	assert.Equal(t, make([]byte, 8192-100-len(pat)), mem[100+len(pat):8192])
	require.NoError(t, mr.Dereg())
	require.NoError(t, imr.Dereg())
}
