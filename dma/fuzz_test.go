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
			if err == nil && (mr.LKey^rawKey != mr.RKey || Access(want)&AccessRemote == 0) { // this MR is the only live one
				t.Fatalf("key %#x translated; only %#x (and rkey %#x) is live", mr.LKey^rawKey, mr.LKey, mr.RKey)
			}
		}
		pd := PD{1, 1}
		if otherPD {
			pd = PD{2, 1}
		}
		w := Access(want & 0xf)
		key := mr.LKey
		if w&AccessRemote != 0 {
			key = mr.RKey // remote access: only the rkey names the MR
		}
		var wantErr error
		switch {
		case key == 0:
			wantErr = ErrBadKey
		case otherPD:
			wantErr = ErrWrongPD
		case acc8&w != w:
			wantErr = ErrAccess
		case tiova < iova || tiova-iova > length || tlen > length-(tiova-iova):
			wantErr = ErrBounds
		}
		acc.Enter()
		n, err := acc.Translate(key, pd, tiova, tlen, w, segs)
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

// FuzzSlice: arbitrary ring addresses never yield a view outside the
// owner's memory; a view shows exactly the client's bytes at that PA.
func FuzzSlice(f *testing.F) {
	s := newSpace(f, Config{})
	a := addHostMem(f, s, 1, 64*kib)
	b := addHostMem(f, s, 2, 64*kib)
	fill(a.client, 1)
	fill(b.client, 2)
	f.Add(uint64(0), uint64(4096), false)
	f.Add(uint64(64*kib-1), uint64(1), false)
	f.Add(uint64(64*kib-64), uint64(128), false)
	f.Add(uint64(b.info.PA-a.info.PA), uint64(64), false)
	f.Add(uint64(math.MaxUint64), uint64(2), true)
	f.Fuzz(func(t *testing.T, rel, n uint64, absolute bool) {
		pa := a.info.PA + rel // relative to region a (wrapping is fine)
		if absolute {
			pa = rel
		}
		v, pin, err := s.Slice(1, pa, n)
		inA := n > 0 && pa >= a.info.PA && n <= a.info.Length && pa-a.info.PA <= a.info.Length-n
		if (err == nil) != inA {
			t.Fatalf("Slice(%#x, %#x) err=%v, inside owner 1's region: %v", pa, n, err, inA)
		}
		if err != nil {
			return
		}
		defer pin.Release()
		off := pa - a.info.PA
		if !inMapping(s, v) || uint64(len(v)) != n || !bytes.Equal(v, a.client[off:off+n]) {
			t.Fatalf("Slice(%#x, %#x) is not the client's bytes", pa, n)
		}
	})
}

