package dma

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReregisterMR(t *testing.T) {
	s := newSpace(t, Config{MaxMRBytes: 1 << 30, MaxPagesPerMR: 1024})
	a := addHostMem(t, s, 1, 64*kib)
	b := addHostMem(t, s, 1, 64*kib)
	other := addHostMem(t, s, 2, 64*kib)
	acc := s.NewAccessor()
	defer acc.Close()
	pd1, pd2 := PD{1, 1}, PD{1, 2}

	mr, err := s.RegisterMR(1, 1, 0x10000, 8192, AccessLocalWrite|AccessRemoteWrite, PageShift4K, []uint64{a.pa(0), a.pa(4096)})
	require.NoError(t, err)
	data := make([]byte, 8192)
	fill(data, 1)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd1, 0x10000, data))
	assert.Equal(t, data, a.client[:8192])

	// A new translation in region b, at another iova, pages out of order.
	got, err := s.ReregisterMR(1, mr.LKey, Rereg{Translation: &Translation{IOVA: 0x20100, Length: 7000, PageShift: PageShift4K,
		Pages: []uint64{b.pa(8192), b.pa(0)}}})
	require.NoError(t, err)
	assert.Equal(t, mr, got, "the keys stay")
	assert.ErrorIs(t, acc.WriteRemote(mr.RKey, pd1, 0x10000, data[:16]), ErrBounds, "the old translation is gone")
	fill(data, 2)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd1, 0x20100, data[:7000]))
	assert.Equal(t, data[:4096-0x100], b.client[8192+0x100:12288], "first page: b's third")
	assert.Equal(t, data[4096-0x100:7000], b.client[:7000-(4096-0x100)], "second page: b's first")
	assert.NoError(t, s.RemoveRegion(1, a.info.Handle), "region a is no longer pinned")
	assert.ErrorIs(t, s.RemoveRegion(1, b.info.Handle), ErrBusy, "region b is")

	// Access: write taken away, read given.
	ra := AccessLocalWrite | AccessRemoteRead
	_, err = s.ReregisterMR(1, mr.LKey, Rereg{Access: &ra})
	require.NoError(t, err)
	assert.ErrorIs(t, acc.WriteRemote(mr.RKey, pd1, 0x20100, data[:16]), ErrAccess)
	buf := make([]byte, 7000)
	require.NoError(t, acc.ReadRemote(mr.RKey, pd1, 0x20100, buf))
	assert.Equal(t, data[:7000], buf, "same translation")

	// PD.
	h2 := uint32(2)
	_, err = s.ReregisterMR(1, mr.LKey, Rereg{PD: &h2})
	require.NoError(t, err)
	assert.ErrorIs(t, acc.ReadRemote(mr.RKey, pd1, 0x20100, buf[:8]), ErrWrongPD)
	require.NoError(t, acc.ReadRemote(mr.RKey, pd2, 0x20100, buf[:8]))
	acc.Enter()
	_, err = acc.Translate(mr.LKey, pd2, 0x20100, 8, AccessLocalWrite, make([][]byte, 4))
	acc.Exit()
	require.NoError(t, err, "the lkey too")

	// Refusals leave the MR as it was.
	bad := AccessRemoteWrite
	for _, tc := range []struct {
		name  string
		owner Owner
		key   uint32
		ch    Rereg
		want  error
	}{
		{"nothing to change", 1, mr.LKey, Rereg{}, ErrInvalid},
		{"unknown key", 1, mr.LKey ^ 0x100, Rereg{PD: &h2}, ErrNoMR},
		{"the rkey", 1, mr.RKey, Rereg{PD: &h2}, ErrNoMR},
		{"another owner", 2, mr.LKey, Rereg{PD: &h2}, ErrNoMR},
		{"remote write without local write", 1, mr.LKey, Rereg{Access: &bad}, ErrAccessFlags},
		{"page of another owner", 1, mr.LKey, Rereg{Translation: &Translation{IOVA: 0, Length: 4096, PageShift: PageShift4K,
			Pages: []uint64{other.pa(0)}}}, ErrNotOwner},
		{"page count", 1, mr.LKey, Rereg{Translation: &Translation{IOVA: 0, Length: 8192, PageShift: PageShift4K,
			Pages: []uint64{b.pa(0)}}}, ErrPageCount},
		{"zero length", 1, mr.LKey, Rereg{Translation: &Translation{IOVA: 0, Length: 0, PageShift: PageShift4K}}, ErrInvalid},
	} {
		_, err := s.ReregisterMR(tc.owner, tc.key, tc.ch)
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
	require.NoError(t, acc.ReadRemote(mr.RKey, pd2, 0x20100, buf))
	assert.Equal(t, data[:7000], buf)

	// All three at once, the page list read from host memory.
	rw := AccessLocalWrite | AccessRemoteWrite
	h1 := uint32(1)
	list := b.pa(32 * kib)
	for i, p := range []uint64{b.pa(16 * kib), b.pa(20 * kib)} {
		for k := range 8 {
			b.client[32*kib+8*i+k] = byte(p >> (8 * k))
		}
	}
	_, err = s.ReregisterMR(1, mr.LKey, Rereg{PD: &h1, Access: &rw, Translation: &Translation{IOVA: 0x7000, Length: 8192,
		PageShift: PageShift4K, ListPA: list, NPages: 2}})
	require.NoError(t, err)
	fill(data, 3)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd1, 0x7000, data))
	assert.Equal(t, data, b.client[16*kib:24*kib])
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	assert.NoError(t, s.RemoveRegion(1, b.info.Handle), "nothing pinned after deregistration")
}

