package dma

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

func TestRegisterMRRejects(t *testing.T) {
	s := newSpace(t, Config{MaxMRBytes: 1 << 30, MaxPagesPerMR: 1024})
	a := addHostMem(t, s, 1, 64*kib)        // owner 1, 4 KiB pages
	a2 := addHostMem(t, s, 1, 4*mib+64*kib) // owner 1, ends 64 KiB into a 2 MiB page
	b := addHostMem(t, s, 2, 64*kib)        // owner 2

	pg := func(h hostMem, off uint64) uint64 { return h.pa(off) }
	for _, tc := range []struct {
		name   string
		owner  Owner
		iova   uint64
		length uint64
		access Access
		shift  uint
		pages  []uint64
		want   error
	}{
		{"page outside any region (guard gap)", 1, 0, 4096, 0, PageShift4K, []uint64{pg(a, 64*kib)}, ErrPAOutside},
		{"page at PA 0", 1, 0, 4096, 0, PageShift4K, []uint64{0}, ErrPAOutside},
		{"page far beyond", 1, 0, 4096, 0, PageShift4K, []uint64{1 << 61}, ErrPAOutside},
		{"page in another owner's region", 1, 0, 8192, 0, PageShift4K, []uint64{pg(a, 0), pg(b, 4096)}, ErrNotOwner},
		{"2 MiB page straddling region end", 1, 0, 2 * mib, 0, PageShift2M, []uint64{pg(a2, 4*mib)}, ErrPAOutside},
		{"2 MiB page larger than region", 1, 0, 2 * mib, 0, PageShift2M, []uint64{pg(a, 0)}, ErrPAOutside},
		{"misaligned 4K page", 1, 0, 4096, 0, PageShift4K, []uint64{pg(a, 512)}, ErrPageAlign},
		{"4K-aligned but not 2M-aligned page", 1, 0, 2 * mib, 0, PageShift2M, []uint64{pg(a2, 4096)}, ErrPageAlign},
		{"too few pages", 1, 0x100, 8192, 0, PageShift4K, []uint64{pg(a, 0), pg(a, 4096)}, ErrPageCount},
		{"too many pages", 1, 0, 8192, 0, PageShift4K, []uint64{pg(a, 0), pg(a, 4096), pg(a, 8192)}, ErrPageCount},
		{"no pages", 1, 0, 4096, 0, PageShift4K, nil, ErrPageCount},
		{"iova+length wraps", 1, math.MaxUint64 - 4095, 8192, 0, PageShift4K, []uint64{pg(a, 0), pg(a, 4096)}, ErrOverflow},
		{"range ends exactly at 2^64", 1, math.MaxUint64 - 4095, 4096, 0, PageShift4K, []uint64{pg(a, 0)}, ErrOverflow},
		{"length above max", 1, 0, 2 << 30, 0, PageShift4K, []uint64{pg(a, 0)}, ErrOverflow},
		{"zero length", 1, 0, 0, 0, PageShift4K, nil, ErrInvalid},
		{"more pages than allowed", 1, 0, 1025 * 4096, 0, PageShift4K, make([]uint64, 1025), ErrTooLarge},
		{"page shift 16", 1, 0, 65536, 0, 16, []uint64{pg(a, 0)}, ErrPageSize},
		{"page shift 30", 1, 0, 4096, 0, 30, []uint64{pg(a, 0)}, ErrPageSize},
		{"remote write without local write", 1, 0, 4096, AccessRemoteWrite, PageShift4K, []uint64{pg(a, 0)}, ErrAccessFlags},
		{"remote atomic without local write", 1, 0, 4096, AccessRemoteAtomic | AccessRemoteRead, PageShift4K, []uint64{pg(a, 0)}, ErrAccessFlags},
		{"unknown access bit", 1, 0, 4096, 1 << 5, PageShift4K, []uint64{pg(a, 0)}, ErrAccessFlags},
		{"owner without memory", 3, 0, 4096, 0, PageShift4K, []uint64{pg(a, 0)}, ErrNotOwner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.RegisterMR(tc.owner, 1, tc.iova, tc.length, tc.access, tc.shift, tc.pages)
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want)
		})
	}
	// No rejected registration may leave a pin behind.
	for _, h := range []hostMem{a, a2, b} {
		owner := Owner(1)
		if h.info.PA == b.info.PA {
			owner = 2
		}
		assert.NoError(t, s.RemoveRegion(owner, h.info.Handle))
	}
}

