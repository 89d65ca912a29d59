package dma

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// region is one mapped memfd: PA [pa, pa+length) is byte pa-x of mem.
// Immutable after AddRegion except the fields below (guarded by Space.mu
// unless said otherwise).
type region struct {
	owner  Owner
	handle uint32
	pa     uint64
	length uint64
	mem    []byte // MAP_SHARED mapping, len == length; nil once unmapped (under lk)
	fd     int    // the Space's duplicate of the client's fd
	seekFd int    // the memfd reopened, for SEEK_DATA/SEEK_HOLE (-1: none)

	acct *account // the owner's account: pins are charged to it
	pins int      // MRs referencing it + live ring views (Pin)
	dead bool     // unpublished: unmapped once pins reaches 0

	// Chunk pinning (pin.go).
	refs     map[uint32]uint64   // chunk -> references (absent: 0)
	dirty    map[uint32]struct{} // chunks whose lock may not match refs
	queued   bool                // in Space.pinq
	locked   map[uint32]uint64   // locked chunk -> bytes present when locked
	unmapped bool                // releaseRegion ran: the pinner records nothing more

	// lk serializes the pinner's mlock/munlock of mem with the munmap.
	lk sync.Mutex
}

func (r *region) contains(pa, n uint64) bool {
	return pa >= r.pa && n <= r.length && pa-r.pa <= r.length-n
}

// unmap unmaps and closes. Only after a grace period, or for a region
// never published.
func (r *region) unmap() {
	r.lk.Lock()
	defer r.lk.Unlock()
	if r.mem != nil {
		_ = unix.Munmap(r.mem) // also drops the locks
		r.mem = nil
	}
	for _, fd := range []*int{&r.fd, &r.seekFd} {
		if *fd >= 0 {
			_ = unix.Close(*fd)
			*fd = -1
		}
	}
}

// releaseRegion unmaps r and drops what its locked chunks counted. Only
// after a grace period. Caller does not hold mu.
func (s *Space) releaseRegion(r *region) {
	s.mu.Lock()
	r.unmapped = true
	if a := r.acct; a != nil {
		for c, present := range r.locked {
			a.u.LockedBytes -= r.chunkBytes(c)
			a.u.PresentBytes -= present
		}
		s.maybeDropAccount(a)
	}
	r.locked = nil
	s.mu.Unlock()
	r.unmap()
}

// RegionInfo describes a region added to the Space.
type RegionInfo struct {
	Handle uint32
	PA     uint64 // PA of byte 0 of the memfd; 2 MiB aligned
	Length uint64
	// Locked: the ranges MRs and rings pin will be locked (mlock) as they
	// are pinned; false when the Space was configured with NoMlock.
	// Adding a region locks nothing.
	Locked bool
}

// AddRegion maps length bytes of the memfd fd into the Space for owner and
// assigns them the PA range [PA, PA+length).
//
// fd ownership: AddRegion does not take fd. It duplicates it
// (F_DUPFD_CLOEXEC) and the Space owns the duplicate, closing it when the
// region is removed; the caller closes fd when it likes (typically right
// after AddRegion returns, as the control server does with fds received
// by SCM_RIGHTS).
//
// The fd must be a memfd sealed with F_SEAL_SHRINK, not write-sealed, at
// least length bytes long; length a non-zero multiple of 4096 not above
// Config.MaxRegionBytes. Nothing is populated or locked here, whatever
// the length: MRs and rings lock what they pin (pin.go), so the cost of a
// call does not grow with the region.
//
// PA ranges are 2 MiB aligned, separated by a 2 MiB unmapped guard gap and
// never reused, so a stale PA never reaches a later region.
func (s *Space) AddRegion(o Owner, fd int, length uint64) (RegionInfo, error) {
	if length == 0 || length%MinPage != 0 {
		return RegionInfo{}, fmt.Errorf("%w: region length %#x not a non-zero multiple of 4096", ErrInvalid, length)
	}
	if length > s.cfg.MaxRegionBytes {
		return RegionInfo{}, fmt.Errorf("%w: region length %#x > %#x", ErrTooLarge, length, s.cfg.MaxRegionBytes)
	}
	if fd < 0 {
		return RegionInfo{}, fmt.Errorf("%w: fd %d", ErrNotMemfd, fd)
	}
	if err := checkMemfd(fd, length); err != nil {
		return RegionInfo{}, err
	}

	// Early refusal before mapping anything (checked again when placing).
	s.mu.Lock()
	err := s.placeLocked(o, nil)
	s.mu.Unlock()
	if err != nil {
		return RegionInfo{}, err
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return RegionInfo{}, fmt.Errorf("dma: dup fd: %w", err)
	}
	mem, err := mapShared(dup, length)
	if err != nil {
		_ = unix.Close(dup)
		return RegionInfo{}, err
	}
	r := &region{owner: o, length: length, mem: mem, fd: dup, seekFd: reopen(dup)}
	locked := !s.cfg.NoMlock

	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.placeLocked(o, r); err != nil {
		r.unmap() // never published: no grace period needed
		return RegionInfo{}, err
	}
	s.log.Debug("dma: host memory added", "owner", o, "handle", r.handle, "pa", r.pa, "length", length, "lock_on_pin", locked, "memlock_limit", memlockLimit())
	return RegionInfo{Handle: r.handle, PA: r.pa, Length: length, Locked: locked}, nil
}

