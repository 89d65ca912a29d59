package dma

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Rereg is what ReregisterMR changes: each part is applied when set.
type Rereg struct {
	// Translation, when set, gives the MR a new range and page table
	// (ibv_rereg_mr IBV_REREG_MR_CHANGE_TRANSLATION).
	Translation *Translation
	// PD, when set, moves the MR to that protection domain.
	PD *uint32
	// Access, when set, replaces the MR's access flags.
	Access *Access
}

// Translation is a new range for ReregisterMR: [IOVA, IOVA+Length) over
// pages of 1<<PageShift bytes, given as Pages or, when Pages is nil, as
// NPages little-endian u64 addresses at ListPA in the owner's host memory
// (RegisterMRList's rules).
type Translation struct {
	IOVA, Length uint64
	PageShift    uint
	Pages        []uint64
	ListPA       uint64
	NPages       uint32
}

// ReregisterMR changes the MR of owner whose lkey is key (ibv_rereg_mr),
// keeping its keys (as Linux rxe, and mlx5 when it can change the MR in
// place, report them). A new
// translation is checked, charged and pinned like a registration before
// anything changes; a refused change leaves the MR as it was. Zero-based
// MRs (device memory) cannot be re-registered (ErrInvalid).
//
// The new MR replaces the old one in its key slot at once; ReregisterMR
// then waits for a grace period, so when it returns no worker is still
// copying through the old translation, PD or access, and the old
// translation's pins are released.
func (s *Space) ReregisterMR(o Owner, key uint32, ch Rereg) (MRInfo, error) {
	if ch.Translation == nil && ch.PD == nil && ch.Access == nil {
		return MRInfo{}, fmt.Errorf("%w: rereg changes nothing", ErrInvalid)
	}
	if ch.Access != nil {
		if err := validateAccess(*ch.Access); err != nil {
			return MRInfo{}, err
		}
	}
	var want uint64
	if t := ch.Translation; t != nil {
		a := Access(0)
		if ch.Access != nil {
			a = *ch.Access
		}
		n, err := s.checkMR(t.IOVA, t.Length, a, t.PageShift)
		if err != nil {
			return MRInfo{}, err
		}
		got := uint64(len(t.Pages))
		if t.Pages == nil {
			got = uint64(t.NPages)
			if t.ListPA%8 != 0 {
				return MRInfo{}, fmt.Errorf("%w: page list PA %#x not 8-byte aligned", ErrInvalid, t.ListPA)
			}
		}
		if got != n {
			return MRInfo{}, fmt.Errorf("%w: %d pages for %d", ErrPageCount, got, n)
		}
		want = n
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return MRInfo{}, ErrClosed
	}
	st := s.owners[o]
	var old *memRegion
	if st != nil {
		old = st.mrs[key]
	}
	if old == nil {
		s.mu.Unlock()
		return MRInfo{}, fmt.Errorf("%w: owner %d key %#x", ErrNoMR, o, key)
	}
	if old.zeroBased {
		s.mu.Unlock()
		return MRInfo{}, fmt.Errorf("%w: a device memory MR cannot be re-registered", ErrInvalid)
	}
	if old.proc != nil {
		s.mu.Unlock()
		return MRInfo{}, fmt.Errorf("%w: an on-demand paging MR cannot be re-registered", ErrInvalid)
	}
	// As DEREG_MR: an MR with memory windows bound keeps its translation,
	// PD and rights: the windows bound to it rely on them.
	s.mwMu.Lock()
	n := old.numMW
	s.mwMu.Unlock()
	if n > 0 {
		s.mu.Unlock()
		return MRInfo{}, fmt.Errorf("%w: %d windows bound to MR %#x", ErrMRBound, n, key)
	}
	pd, access := old.pd.Handle, old.access
	if ch.PD != nil {
		pd = *ch.PD
	}
	if ch.Access != nil {
		access = *ch.Access
	}
	var m *memRegion
	if t := ch.Translation; t != nil {
		page := func(i uint64) uint64 { return t.Pages[i] }
		if t.Pages == nil {
			r, err := s.findPA(o, t.ListPA, want*8)
			if err != nil {
				s.mu.Unlock()
				return MRInfo{}, fmt.Errorf("page list: %w", err)
			}
			b := r.mem[t.ListPA-r.pa : t.ListPA-r.pa+want*8]
			page = func(i uint64) uint64 { return binary.LittleEndian.Uint64(b[i*8:]) }
		}
		ps := uint64(1) << t.PageShift
		var err error
		m, err = s.buildLocked(o, pd, t.IOVA, t.Length, access, t.PageShift, t.IOVA&(ps-1), want, page)
		if err != nil {
			s.mu.Unlock()
			return MRInfo{}, err
		}
	} else {
		// Same table, pins and charge: they move to the new MR.
		m = &memRegion{
			pd: PD{Owner: o, Handle: pd}, access: access,
			iova: old.iova, length: old.length, base: old.base, shift: old.shift, npages: old.npages,
			pages: old.pages, runs: old.runs, regs: old.regs, store: old.store, tableBytes: old.tableBytes,
		}
	}
	idx := key >> 8
	m.lkey, m.rkey = old.lkey, old.rkey
	st.mrs[key] = m
	s.slots[idx].Store(m) // the old MR is unreachable for new lookups
	var rl retireList
	if ch.Translation != nil {
		s.releaseTranslation(st, old, &rl)
	}
	s.mu.Unlock()
	// Copies that found the old MR finish before the reply (and before
	// its regions or table can go).
	s.synchronize()
	s.retire(&rl)
	return MRInfo{LKey: m.lkey, RKey: m.rkey}, nil
}

// RegisterZeroBased registers the MR of a device memory range: length
// bytes (0 allowed) at physical address pa in owner's host memory (a
// DM's region), in protection domain pd, addressed from 0 (address x is
// the byte at pa+x). It is otherwise RegisterMR with 4 KiB pages.
func (s *Space) RegisterZeroBased(o Owner, pd uint32, pa, length uint64, access Access) (MRInfo, error) {
	if err := validateAccess(access); err != nil {
		return MRInfo{}, err
	}
	if pa > math.MaxUint64-length-MinPage {
		return MRInfo{}, fmt.Errorf("%w: PA %#x + length %#x wraps", ErrOverflow, pa, length)
	}
	span := max(length, 1) // a zero-length MR still names its first byte's page
	off := pa & (MinPage - 1)
	n := (off+span-1)>>PageShift4K + 1
	if n > uint64(s.cfg.MaxPagesPerMR) {
		return MRInfo{}, fmt.Errorf("%w: %d pages > %d per MR", ErrTooLarge, n, s.cfg.MaxPagesPerMR)
	}
	first := pa - off
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return MRInfo{}, ErrClosed
	}
	if !s.keys.available() {
		return MRInfo{}, fmt.Errorf("%w: %d MR keys in use", ErrLimit, len(s.slots)-1)
	}
	m, err := s.buildLocked(o, pd, 0, length, access, PageShift4K, off, n, func(i uint64) uint64 { return first + i*MinPage })
	if err != nil {
		return MRInfo{}, err
	}
	m.zeroBased = true
	idx, lv, rv, _ := s.keys.alloc()
	m.lkey = idx<<8 | uint32(lv)
	m.rkey = idx<<8 | uint32(rv)
	s.owner(o).mrs[m.lkey] = m
	s.slots[idx].Store(m)
	return MRInfo{LKey: m.lkey, RKey: m.rkey}, nil
}