func TestRegisterMRPinsRegions(t *testing.T) {
	s := newSpace(t, Config{})
	a := addHostMem(t, s, 1, 16*kib)
	b := addHostMem(t, s, 1, 16*kib)
	mr, err := s.RegisterMR(1, 7, 0x7000, 8192, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{b.pa(4096), a.pa(0)})
	require.NoError(t, err)
	assert.NotEqual(t, mr.LKey, mr.RKey, "remote access: an rkey of its own")
	assert.Equal(t, mr.LKey>>8, mr.RKey>>8, "same index, another variant")
	assert.NotZero(t, mr.LKey>>8, "index 0 is never used")

	assert.ErrorIs(t, s.RemoveRegion(1, a.info.Handle), ErrBusy)
	assert.ErrorIs(t, s.RemoveRegion(1, b.info.Handle), ErrBusy)
	assert.ErrorIs(t, s.DeregisterMR(2, mr.LKey), ErrNoMR, "another owner cannot deregister it")
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	assert.ErrorIs(t, s.DeregisterMR(1, mr.LKey), ErrNoMR, "double deregistration")
	assert.NoError(t, s.RemoveRegion(1, a.info.Handle))
	assert.NoError(t, s.RemoveRegion(1, b.info.Handle))

	local := addHostMem(t, s, 1, 4096)
	mr, err = s.RegisterMR(1, 7, 0, 4096, AccessLocalWrite, PageShift4K, []uint64{local.pa(0)})
	require.NoError(t, err)
	assert.NotZero(t, mr.RKey, "every MR has an rkey (rxe, mlx5)")
	assert.NotEqual(t, mr.LKey, mr.RKey)
}

