package dma

import (
	"crypto/rand"
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openSelf opens the test process itself for on-demand paging, as a
// client proves its pid with a nonce in its memory.
func openSelf(t *testing.T) *Process {
	t.Helper()
	nonce := make([]byte, NonceLen)
	_, err := rand.Read(nonce)
	require.NoError(t, err)
	p, err := OpenProcess(os.Getpid(), uint64(addrOf(nonce)), nonce)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// anonPages maps n private anonymous pages, unmapped at cleanup.
func anonPages(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n*MinPage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// remapPage replaces page i of b with a fresh anonymous page (MAP_FIXED),
// as a program that unmaps and maps memory again in a registered range.
func remapPage(t *testing.T, b []byte, i int) {
	t.Helper()
	p := addrOf(b) + uintptr(i*MinPage)
	_, _, e := unix.Syscall6(unix.SYS_MMAP, p, MinPage, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0)
	require.Zero(t, e)
}

func TestOpenProcessChecksTheNonce(t *testing.T) {
	nonce := make([]byte, NonceLen)
	_, err := rand.Read(nonce)
	require.NoError(t, err)
	other := append([]byte(nil), nonce...)
	other[3] ^= 1
	_, err = OpenProcess(os.Getpid(), uint64(addrOf(other)), nonce)
	assert.ErrorIs(t, err, unix.EACCES, "nonce differs")
	_, err = OpenProcess(os.Getpid(), 4096, nonce)
	assert.ErrorIs(t, err, unix.EACCES, "nonce address not mapped")
	_, err = OpenProcess(0, uint64(addrOf(nonce)), nonce)
	assert.ErrorIs(t, err, ErrInvalid)
	_, err = OpenProcess(os.Getpid(), uint64(addrOf(nonce)), nonce[:8])
	assert.ErrorIs(t, err, ErrInvalid)
	// A process that is not the client: pid 1 does not hold the nonce
	// (EACCES), or the daemon may not read it (EPERM).
	_, err = OpenProcess(1, uint64(addrOf(nonce)), nonce)
	assert.True(t, err != nil && (Errno(err) == unix.EACCES || Errno(err) == unix.EPERM), "%v", err)
}

func TestODPCopiesFaultAndSeeRemaps(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	buf := anonPages(t, 4)
	base := uint64(addrOf(buf))
	all := AccessLocalWrite | AccessRemote
	mr, err := s.RegisterODPMR(1, 7, base, base, uint64(len(buf)), all, p)
	require.NoError(t, err)
	a := s.NewAccessor()
	defer a.Close()
	pd := PD{Owner: 1, Handle: 7}

	// Scatter crosses a page boundary; the client sees the bytes.
	src := make([]byte, 6000)
	fill(src, 1)
	bad, err := a.ScatterAt(pd, []SGE{{Addr: base + 100, Length: 6000, LKey: mr.LKey}}, 0, src)
	require.NoError(t, err, "bad %d", bad)
	assert.Equal(t, src, buf[100:6100])
	// Gather and the remote paths read and write the same memory.
	fill(buf[8192:12288], 2)
	dst := make([]byte, 4096)
	_, err = a.GatherAt(pd, []SGE{{Addr: base + 8192, Length: 4096, LKey: mr.LKey}}, 0, dst)
	require.NoError(t, err)
	assert.Equal(t, buf[8192:12288], dst)
	require.NoError(t, a.WriteRemote(mr.RKey, pd, base+12288, []byte("remote write")))
	assert.Equal(t, "remote write", string(buf[12288:12300]))
	got := make([]byte, 12)
	require.NoError(t, a.ReadRemote(mr.RKey, pd, base+12288, got))
	assert.Equal(t, "remote write", string(got))

	// Atomics: the original value back, the new one in memory.
	w := base + 16
	putWord(buf[16:], 5)
	v, err := a.CompareSwap(mr.RKey, pd, w, 5, 9)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), v)
	v, err = a.CompareSwap(mr.RKey, pd, w, 5, 11)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), v, "compare fails: no store")
	v, err = a.FetchAdd(mr.RKey, pd, w, 3)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), v)
	assert.Equal(t, uint64(12), word(buf[16:]))
	_, err = a.FetchAdd(mr.RKey, pd, w+4, 1)
	assert.ErrorIs(t, err, ErrMisaligned)

	// Unmapped page: the access faults, the SGE fails; bytes before the
	// page were written.
	munmap(t, buf[4096:8192])
	bad, err = a.ScatterAt(pd, []SGE{{Addr: base + 4000, Length: 200, LKey: mr.LKey}}, 0, src[:200])
	assert.ErrorIs(t, err, ErrFault)
	assert.Equal(t, 0, bad)
	assert.ErrorIs(t, a.ReadRemote(mr.RKey, pd, base+4096, got), ErrFault)
	_, err = a.FetchAdd(mr.RKey, pd, base+4096, 1)
	assert.ErrorIs(t, err, ErrFault)
	// Mapped again (new, zeroed page): reachable, new contents seen.
	remapPage(t, buf, 1)
	require.NoError(t, a.ReadRemote(mr.RKey, pd, base+4096, got))
	assert.Equal(t, make([]byte, 12), got)
	// Replaced under the MR with other contents: the device sees them.
	fill(buf[8192:12288], 3)
	remapPage(t, buf, 2)
	copy(buf[8192:], "after remap")
	_, err = a.GatherAt(pd, []SGE{{Addr: base + 8192, Length: 11, LKey: mr.LKey}}, 0, got[:11])
	require.NoError(t, err)
	assert.Equal(t, "after remap", string(got[:11]))

	// Read-only page: reads work, writes fault.
	require.NoError(t, unix.Mprotect(buf[12288:16384], unix.PROT_READ))
	assert.NoError(t, a.ReadRemote(mr.RKey, pd, base+12288, got))
	assert.ErrorIs(t, a.WriteRemote(mr.RKey, pd, base+12288, got), ErrFault)

	// The usual checks still come first: bounds, PD, access, keys.
	assert.ErrorIs(t, a.WriteRemote(mr.RKey, pd, base+16380, got), ErrBounds)
	assert.ErrorIs(t, a.WriteRemote(mr.RKey, PD{Owner: 1, Handle: 8}, base, got), ErrWrongPD)
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	assert.ErrorIs(t, a.ReadRemote(mr.RKey, pd, base, got), ErrBadKey)
}

