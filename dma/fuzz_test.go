package dma

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// FuzzRegisterTranslate feeds arbitrary registration parameters and
// translation requests. Invariants: no panic; a registration succeeds only
// for a page list a reference model accepts; every translated segment lies
// inside a live mapping and holds exactly the bytes the reference model
// finds through the client's mapping; errors are the model's errors.
func FuzzRegisterTranslate(f *testing.F) {
	s := newSpace(f, Config{MaxMRBytes: 1 << 30})
	ra := addHostMem(f, s, 1, 64*kib)
	rb := addHostMem(f, s, 1, 4*mib)
	rc := addHostMem(f, s, 2, 64*kib)
	fill(ra.client, 0xa0)
	fill(rb.client, 0xb0)
	fill(rc.client, 0xc0)
	regions := []hostMem{ra, rb, rc}
	acc := s.NewAccessor()
	f.Cleanup(acc.Close)

	f.Add(uint64(0x1000), uint64(8192), uint32(7), false, []byte{0, 1, 0, 0}, uint64(0x1100), uint64(5000), uint32(1), false, uint32(0))
	f.Add(uint64(0x1234), uint64(3*4096), uint32(15), false, []byte{1, 5, 0, 3, 1, 9, 0, 2}, uint64(0x1234), uint64(3*4096), uint32(8), false, uint32(258))
	f.Add(uint64(0x200000), uint64(4*mib), uint32(1), true, []byte{1, 1, 1, 0}, uint64(0x3ffff0), uint64(64), uint32(0), false, uint32(0))
	f.Add(uint64(0), uint64(4096), uint32(0), false, []byte{2, 0}, uint64(0), uint64(8), uint32(0), false, uint32(260))
	f.Add(uint64(0), uint64(4096), uint32(0), false, []byte{3, 16}, uint64(0), uint64(8), uint32(0), false, uint32(0))
	f.Add(uint64(math.MaxUint64-100), uint64(4096), uint32(1), false, []byte{0, 0, 0, 1}, uint64(math.MaxUint64-50), uint64(8), uint32(0), true, uint32(262))
	f.Add(uint64(0x10), uint64(100), uint32(2), false, []byte{0x80, 3}, uint64(0x10), uint64(8), uint32(2), false, uint32(0))
	f.Add(uint64(0x77), uint64(0), uint32(0x101), false, []byte{0, 7, 1, 2, 0, 8, 0, 3}, uint64(0x1000), uint64(9000), uint32(0), false, uint32(264))

	segs := make([][]byte, 24)
	f.Fuzz(func(t *testing.T, iova, length uint64, access uint32, huge bool, sel []byte, tiova, tlen uint64, want uint32, otherPD bool, rawKey uint32) {
		shift := uint(PageShift4K)
		if huge {
			shift = PageShift2M
		}
		ps := uint64(1) << shift
		if len(sel) > 64 {
			sel = sel[:64]
		}
		pages := make([]uint64, len(sel)/2)
		for i := range pages {
			kind, idx := sel[2*i], uint64(sel[2*i+1])
			var pa uint64
			switch kind & 3 {
			case 0, 1, 2:
				h := regions[kind&3]
				pa = h.info.PA + idx*ps
			case 3: // the guard gap after region a, or nothing at all
				pa = ra.info.PA + ra.info.Length + idx*4096
			}
			if kind&0x80 != 0 {
				pa += idx // misaligned
			}
			pages[i] = pa
		}
		acc8 := Access(access & 0x1f)
		if access&0x100 != 0 && len(pages) > 0 && iova&(ps-1) < uint64(len(pages))*ps {
			// Steer towards a matching page count so that the success
			// paths get explored as much as the rejections.
			length = uint64(len(pages))*ps - iova&(ps-1)
		}

		// Reference model of RegisterMR.
		modelOK := validateAccess(acc8) == nil && length != 0 && length <= 1<<30 &&
			iova <= math.MaxUint64-length &&
			uint64(len(pages)) == (iova+length-1)>>shift-iova>>shift+1
		for _, pa := range pages {
			if !modelOK {
				break
			}
			if pa%ps != 0 {
				modelOK = false
			} else if h := findModel(regions, pa); h == nil || h.info.PA+h.info.Length-pa < ps || h == &regions[2] {
				modelOK = false
			}
		}
		mr, err := s.RegisterMR(1, 1, iova, length, acc8, shift, pages)
		if (err == nil) != modelOK {
			t.Fatalf("RegisterMR err=%v, model accepts=%v", err, modelOK)
		}
		if err != nil {
			return
		}
		defer func() {
			if err := s.DeregisterMR(1, mr.LKey); err != nil {
				t.Fatal(err)
			}
		}()

		tlen %= 64 * kib
		// A key near the live one (stale variants, other indices): a
		// lookup either fails or translates inside a mapping.
		if rawKey != 0 {
			acc.Enter()
			n, err := acc.Translate(mr.LKey^rawKey, PD{1, 1}, tiova, tlen, Access(want&0xf), segs)
			for _, sg := range segs[:n] {
				if !inMapping(s, sg) {
					acc.Exit()
					t.Fatalf("key %#x: segment outside every mapping", mr.LKey^rawKey)
				}
			}
			acc.Exit()
			if err == nil { // this MR is the only live one
				t.Fatalf("key %#x translated; only %#x is live", mr.LKey^rawKey, mr.LKey)
			}
		}
		pd := PD{1, 1}
		if otherPD {
			pd = PD{2, 1}
		}
		w := Access(want & 0xf)
		var wantErr error
		switch {
		case otherPD:
			wantErr = ErrWrongPD
		case acc8&w != w:
			wantErr = ErrAccess
		case tiova < iova || tiova-iova > length || tlen > length-(tiova-iova):
			wantErr = ErrBounds
		}
		acc.Enter()
		n, err := acc.Translate(mr.LKey, pd, tiova, tlen, w, segs)
		if errors.Is(err, ErrSegments) && wantErr == nil {
			acc.Exit()
			return // model has no segment merging; 24 segments too few
		}
		if !errors.Is(err, wantErr) || (wantErr == nil && err != nil) {
			acc.Exit()
			t.Fatalf("Translate err=%v, want %v", err, wantErr)
		}
		var got []byte
		for _, sg := range segs[:n] {
			if !inMapping(s, sg) {
				acc.Exit()
				t.Fatalf("segment outside every mapping")
			}
			got = append(got, sg...)
		}
		acc.Exit()
		if err != nil {
			return
		}
		// Reference bytes through the client's mappings.
		var ref []byte
		for v, left := tiova, tlen; left > 0; {
			rel := v - iova&^(ps-1)
			pa := pages[rel>>shift] + rel&(ps-1)
			c := min(ps-rel&(ps-1), left)
			h := findModel(regions, pa)
			ref = append(ref, h.client[pa-h.info.PA:pa-h.info.PA+c]...)
			v += c
			left -= c
		}
		if !bytes.Equal(got, ref) {
			t.Fatalf("translated bytes differ from the client's view")
		}
		// The gather path sees the same bytes.
		if tlen > 0 && tlen <= math.MaxUint32 {
			buf := make([]byte, tlen)
			if _, err := acc.GatherAt(pd, []SGE{{Addr: tiova, Length: uint32(tlen), LKey: mr.LKey}}, 0, buf); err != nil {
				t.Fatalf("GatherAt: %v", err)
			}
			if !bytes.Equal(buf, ref) {
				t.Fatalf("gathered bytes differ from the client's view")
			}
		}
	})
}

// findModel returns the region containing pa (any owner), or nil.
func findModel(regions []hostMem, pa uint64) *hostMem {
	for i := range regions {
		h := &regions[i]
		if pa >= h.info.PA && pa-h.info.PA < h.info.Length {
			return h
		}
	}
	return nil
}