// TestTranslateOutOfOrder4K registers an MR whose pages are deliberately
// out of order in PA space, in two regions, and checks every translation
// and copy against the client's own mapping.
func TestTranslateOutOfOrder4K(t *testing.T) {
	s := newSpace(t, Config{})
	r0 := addHostMem(t, s, 1, 64*kib)
	r1 := addHostMem(t, s, 1, 64*kib)
	fill(r0.client, 0x11)
	fill(r1.client, 0x22)

	// MR page i -> (region, page offset). Pages 2,3 are contiguous in r0 (merge).
	type loc struct {
		h   hostMem
		off uint64
	}
	layout := []loc{{r0, 5 * 4096}, {r1, 0}, {r0, 2 * 4096}, {r0, 3 * 4096}, {r1, 9 * 4096}, {r0, 0}}
	pages := make([]uint64, len(layout))
	for i, l := range layout {
		pages[i] = l.h.pa(l.off)
	}
	const iova = 0x7f00_1234_5000 + 0x123 // not page aligned
	length := uint64(len(layout))*4096 - 0x123 - 0x200
	mr, err := s.RegisterMR(1, 1, iova, length, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead, PageShift4K, pages)
	require.NoError(t, err)
	pd := PD{1, 1}

	// expected returns the client's bytes for MR iova [v, v+n).
	expected := func(v, n uint64) []byte {
		out := make([]byte, 0, n)
		for n > 0 {
			rel := v - (iova &^ 4095)
			l := layout[rel/4096]
			in := rel % 4096
			c := min(4096-in, n)
			out = append(out, l.h.client[l.off+in:l.off+in+c]...)
			v += c
			n -= c
		}
		return out
	}

	acc := s.NewAccessor()
	defer acc.Close()
	segs := make([][]byte, 8)

	for _, tc := range []struct {
		name   string
		off, n uint64
		nseg   int
	}{
		{"whole MR", 0, length, 5},
		{"one byte", 17, 1, 1},
		{"inside first page", 0, 4096 - 0x123, 1},
		{"straddle page 0/1", 4096 - 0x123 - 10, 20, 2},
		{"merged pages 2-3", 2*4096 - 0x123, 8192, 1},
		{"straddle merged into page 4", 3*4096 - 0x123 + 100, 4096, 2},
		{"last byte", length - 1, 1, 1},
		{"zero length", 100, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc.Enter()
			defer acc.Exit()
			n, err := acc.Translate(mr.LKey, pd, iova+tc.off, tc.n, AccessLocalWrite, segs)
			require.NoError(t, err)
			assert.Equal(t, tc.nseg, n)
			got := []byte{}
			for _, sg := range segs[:n] {
				assert.True(t, inMapping(s, sg), "segment inside a mapping")
				got = append(got, sg...)
			}
			assert.Equal(t, expected(iova+tc.off, tc.n), got)
		})
	}

	// Gather with several SGEs at every offset that straddles pages.
	sges := []SGE{
		{Addr: iova + 4000, Length: 300, LKey: mr.LKey},       // crosses page 0/1
		{Addr: iova + 10, Length: 0, LKey: 0xdeadbe00},        // empty: skipped, key ignored
		{Addr: iova + 8000, Length: 9000, LKey: mr.LKey},      // crosses 1/2, merged 2-3, into 4
		{Addr: iova + length - 50, Length: 50, LKey: mr.LKey}, // tail
	}
	var want []byte
	for _, sg := range sges {
		if sg.Length > 0 {
			want = append(want, expected(sg.Addr, uint64(sg.Length))...)
		}
	}
	total, bad, err := acc.Validate(pd, sges, 0)
	require.NoError(t, err, "sge %d", bad)
	require.Equal(t, uint64(len(want)), total)
	for _, off := range []uint64{0, 1, 299, 300, 301, 4096, 9299, 9300, 9330} {
		for _, n := range []int{1, 64, 1024, len(want) - int(off)} {
			if int(off)+n > len(want) {
				continue
			}
			dst := make([]byte, n)
			bad, err := acc.GatherAt(pd, sges, off, dst)
			require.NoError(t, err, "off %d n %d sge %d", off, n, bad)
			require.Equal(t, want[off:int(off)+n], dst, "gather off %d n %d", off, n)
			var sink collectSink
			bad, err = acc.GatherInto(pd, sges, off, uint64(n), &sink)
			require.NoError(t, err, "off %d n %d sge %d", off, n, bad)
			require.Equal(t, want[off:int(off)+n], sink.b, "gather into off %d n %d", off, n)
		}
	}
	_, err = acc.GatherInto(pd, sges, uint64(len(want))-10, 11, new(collectSink))
	assert.ErrorIs(t, err, ErrLength)
	_, err = acc.GatherAt(pd, sges, uint64(len(want))-10, make([]byte, 11))
	assert.ErrorIs(t, err, ErrLength)

	// Scatter a new pattern in packet-sized pieces; check via the client.
	msg := make([]byte, len(want))
	fill(msg, 0x99)
	for off := 0; off < len(msg); off += 1024 {
		end := min(off+1024, len(msg))
		bad, err := acc.ScatterAt(pd, sges, uint64(off), msg[off:end])
		require.NoError(t, err, "sge %d", bad)
	}
	var got []byte
	for _, sg := range sges {
		if sg.Length > 0 {
			got = append(got, expected(sg.Addr, uint64(sg.Length))...)
		}
	}
	assert.Equal(t, msg, got, "scattered bytes read back through the client's mapping")
	bad, err = acc.ScatterAt(pd, sges, 0, make([]byte, len(msg)+1))
	assert.ErrorIs(t, err, ErrLength)
	assert.Equal(t, len(sges), bad)

	// Remote read/write straddling pages.
	wbuf := bytes.Repeat([]byte{0xab, 0xcd}, 3000)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd, iova+4000, wbuf))
	assert.Equal(t, wbuf, expected(iova+4000, uint64(len(wbuf))))
	rbuf := make([]byte, len(wbuf)+200)
	require.NoError(t, acc.ReadRemote(mr.RKey, pd, iova+3900, rbuf))
	assert.Equal(t, expected(iova+3900, uint64(len(rbuf))), rbuf)
	var sink collectSink
	require.NoError(t, acc.ReadRemoteInto(mr.RKey, pd, iova+3900, uint64(len(rbuf)), &sink))
	assert.Equal(t, rbuf, sink.b)
	assert.Greater(t, sink.n, 1, "pieces across pages")
	// A failing check puts nothing.
	sink = collectSink{}
	assert.ErrorIs(t, acc.ReadRemoteInto(mr.RKey, pd, iova+length-10, 11, &sink), ErrBounds)
	assert.ErrorIs(t, acc.ReadRemoteInto(mr.LKey^0xff, pd, iova, 8, &sink), ErrBadKey)
	assert.Empty(t, sink.b)
}