func TestODPImplicitReachesMemoryMappedLater(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	mr, err := s.RegisterODPMR(1, 1, 0, 0, ODPImplicit, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead, p)
	require.NoError(t, err)
	a := s.NewAccessor()
	defer a.Close()
	pd := PD{Owner: 1, Handle: 1}
	later := anonPages(t, 2) // mapped after the registration
	va := uint64(addrOf(later))
	require.NoError(t, a.WriteRemote(mr.RKey, pd, va+4090, []byte("crosses a page")))
	assert.Equal(t, "crosses a page", string(later[4090:4104]))
	// Between two MRs of the device: mapped to on-demand and back.
	h := addHostMem(t, s, 1, 1<<21)
	fill(h.client[:8192], 4)
	hm, err := s.RegisterMR(1, 1, 1<<30, 8192, AccessLocalWrite|AccessRemoteWrite, PageShift4K, []uint64{h.pa(0), h.pa(4096)})
	require.NoError(t, err)
	n, bad, err := a.CopyToRemote(pd, []SGE{{Addr: 1 << 30, Length: 8192, LKey: hm.LKey}}, mr.RKey, pd, va)
	require.NoError(t, err, "bad %d", bad)
	assert.Equal(t, uint64(8192), n)
	assert.Equal(t, h.client[:8192], later)
	fill(later, 5)
	_, _, err = a.CopyFromRemote(pd, []SGE{{Addr: 1 << 30, Length: 8192, LKey: hm.LKey}}, mr.RKey, pd, va)
	require.NoError(t, err)
	assert.Equal(t, later, h.client[:8192])
	// Address 0 is never mapped: a fault, not a crash.
	assert.ErrorIs(t, a.ReadRemote(mr.RKey, pd, 0, make([]byte, 8)), ErrFault)
	assert.ErrorIs(t, a.ReadRemote(mr.RKey, pd, math.MaxUint64-8, make([]byte, 8)), ErrFault)
	// Translate hands out no slices of on-demand memory.
	a.Enter()
	_, err = a.Translate(mr.LKey, pd, va, 8, 0, make([][]byte, 1))
	a.Exit()
	assert.ErrorIs(t, err, ErrFault)
}

func TestODPRegistrationChecks(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	for _, c := range []struct {
		name          string
		iova, addr, n uint64
		access        Access
		proc          *Process
		want          error
	}{
		{"no process", 4096, 4096, 4096, 0, nil, ErrInvalid},
		{"zero length", 4096, 4096, 0, 0, p, ErrInvalid},
		{"implicit with an address", 4096, 0, ODPImplicit, 0, p, ErrInvalid},
		{"too long", 0, 0, 1 << 41, 0, p, ErrOverflow},
		{"wraps", math.MaxUint64 - 10, 4096, 100, 0, p, ErrOverflow},
		{"page offsets differ", 4096, 8192 + 8, 100, 0, p, ErrInvalid},
		{"remote write without local write", 4096, 4096, 100, AccessRemoteWrite, p, ErrAccessFlags},
	} {
		_, err := s.RegisterODPMR(1, 1, c.iova, c.addr, c.n, c.access, c.proc)
		assert.ErrorIs(t, err, c.want, c.name)
	}
	// iova other than the address, same offset in the page.
	buf := anonPages(t, 1)
	mr, err := s.RegisterODPMR(1, 1, 1<<40+8, uint64(addrOf(buf))+8, 100, AccessLocalWrite, p)
	require.NoError(t, err)
	a := s.NewAccessor()
	defer a.Close()
	_, err = a.ScatterAt(PD{Owner: 1, Handle: 1}, []SGE{{Addr: 1<<40 + 8, Length: 5, LKey: mr.LKey}}, 0, []byte("iova!"))
	require.NoError(t, err)
	assert.Equal(t, "iova!", string(buf[8:13]))
	assert.Zero(t, mr.RKey, "no remote access, no rkey")
	mrs, _ := s.ReleaseOwner(1)
	assert.Equal(t, 1, mrs)
}

