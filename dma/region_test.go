package dma

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// TestAccessFlagsMatchABI checks the flag values and page shifts against
// the client ABI header, the contract.
func TestAccessFlagsMatchABI(t *testing.T) {
	hdr, err := os.ReadFile(filepath.Join("..", "abi", "vrnic_abi.h"))
	require.NoError(t, err)
	def := func(name string) uint64 {
		t.Helper()
		re := regexp.MustCompile(`(?m)\b` + name + `\s*=?\s*\(?1u?l?l?\s*<<\s*(\d+)\)?`)
		if m := re.FindSubmatch(hdr); m != nil {
			n, err := strconv.Atoi(string(m[1]))
			require.NoError(t, err)
			return 1 << n
		}
		re = regexp.MustCompile(`(?m)#define\s+` + name + `\s+(\d+)u`)
		m := re.FindSubmatch(hdr)
		require.NotNil(t, m, "%s not found in vrnic_abi.h", name)
		n, err := strconv.ParseUint(string(m[1]), 10, 64)
		require.NoError(t, err)
		return n
	}
	assert.EqualValues(t, def("VRNIC_ACCESS_LOCAL_WRITE"), AccessLocalWrite)
	assert.EqualValues(t, def("VRNIC_ACCESS_REMOTE_WRITE"), AccessRemoteWrite)
	assert.EqualValues(t, def("VRNIC_ACCESS_REMOTE_READ"), AccessRemoteRead)
	assert.EqualValues(t, def("VRNIC_ACCESS_REMOTE_ATOMIC"), AccessRemoteAtomic)
	assert.EqualValues(t, def("VRNIC_PAGE_SHIFT_4K"), PageShift4K)
	assert.EqualValues(t, def("VRNIC_PAGE_SHIFT_2M"), PageShift2M)
	assert.EqualValues(t, def("VRNIC_MAX_MR_SIZE"), maxMRBytes)
	// And the abi Go mirror (which has its own header test).
	assert.EqualValues(t, def("VRNIC_ACCESS_MW_BIND"), AccessMWBind)
	assert.EqualValues(t, def("VRNIC_ACCESS_ZERO_BASED"), AccessZeroBased)
	assert.EqualValues(t, abi.AccessMRAll, accessAll)
	assert.EqualValues(t, abi.AccessMWAll, AccessMWAll)
	assert.EqualValues(t, abi.AccessRemoteAtomic, AccessRemoteAtomic)
	assert.EqualValues(t, abi.MaxMRSize, maxMRBytes)
}