// TestTranslate2M uses 2 MiB pages out of order and copies straddling
// 2 MiB boundaries.
func TestTranslate2M(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 8*mib)
	fill(h.client, 0x3c)
	order := []uint64{3, 0, 2} // 2 MiB page index in the region, per MR page
	pages := make([]uint64, len(order))
	for i, p := range order {
		pages[i] = h.pa(p * 2 * mib)
	}
	const iova = 0x4000_0000_0000 + 0x1000 // 4K aligned, not 2M aligned
	length := uint64(3*2*mib - 0x1000)
	mr, err := s.RegisterMR(1, 9, iova, length, AccessLocalWrite|AccessRemoteRead|AccessRemoteWrite, PageShift2M, pages)
	require.NoError(t, err)
	pd := PD{1, 9}
	clientAt := func(v uint64) []byte { // client bytes from v to the end of its page
		rel := v - (iova &^ (2*mib - 1))
		p := order[rel/(2*mib)]
		in := rel % (2 * mib)
		return h.client[p*2*mib+in : (p+1)*2*mib]
	}

	acc := s.NewAccessor()
	defer acc.Close()
	segs := make([][]byte, 4)
	acc.Enter()
	n, err := acc.Translate(mr.LKey, pd, iova, length, 0, segs)
	acc.Exit()
	require.NoError(t, err)
	require.Equal(t, 3, n)
	assert.Len(t, segs[0], 2*mib-0x1000)
	assert.Len(t, segs[1], 2*mib)
	assert.Len(t, segs[2], 2*mib)

	// A 1 MiB remote write centred on the boundary of MR pages 0 and 1.
	boundary := uint64(iova&^(2*mib-1)) + 2*mib
	src := make([]byte, mib)
	fill(src, 0xe1)
	require.NoError(t, acc.WriteRemote(mr.RKey, pd, boundary-mib/2, src))
	assert.Equal(t, src[:mib/2], clientAt(boundary - mib/2)[:mib/2])
	assert.Equal(t, src[mib/2:], clientAt(boundary)[:mib/2])

	// Gather across both boundaries with one SGE.
	sges := []SGE{{Addr: boundary - 100, Length: 2*mib + 200, LKey: mr.LKey}}
	dst := make([]byte, 2*mib+200)
	_, err = acc.GatherAt(pd, sges, 0, dst)
	require.NoError(t, err)
	assert.Equal(t, clientAt(boundary - 100)[:100], dst[:100])
	assert.Equal(t, clientAt(boundary)[:2*mib], dst[100:100+2*mib])
	assert.Equal(t, clientAt(boundary + 2*mib)[:100], dst[100+2*mib:])
}

