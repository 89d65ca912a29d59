package dma

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestConcurrentRegistrationAndCopies runs workers copying through MRs
// while the control plane keeps replacing MRs and removing and adding the
// regions under them. Every successful copy must return the bytes of the
// MR it named (never a reused or unmapped region: an unmap under a copy
// would fault), and the only error allowed is ErrBadKey.
func TestConcurrentRegistrationAndCopies(t *testing.T) {
	const (
		slots   = 4
		rounds  = 120
		workers = 4
		size    = 64 * kib
	)
	s := newSpace(t, Config{MaxMRs: 64})
	pd := PD{1, 1}
	// published[i] holds key<<8 | fill byte of the MR currently in slot i.
	var published [slots]atomic.Uint64
	type live struct {
		key    uint32
		handle uint32
	}
	var cur [slots]live

	addMR := func(i int, v byte) {
		fd := newMemfd(t, size, unix.F_SEAL_SHRINK)
		m := clientMap(t, fd, size)
		for j := range m {
			m[j] = v
		}
		info, err := s.AddRegion(1, fd, size)
		require.NoError(t, err)
		// Pages reversed so copies cross non-contiguous pages.
		pages := make([]uint64, size/4096)
		for j := range pages {
			pages[j] = info.PA + uint64(len(pages)-1-j)*4096
		}
		mr, err := s.RegisterMR(1, 1, 0x10000, size, AccessLocalWrite|AccessRemoteRead|AccessRemoteAtomic, PageShift4K, pages)
		require.NoError(t, err)
		cur[i] = live{mr.LKey, info.Handle}
		published[i].Store(uint64(mr.LKey)<<8 | uint64(v))
	}
	for i := range slots {
		addMR(i, byte(i+1))
	}

	var stop atomic.Bool
	var copies, badKeys atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acc := s.NewAccessor()
			defer acc.Close()
			buf := make([]byte, 6000)
			segs := make([][]byte, 4)
			for n := 0; !stop.Load(); n++ {
				p := published[(n+w)%slots].Load()
				key, v := uint32(p>>8), byte(p)
				var err error
				switch n % 3 {
				case 0:
					_, err = acc.GatherAt(pd, []SGE{{Addr: 0x10000 + 3000, Length: 6000, LKey: key}}, 0, buf)
				case 1:
					err = acc.ReadRemote(key, pd, 0x10000+uint64(n%50)*1000, buf)
				case 2:
					acc.Enter()
					var k int
					k, err = acc.Translate(key, pd, 0x10000+4000, 6000, 0, segs)
					// Hold the section for a while, re-reading the
					// segments: a region unmapped under it would fault.
					for rep := 0; err == nil && rep < 64; rep++ {
						o := 0
						for _, sg := range segs[:k] {
							o += copy(buf[o:], sg)
						}
					}
					acc.Exit()
				}
				if errors.Is(err, ErrBadKey) {
					badKeys.Add(1)
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				for _, b := range buf {
					if b != v {
						errs <- errors.New("copy returned bytes of another MR")
						return
					}
				}
				copies.Add(1)
			}
		}()
	}

	for r := range rounds {
		i := r % slots
		old := cur[i]
		if r%5 == 0 {
			_ = s.Invalidate(old.key, pd)
		}
		require.NoError(t, s.DeregisterMR(1, old.key))
		require.NoError(t, s.RemoveRegion(1, old.handle)) // waits for copies in flight
		addMR(i, byte(r+slots+1))
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Positive(t, copies.Load(), "workers copied")
	t.Logf("%d copies, %d stale-key errors", copies.Load(), badKeys.Load())
}