func TestAddRegionRejects(t *testing.T) {
	s := newSpace(t, Config{MaxRegionBytes: 1 << 30})
	const size = 64 << 10

	noSealing, err := unix.MemfdCreate("nosealing", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(noSealing) })
	require.NoError(t, unix.Ftruncate(noSealing, size))

	var pipe [2]int
	require.NoError(t, unix.Pipe2(pipe[:], unix.O_CLOEXEC))
	t.Cleanup(func() { unix.Close(pipe[0]); unix.Close(pipe[1]) })

	tmp, err := os.CreateTemp(t.TempDir(), "notmemfd")
	require.NoError(t, err)
	t.Cleanup(func() { tmp.Close() })
	require.NoError(t, tmp.Truncate(size))
	// A regular file on tmpfs is a shmem file: F_GET_SEALS answers, with
	// F_SEAL_SEAL set forever, so it is refused as unsealable.
	tmpWant := ErrNotMemfd
	var sfs unix.Statfs_t
	require.NoError(t, unix.Fstatfs(int(tmp.Fd()), &sfs))
	if sfs.Type == unix.TMPFS_MAGIC {
		tmpWant = ErrUnsealed
	}

	type hostile struct {
		name   string
		fd     int
		length uint64
		want   error
	}
	cases := []hostile{
		{"unsealed memfd", newMemfd(t, size, 0), size, ErrUnsealed},
		{"memfd without sealing", noSealing, size, ErrUnsealed},
		{"sealed grow only", newMemfd(t, size, unix.F_SEAL_GROW), size, ErrUnsealed},
		{"write sealed", newMemfd(t, size, unix.F_SEAL_SHRINK|unix.F_SEAL_WRITE), size, ErrWriteSealed},
		{"future write sealed", newMemfd(t, size, unix.F_SEAL_SHRINK|unix.F_SEAL_FUTURE_WRITE), size, ErrWriteSealed},
		{"truncated memfd", newMemfd(t, size/2, unix.F_SEAL_SHRINK), size, ErrTooShort},
		{"pipe", pipe[0], size, ErrNotMemfd},
		{"regular file", int(tmp.Fd()), size, tmpWant},
		{"directory", dirFd(t), size, ErrNotMemfd},
		{"negative fd", -1, size, ErrNotMemfd},
		{"closed fd", 1 << 20, size, ErrNotMemfd},
		{"zero length", newMemfd(t, size, unix.F_SEAL_SHRINK), 0, ErrInvalid},
		{"unaligned length", newMemfd(t, size, unix.F_SEAL_SHRINK), size - 1, ErrInvalid},
		{"length 4097", newMemfd(t, size, unix.F_SEAL_SHRINK), 4097, ErrInvalid},
		{"absurd length", newMemfd(t, size, unix.F_SEAL_SHRINK), 1 << 50, ErrTooLarge},
		{"above configured max", newMemfd(t, size, unix.F_SEAL_SHRINK), 2 << 30, ErrTooLarge},
	}
	if shm, err := os.OpenFile("/dev/shm/vrnic-dma-test-"+strconv.Itoa(os.Getpid()), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
		t.Cleanup(func() { shm.Close(); os.Remove(shm.Name()) })
		require.NoError(t, shm.Truncate(size))
		cases = append(cases, hostile{"tmpfs file (not a memfd)", int(shm.Fd()), size, ErrUnsealed})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.AddRegion(1, tc.fd, tc.length)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
		})
	}
	s.mu.Lock()
	assert.Empty(t, s.byPA, "no rejected fd may leave a region behind")
	s.mu.Unlock()
}

func dirFd(t *testing.T) int {
	fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func TestAddRegionLayoutAndFdOwnership(t *testing.T) {
	s := newSpace(t, Config{MaxRegionsPerOwner: 3})
	sizes := []uint64{4096, 3 << 20, 64 << 10}
	var infos []RegionInfo
	for i, size := range sizes {
		fd, err := unix.MemfdCreate("layout", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
		require.NoError(t, err)
		require.NoError(t, unix.Ftruncate(fd, int64(size)))
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
		require.NoError(t, err)
		client := clientMap(t, fd, int(size))
		info, err := s.AddRegion(1, fd, size)
		require.NoError(t, err)
		// The Space keeps its own duplicate: closing ours is fine.
		require.NoError(t, unix.Close(fd))
		assert.Zero(t, info.PA%RegionAlign, "PA 2 MiB aligned")
		assert.Equal(t, size, info.Length)
		if i > 0 {
			prev := infos[i-1]
			assert.GreaterOrEqual(t, info.PA, prev.PA+prev.Length+guardGap, "guard gap between regions")
		}
		infos = append(infos, info)

		b, pin, err := s.Slice(1, info.PA, size)
		require.NoError(t, err)
		fill(b, byte(i))
		assert.Equal(t, b, client, "daemon writes visible in the client's mapping")
		client[size-1] ^= 0xff
		assert.Equal(t, client[size-1], b[size-1], "client writes visible to the daemon")
		pin.Release()
	}
	// Locked reflects mlock: with the unlimited rlimit or CAP_IPC_LOCK of
	// root it must have succeeded for these small regions.
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl))
	if os.Geteuid() == 0 || rl.Cur == unix.RLIM_INFINITY {
		for _, info := range infos {
			assert.True(t, info.Locked)
		}
	}

	_, err := s.AddRegion(1, newMemfd(t, 4096, unix.F_SEAL_SHRINK), 4096)
	assert.ErrorIs(t, err, ErrLimit, "regions per owner bounded")

	// A removed range is never handed out again.
	require.NoError(t, s.RemoveRegion(1, infos[1].Handle))
	again, err := s.AddRegion(1, newMemfd(t, 3<<20, unix.F_SEAL_SHRINK), 3<<20)
	require.NoError(t, err)
	assert.Greater(t, again.PA, infos[2].PA, "PA ranges are not reused")
	_, _, err = s.Slice(1, infos[1].PA, 4096)
	assert.ErrorIs(t, err, ErrPAOutside, "the removed range is gone")
	assert.ErrorIs(t, s.RemoveRegion(1, infos[1].Handle), ErrNoRegion)
	assert.ErrorIs(t, s.RemoveRegion(2, infos[0].Handle), ErrNoRegion, "another owner's handle")
}