func TestTranslateErrors(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 64*kib)
	h2 := addHostMem(t, s, 2, 64*kib)
	ro, err := s.RegisterMR(1, 1, 0x10000, 8192, 0, PageShift4K, []uint64{h.pa(4096), h.pa(0)})
	require.NoError(t, err)
	rw, err := s.RegisterMR(1, 1, 0x20000, 8192, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(8192), h.pa(12288)})
	require.NoError(t, err)
	inv, err := s.RegisterMR(1, 1, 0x30000, 4096, AccessLocalWrite, PageShift4K, []uint64{h.pa(16384)})
	require.NoError(t, err)
	other, err := s.RegisterMR(2, 1, 0x10000, 4096, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{h2.pa(0)})
	require.NoError(t, err)

	assert.ErrorIs(t, s.Invalidate(inv.LKey, PD{1, 2}), ErrWrongPD)
	require.NoError(t, s.Invalidate(inv.LKey, PD{1, 1}))
	assert.ErrorIs(t, s.Invalidate(inv.LKey, PD{1, 1}), ErrBadKey, "already invalid")

	acc := s.NewAccessor()
	defer acc.Close()
	segs := make([][]byte, 1)
	pd := PD{1, 1}
	for _, tc := range []struct {
		name    string
		key     uint32
		pd      PD
		iova, n uint64
		want    Access
		err     error
	}{
		{"ok read", ro.LKey, pd, 0x10000, 10, 0, nil},
		{"key 0", 0, pd, 0x10000, 10, 0, ErrBadKey},
		{"unknown index", 0x1234500 | ro.LKey&0xff, pd, 0x10000, 10, 0, ErrBadKey},
		{"index beyond table", 0xffffff00, pd, 0x10000, 10, 0, ErrBadKey},
		{"wrong variant", ro.LKey ^ 0x01, pd, 0x10000, 10, 0, ErrBadKey},
		{"invalidated", inv.LKey, pd, 0x30000, 10, 0, ErrBadKey},
		{"wrong PD handle", ro.LKey, PD{1, 2}, 0x10000, 10, 0, ErrWrongPD},
		{"same PD handle, other owner", ro.LKey, PD{2, 1}, 0x10000, 10, 0, ErrWrongPD},
		{"other owner's key from owner 1", other.LKey, pd, 0x10000, 10, 0, ErrWrongPD},
		{"local write on read-only MR", ro.LKey, pd, 0x10000, 10, AccessLocalWrite, ErrAccess},
		{"remote read of an MR without remote access", ro.LKey, pd, 0x10000, 10, AccessRemoteRead, ErrBadKey},
		{"remote write without flag", rw.RKey, pd, 0x20000, 10, AccessRemoteWrite, ErrAccess},
		{"remote read ok", rw.RKey, pd, 0x20000, 10, AccessRemoteRead, nil},
		{"lkey used as an rkey", rw.LKey, pd, 0x20000, 10, AccessRemoteRead, ErrBadKey},
		{"rkey used as an lkey", rw.RKey, pd, 0x20000, 10, 0, ErrBadKey},
		{"before start", ro.LKey, pd, 0xffff, 2, 0, ErrBounds},
		{"past end", ro.LKey, pd, 0x11fff, 2, 0, ErrBounds},
		{"starts at end", ro.LKey, pd, 0x12000, 1, 0, ErrBounds},
		{"huge length", ro.LKey, pd, 0x10000, math.MaxUint64, 0, ErrBounds},
		{"iova wraps", ro.LKey, pd, math.MaxUint64, 2, 0, ErrBounds},
		{"too few segments", ro.LKey, pd, 0x10f00, 0x200, 0, ErrSegments},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acc.Enter()
			_, err := acc.Translate(tc.key, tc.pd, tc.iova, tc.n, tc.want, segs)
			acc.Exit()
			if tc.err == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.err)
			}
		})
	}
	_, err = acc.Translate(ro.LKey, pd, 0x10000, 1, 0, segs)
	assert.ErrorIs(t, err, ErrNoSection)
	assert.NoError(t, acc.CheckRemote(rw.RKey, pd, 0x20000, 8192, AccessRemoteRead))
	assert.ErrorIs(t, acc.CheckRemote(rw.RKey, pd, 0x20000, 8193, AccessRemoteRead), ErrBounds)
	assert.ErrorIs(t, acc.CheckRemote(rw.RKey, pd, 0x20000, 1, AccessRemoteWrite), ErrAccess)
	assert.ErrorIs(t, acc.CheckRemote(rw.RKey, PD{2, 1}, 0x20000, 1, AccessRemoteRead), ErrWrongPD)
	assert.ErrorIs(t, acc.CheckRemote(inv.LKey, pd, 0x30000, 1, 0), ErrBadKey)

	// SGE errors report the failing index.
	sges := []SGE{{Addr: 0x10000, Length: 100, LKey: ro.LKey}, {Addr: 0x20000, Length: 100, LKey: rw.LKey}, {Addr: 0x30000, Length: 100, LKey: inv.LKey}}
	_, bad, err := acc.Validate(pd, sges, 0)
	assert.ErrorIs(t, err, ErrBadKey)
	assert.Equal(t, 2, bad)
	bad, err = acc.ScatterAt(pd, sges, 0, make([]byte, 150))
	assert.ErrorIs(t, err, ErrAccess, "read-only MR as receive buffer")
	assert.Equal(t, 0, bad)
	bad, err = acc.GatherAt(pd, sges, 150, make([]byte, 100))
	assert.ErrorIs(t, err, ErrBadKey)
	assert.Equal(t, 2, bad)
	bad, err = acc.GatherAt(pd, []SGE{{Addr: math.MaxUint64 - 10, Length: 100, LKey: ro.LKey}}, 20, make([]byte, 10))
	assert.ErrorIs(t, err, ErrBounds, "wrapping SGE")
	assert.Equal(t, 0, bad)
	_, bad, err = acc.CopyToRemote(pd, sges[:1], rw.RKey, pd, 0x20000)
	assert.ErrorIs(t, err, ErrAccess, "rkey without remote write")
	assert.Equal(t, BadRemote, bad)
	_, bad, err = acc.CopyFromRemote(pd, sges[:2], rw.RKey, pd, 0x20000)
	assert.ErrorIs(t, err, ErrAccess, "read-only local SGE")
	assert.Equal(t, 0, bad)
}

