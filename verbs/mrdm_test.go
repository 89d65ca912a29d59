package verbs

import (
	"errors"
	"math"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
)

// The ABI 1.4 control path of the Go client against a real device:
// QUERY_DEVICE_EX, device memory, rereg MR and resize CQ, their errors.
// RC traffic through the same features is in device/dataplane
// (TestVerbs*).

// controlErrno asserts err is the daemon's refusal with errno want (not
// one made up by the client).
func controlErrno(t *testing.T, err error, want syscall.Errno, msg string) {
	t.Helper()
	var ce *abi.ControlError
	if assert.ErrorAs(t, err, &ce, msg) {
		assert.Equal(t, want, ce.Errno, msg)
	}
}

// clientErrno asserts err is the client's refusal with errno want, made
// before any command.
func clientErrno(t *testing.T, err error, want syscall.Errno, msg string) {
	t.Helper()
	var ce *abi.ControlError
	assert.ErrorIs(t, err, want, msg)
	assert.False(t, errors.As(err, &ce), "%s: refused by the client, not the daemon: %v", msg, err)
}

func TestQueryDeviceEx(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	a, err := c.QueryDevice()
	require.NoError(t, err)
	x, err := c.QueryDeviceEx()
	require.NoError(t, err)
	assert.Equal(t, a, x.DeviceAttr)
	assert.Equal(t, uint64(device.DefaultDMSize), x.MaxDMSize)
	assert.Equal(t, uint32(abi.DMMaxLogAlign), x.DMMaxLogAlign)
	assert.Equal(t, uint64(math.MaxUint64), x.CompletionTimestampMask)
	assert.Equal(t, uint64(1_000_000), x.HCACoreClock, "1 GHz in kHz")
	assert.Equal(t, uint32(a.PhysPortCnt), x.PhysPortCntEx)
	assert.Equal(t, uint64(a.DeviceCapFlags), x.DeviceCapFlagsEx&math.MaxUint32)
	for _, p := range []struct {
		cap uint8
		ex  uint64
	}{{abi.PlacementAtomicWrite, DeviceCapExAtomicWrite}, {abi.PlacementFlushGlobal, DeviceCapExFlushGlobal},
		{abi.PlacementFlushPersistent, DeviceCapExFlushPersistent}} {
		assert.Equal(t, a.PlacementCaps&p.cap != 0, x.DeviceCapFlagsEx&p.ex != 0, "placement cap %#x", p.cap)
	}
	assert.Zero(t, x.DeviceCapFlagsEx&^(math.MaxUint32|DeviceCapExAtomicWrite|DeviceCapExFlushGlobal|DeviceCapExFlushPersistent))

	before := uint64(time.Now().UnixNano())
	now, err := c.QueryRTValues()
	require.NoError(t, err)
	after := uint64(time.Now().UnixNano())
	assert.GreaterOrEqual(t, now, before)
	assert.LessOrEqual(t, now, after)
}

