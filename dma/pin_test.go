package dma

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// procStatus returns a "kB" field of /proc/self/status in bytes.
func procStatus(t testing.TB, field string) uint64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return n << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// dataBytes sums the data extents of a memfd (SEEK_DATA/SEEK_HOLE), on a
// file description of its own.
func dataBytes(t testing.TB, fd int) uint64 {
	t.Helper()
	own := reopen(fd)
	require.GreaterOrEqual(t, own, 0)
	defer unix.Close(own)
	var n uint64
	for off := int64(0); ; {
		d, err := unix.Seek(own, off, unix.SEEK_DATA)
		if err != nil {
			return n
		}
		h, err := unix.Seek(own, d, unix.SEEK_HOLE)
		require.NoError(t, err)
		n += uint64(h - d)
		off = h
	}
}

// canLock reports whether this process may lock memory at all.
func canLock() bool {
	b := make([]byte, 4096)
	if lockOnFault(b) != nil {
		return false
	}
	_ = unix.Munlock(b)
	return true
}

// TestSparseRegionCostsNothing adds a 1 GiB memfd of which one page was
// written: adding it is quick, locks nothing and populates nothing.
func TestSparseRegionCostsNothing(t *testing.T) {
	s := newSpace(t, Config{})
	lck := procStatus(t, "VmLck")
	fd := newMemfd(t, 1<<30, unix.F_SEAL_SHRINK)
	_, err := unix.Pwrite(fd, []byte("x"), 1<<29)
	require.NoError(t, err)
	start := time.Now()
	info, err := s.AddRegion(1, fd, 1<<30)
	require.NoError(t, err)
	// Quick, but timed only for the log: what shows it costs nothing is
	// below (nothing locked, nothing populated), not a clock.
	t.Logf("a sparse 1 GiB region added in %v", time.Since(start))
	assert.Equal(t, !s.cfg.NoMlock, info.Locked, "pinned ranges will be locked")
	s.WaitPinned()
	assert.Equal(t, lck, procStatus(t, "VmLck"), "nothing locked by ADD_HOST_MEM")
	assert.Equal(t, uint64(4096), dataBytes(t, fd), "nothing populated")
	require.NoError(t, s.RemoveRegion(1, info.Handle))
}

// TestPinLocksChunksLazily registers MRs and a ring view over a sparse
// region and checks that exactly the 2 MiB chunks under them are charged
// and locked, that holes stay holes, and that everything is undone.
func TestPinLocksChunksLazily(t *testing.T) {
	if !canLock() {
		t.Skip("this process may not lock memory (RLIMIT_MEMLOCK without CAP_IPC_LOCK)")
	}
	s := newSpace(t, Config{})
	require.NoError(t, s.SetAccount(1, 1000, AccountLimits{}))
	lck := procStatus(t, "VmLck")
	fd := newMemfd(t, 64*mib, unix.F_SEAL_SHRINK)
	// The client wrote 3 pages of chunk 1 and one of chunk 5.
	for _, off := range []int64{2*mib + 4096, 2*mib + 8192, 2*mib + 12288, 10*mib + 4096} {
		_, err := unix.Pwrite(fd, []byte{byte(off)}, off)
		require.NoError(t, err)
	}
	info, err := s.AddRegion(1, fd, 64*mib)
	require.NoError(t, err)
	pa := func(off uint64) uint64 { return info.PA + off }

	// One MR: 4 pages in chunk 1 (one of them a hole), contiguous: one run.
	mr1, err := s.RegisterMR(1, 1, 0, 4*4096, AccessLocalWrite, PageShift4K,
		[]uint64{pa(2*mib + 4096), pa(2*mib + 8192), pa(2*mib + 12288), pa(2*mib + 16384)})
	require.NoError(t, err)
	// Another aliasing one page of chunk 5 many times: one reference.
	alias := make([]uint64, 4096)
	for i := range alias {
		alias[i] = pa(10*mib + 4096)
	}
	mr2, err := s.RegisterMR(1, 1, 0, 4096*4096, 0, PageShift4K, alias)
	require.NoError(t, err)
	// A ring in chunk 1 too (no new chunk) and one straddling chunks 7/8.
	_, pin1, err := s.Slice(1, pa(2*mib), 4096)
	require.NoError(t, err)
	_, pin2, err := s.Slice(1, pa(16*mib-4096), 8192)
	require.NoError(t, err)

	s.WaitPinned()
	u := s.AccountUsage(1000)
	assert.Equal(t, uint64(4*2*mib), u.PinnedBytes, "chunks 1, 5, 7, 8")
	assert.Equal(t, uint64(4*2*mib), u.LockedBytes)
	assert.Equal(t, uint64(4*4096), u.PresentBytes, "the pages the client had written")
	assert.Equal(t, lck+4*2*mib, procStatus(t, "VmLck"))
	assert.Equal(t, uint64(4*4096), dataBytes(t, fd), "locking populated no hole")

	// Data still flows, through holes too.
	acc := s.NewAccessor()
	defer acc.Close()
	_, err = acc.ScatterAt(PD{1, 1}, []SGE{{Addr: 3 * 4096, Length: 4, LKey: mr1.LKey}}, 0, []byte("hole"))
	require.NoError(t, err)
	assert.Equal(t, "hole", string(clientMap(t, fd, 64*mib)[2*mib+16384:][:4]))

	require.NoError(t, s.DeregisterMR(1, mr1.LKey))
	s.WaitPinned()
	assert.Equal(t, uint64(4*2*mib), s.AccountUsage(1000).PinnedBytes, "the ring still pins chunk 1")
	pin1.Release()
	pin2.Release()
	require.NoError(t, s.DeregisterMR(1, mr2.LKey))
	s.WaitPinned()
	u = s.AccountUsage(1000)
	assert.Equal(t, AccountUsage{Owners: 1}, u)
	assert.Equal(t, lck, procStatus(t, "VmLck"))
	require.NoError(t, s.RemoveRegion(1, info.Handle))
	s.ReleaseOwner(1)
	assert.Equal(t, AccountUsage{}, s.AccountUsage(1000), "account forgotten")
}