// TestStaleKeyAfterReuse: deregister and re-register until the same key
// index comes back; neither key of the previous MR may match the new one,
// lkey and rkey always differ, and the variants are not a sequence.
func TestStaleKeyAfterReuse(t *testing.T) {
	s := newSpace(t, Config{MaxMRs: 2}) // one usable index: reuse every time
	h := addHostMem(t, s, 1, 8192)
	acc := s.NewAccessor()
	defer acc.Close()
	pd := PD{1, 1}
	variants := map[uint8]bool{}
	steps := map[uint8]int{}
	var prev MRInfo
	for i := 0; i < 255; i++ {
		mr, err := s.RegisterMR(1, 1, 0x1000, 4096, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(uint64(i%2) * 4096)})
		require.NoError(t, err)
		require.Equal(t, uint32(1), mr.LKey>>8, "same index")
		require.Equal(t, uint32(1), mr.RKey>>8, "same index")
		require.NotEqual(t, mr.LKey, mr.RKey)
		variants[uint8(mr.LKey)] = true
		if prev.LKey != 0 {
			for _, old := range []uint32{prev.LKey, prev.RKey} {
				require.NotEqual(t, old, mr.LKey)
				require.NotEqual(t, old, mr.RKey)
			}
			err = acc.ReadRemote(prev.RKey, pd, 0x1000, make([]byte, 8))
			require.ErrorIs(t, err, ErrBadKey, "stale rkey %#x after reuse as %#x", prev.RKey, mr.RKey)
			_, err = acc.GatherAt(pd, []SGE{{Addr: 0x1000, Length: 8, LKey: prev.LKey}}, 0, make([]byte, 8))
			require.ErrorIs(t, err, ErrBadKey, "stale lkey %#x after reuse as %#x", prev.LKey, mr.LKey)
			steps[uint8(mr.LKey)-uint8(prev.LKey)]++
		}
		require.NoError(t, acc.ReadRemote(mr.RKey, pd, 0x1000, make([]byte, 8)))
		_, err = s.RegisterMR(1, 1, 0x1000, 4096, 0, PageShift4K, []uint64{h.pa(0)})
		require.ErrorIs(t, err, ErrLimit, "key table full")
		require.NoError(t, s.DeregisterMR(1, mr.LKey))
		err = acc.ReadRemote(mr.RKey, pd, 0x1000, make([]byte, 8))
		require.ErrorIs(t, err, ErrBadKey, "deregistered key")
		prev = mr
	}
	// 255 uniform draws from 254 values cover about 160; a counter would
	// take one step, always.
	assert.Greater(t, len(variants), 100, "variants spread")
	for d, n := range steps {
		assert.Less(t, n, 20, "step %d between consecutive variants repeats %d times", d, n)
	}
}