func TestDeviceMemory(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	const n = 4096
	dm, err := c.AllocDM(n)
	require.NoError(t, err)
	assert.Equal(t, uint64(n), dm.Len())
	assert.Equal(t, uint64(n), s.Device.DMInUse())

	got := make([]byte, n)
	for i := range got {
		got[i] = 0xee
	}
	require.NoError(t, dm.CopyFrom(0, got))
	assert.Equal(t, make([]byte, n), got, "new device memory is zero")
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = byte(i*7 + i>>8)
	}
	require.NoError(t, dm.CopyTo(0, pat))
	require.NoError(t, dm.CopyFrom(0, got))
	assert.Equal(t, pat, got)
	part := make([]byte, 12)
	require.NoError(t, dm.CopyFrom(100, part))
	assert.Equal(t, pat[100:112], part)
	require.NoError(t, dm.CopyTo(n-4, []byte{1, 2, 3, 4}), "the last word")
	require.NoError(t, dm.CopyFrom(n-8, part[:8]))
	assert.Equal(t, append(append([]byte(nil), pat[n-8:n-4]...), 1, 2, 3, 4), part[:8])

	// Out of range: EFAULT; unaligned: EINVAL (the C library's rules). The
	// DM is unchanged.
	require.NoError(t, dm.CopyTo(0, pat))
	for _, b := range []struct {
		name string
		off  uint64
		n    int
		want syscall.Errno
	}{
		{"offset at the end", n, 4, syscall.EFAULT},
		{"length past the end", n - 4, 8, syscall.EFAULT},
		{"offset past the end", n + 8, 0, syscall.EFAULT},
		{"huge offset", math.MaxUint64 - 3, 8, syscall.EFAULT},
		{"unaligned offset", 2, 4, syscall.EINVAL},
		{"unaligned length", 4, 3, syscall.EINVAL},
	} {
		buf := make([]byte, b.n)
		clientErrno(t, dm.CopyTo(b.off, buf), b.want, "CopyTo: "+b.name)
		clientErrno(t, dm.CopyFrom(b.off, buf), b.want, "CopyFrom: "+b.name)
	}
	assert.ErrorIs(t, dm.CopyTo(n, make([]byte, 4)), ErrDMRange)
	require.NoError(t, dm.CopyFrom(0, got))
	assert.Equal(t, pat, got, "refused copies changed nothing")

	// Allocation limits: max_dm_size (256 KiB by default) in all.
	clientErrno(t, func() error { _, err := c.AllocDM(0); return err }(), syscall.EINVAL, "AllocDM(0)")
	clientErrno(t, func() error { _, err := c.AllocDM(device.DefaultDMSize + 1); return err }(), syscall.EINVAL, "beyond max_dm_size")
	big, err := c.AllocDM(device.DefaultDMSize - 2*n + 1) // rounds up to what is left but a page
	require.NoError(t, err)
	_, err = c.AllocDM(n + 1)
	controlErrno(t, err, syscall.ENOMEM, "two pages wanted, one left")
	require.NoError(t, big.Free())

	// REG_DM_MR: within the DM, zero-based.
	acc := abi.DMMRZeroBased | abi.AccessLocalWrite
	_, err = pd.RegDMMR(dm, 0, n+4, acc)
	controlErrno(t, err, syscall.EINVAL, "reg beyond the DM")
	_, err = pd.RegDMMR(dm, 8, n, acc)
	controlErrno(t, err, syscall.EINVAL, "reg at an offset, beyond the DM")
	_, err = pd.RegDMMR(dm, math.MaxUint64-3, 8, acc)
	controlErrno(t, err, syscall.EINVAL, "offset wrapping")
	_, err = pd.RegDMMR(dm, 0, n, abi.AccessLocalWrite)
	controlErrno(t, err, syscall.EINVAL, "reg without ZERO_BASED")
	_, err = pd.RegDMMR(dm, 0, n, abi.DMMRZeroBased|abi.AccessRemoteWrite)
	controlErrno(t, err, syscall.EINVAL, "remote write without local write")
	other := openCtx(t, s)
	opd, err := other.AllocPD()
	require.NoError(t, err)
	_, err = opd.RegDMMR(dm, 0, n, acc)
	clientErrno(t, err, syscall.EINVAL, "a DM of another context")
	mr, err := pd.RegDMMR(dm, 1024, 2048, acc|abi.AccessRemoteRead)
	require.NoError(t, err)
	assert.Zero(t, mr.Addr)
	assert.Equal(t, uint64(2048), mr.Length)
	assert.NotZero(t, mr.LKey)
	controlErrno(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite), syscall.EINVAL, "rereg of a DM MR")
	controlErrno(t, dm.Free(), syscall.EBUSY, "free with an MR on it")
	require.NoError(t, dm.CopyFrom(0, got))
	assert.Equal(t, pat, got, "a refused free keeps the DM mapped")
	require.NoError(t, mr.Dereg())
	require.NoError(t, dm.Free())
	clientErrno(t, dm.CopyTo(0, pat[:4]), syscall.EINVAL, "copy into a freed DM")
	controlErrno(t, dm.Free(), syscall.ENOENT, "free twice")
	assert.Zero(t, s.Device.DMInUse())

	// A context that goes frees its device memory.
	_, err = other.AllocDM(3 * n)
	require.NoError(t, err)
	assert.Equal(t, uint64(3*n), s.Device.DMInUse())
	require.NoError(t, other.Close())
	require.Eventually(t, func() bool { return s.Device.DMInUse() == 0 }, 20*time.Second, time.Millisecond)
}