// placeLocked gives r a handle and the next PA range and publishes it, or
// says why it cannot (r nil: only check). Caller holds mu.
func (s *Space) placeLocked(o Owner, r *region) error {
	if s.closed {
		return ErrClosed
	}
	st := s.owner(o)
	if len(st.regions) >= s.cfg.MaxRegionsPerOwner {
		return fmt.Errorf("%w: %d regions per owner", ErrLimit, s.cfg.MaxRegionsPerOwner)
	}
	if r == nil {
		return nil
	}
	pa := s.nextPA
	next := alignUp(pa+r.length, RegionAlign) + guardGap
	if next > paLimit {
		return fmt.Errorf("%w: physical address space exhausted", ErrLimit)
	}
	s.nextPA = next
	s.nextHandle++
	r.handle, r.pa, r.acct = s.nextHandle, pa, st.acct
	st.regions[r.handle] = r
	s.byPA = append(s.byPA, r) // PAs only grow: stays sorted
	return nil
}

// RemoveRegion unmaps a region of owner. It fails with ErrBusy while an MR
// or a ring view (Slice) pins it. The unmapping waits for a grace period
// (see the package comment), so no worker is copying from it when it goes.
func (s *Space) RemoveRegion(o Owner, handle uint32) error {
	s.mu.Lock()
	st := s.owners[o]
	var r *region
	if st != nil {
		r = st.regions[handle]
	}
	if r == nil {
		s.mu.Unlock()
		return fmt.Errorf("%w: owner %d handle %d", ErrNoRegion, o, handle)
	}
	if r.pins > 0 {
		s.mu.Unlock()
		return fmt.Errorf("%w: handle %d has %d pins", ErrBusy, handle, r.pins)
	}
	s.unpublish(r)
	s.mu.Unlock()
	s.retire(&retireList{regions: []*region{r}})
	return nil
}

// Pin keeps a region mapped while a ring view of it is in use. Release it
// when the ring is destroyed; the []byte from Slice must not be touched
// after that.
//
// Every QP holds two (its rings): the fields fit 32 bytes.
type Pin struct {
	s    *Space
	r    *region
	off  uint64        // the pinned range of r: [off, off+n)
	n    uint32        // a ring is far below 4 GiB (Slice checks)
	done atomic.Uint32 // Release ran
}

// Bytes returns the pinned range as the daemon maps it, as Slice did
// (the region stays mapped while the pin is held): a holder need not keep
// the slice beside the pin. Not valid after Release.
func (p *Pin) Bytes() []byte {
	end := p.off + uint64(p.n)
	return p.r.mem[p.off:end:end]
}

// Release drops the pin. Safe to call more than once. Ring views are not
// covered by the accessor grace period: the ring's user must have stopped
// touching the slice before it calls Release.
func (p *Pin) Release() {
	if !p.done.CompareAndSwap(0, 1) {
		return
	}
	s := p.s
	s.mu.Lock()
	s.unpinRange(p.r, p.off, uint64(p.n))
	p.r.pins--
	last := p.r.dead && p.r.pins == 0
	s.mu.Unlock()
	if last {
		s.retire(&retireList{regions: []*region{p.r}})
	}
}

// Slice returns the bytes of [pa, pa+length) for a ring of owner, which
// must lie wholly inside one of owner's regions, and pins that region (it
// cannot be removed, and survives ReleaseOwner, until the Pin is
// released) and the chunks of the range (locked, charged to the owner's
// account: ErrQuota beyond its limit). The slice aliases shared memory the client writes
// concurrently: read each index once, validate, never trust.
func (s *Space) Slice(o Owner, pa, length uint64) ([]byte, *Pin, error) {
	if length == 0 {
		return nil, nil, fmt.Errorf("%w: zero-length slice", ErrInvalid)
	}
	if length > math.MaxUint32 {
		return nil, nil, fmt.Errorf("%w: ring of %d bytes", ErrTooLarge, length)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	r, err := s.findPA(o, pa, length)
	if err != nil {
		return nil, nil, err
	}
	off := pa - r.pa
	if err := s.pinRange(r, off, length); err != nil {
		return nil, nil, fmt.Errorf("ring at PA %#x (%d bytes): %w", pa, length, err)
	}
	r.pins++
	return r.mem[off : off+length : off+length], &Pin{s: s, r: r, off: off, n: uint32(length)}, nil
}

// ReadPageList copies n little-endian u64 page addresses stored at pa in
// owner's host memory (REG_MR's pbl_pa) into a new slice. The client may
// reuse the memory afterwards; the copy is what gets validated.
func (s *Space) ReadPageList(o Owner, pa uint64, n uint32) ([]uint64, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: empty page list", ErrInvalid)
	}
	if pa%8 != 0 {
		return nil, fmt.Errorf("%w: page list PA %#x not 8-byte aligned", ErrInvalid, pa)
	}
	if int64(n) > int64(s.cfg.MaxPagesPerMR) {
		return nil, fmt.Errorf("%w: %d pages > %d per MR", ErrTooLarge, n, s.cfg.MaxPagesPerMR)
	}
	size := uint64(n) * 8
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.findPA(o, pa, size)
	if err != nil {
		return nil, err
	}
	b := r.mem[pa-r.pa : pa-r.pa+size]
	out := make([]uint64, n)
	for i := range out {
		o := b[i*8 : i*8+8]
		out[i] = uint64(o[0]) | uint64(o[1])<<8 | uint64(o[2])<<16 | uint64(o[3])<<24 |
			uint64(o[4])<<32 | uint64(o[5])<<40 | uint64(o[6])<<48 | uint64(o[7])<<56
	}
	return out, nil
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) &^ (a - 1) }