func TestODPProcessGone(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	buf := anonPages(t, 1)
	mr, err := s.RegisterODPMR(1, 1, uint64(addrOf(buf)), uint64(addrOf(buf)), 4096, AccessLocalWrite|AccessRemoteRead, p)
	require.NoError(t, err)
	a := s.NewAccessor()
	defer a.Close()
	require.NoError(t, a.ReadRemote(mr.RKey, PD{Owner: 1, Handle: 1}, uint64(addrOf(buf)), make([]byte, 8)))
	p.Close()
	assert.False(t, p.Alive())
	assert.ErrorIs(t, a.ReadRemote(mr.RKey, PD{Owner: 1, Handle: 1}, uint64(addrOf(buf)), make([]byte, 8)), ErrFault)
	p.Close() // idempotent
}

func TestODPPrefetch(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	buf := anonPages(t, 3)
	base := uint64(addrOf(buf))
	odp, err := s.RegisterODPMR(1, 1, base, base, 3*4096, AccessLocalWrite, p)
	require.NoError(t, err)
	ro, err := s.RegisterODPMR(1, 1, base, base, 3*4096, 0, p)
	require.NoError(t, err)
	foreign, err := s.RegisterODPMR(2, 1, base, base, 3*4096, AccessLocalWrite, p)
	require.NoError(t, err)
	h := addHostMem(t, s, 1, 1<<21)
	pinned, err := s.RegisterMR(1, 1, 1<<30, 4096, AccessLocalWrite, PageShift4K, []uint64{h.pa(0)})
	require.NoError(t, err)

	sge := func(addr, n uint64, key uint32) []SGE { return []SGE{{Addr: addr, Length: uint32(n), LKey: key}} }
	for _, adv := range []uint32{AdvicePrefetch, AdvicePrefetchWrite, AdvicePrefetchNoFault} {
		assert.NoError(t, s.Prefetch(1, 1, adv, sge(base+10, 3*4096-10, odp.LKey)), "advice %d", adv)
	}
	assert.NoError(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base, 0, odp.LKey)), "empty SGE")
	assert.NoError(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base, 4096, ro.LKey)))
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetchWrite, sge(base, 4096, ro.LKey)), ErrNotPrefetchable, "no local write")
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base, 4096, foreign.LKey)), ErrNotPrefetchable, "another owner's MR")
	assert.ErrorIs(t, s.Prefetch(1, 2, AdvicePrefetch, sge(base, 4096, odp.LKey)), ErrNotPrefetchable, "another PD")
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(1<<30, 4096, pinned.LKey)), ErrNotPrefetchable, "not on demand")
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base, 4096, 0x12345)), ErrNotPrefetchable, "no such key")
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base+4096, 3*4096, odp.LKey)), ErrBounds)
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(math.MaxUint64-10, 100, odp.LKey)), ErrBounds)
	munmap(t, buf[8192:])
	assert.ErrorIs(t, s.Prefetch(1, 1, AdvicePrefetch, sge(base, 3*4096, odp.LKey)), ErrFault)
	assert.NoError(t, s.Prefetch(1, 1, AdvicePrefetchNoFault, sge(base, 3*4096, odp.LKey)), "no fault: nothing read")
}

// TestODPHotPathAllocs: the on-demand copy paths allocate nothing once
// the accessor's bounce buffer exists.
func TestODPHotPathAllocs(t *testing.T) {
	s := newSpace(t, Config{})
	p := openSelf(t)
	buf := anonPages(t, 2)
	base := uint64(addrOf(buf))
	mr, err := s.RegisterODPMR(1, 1, base, base, 8192, AccessLocalWrite|AccessRemote, p)
	require.NoError(t, err)
	a := s.NewAccessor()
	defer a.Close()
	pd := PD{Owner: 1, Handle: 1}
	sges := []SGE{{Addr: base, Length: 8192, LKey: mr.LKey}}
	pkt := make([]byte, 4096)
	var sink discardSink
	_, _ = a.GatherInto(pd, sges, 0, 4096, &sink)
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = a.ScatterAt(pd, sges, 100, pkt)
		_, _ = a.GatherInto(pd, sges, 100, 4096, &sink)
		_ = a.WriteRemote(mr.RKey, pd, base+8, pkt[:64])
		_, _ = a.FetchAdd(mr.RKey, pd, base+8, 1)
	})
	assert.Zero(t, allocs)
}

type discardSink struct{ n int }

func (d *discardSink) Put(b []byte) { d.n += len(b) }

func putWord(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
func word(b []byte) uint64       { return binary.NativeEndian.Uint64(b) }

// munmap unmaps b (part of a mapping of anonPages: unix.Munmap takes
// whole mappings only).
func munmap(t *testing.T, b []byte) {
	t.Helper()
	_, _, e := unix.Syscall(unix.SYS_MUNMAP, addrOf(b), uintptr(len(b)), 0)
	require.Zero(t, e)
}