func TestReregMR(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	b1, err := c.Alloc(6000, 64)
	require.NoError(t, err)
	b2, err := c.Alloc(400<<10, 4096) // 100 pages: the list goes by pbl_pa
	require.NoError(t, err)
	mr, err := pd.RegMR(b1, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	require.NoError(t, err)
	keep := *mr

	// Bad input, refused by the client: the MR is unchanged.
	clientErrno(t, mr.Rereg(8, nil, nil, 0), syscall.EINVAL, "unknown flag")
	clientErrno(t, mr.Rereg(abi.ReregChangeTranslation, nil, nil, 0), syscall.EINVAL, "translation without a buffer")
	clientErrno(t, mr.Rereg(abi.ReregChangeAccess, nil, b2, abi.AccessLocalWrite), syscall.EINVAL, "a buffer without translation")
	clientErrno(t, mr.Rereg(abi.ReregChangePD, nil, nil, 0), syscall.EINVAL, "CHANGE_PD without a PD")
	other := openCtx(t, s)
	opd, err := other.AllocPD()
	require.NoError(t, err)
	clientErrno(t, mr.Rereg(abi.ReregChangePD, opd, nil, 0), syscall.EINVAL, "a PD of another context")
	// Refused by the daemon.
	controlErrno(t, mr.Rereg(0, nil, nil, 0), syscall.EINVAL, "no flag")
	controlErrno(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessRemoteWrite), syscall.EINVAL, "remote write without local write")
	controlErrno(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, 1<<20), syscall.EINVAL, "unknown access bit")
	controlErrno(t, mr.Rereg(abi.ReregChangePD, c.RawPD(0x7fff), nil, 0), syscall.ENOENT, "a PD the daemon does not know")
	assert.Equal(t, keep, *mr)

	// Another context's MR, named by its handle on this context: unknown.
	ob, err := other.Alloc(4096, 4096)
	require.NoError(t, err)
	omr, err := opd.RegMR(ob, abi.AccessLocalWrite)
	require.NoError(t, err)
	foreign := &MR{ctx: c, Handle: omr.Handle}
	controlErrno(t, foreign.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite), syscall.ENOENT, "a foreign MR")
	controlErrno(t, foreign.Rereg(abi.ReregChangeTranslation, nil, b2, 0), syscall.ENOENT, "a foreign MR, with pages")
	require.NoError(t, omr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite|abi.AccessRemoteRead), "the owner still can")

	// The positive path: the new range, the reply's keys.
	require.NoError(t, mr.Rereg(abi.ReregAll, pd, b2, abi.AccessLocalWrite|abi.AccessRemoteRead))
	assert.Equal(t, b2.Addr(), mr.Addr)
	assert.Equal(t, uint64(400<<10), mr.Length)
	assert.Equal(t, keep.LKey, mr.LKey)
	assert.Equal(t, keep.RKey, mr.RKey)
	assert.Equal(t, keep.Handle, mr.Handle)
	require.NoError(t, mr.ReregAt(abi.ReregChangeTranslation, nil, b1, 0x10000+b1.PA%pageSize, 0))
	assert.Equal(t, 0x10000+b1.PA%pageSize, mr.Addr)
	assert.Equal(t, uint64(6000), mr.Length)
	assert.Error(t, mr.ReregAt(abi.ReregChangeTranslation, nil, b1, 0x10001+b1.PA%pageSize, 0), "page offsets differ")
	assert.Equal(t, 0x10000+b1.PA%pageSize, mr.Addr)

	// A deregistered MR: unknown.
	require.NoError(t, mr.Dereg())
	controlErrno(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite), syscall.ENOENT, "a deregistered MR")
	// The PD is free again: nothing of the MR is left.
	require.NoError(t, pd.Dealloc())
}

