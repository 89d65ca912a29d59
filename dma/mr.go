package dma

import (
	"fmt"
	"math"
	"sync/atomic"
)

// memRegion is a registered MR: the pinned page table (MTT) of
// [iova, iova+length). Immutable once published in a key slot, except
// invalid. Page i covers iova [base + i<<shift, base + (i+1)<<shift) and
// its entry is regs index << pteRegShift | byte offset in that region.
type memRegion struct {
	lkey, rkey uint32
	pd         PD
	access     Access
	iova       uint64
	length     uint64
	base       uint64 // iova rounded down to the page size
	shift      uint8
	pages      []uint64
	regs       []*region // the regions the pages lie in (each pinned once)
	invalid    atomic.Bool
}

const (
	pteRegShift = 48
	pteOffMask  = 1<<pteRegShift - 1
	maxMRRegs   = 1 << 16
)

// MRInfo is the result of a registration. LKey doubles as the handle for
// DeregisterMR. RKey is LKey when the MR grants any remote access, else 0
// (no remote peer can name it), as Linux rxe does.
type MRInfo struct {
	LKey, RKey uint32
}

// RegisterMR registers [iova, iova+length) of owner in protection domain
// pd, with page i of the range (iova rounded down to 1<<pageShift, plus i
// pages) at physical address pages[i].
//
// Checks, each with its own error: access flags (ErrAccessFlags); page
// size 4 KiB or 2 MiB (ErrPageSize); length non-zero (ErrInvalid) and not
// above Config.MaxMRBytes, iova+length not wrapping (ErrOverflow); at most
// Config.MaxPagesPerMR pages (ErrTooLarge);
// len(pages) equal to the pages the range touches (ErrPageCount); every
// page aligned (ErrPageAlign) and wholly inside one region (ErrPAOutside)
// of this owner (ErrNotOwner). The page list is copied; the caller may
// reuse it. Every region a page lies in is pinned until DeregisterMR or
// ReleaseOwner.
func (s *Space) RegisterMR(o Owner, pd uint32, iova, length uint64, access Access, pageShift uint, pages []uint64) (MRInfo, error) {
	if err := validateAccess(access); err != nil {
		return MRInfo{}, err
	}
	if pageShift != PageShift4K && pageShift != PageShift2M {
		return MRInfo{}, fmt.Errorf("%w: page shift %d", ErrPageSize, pageShift)
	}
	if length == 0 {
		return MRInfo{}, fmt.Errorf("%w: zero-length MR", ErrInvalid)
	}
	if length > s.cfg.MaxMRBytes {
		return MRInfo{}, fmt.Errorf("%w: MR length %#x > %#x", ErrOverflow, length, s.cfg.MaxMRBytes)
	}
	if iova > math.MaxUint64-length {
		return MRInfo{}, fmt.Errorf("%w: iova %#x + length %#x wraps", ErrOverflow, iova, length)
	}
	ps := uint64(1) << pageShift
	base := iova &^ (ps - 1)
	want := ((iova+length-1)>>pageShift - iova>>pageShift) + 1
	if want > uint64(s.cfg.MaxPagesPerMR) {
		return MRInfo{}, fmt.Errorf("%w: %d pages > %d per MR", ErrTooLarge, want, s.cfg.MaxPagesPerMR)
	}
	if uint64(len(pages)) != want {
		return MRInfo{}, fmt.Errorf("%w: %d pages for %d", ErrPageCount, len(pages), want)
	}

	m := &memRegion{
		pd: PD{Owner: o, Handle: pd}, access: access,
		iova: iova, length: length, base: base, shift: uint8(pageShift),
		pages: make([]uint64, len(pages)),
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return MRInfo{}, ErrClosed
	}
	for i, pa := range pages {
		if pa&(ps-1) != 0 {
			return MRInfo{}, fmt.Errorf("%w: page %d at %#x", ErrPageAlign, i, pa)
		}
		r, err := s.findPA(o, pa, ps)
		if err != nil {
			return MRInfo{}, fmt.Errorf("page %d: %w", i, err)
		}
		ri := -1
		for j := len(m.regs) - 1; j >= 0; j-- { // few regions per MR
			if m.regs[j] == r {
				ri = j
				break
			}
		}
		if ri < 0 {
			if len(m.regs) == maxMRRegs {
				return MRInfo{}, fmt.Errorf("%w: MR spans more than %d regions", ErrLimit, maxMRRegs)
			}
			ri = len(m.regs)
			m.regs = append(m.regs, r)
		}
		m.pages[i] = uint64(ri)<<pteRegShift | (pa - r.pa)
	}
	if s.freeHead == len(s.free) {
		return MRInfo{}, fmt.Errorf("%w: %d MR keys in use", ErrLimit, len(s.slots)-1)
	}
	idx := s.free[s.freeHead]
	s.freeHead++
	if s.freeHead > len(s.free)/2 && s.freeHead > 64 { // compact the FIFO
		s.free = append(s.free[:0], s.free[s.freeHead:]...)
		s.freeHead = 0
	}
	s.variants[idx]++
	m.lkey = idx<<8 | uint32(s.variants[idx])
	if access&AccessRemote != 0 {
		m.rkey = m.lkey
	}
	for _, r := range m.regs {
		r.pins++
	}
	s.owner(o).mrs[m.lkey] = m
	s.slots[idx].Store(m) // publish: after this, workers can find it
	return MRInfo{LKey: m.lkey, RKey: m.rkey}, nil
}

