package dma

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync/atomic"
)

// memRegion is a registered MR: the pinned page table (MTT) of
// [iova, iova+length). Immutable once published in a key slot, except
// invalid. Page i covers iova [base + i<<shift, base + (i+1)<<shift); its
// PTE, regs index << pteRegShift | byte offset in that region, is in pages
// or runs (table.go).
type memRegion struct {
	lkey, rkey uint32
	pd         PD
	access     Access
	iova       uint64
	length     uint64
	base       uint64 // iova rounded down to the page size
	shift      uint8
	npages     uint64
	pages      []uint64  // flat table, or nil
	runs       []pteRun  // runs table, or nil
	regs       []*region // the regions the pages lie in (each pinned once)
	invalid    atomic.Bool
	zeroBased  bool // device memory, addressed from 0 (RegisterZeroBased)

	// win is set in the slot entry of a memory window (mw.go), whose
	// lkey and rkey are 0; numMW counts the windows bound to this MR
	// (guarded by Space.mwMu).
	win   *memWindow
	numMW int

	store      []byte // the table's own mapping, or nil (Go heap)
	tableBytes uint64 // charged to the owner's account

	// proc is set for an on-demand paging MR (odp.go): no table, no
	// regions, no pins; iova+vaDelta is the address in proc's memory.
	proc    *Process
	vaDelta uint64
}

const (
	pteRegShift = 48
	pteOffMask  = 1<<pteRegShift - 1
	maxMRRegs   = 1 << 16
)

// MRInfo is the result of a registration. LKey doubles as the handle for
// DeregisterMR. RKey is a key of its own: the same index as the lkey with
// another variant (see keys.go), and only remote accesses match it. Every
// MR has one, as every MR of Linux rxe and mlx5 has (the kernel reports
// it whatever the access): a remote access to an MR without the remote
// right fails its access check (ErrAccess), and an MR that gains remote
// access by a re-registration (ibv_rereg_mr) keeps the rkey its peer
// already knows.
type MRInfo struct {
	LKey, RKey uint32
}