func TestAtomics(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 16*kib)
	at, err := s.RegisterMR(1, 1, 0x9000, 8192, AccessLocalWrite|AccessRemoteAtomic, PageShift4K, []uint64{h.pa(8192), h.pa(0)})
	require.NoError(t, err)
	noat, err := s.RegisterMR(1, 1, 0x9000, 4096, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(4096)})
	require.NoError(t, err)
	pd := PD{1, 1}
	acc := s.NewAccessor()
	defer acc.Close()

	word := func(off int) uint64 { // through the client's mapping, host order
		var v uint64
		for i := 7; i >= 0; i-- {
			v = v<<8 | uint64(h.client[off+i])
		}
		return v
	}
	// va 0x9000+4096+8 is MR page 1 = region offset 0 + 8.
	va := uint64(0x9000 + 4096 + 8)
	old, err := acc.FetchAdd(at.RKey, pd, va, 5)
	require.NoError(t, err)
	assert.Equal(t, uint64(0), old)
	old, err = acc.FetchAdd(at.RKey, pd, va, math.MaxUint64) // -1
	require.NoError(t, err)
	assert.Equal(t, uint64(5), old)
	assert.Equal(t, uint64(4), word(8))

	old, err = acc.CompareSwap(at.RKey, pd, va, 3, 100)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), old, "mismatch returns current value")
	assert.Equal(t, uint64(4), word(8), "no swap on mismatch")
	old, err = acc.CompareSwap(at.RKey, pd, va, 4, 0xdead_beef_0000_0001)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), old)
	assert.Equal(t, uint64(0xdead_beef_0000_0001), word(8))

	for _, tc := range []struct {
		name string
		key  uint32
		pd   PD
		va   uint64
		err  error
	}{
		{"misaligned by 4", at.RKey, pd, va + 4, ErrMisaligned},
		{"misaligned by 1", at.RKey, pd, va + 1, ErrMisaligned},
		{"no REMOTE_ATOMIC", noat.RKey, pd, 0x9000, ErrAccess},
		{"wrong PD", at.RKey, PD{1, 2}, va, ErrWrongPD},
		{"last word", at.RKey, pd, 0x9000 + 8192 - 8, nil},
		{"crosses MR end", at.RKey, pd, 0x9000 + 8192 - 4, ErrBounds},
		{"past end", at.RKey, pd, 0x9000 + 8192, ErrBounds},
		{"bad key", 0x100, pd, va, ErrBadKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := acc.FetchAdd(tc.key, tc.pd, tc.va, 1)
			_, err2 := acc.CompareSwap(tc.key, tc.pd, tc.va, 0, 1)
			if tc.err == nil {
				assert.NoError(t, err)
				assert.NoError(t, err2)
				return
			}
			assert.ErrorIs(t, err, tc.err)
			assert.ErrorIs(t, err2, tc.err)
		})
	}
}