// TestReregisterWaitsForCopies: a copy that looked the MR up before the
// change holds the re-registration until it leaves its section (the old
// translation is never used after ReregisterMR returns).
func TestReregisterWaitsForCopies(t *testing.T) {
	s := newSpace(t, Config{MaxMRBytes: 1 << 30, MaxPagesPerMR: 1024})
	a := addHostMem(t, s, 1, 16*kib)
	mr, err := s.RegisterMR(1, 1, 0, 4096, AccessLocalWrite|AccessRemoteWrite, PageShift4K, []uint64{a.pa(0)})
	require.NoError(t, err)
	acc := s.NewAccessor()
	defer acc.Close()
	acc.Enter() // a worker inside a copy section
	segs := make([][]byte, 1)
	_, err = acc.Translate(mr.RKey, PD{1, 1}, 0, 16, AccessRemoteWrite, segs)
	require.NoError(t, err)
	e0 := s.epoch.Load()
	done := make(chan error, 1)
	go func() {
		_, err := s.ReregisterMR(1, mr.LKey, Rereg{Translation: &Translation{IOVA: 0, Length: 4096, PageShift: PageShift4K,
			Pages: []uint64{a.pa(8192)}}})
		done <- err
	}()
	for s.epoch.Load() == e0 { // the new translation is published, the grace period begun
		runtime.Gosched()
	}
	select {
	case err := <-done:
		t.Fatalf("ReregisterMR returned (%v) while a copy through the old translation is in its section", err)
	default:
	}
	copy(segs[0], "old translation!")
	acc.Exit()
	require.NoError(t, <-done)
	assert.Equal(t, "old translation!", string(a.client[:16]))
	require.NoError(t, acc.WriteRemote(mr.RKey, PD{1, 1}, 0, []byte("new")))
	assert.Equal(t, "new", string(a.client[8192:8195]))
}

func TestRegisterZeroBased(t *testing.T) {
	s := newSpace(t, Config{MaxMRBytes: 1 << 30, MaxPagesPerMR: 1024})
	a := addHostMem(t, s, 1, 16*kib)
	acc := s.NewAccessor()
	defer acc.Close()
	pd := PD{1, 1}
	all := AccessLocalWrite | AccessRemote
	// 400 bytes at byte 4096+100: address x is byte 4196+x.
	mr, err := s.RegisterZeroBased(1, 1, a.pa(4096+100), 400, all)
	require.NoError(t, err)
	assert.NotZero(t, mr.RKey)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd, 0, []byte("zero-based")))
	assert.Equal(t, "zero-based", string(a.client[4196:4206]))
	assert.ErrorIs(t, acc.WriteRemote(mr.RKey, pd, 396, make([]byte, 8)), ErrBounds)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd, 392, []byte("12345678")))
	assert.Equal(t, "12345678", string(a.client[4196+392:4196+400]))
	_, err = acc.FetchAdd(mr.RKey, pd, 0, 1)
	assert.ErrorIs(t, err, ErrMisaligned, "address 0 is byte 4196: not 8-byte aligned")
	clear(a.client[4200:4208])
	a.client[4200] = 41
	old, err := acc.FetchAdd(mr.RKey, pd, 4, 1)
	require.NoError(t, err)
	assert.Equal(t, uint64(41), old)
	assert.Equal(t, byte(42), a.client[4200])

	// Across a page boundary: 8000 bytes from byte 100.
	big, err := s.RegisterZeroBased(1, 1, a.pa(100), 8000, all)
	require.NoError(t, err)
	data := make([]byte, 8000)
	fill(data, 5)
	require.NoError(t, acc.WriteRemote(big.RKey, pd, 0, data))
	assert.Equal(t, data, a.client[100:8100])

	empty, err := s.RegisterZeroBased(1, 1, a.pa(16*kib-4), 0, all)
	require.NoError(t, err, "a zero-length MR")
	assert.ErrorIs(t, acc.WriteRemote(empty.RKey, pd, 0, []byte{1}), ErrBounds)

	la := AccessLocalWrite
	_, err = s.ReregisterMR(1, mr.LKey, Rereg{Access: &la})
	assert.ErrorIs(t, err, ErrInvalid, "a zero-based MR cannot be re-registered")
	_, err = s.RegisterZeroBased(2, 1, a.pa(0), 16, all)
	assert.ErrorIs(t, err, ErrNotOwner)
	_, err = s.RegisterZeroBased(1, 1, a.pa(16*kib-8), 16, all)
	assert.ErrorIs(t, err, ErrPAOutside, "past the region")
	for _, k := range []uint32{mr.LKey, big.LKey, empty.LKey} {
		require.NoError(t, s.DeregisterMR(1, k))
	}
	assert.NoError(t, s.RemoveRegion(1, a.info.Handle))
}