// checkMR validates a registration's arguments and returns the number of
// pages [iova, iova+length) touches.
func (s *Space) checkMR(iova, length uint64, access Access, pageShift uint) (uint64, error) {
	if err := validateAccess(access); err != nil {
		return 0, err
	}
	if pageShift != PageShift4K && pageShift != PageShift2M {
		return 0, fmt.Errorf("%w: page shift %d", ErrPageSize, pageShift)
	}
	if length == 0 {
		return 0, fmt.Errorf("%w: zero-length MR", ErrInvalid)
	}
	if length > s.cfg.MaxMRBytes {
		return 0, fmt.Errorf("%w: MR length %#x > %#x", ErrOverflow, length, s.cfg.MaxMRBytes)
	}
	if iova > math.MaxUint64-length {
		return 0, fmt.Errorf("%w: iova %#x + length %#x wraps", ErrOverflow, iova, length)
	}
	want := ((iova+length-1)>>pageShift - iova>>pageShift) + 1
	if want > uint64(s.cfg.MaxPagesPerMR) {
		return 0, fmt.Errorf("%w: %d pages > %d per MR", ErrTooLarge, want, s.cfg.MaxPagesPerMR)
	}
	return want, nil
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
// of this owner (ErrNotOwner); the page table's storage and the chunks
// newly pinned within the owner's account limits and the device's
// (ErrQuota). The page list is copied; the caller may reuse it. Every
// region a page lies in is pinned until DeregisterMR or ReleaseOwner, and
// the chunks under the pages are locked (asynchronously: pin.go).
func (s *Space) RegisterMR(o Owner, pd uint32, iova, length uint64, access Access, pageShift uint, pages []uint64) (MRInfo, error) {
	want, err := s.checkMR(iova, length, access, pageShift)
	if err != nil {
		return MRInfo{}, err
	}
	if uint64(len(pages)) != want {
		return MRInfo{}, fmt.Errorf("%w: %d pages for %d", ErrPageCount, len(pages), want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registerLocked(o, pd, iova, length, access, pageShift, want, func(i uint64) uint64 { return pages[i] })
}

// RegisterMRList is RegisterMR with the page list in owner's host memory:
// n little-endian u64 page addresses at pa (REG_MR's pbl_pa, 8-byte
// aligned, wholly inside one region of owner). Each entry is read once,
// checked and stored in the table directly: no copy of the list is made,
// and what the client writes there afterwards changes nothing.
func (s *Space) RegisterMRList(o Owner, pd uint32, iova, length uint64, access Access, pageShift uint, pa uint64, n uint32) (MRInfo, error) {
	want, err := s.checkMR(iova, length, access, pageShift)
	if err != nil {
		return MRInfo{}, err
	}
	if uint64(n) != want {
		return MRInfo{}, fmt.Errorf("%w: %d pages for %d", ErrPageCount, n, want)
	}
	if pa%8 != 0 {
		return MRInfo{}, fmt.Errorf("%w: page list PA %#x not 8-byte aligned", ErrInvalid, pa)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return MRInfo{}, ErrClosed
	}
	r, err := s.findPA(o, pa, want*8)
	if err != nil {
		return MRInfo{}, fmt.Errorf("page list: %w", err)
	}
	b := r.mem[pa-r.pa : pa-r.pa+want*8]
	return s.registerLocked(o, pd, iova, length, access, pageShift, want, func(i uint64) uint64 {
		return binary.LittleEndian.Uint64(b[i*8:])
	})
}

// registerLocked builds, charges, pins and publishes an MR of n pages,
// page i at page(i). Caller holds mu.
func (s *Space) registerLocked(o Owner, pd uint32, iova, length uint64, access Access, pageShift uint, n uint64, page func(uint64) uint64) (MRInfo, error) {
	if s.closed {
		return MRInfo{}, ErrClosed
	}
	if !s.keys.available() {
		return MRInfo{}, fmt.Errorf("%w: %d MR keys in use", ErrLimit, len(s.slots)-1)
	}
	ps := uint64(1) << pageShift
	m, err := s.buildLocked(o, pd, iova, length, access, pageShift, iova&(ps-1), n, page)
	if err != nil {
		return MRInfo{}, err
	}
	idx, lv, rv, _ := s.keys.alloc() // available, checked above, under mu
	m.lkey = idx<<8 | uint32(lv)
	m.rkey = idx<<8 | uint32(rv)
	s.owner(o).mrs[m.lkey] = m
	s.slots[idx].Store(m) // publish: after this, workers can find it
	return MRInfo{LKey: m.lkey, RKey: m.rkey}, nil
}

// buildLocked builds, charges and pins an MR of n pages, page i at
// page(i), whose address iova lies pageOff bytes into its first page
// (iova's own offset, or another one for a zero-based MR), without keys
// and unpublished; every region it uses has one more pin. A refused build
// leaves nothing behind. Caller holds mu.
func (s *Space) buildLocked(o Owner, pd uint32, iova, length uint64, access Access, pageShift uint, pageOff, n uint64, page func(uint64) uint64) (*memRegion, error) {
	ps := uint64(1) << pageShift
	m := &memRegion{
		pd: PD{Owner: o, Handle: pd}, access: access,
		iova: iova, length: length, base: iova - pageOff, shift: uint8(pageShift), npages: n,
	}
	// The table is built in the scratch first: a registration refused
	// (bad page, over the account's limit) allocates nothing.
	flat, err := s.scratchPages(n)
	if err != nil {
		return nil, err
	}
	defer s.releaseScratch(n)
	fail := func(err error) (*memRegion, error) { return nil, err }
	var nruns uint64
	for i := range n {
		pa := page(i)
		if pa&(ps-1) != 0 {
			return fail(fmt.Errorf("%w: page %d at %#x", ErrPageAlign, i, pa))
		}
		r, err := s.findPA(o, pa, ps)
		if err != nil {
			return fail(fmt.Errorf("page %d: %w", i, err))
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
				return fail(fmt.Errorf("%w: MR spans more than %d regions", ErrLimit, maxMRRegs))
			}
			ri = len(m.regs)
			m.regs = append(m.regs, r)
		}
		pte := uint64(ri)<<pteRegShift | (pa - r.pa)
		if i == 0 || pte != flat[i-1]+ps {
			nruns++
		}
		flat[i] = pte
	}
	useRuns := nruns <= n/4
	if useRuns {
		m.tableBytes = tableCost(nruns * 16)
	} else {
		m.tableBytes = tableCost(n * 8)
	}
	st := s.owner(o)
	if err := s.chargeTables(st.acct, m.tableBytes); err != nil {
		return nil, err
	}
	if useRuns {
		m.runs, m.store, err = allocRuns(nruns)
		if err == nil {
			k := 0
			for i, pte := range flat {
				if i == 0 || pte != flat[i-1]+ps {
					m.runs[k] = pteRun{first: uint64(i), pte: pte}
					k++
				}
			}
		}
	} else {
		m.pages, m.store, err = allocPages(n)
		if err == nil {
			copy(m.pages, flat)
		}
	}
	if err != nil {
		s.refundTables(st.acct, m.tableBytes)
		return nil, err
	}
	if err := s.pinMR(st.acct, m); err != nil {
		s.refundTables(st.acct, m.tableBytes)
		freeStore(m.store)
		return nil, err
	}
	for _, r := range m.regs {
		r.pins++
	}
	return m, nil
}

// DeregisterMR removes the MR of owner whose lkey is key and releases its
// pins. A worker that looked the MR up before finishes its copy; the
// regions and the table stay mapped until it has (grace period).
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
	var rl retireList
	s.mwMu.Lock()
	if n := m.numMW; n > 0 {
		s.mwMu.Unlock()
		s.mu.Unlock()
		return fmt.Errorf("%w: %d windows bound to MR %#x", ErrMRBound, n, key)
	}
	s.slots[m.lkey>>8].Store(nil) // no bind finds it from here on
	s.mwMu.Unlock()
	s.dropMR(st, m, &rl)
	s.mu.Unlock()
	s.retire(&rl)
	return nil
}

// dropMR unpublishes m, frees its index, unpins its chunks and regions
// and refunds its table, adding to rl what to free after the grace
// period. Caller holds mu.
func (s *Space) dropMR(st *ownerState, m *memRegion, rl *retireList) {
	idx := m.lkey >> 8
	s.slots[idx].Store(nil)
	delete(st.mrs, m.lkey)
	s.keys.free(idx)
	s.releaseTranslation(st, m, rl)
}

// releaseTranslation unpins m's chunks and regions and refunds its table,
// adding to rl what to free after the grace period; m must no longer be
// published. Caller holds mu.
func (s *Space) releaseTranslation(st *ownerState, m *memRegion, rl *retireList) {
	if m.proc != nil {
		return // on-demand paging: nothing pinned, no table
	}
	s.unpinMR(m)
	s.refundTables(st.acct, m.tableBytes)
	for _, r := range m.regs {
		r.pins--
		if r.dead && r.pins == 0 {
			rl.regions = append(rl.regions, r)
		}
	}
	if m.store != nil {
		rl.tables = append(rl.tables, m.store)
	} else {
		rl.heapBytes += m.tableBytes
	}
}

// Invalidate makes the MR named by key (lkey or rkey) fail every lookup
// until it is deregistered and registered again (LOCAL_INV,
// SEND_WITH_INV). The MR must belong to pd and have no memory window
// bound (ErrMRBound). For the rkey of a type 2 memory window bound in pd,
// it frees the window (a type 1 window's: ErrMWType). Safe from workers:
// it takes only the short mwMu. Copies that already passed their lookup
// finish.
func (s *Space) Invalidate(key uint32, pd PD) error {
	s.mwMu.Lock()
	defer s.mwMu.Unlock()
	m := s.slot(key)
	if m != nil && m.win != nil {
		return s.invalidateMWLocked(m.win, key, pd)
	}
	if m == nil || (m.lkey != key && m.rkey != key) || m.invalid.Load() {
		return ErrBadKey
	}
	if m.pd != pd {
		return ErrWrongPD
	}
	if m.numMW > 0 {
		return ErrMRBound
	}
	m.invalid.Store(true)
	return nil
}

// slot returns the MR in key's index slot, if any. Lock-free.
func (s *Space) slot(key uint32) *memRegion {
	idx := key >> 8
	if idx >= uint32(len(s.slots)) {
		return nil
	}
	return s.slots[idx].Load()
}

// lookupLocal returns the live, valid MR whose lkey is key, or nil.
// Lock-free.
func (s *Space) lookupLocal(key uint32) *memRegion {
	m := s.slot(key)
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
	var pte, start, end uint64
	if m.runs == nil {
		pte = m.pages[i]
		start = pte&pteOffMask + rel&(ps-1)
		end = pte&pteOffMask + ps
		for end-start < n && i+1 < uint64(len(m.pages)) && m.pages[i+1] == pte+ps {
			i++
			pte += ps
			end += ps
		}
	} else {
		k := m.runAt(i)
		next := m.npages
		if k+1 < len(m.runs) {
			next = m.runs[k+1].first
		}
		pte = m.runs[k].pte + (i-m.runs[k].first)<<m.shift
		start = pte&pteOffMask + rel&(ps-1)
		end = pte&pteOffMask + (next-i)<<m.shift
	}
	if end-start > n {
		end = start + n
	}
	return m.regs[pte>>pteRegShift].mem[start:end:end]
}
