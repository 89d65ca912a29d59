package dma

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestMlockFollowsRlimit lowers RLIMIT_MEMLOCK and, on one OS thread,
// drops CAP_IPC_LOCK (capabilities are per thread), then adds a region
// that fits the limit and one that does not: the first is locked, the
// second is added unlocked, not refused.
func TestMlockFollowsRlimit(t *testing.T) {
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old))
	const limit = 256 * kib
	if old.Max != unix.RLIM_INFINITY && old.Max < limit {
		t.Skipf("hard RLIMIT_MEMLOCK %d below %d", old.Max, limit)
	}
	s := newSpace(t, Config{})
	small := newMemfd(t, 64*kib, unix.F_SEAL_SHRINK)
	big := newMemfd(t, 4*mib, unix.F_SEAL_SHRINK)

	type result struct {
		small, big RegionInfo
		errs       []error
	}
	res := make(chan result, 1)
	go func() {
		// This thread's credentials change: it is never handed back to
		// the scheduler, and exits with the goroutine.
		runtime.LockOSThread()
		var r result
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			r.errs = append(r.errs, err)
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			r.errs = append(r.errs, err)
		}
		lim := unix.Rlimit{Cur: limit, Max: old.Max}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			r.errs = append(r.errs, err)
		}
		var err error
		r.small, err = s.AddRegion(1, small, 64*kib)
		if err != nil {
			r.errs = append(r.errs, err)
		}
		r.big, err = s.AddRegion(1, big, 4*mib)
		if err != nil {
			r.errs = append(r.errs, err)
		}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
			r.errs = append(r.errs, err)
		}
		res <- r
	}()
	r := <-res
	require.Empty(t, r.errs)
	assert.True(t, r.small.Locked, "64 KiB fits a 256 KiB RLIMIT_MEMLOCK")
	assert.False(t, r.big.Locked, "4 MiB does not: added unlocked")

	// Unlocked memory works the same.
	b, pin, err := s.Slice(1, r.big.PA+4*mib-4096, 4096)
	require.NoError(t, err)
	defer pin.Release()
	b[4095] = 1
	assert.Equal(t, byte(1), clientMap(t, big, 4*mib)[4*mib-1])
}