func TestAddRegionNoMlock(t *testing.T) {
	s := newSpace(t, Config{NoMlock: true})
	h := addHostMem(t, s, 1, 8192)
	assert.False(t, h.info.Locked)
}

func TestSlice(t *testing.T) {
	s := newSpace(t, Config{})
	a := addHostMem(t, s, 1, 64<<10)
	b := addHostMem(t, s, 2, 64<<10)

	for _, tc := range []struct {
		name   string
		owner  Owner
		pa, n  uint64
		want   error
		wantOK bool
	}{
		{"whole region", 1, a.pa(0), 64 << 10, nil, true},
		{"inside", 1, a.pa(4096), 128, nil, true},
		{"last byte", 1, a.pa(64<<10 - 1), 1, nil, true},
		{"straddles end", 1, a.pa(60 << 10), 8 << 10, ErrPAOutside, false},
		{"guard gap", 1, a.pa(64 << 10), 64, ErrPAOutside, false},
		{"PA zero", 1, 0, 64, ErrPAOutside, false},
		{"wraps", 1, ^uint64(0) - 10, 64, ErrPAOutside, false},
		{"before first", 1, a.pa(0) - 64, 64, ErrPAOutside, false},
		{"other owner", 1, b.pa(0), 64, ErrNotOwner, false},
		{"zero length", 1, a.pa(0), 0, ErrInvalid, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, pin, err := s.Slice(tc.owner, tc.pa, tc.n)
			if !tc.wantOK {
				assert.ErrorIs(t, err, tc.want)
				assert.Nil(t, v)
				return
			}
			require.NoError(t, err)
			defer pin.Release()
			assert.Len(t, v, int(tc.n))
			assert.Equal(t, int(tc.n), cap(v), "capacity clipped to the range")
			assert.True(t, inMapping(s, v))
			v[0] = 0x5a
			assert.Equal(t, byte(0x5a), a.client[tc.pa-a.info.PA])
		})
	}

	// A ring pin keeps RemoveRegion away.
	_, pin, err := s.Slice(1, a.pa(0), 4096)
	require.NoError(t, err)
	assert.ErrorIs(t, s.RemoveRegion(1, a.info.Handle), ErrBusy)
	pin.Release()
	pin.Release() // idempotent
	require.NoError(t, s.RemoveRegion(1, a.info.Handle))
}

func TestReadPageList(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 8192)
	for i := 0; i < 4; i++ {
		v := uint64(0x1122334455667700 + i)
		for j := 0; j < 8; j++ {
			h.client[100*8+i*8+j] = byte(v >> (8 * j))
		}
	}
	got, err := s.ReadPageList(1, h.pa(800), 4)
	require.NoError(t, err)
	assert.Equal(t, []uint64{0x1122334455667700, 0x1122334455667701, 0x1122334455667702, 0x1122334455667703}, got)
	_, err = s.ReadPageList(1, h.pa(801), 4)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = s.ReadPageList(1, h.pa(8192-16), 4)
	assert.ErrorIs(t, err, ErrPAOutside)
	_, err = s.ReadPageList(2, h.pa(800), 4)
	assert.ErrorIs(t, err, ErrNotOwner)
	_, err = s.ReadPageList(1, h.pa(800), 0)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = s.ReadPageList(1, h.pa(0), 1<<30)
	assert.ErrorIs(t, err, ErrTooLarge, "page list bounded before any allocation")
}