// TestPinQuota: the account's pinned limit refuses an MR or a ring with
// ErrQuota (ENOMEM) and leaves nothing behind; owners of one account share
// the limit; the device-wide limit applies too.
func TestPinQuota(t *testing.T) {
	s := newSpace(t, Config{MaxPinnedBytes: 16 * mib})
	lim := AccountLimits{PinnedBytes: 4 * mib}
	require.NoError(t, s.SetAccount(1, 7, lim))
	require.NoError(t, s.SetAccount(2, 7, lim))
	h1 := addHostMem(t, s, 1, 8*mib)
	h2 := addHostMem(t, s, 2, 8*mib)

	mr, err := s.RegisterMR(1, 1, 0, 2*mib, 0, PageShift2M, []uint64{h1.pa(0)})
	require.NoError(t, err)
	_, err = s.RegisterMR(1, 1, 0, 4*mib, 0, PageShift2M, []uint64{h1.pa(2 * mib), h1.pa(4 * mib)})
	require.ErrorIs(t, err, ErrQuota)
	assert.Equal(t, unix.ENOMEM, Errno(err))
	assert.Contains(t, err.Error(), "account 7")
	_, pin, err := s.Slice(2, h2.pa(0), 4096)
	require.NoError(t, err, "the second 2 MiB fits")
	_, _, err = s.Slice(2, h2.pa(2*mib), 4096)
	require.ErrorIs(t, err, ErrQuota, "owner 2 shares account 7")
	assert.Equal(t, uint64(4*mib), s.AccountUsage(7).PinnedBytes, "refusals charge nothing")

	// The device-wide bound.
	require.NoError(t, s.SetAccount(3, 8, AccountLimits{}))
	h3 := addHostMem(t, s, 3, 16*mib)
	pages := []uint64{}
	for off := uint64(0); off < 14*mib; off += 2 * mib {
		pages = append(pages, h3.pa(off))
	}
	_, err = s.RegisterMR(3, 1, 0, 14*mib, 0, PageShift2M, pages)
	require.ErrorIs(t, err, ErrQuota)
	assert.Contains(t, err.Error(), "device")
	_, err = s.RegisterMR(3, 1, 0, 12*mib, 0, PageShift2M, pages[:6])
	require.NoError(t, err)
	assert.Equal(t, uint64(16*mib), s.PinnedBytes())

	pin.Release()
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	assert.Zero(t, s.AccountUsage(7).PinnedBytes)
	require.NoError(t, s.RemoveRegion(1, h1.info.Handle), "no pin left behind")
	require.NoError(t, s.RemoveRegion(2, h2.info.Handle))
}