// DeregisterMR removes the MR of owner whose lkey is key and releases its
// region pins. A worker that looked the MR up before finishes its copy;
// the regions stay mapped until it has (grace period in RemoveRegion).
func (s *Space) DeregisterMR(o Owner, key uint32) error {
	s.mu.Lock()
	st := s.owners[o]
	var m *memRegion
	if st != nil {
		m = st.mrs[key]
	}
	if m == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: owner %d key %#x", ErrNoMR, o, key)
	}
	retire := s.dropMR(st, m, nil)
	s.mu.Unlock()
	s.retire(retire)
	return nil
}

// dropMR unpublishes m, frees its index and unpins its regions, appending
// dead regions whose last pin it was to retire. Caller holds mu.
func (s *Space) dropMR(st *ownerState, m *memRegion, retire []*region) []*region {
	idx := m.lkey >> 8
	s.slots[idx].Store(nil)
	delete(st.mrs, m.lkey)
	s.free = append(s.free, idx) // FIFO: the index is reused last
	for _, r := range m.regs {
		r.pins--
		if r.dead && r.pins == 0 {
			retire = append(retire, r)
		}
	}
	return retire
}

// Invalidate makes the MR named by key (lkey or rkey) fail every lookup
// until it is deregistered and registered again (LOCAL_INV,
// SEND_WITH_INV). The MR must belong to pd. Lock-free; safe from workers.
// Copies that already passed their lookup finish.
func (s *Space) Invalidate(key uint32, pd PD) error {
	m := s.lookup(key)
	if m == nil {
		return ErrBadKey
	}
	if m.pd != pd {
		return ErrWrongPD
	}
	m.invalid.Store(true)
	return nil
}

// lookup returns the live, valid MR named by key, or nil. Lock-free.
func (s *Space) lookup(key uint32) *memRegion {
	idx := key >> 8
	if idx >= uint32(len(s.slots)) {
		return nil
	}
	m := s.slots[idx].Load()
	if m == nil || m.lkey != key || m.invalid.Load() {
		return nil
	}
	return m
}

// check validates an access of [iova, iova+n) wanting access bits want.
func (m *memRegion) check(pd PD, iova, n uint64, want Access) error {
	if m.pd != pd {
		return ErrWrongPD
	}
	if m.access&want != want {
		return ErrAccess
	}
	if iova < m.iova || n > m.length || iova-m.iova > m.length-n {
		return ErrBounds
	}
	return nil
}

// span returns the mapped bytes at iova, at most n bytes and at least one
// (n > 0), running on over following pages while they are contiguous in
// the same region. iova must have passed check.
func (m *memRegion) span(iova, n uint64) []byte {
	rel := iova - m.base
	i := rel >> m.shift
	ps := uint64(1) << m.shift
	pte := m.pages[i]
	start := pte&pteOffMask + rel&(ps-1)
	end := pte&pteOffMask + ps
	for end-start < n && i+1 < uint64(len(m.pages)) && m.pages[i+1] == pte+ps {
		i++
		pte += ps
		end += ps
	}
	if end-start > n {
		end = start + n
	}
	return m.regs[pte>>pteRegShift].mem[start:end:end]
}