func TestCopyBetweenSGEsAndRemote(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 64*kib)
	fill(h.client, 0x42)
	src, err := s.RegisterMR(1, 1, 0x1000_0f00, 3*4096-0xf00, 0, PageShift4K, []uint64{h.pa(40960), h.pa(4096), h.pa(20480)})
	require.NoError(t, err)
	dstMR, err := s.RegisterMR(2-1, 1, 0x5000, 3*4096, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(61440), h.pa(8192), h.pa(0)})
	require.NoError(t, err)
	pd := PD{1, 1}
	acc := s.NewAccessor()
	defer acc.Close()
	sges := []SGE{{Addr: 0x1000_0f00, Length: 200, LKey: src.LKey}, {Addr: 0x1000_1ff0, Length: 4000, LKey: src.LKey}}
	want := make([]byte, 4200)
	_, err = acc.GatherAt(pd, sges, 0, want)
	require.NoError(t, err)

	n, bad, err := acc.CopyToRemote(pd, sges, dstMR.RKey, pd, 0x5000+4000)
	require.NoError(t, err, "sge %d", bad)
	assert.Equal(t, uint64(4200), n)
	got := make([]byte, 4200)
	require.NoError(t, acc.ReadRemote(dstMR.RKey, pd, 0x5000+4000, got))
	assert.Equal(t, want, got)

	// And back: remote -> local SGEs of a writable MR.
	back := []SGE{{Addr: 0x5000, Length: 100, LKey: dstMR.LKey}, {Addr: 0x5000 + 10000, Length: 1000, LKey: dstMR.LKey}}
	n, _, err = acc.CopyFromRemote(pd, back, dstMR.RKey, pd, 0x5000+4000)
	require.NoError(t, err)
	assert.Equal(t, uint64(1100), n)
	b1 := make([]byte, 1100)
	_, err = acc.GatherAt(pd, back, 0, b1)
	require.NoError(t, err)
	assert.Equal(t, want[:1100], b1)
}

// TestAliasing: the same memfd added twice gets two disjoint PA ranges
// that alias the same bytes, and an MR may name the same page twice (as
// a kernel driver's page list may); neither confuses bounds or pins.
func TestAliasing(t *testing.T) {
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 16*kib)
	again, err := s.AddRegion(1, h.fd, 16*kib)
	require.NoError(t, err)
	assert.True(t, again.PA >= h.info.PA+h.info.Length+guardGap || again.PA+again.Length+guardGap <= h.info.PA, "disjoint ranges")

	fill(h.client, 0x5e)
	mr, err := s.RegisterMR(1, 1, 0x3000, 3*4096, AccessLocalWrite|AccessRemoteRead, PageShift4K, []uint64{h.pa(4096), again.PA + 4096, h.pa(4096)})
	require.NoError(t, err)
	acc := s.NewAccessor()
	defer acc.Close()
	got := make([]byte, 3*4096)
	require.NoError(t, acc.ReadRemote(mr.RKey, PD{1, 1}, 0x3000, got))
	for i := range 3 {
		assert.Equal(t, h.client[4096:8192], got[i*4096:(i+1)*4096], "MR page %d", i)
	}
	assert.ErrorIs(t, s.RemoveRegion(1, again.Handle), ErrBusy)
	require.NoError(t, s.DeregisterMR(1, mr.LKey))
	require.NoError(t, s.RemoveRegion(1, again.Handle))
	require.NoError(t, s.RemoveRegion(1, h.info.Handle))
}