func TestReleaseOwnerWithRingPin(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 64<<10)
	mr, err := s.RegisterMR(1, 1, 0x1000, 8192, AccessLocalWrite, PageShift4K, []uint64{h.pa(0), h.pa(4096)})
	require.NoError(t, err)
	ring, pin, err := s.Slice(1, h.pa(32<<10), 4096)
	require.NoError(t, err)

	mrs, regions := s.ReleaseOwner(1)
	assert.Equal(t, 1, mrs)
	assert.Equal(t, 1, regions)
	a := s.NewAccessor()
	defer a.Close()
	err = a.ReadRemote(mr.LKey, PD{1, 1}, 0x1000, make([]byte, 8))
	assert.ErrorIs(t, err, ErrBadKey, "MRs of a released owner are gone")
	_, _, err = s.Slice(1, h.pa(0), 4096)
	assert.ErrorIs(t, err, ErrPAOutside, "its regions are unpublished")

	// The ring view is still mapped until its pin goes.
	ring[0] = 0x77
	assert.Equal(t, byte(0x77), h.client[32<<10])
	r := pin.r
	s.mu.Lock()
	assert.NotNil(t, r.mem)
	s.mu.Unlock()
	pin.Release()
	assert.Nil(t, r.mem, "unmapped with the last pin")
	assert.Equal(t, -1, r.fd, "duplicate fd closed")
}

// TestGracePeriod: a region is not unmapped while an accessor that may
// hold a pointer into it is inside a section.
func TestGracePeriod(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 8192)
	mr, err := s.RegisterMR(1, 1, 0, 4096, AccessLocalWrite, PageShift4K, []uint64{h.pa(0)})
	require.NoError(t, err)

	a := s.NewAccessor()
	defer a.Close()
	segs := make([][]byte, 1)
	a.Enter()
	n, err := a.Translate(mr.LKey, PD{1, 1}, 0, 4096, AccessLocalWrite, segs)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	done := make(chan error)
	go func() { done <- s.RemoveRegion(1, h.info.Handle) }()
	select {
	case err := <-done:
		t.Fatalf("RemoveRegion returned (%v) while an accessor was inside its section", err)
	case <-time.After(50 * time.Millisecond):
	}
	segs[0][100] = 0x42 // still mapped: must not fault
	assert.Equal(t, byte(0x42), h.client[100])
	a.Exit()
	require.NoError(t, <-done)

	// A new section after the grace period never sees the MR.
	a.Enter()
	_, err = a.Translate(mr.LKey, PD{1, 1}, 0, 4096, 0, segs)
	a.Exit()
	assert.ErrorIs(t, err, ErrBadKey)
}

func TestErrno(t *testing.T) {
	assert.Equal(t, unix.EBUSY, Errno(ErrBusy))
	assert.Equal(t, unix.EACCES, Errno(ErrAccess))
	assert.Equal(t, unix.EINVAL, Errno(ErrPageCount))
	assert.Equal(t, unix.ENOENT, Errno(ErrNoMR))
	assert.Equal(t, unix.Errno(0), Errno(nil))
	assert.Equal(t, unix.EIO, Errno(os.ErrInvalid))
	assert.Equal(t, unix.EBUSY, Errno(fmt.Errorf("ctx: %w", ErrBusy)), "through wrapping")
	assert.ErrorIs(t, ErrNotOwner, unix.EACCES, "sentinels unwrap to their errno")
	assert.Equal(t, abi.ErrnoOf(fmt.Errorf("x: %w", ErrPAOutside)), unix.EFAULT, "abi.ErrnoOf sees it")
	assert.NotErrorIs(t, ErrBusy, ErrInvalid)
}

func TestClose(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 16*kib)
	mr, err := s.RegisterMR(1, 1, 0, 4096, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(0)})
	require.NoError(t, err)
	_, pin, err := s.Slice(1, h.pa(8192), 4096)
	require.NoError(t, err)
	acc := s.NewAccessor()
	defer acc.Close()

	s.Close()
	s.Close() // idempotent
	_, err = s.AddRegion(1, newMemfd(t, 4096, unix.F_SEAL_SHRINK), 4096)
	assert.ErrorIs(t, err, ErrClosed)
	_, err = s.RegisterMR(1, 1, 0, 4096, 0, PageShift4K, []uint64{h.pa(0)})
	assert.ErrorIs(t, err, ErrClosed)
	_, _, err = s.Slice(1, h.pa(0), 4096)
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, acc.ReadRemote(mr.RKey, PD{1, 1}, 0, make([]byte, 8)), ErrBadKey)
	r := pin.r
	pin.Release()
	assert.Nil(t, r.mem, "the ring's region goes with its pin")
}