func TestResizeCQ(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	for _, ts := range []bool{false, true} {
		cq, err := c.createCQ(3, nil, map[bool]uint32{true: abi.CQFlagTimestamp}[ts])
		require.NoError(t, err)
		assert.Equal(t, ts, cq.Timestamps())
		assert.Equal(t, 4, cq.Len())
		assert.Len(t, cq.ring.Bytes, cqRingBytes(4, ts))
		clientErrno(t, cq.Resize(0), syscall.EINVAL, "0 entries")
		clientErrno(t, cq.Resize(abi.MaxCQE+1), syscall.EINVAL, "beyond max_cqe")
		old := cq.ring
		require.NoError(t, cq.Resize(100))
		assert.Equal(t, 128, cq.Len())
		assert.Equal(t, ts, cq.Timestamps())
		assert.Len(t, cq.ring.Bytes, cqRingBytes(128, ts))
		if ts {
			assert.Len(t, cq.ts, 128*8)
			assert.Equal(t, addrOf(cq.ring.Bytes)+128*abi.SizeofCQE, addrOf(cq.ts), "timestamps follow the CQEs")
		}
		assert.Nil(t, old.hm, "the old ring was freed")
		wc := make([]abi.CQE, 4)
		assert.Zero(t, cq.Poll(wc), "nothing completed")
		require.NoError(t, cq.Resize(1))
		assert.Equal(t, 2, cq.Len())
		require.NoError(t, cq.Destroy())
		controlErrno(t, cq.Resize(8), syscall.ENOENT, "a destroyed CQ")
	}
}

// TestABI14BogusHandles: handles the daemon never gave, or gave another
// context, to every ABI 1.4 command of this file: refused with ENOENT,
// nothing allocated, and the daemon goes on serving.
func TestABI14BogusHandles(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	other := openCtx(t, s)
	odm, err := other.AllocDM(4096)
	require.NoError(t, err)
	for _, h := range []uint32{0, 0x7fff, math.MaxUint32, odm.Handle} {
		controlErrno(t, (&MR{ctx: c, Handle: h}).Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite), syscall.ENOENT, "rereg")
		controlErrno(t, (&CQ{ctx: c, Handle: h}).Resize(4), syscall.ENOENT, "resize")
		controlErrno(t, (&DM{ctx: c, Handle: h}).Free(), syscall.ENOENT, "free DM")
		_, err := pd.RegDMMR(&DM{ctx: c, Handle: h}, 0, 64, abi.DMMRZeroBased)
		controlErrno(t, err, syscall.ENOENT, "reg DM MR")
	}
	dm, err := c.AllocDM(4096)
	require.NoError(t, err)
	_, err = c.RawPD(0x7fff).RegDMMR(dm, 0, 64, abi.DMMRZeroBased)
	controlErrno(t, err, syscall.ENOENT, "reg DM MR on an unknown PD")
	assert.Equal(t, uint64(2*4096), s.Device.DMInUse(), "nothing more allocated")
	// The daemon still serves both contexts.
	_, err = c.QueryDeviceEx()
	require.NoError(t, err)
	require.NoError(t, odm.Free())
	require.NoError(t, dm.Free())
	assert.Zero(t, s.Device.DMInUse())
}