// FuzzSGECopy feeds arbitrary SGE lists (as a client writes them in WQEs)
// and message offsets to GatherAt and ScatterAt, and compares with a
// reference model: same bytes on success, the same failing SGE and error
// otherwise.
func FuzzSGECopy(f *testing.F) {
	s := newSpace(f, Config{})
	h := addHostMem(f, s, 1, 64*kib)
	fill(h.client, 0x3a)
	// MR 0: read-only, pages shuffled; MR 1: writable; key 2: invalidated.
	ro, err := s.RegisterMR(1, 1, 0x10000, 4*4096, 0, PageShift4K, []uint64{h.pa(12288), h.pa(0), h.pa(8192), h.pa(4096)})
	if err != nil {
		f.Fatal(err)
	}
	rw, err := s.RegisterMR(1, 1, 0x20000-100, 4*4096, AccessLocalWrite, PageShift4K, []uint64{h.pa(40960), h.pa(32768), h.pa(16384), h.pa(61440), h.pa(20480)})
	if err != nil {
		f.Fatal(err)
	}
	inv, err := s.RegisterMR(1, 1, 0x30000, 4096, AccessLocalWrite, PageShift4K, []uint64{h.pa(24576)})
	if err != nil || s.Invalidate(inv.LKey, PD{1, 1}) != nil {
		f.Fatal("setup")
	}
	type mrModel struct {
		key, base uint64
		iova, n   uint64
		pages     []uint64 // region offsets
		write     bool
	}
	models := []mrModel{
		{uint64(ro.LKey), 0x10000, 0x10000, 4 * 4096, []uint64{12288, 0, 8192, 4096}, false},
		{uint64(rw.LKey), 0x1f000, 0x20000 - 100, 4 * 4096, []uint64{40960, 32768, 16384, 61440, 20480}, true},
	}
	acc := s.NewAccessor()
	f.Cleanup(acc.Close)

	f.Add([]byte{0, 0x00, 0x10, 0x00, 0x10}, uint64(0), uint16(100), false)
	f.Add([]byte{1, 0x00, 0x10, 0x00, 0x20, 0, 0x10, 0x00, 0x00, 0x10}, uint64(10), uint16(5000), true)
	f.Add([]byte{2, 0, 0, 0, 1}, uint64(0), uint16(1), false)
	f.Add([]byte{0, 0xf0, 0x3f, 0x20, 0x00, 1, 0, 0, 0, 0}, uint64(0), uint16(8192), true)
	buf := make([]byte, 1<<16)
	f.Fuzz(func(t *testing.T, raw []byte, off uint64, n uint16, write bool) {
		// 5 bytes per SGE: key selector, 16-bit offset from the MR's iova
		// (may run past it), 16-bit length.
		var sges []SGE
		for len(raw) >= 5 && len(sges) < 8 {
			sel := raw[0]
			addr := uint64(raw[1]) | uint64(raw[2])<<8
			l := uint32(raw[3]) | uint32(raw[4])<<8
			raw = raw[5:]
			var key uint32
			var base uint64
			switch sel % 4 {
			case 0, 1:
				key, base = uint32(models[sel%4].key), models[sel%4].iova
			case 2:
				key, base = inv.LKey, 0x30000
			case 3:
				key, base = uint32(sel)<<8|7, 0x10000
			}
			if sel&0x80 != 0 {
				base -= 0x800 // before the MR start
			}
			sges = append(sges, SGE{Addr: base + addr, Length: l, LKey: key})
		}
		// Reference model.
		find := func(key uint32) *mrModel {
			for i := range models {
				if uint32(models[i].key) == key {
					return &models[i]
				}
			}
			return nil
		}
		var want []byte
		var wantAt []uint64 // region offset of each byte of want
		wantBad, wantErr := 0, error(nil)
		need, o := uint64(n), off
		for i, sg := range sges {
			if need == 0 {
				break
			}
			l := uint64(sg.Length)
			if o >= l {
				o -= l
				continue
			}
			c := min(l-o, need)
			m := find(sg.LKey)
			switch {
			case m == nil:
				wantErr = ErrBadKey
			case write && !m.write:
				wantErr = ErrAccess
			case sg.Addr+o < m.iova || sg.Addr+o+c > m.iova+m.n:
				wantErr = ErrBounds
			}
			if wantErr != nil {
				wantBad = i
				break
			}
			for v := sg.Addr + o; v < sg.Addr+o+c; v++ {
				rel := v - m.base
				at := m.pages[rel/4096] + rel%4096
				want = append(want, h.client[at])
				wantAt = append(wantAt, at)
			}
			need -= c
			o = 0
		}
		if wantErr == nil && need > 0 {
			wantErr, wantBad = ErrLength, len(sges)
		}

		dst := buf[:n]
		var bad int
		var err error
		var model []byte
		if write {
			for i := range dst {
				dst[i] = byte(i) ^ 0xc5
			}
			// What the client must see afterwards: the writes in order
			// (SGEs may overlap; the last write wins).
			model = bytes.Clone(h.client)
			if wantErr == nil {
				for i, at := range wantAt {
					model[at] = dst[i]
				}
			}
			bad, err = acc.ScatterAt(PD{1, 1}, sges, off, dst)
		} else {
			bad, err = acc.GatherAt(PD{1, 1}, sges, off, dst)
			var sink collectSink
			ibad, ierr := acc.GatherInto(PD{1, 1}, sges, off, uint64(n), &sink)
			if ierr != err || ibad != bad || err == nil && !bytes.Equal(sink.b, want) {
				t.Fatalf("GatherInto: err=%v bad=%d, GatherAt err=%v bad=%d; bytes equal %v", ierr, ibad, err, bad, bytes.Equal(sink.b, want))
			}
			if len(sink.b) > len(want) || !bytes.Equal(sink.b, want[:len(sink.b)]) {
				t.Fatalf("GatherInto put bytes the message does not hold there")
			}
		}
		if !errors.Is(err, wantErr) || (wantErr == nil && err != nil) || (err != nil && bad != wantBad) {
			t.Fatalf("err=%v bad=%d, model err=%v bad=%d (sges %+v off %d n %d)", err, bad, wantErr, wantBad, sges, off, n)
		}
		if write {
			ok := err != nil || bytes.Equal(h.client, model)
			fill(h.client, 0x3a) // known bytes for the next input
			if !ok {
				t.Fatalf("client memory after scatter differs from the model")
			}
			return
		}
		if err != nil {
			return
		}
		if !bytes.Equal(dst, want) {
			t.Fatalf("gathered bytes differ from the client's view")
		}
	})
}

// collectSink is a Sink that appends what it is given; n counts the
// pieces.
type collectSink struct {
	b []byte
	n int
}

func (c *collectSink) Put(b []byte) { c.b = append(c.b, b...); c.n++ }