// TestConcurrentAtomics: FetchAdd from several workers and the client's own
// CPU atomics on the same word never lose an update.
func TestConcurrentAtomics(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 8192)
	mr, err := s.RegisterMR(1, 1, 0x1000, 8192, AccessLocalWrite|AccessRemoteAtomic, PageShift4K, []uint64{h.pa(4096), h.pa(0)})
	require.NoError(t, err)
	pd := PD{1, 1}
	const workers, adds = 4, 2000
	client := word64(h.client[16:24]) // the client's view of the word at va 0x2010
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acc := s.NewAccessor()
			defer acc.Close()
			for range adds {
				if _, err := acc.FetchAdd(mr.RKey, pd, 0x2010, 1); err != nil {
					t.Error(err)
					return
				}
				for {
					old, err := acc.CompareSwap(mr.RKey, pd, 0x2010, 0, 0) // read
					if err != nil {
						t.Error(err)
						return
					}
					if sw, _ := acc.CompareSwap(mr.RKey, pd, 0x2010, old, old+2); sw == old {
						break
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range adds {
			atomic.AddUint64(client, 10)
		}
	}()
	wg.Wait()
	assert.Equal(t, uint64(workers*adds*3+adds*10), atomic.LoadUint64(client))
}

// TestHotPathAllocs: translation, copies and atomics allocate nothing,
// on success and on error.
func TestHotPathAllocs(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 64*kib)
	pages := []uint64{h.pa(8192), h.pa(0), h.pa(4096), h.pa(12288)}
	mr, err := s.RegisterMR(1, 1, 0x10000, 4*4096, AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite|AccessRemoteAtomic, PageShift4K, pages)
	require.NoError(t, err)
	pd := PD{1, 1}
	acc := s.NewAccessor()
	defer acc.Close()
	segs := make([][]byte, 8)
	buf := make([]byte, 9001)
	sges := []SGE{{Addr: 0x10000 + 100, Length: 5000, LKey: mr.LKey}, {Addr: 0x10000 + 9000, Length: 4000, LKey: mr.LKey}}
	bad := []SGE{{Addr: 0x10000, Length: 10, LKey: mr.LKey ^ 1}}
	for _, tc := range []struct {
		name string
		fn   func()
		want error
	}{
		{"Translate", func() { acc.Enter(); _, err = acc.Translate(mr.LKey, pd, 0x10000+100, 9000, 0, segs); acc.Exit() }, nil},
		{"Translate bad key", func() { acc.Enter(); _, err = acc.Translate(1, pd, 0x10000, 10, 0, segs); acc.Exit() }, ErrBadKey},
		{"Translate bounds", func() { acc.Enter(); _, err = acc.Translate(mr.LKey, pd, 0, 10, 0, segs); acc.Exit() }, ErrBounds},
		{"GatherAt", func() { _, err = acc.GatherAt(pd, sges, 0, buf[:9000]) }, nil},
		{"GatherAt bad key", func() { _, err = acc.GatherAt(pd, bad, 0, buf[:10]) }, ErrBadKey},
		{"ScatterAt", func() { _, err = acc.ScatterAt(pd, sges, 1000, buf[:4000]) }, nil},
		{"ScatterAt length", func() { _, err = acc.ScatterAt(pd, sges, 0, buf[:9001]) }, ErrLength},
		{"Validate", func() { _, _, err = acc.Validate(pd, sges, AccessLocalWrite) }, nil},
		{"ReadRemote", func() { err = acc.ReadRemote(mr.RKey, pd, 0x10000+4000, buf[:5000]) }, nil},
		{"WriteRemote", func() { err = acc.WriteRemote(mr.RKey, pd, 0x10000+4000, buf[:5000]) }, nil},
		{"WriteRemote wrong PD", func() { err = acc.WriteRemote(mr.RKey, PD{2, 1}, 0x10000, buf[:10]) }, ErrWrongPD},
		{"CopyToRemote", func() { _, _, err = acc.CopyToRemote(pd, sges[:1], mr.RKey, pd, 0x10000+8000) }, nil},
		{"CheckRemote", func() { err = acc.CheckRemote(mr.RKey, pd, 0x10000, 4*4096, AccessRemoteWrite) }, nil},
		{"CheckRemote bounds", func() { err = acc.CheckRemote(mr.RKey, pd, 0x10000, 4*4096+1, AccessRemoteWrite) }, ErrBounds},
		{"CompareSwap", func() { _, err = acc.CompareSwap(mr.RKey, pd, 0x10000+4096, 1, 2) }, nil},
		{"FetchAdd", func() { _, err = acc.FetchAdd(mr.RKey, pd, 0x10000+4096, 1) }, nil},
		{"FetchAdd misaligned", func() { _, err = acc.FetchAdd(mr.RKey, pd, 0x10000+4097, 1) }, ErrMisaligned},
		{"Invalidate bad key", func() { err = s.Invalidate(1, pd) }, ErrBadKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Zero(t, testing.AllocsPerRun(100, tc.fn))
			if tc.want == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.want)
			}
		})
	}
}