// TestTableQuotaAndForms checks the page-table forms and their charge:
// a contiguous MR is one run (16 bytes), an aliasing one is flat (8 bytes
// a page, in a mapping of its own from 256 KiB on), and the account's
// table limit refuses with ErrQuota.
func TestTableQuotaAndForms(t *testing.T) {
	s := newSpace(t, Config{})
	require.NoError(t, s.SetAccount(1, 5, AccountLimits{TableBytes: 9 << 20}))
	h := addHostMem(t, s, 1, 64*mib)
	contig := make([]uint64, 16384)
	for i := range contig {
		contig[i] = h.pa(uint64(i) * 4096)
	}
	mr, err := s.RegisterMR(1, 1, 0, 64*mib, 0, PageShift4K, contig)
	require.NoError(t, err)
	assert.Equal(t, uint64(16), s.AccountUsage(5).TableBytes, "one run")

	alias := make([]uint64, 1<<20)
	for i := range alias {
		alias[i] = h.pa(0)
	}
	big, err := s.RegisterMR(1, 1, 0, 4<<30, 0, PageShift4K, alias)
	require.NoError(t, err)
	assert.Equal(t, uint64(16+8<<20), s.AccountUsage(5).TableBytes, "flat: 8 MiB")
	_, err = s.RegisterMR(1, 1, 0, 4<<30, 0, PageShift4K, alias)
	require.ErrorIs(t, err, ErrQuota)
	assert.Equal(t, unix.ENOMEM, Errno(err))
	assert.Contains(t, err.Error(), "page tables of account 5")
	s.mu.Lock()
	m := s.owners[1].mrs[big.LKey]
	assert.NotNil(t, m.store, "an 8 MiB table has a mapping of its own")
	assert.Nil(t, m.runs)
	s.mu.Unlock()

	require.NoError(t, s.DeregisterMR(1, big.LKey))
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	assert.Zero(t, s.AccountUsage(5).TableBytes)
}

// TestRunsTranslate registers an MR of 4 runs of 16 pages in shuffled
// order (runs form) and checks translation and copies against the
// client's mapping.
func TestRunsTranslate(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 64*4096)
	fill(h.client, 3)
	order := []uint64{2, 0, 3, 1}
	var pages []uint64
	for _, r := range order {
		for p := range uint64(16) {
			pages = append(pages, h.pa((r*16+p)*4096))
		}
	}
	mr, err := s.RegisterMR(1, 1, 0x100000+100, 64*4096-200, AccessLocalWrite, PageShift4K, pages)
	require.NoError(t, err)
	s.mu.Lock()
	require.Len(t, s.owners[1].mrs[mr.LKey].runs, 4)
	s.mu.Unlock()
	acc := s.NewAccessor()
	defer acc.Close()
	segs := make([][]byte, 8)
	ref := func(iova, n uint64) []byte {
		var out []byte
		for n > 0 {
			rel := iova - 0x100000
			off := (pages[rel/4096] - h.info.PA) + rel%4096
			c := min(4096-rel%4096, n)
			out = append(out, h.client[off:off+c]...)
			iova += c
			n -= c
		}
		return out
	}
	for _, tc := range []struct {
		iova, n uint64
		segs    int // runs touched
	}{{0x100000 + 100, 10, 1}, {0x100000 + 15*4096, 8192, 2}, {0x100000 + 100, 64*4096 - 200, 4}, {0x100000 + 47*4096 + 5, 4096*16 - 200, 2}} {
		acc.Enter()
		k, err := acc.Translate(mr.LKey, PD{1, 1}, tc.iova, tc.n, 0, segs)
		require.NoError(t, err)
		var got []byte
		for _, sg := range segs[:k] {
			got = append(got, sg...)
		}
		acc.Exit()
		assert.Equal(t, ref(tc.iova, tc.n), got, "%#x+%d", tc.iova, tc.n)
		assert.Equal(t, tc.segs, k, "a span covers a whole run")
		buf := make([]byte, tc.n)
		_, err = acc.GatherAt(PD{1, 1}, []SGE{{Addr: tc.iova, Length: uint32(tc.n), LKey: mr.LKey}}, 0, buf)
		require.NoError(t, err)
		assert.Equal(t, ref(tc.iova, tc.n), buf)
	}
}

// TestLockFailureLeavesMemoryUsable: when mlock is refused
// (RLIMIT_MEMLOCK), registration still succeeds, data flows, and the
// failure is counted.
func TestLockFailureLeavesMemoryUsable(t *testing.T) {
	s := newSpace(t, Config{})
	s.mu.Lock()
	s.lockChunkFn = func([]byte) error { return unix.EPERM }
	s.mu.Unlock()
	h := addHostMem(t, s, 1, 4*mib)
	fill(h.client, 5)
	mr, err := s.RegisterMR(1, 1, 0, 4096, 0, PageShift4K, []uint64{h.pa(3 * mib)})
	require.NoError(t, err)
	s.WaitPinned()
	pinned, locked, fails := s.LockStats()
	assert.Equal(t, uint64(2*mib), pinned)
	assert.Zero(t, locked)
	assert.Equal(t, uint64(1), fails)
	acc := s.NewAccessor()
	defer acc.Close()
	buf := make([]byte, 4096)
	_, err = acc.GatherAt(PD{1, 1}, []SGE{{Addr: 0, Length: 4096, LKey: mr.LKey}}, 0, buf)
	require.NoError(t, err)
	assert.Equal(t, h.client[3*mib:3*mib+4096], buf)
}

// TestTablesReturnToTheSystem registers 8 MRs of 1<<20 aliasing pages (64
// MiB of page tables) and checks the process RSS grows by about that and
// falls back once the owner is released.
func TestTablesReturnToTheSystem(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 4096)
	alias := make([]uint64, 1<<20)
	for i := range alias {
		alias[i] = h.pa(0)
	}
	before := procStatus(t, "VmRSS")
	for range 8 {
		_, err := s.RegisterMR(1, 1, 0, 4<<30, 0, PageShift4K, alias)
		require.NoError(t, err)
	}
	during := procStatus(t, "VmRSS")
	assert.Greater(t, during, before+56*mib, "8 tables of 8 MiB")
	mrs, _ := s.ReleaseOwner(1)
	require.Equal(t, 8, mrs)
	after := procStatus(t, "VmRSS")
	assert.Less(t, after, before+8*mib, fmt.Sprintf("RSS %d MiB before, %d with the tables, %d after", before>>20, during>>20, after>>20))
}

// TestHeapReturnedAfterLateFrees: page tables on the Go heap that are
// freed while a return of the heap to the system runs (a client's MRs go
// one by one, and the first heapReturnMin bytes start the return) get a
// return of their own once it ends; else they would stay on the heap, as
// garbage, until some later collection. The first return is held in the
// middle by the test, so the order of events is fixed.
func TestHeapReturnedAfterLateFrees(t *testing.T) {
	var calls atomic.Int32
	started := make(chan struct{})
	release := make(chan struct{})
	freeOSMemory = func() {
		if calls.Add(1) == 1 {
			close(started)
			<-release
		}
	}
	t.Cleanup(func() { freeOSMemory = debug.FreeOSMemory }) // after s.Close (cleanups run last first)
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 4096)
	// 8192 pages that all alias one page: a flat table of 64 KiB, on
	// the Go heap (below tableMmapMin).
	alias := make([]uint64, 8192)
	for i := range alias {
		alias[i] = h.pa(0)
	}
	const n = heapReturnMin / (8192 * 8) // tables whose release starts a return
	var keys []uint32
	for range 3 * n {
		mr, err := s.RegisterMR(1, 1, 0, 8192*4096, 0, PageShift4K, alias)
		require.NoError(t, err)
		keys = append(keys, mr.LKey)
	}
	for _, k := range keys[:n-1] {
		require.NoError(t, s.DeregisterMR(1, k))
	}
	s.pinWG.Wait()
	require.Zero(t, calls.Load(), "less than heapReturnMin freed: no return")
	require.NoError(t, s.DeregisterMR(1, keys[n-1]))
	<-started // the return runs; the test holds it

	// The other tables are freed while it runs.
	for _, k := range keys[n:] {
		require.NoError(t, s.DeregisterMR(1, k))
	}
	assert.Equal(t, int32(1), calls.Load(), "one return at a time")
	close(release)
	s.pinWG.Wait() // the returns are done
	assert.Equal(t, int32(2), calls.Load(), "a second return, for the tables freed during the first")
}
