package dma

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Pinning host memory.
//
// Adding a region maps it and nothing more: no page is populated or
// locked, so a sparse memfd of any size costs the daemon address space
// only. What MRs and rings cover is pinned, in chunks of 2 MiB of a
// region (chunk c is bytes [c<<21, (c+1)<<21) of the memfd):
//
//   - Each chunk has a reference count: one per MR run (maximal range of
//     pages contiguous in the region) and per ring view touching it.
//     Control-plane calls change the counts under Space.mu and charge the
//     owner's account the chunk's bytes when its count leaves 0, refund
//     them when it returns to 0, and refuse with ErrQuota when the charge
//     would exceed the account's or the device's limit.
//   - A chunk whose count crossed 0 is dirty; one pinner goroutine per
//     Space brings each dirty chunk's lock in line with its count, one
//     chunk per step, holding only the region's lk (never Space.mu nor
//     the device's lock): mlock2(MLOCK_ONFAULT) on the chunk, then
//     MADV_POPULATE_READ on the pages the memfd has (found with
//     SEEK_DATA/SEEK_HOLE), or munlock. A command never waits for a lock
//     to be taken, and the process's mmap lock is held for one chunk at a
//     time.
//   - MLOCK_ONFAULT leaves holes alone: the daemon never allocates the
//     pages of a sparse memfd on the client's behalf; a hole is locked if
//     and when a copy first touches it.
//
// Why SEEK_DATA/SEEK_HOLE to find the pages present: it reads the memfd's
// own allocation map (page cache and swap), so it sees exactly the pages
// the client has, whatever the daemon has mapped so far, in one call per
// extent. mincore would report swapped-out pages as absent and only
// answers for a mapping; /proc/self/smaps counts only what this process
// has mapped and costs a text parse. The seeks use a file description of
// the daemon's own (the memfd reopened through /proc/self/fd), because
// the duplicate received by SCM_RIGHTS shares its file offset with the
// client.
//
// Locked chunks split a region's mapping into several; the limits on
// pinned bytes also bound how many mappings a client can make the daemon
// hold (vm.max_map_count).
const (
	chunkShift = PageShift2M
	chunkSize  = 1 << chunkShift
)

// chunkRef names one chunk of one region.
type chunkRef struct {
	r *region
	c uint32
}

func (r *region) chunkBytes(c uint32) uint64 {
	return min(chunkSize, r.length-uint64(c)<<chunkShift)
}

// ref adds a reference to chunk c of r, appending it to fresh if it was
// unpinned. Caller holds mu.
func (r *region) ref(c uint32, fresh []chunkRef) []chunkRef {
	if r.refs == nil {
		r.refs = make(map[uint32]uint64)
	}
	r.refs[c]++
	if r.refs[c] == 1 {
		fresh = append(fresh, chunkRef{r, c})
	}
	return fresh
}

// unref drops a reference taken by ref; a chunk left without references
// is refunded and queued for unlocking. Caller holds mu.
func (s *Space) unref(r *region, c uint32) {
	r.refs[c]--
	if r.refs[c] == 0 {
		delete(r.refs, c)
		s.refundPinned(r.acct, r.chunkBytes(c))
		s.markDirty(r, c)
	}
}

// commitPins charges the chunks that ref found unpinned to a and queues
// them for locking. On ErrQuota the caller must undo its refs with unref
// (which then refunds nothing: see rollbackPins). Caller holds mu.
func (s *Space) commitPins(a *account, fresh []chunkRef) error {
	var n uint64
	for _, f := range fresh {
		n += f.r.chunkBytes(f.c)
	}
	if err := s.chargePinned(a, n); err != nil {
		return err
	}
	for _, f := range fresh {
		s.markDirty(f.r, f.c)
	}
	return nil
}

// rollbackPins undoes refs whose commit failed: nothing was charged.
func rollbackPins(undo func(func(r *region, c uint32))) {
	undo(func(r *region, c uint32) {
		r.refs[c]--
		if r.refs[c] == 0 {
			delete(r.refs, c)
		}
	})
}

// rangeChunks calls fn for every chunk [off, off+n) of a region touches
// (n > 0).
func rangeChunks(off, n uint64, fn func(c uint32)) {
	for c := off >> chunkShift; c <= (off+n-1)>>chunkShift; c++ {
		fn(uint32(c))
	}
}

// pinRange references the chunks of [off, off+n) of r for a ring view,
// charging r's account. Caller holds mu.
func (s *Space) pinRange(r *region, off, n uint64) error {
	var fresh []chunkRef
	rangeChunks(off, n, func(c uint32) { fresh = r.ref(c, fresh) })
	if err := s.commitPins(r.acct, fresh); err != nil {
		rollbackPins(func(f func(*region, uint32)) { rangeChunks(off, n, func(c uint32) { f(r, c) }) })
		return err
	}
	return nil
}

// unpinRange drops what pinRange took. Caller holds mu.
func (s *Space) unpinRange(r *region, off, n uint64) {
	rangeChunks(off, n, func(c uint32) { s.unref(r, c) })
}

// pinMR references the chunks under m's runs. An MR referencing one chunk
// through many consecutive runs (pages aliasing each other, say) takes
// one reference. Caller holds mu.
func (s *Space) pinMR(a *account, m *memRegion) error {
	var fresh []chunkRef
	m.walkChunks(func(r *region, c uint32) { fresh = r.ref(c, fresh) })
	if err := s.commitPins(a, fresh); err != nil {
		rollbackPins(m.walkChunks)
		return err
	}
	return nil
}

// unpinMR drops what pinMR took. Caller holds mu.
func (s *Space) unpinMR(m *memRegion) {
	m.walkChunks(func(r *region, c uint32) { s.unref(r, c) })
}

// markDirty queues chunk c of r for the pinner. Caller holds mu.
func (s *Space) markDirty(r *region, c uint32) {
	if s.cfg.NoMlock {
		return
	}
	if r.dirty == nil {
		r.dirty = make(map[uint32]struct{})
	}
	r.dirty[c] = struct{}{}
	if !r.queued {
		r.queued = true
		s.pinq = append(s.pinq, r)
	}
	if !s.pinRunning {
		s.pinRunning = true
		s.pinWG.Add(1)
		go s.pinner()
	}
}

// nextDirty pops a dirty chunk. Caller holds mu.
func (s *Space) nextDirty() (*region, uint32, bool) {
	for len(s.pinq) > 0 {
		r := s.pinq[0]
		for c := range r.dirty {
			delete(r.dirty, c)
			return r, c, true
		}
		r.queued = false
		s.pinq[0] = nil
		s.pinq = s.pinq[1:]
	}
	return nil, 0, false
}

// pinner locks and unlocks dirty chunks until none is left, then exits
// (markDirty starts it again).
func (s *Space) pinner() {
	defer s.pinWG.Done()
	for {
		s.mu.Lock()
		r, c, ok := s.nextDirty()
		if !ok {
			s.pinRunning = false
			s.mu.Unlock()
			return
		}
		want := r.refs[c] > 0
		_, have := r.locked[c]
		s.mu.Unlock()
		if want == have {
			continue
		}
		var (
			present uint64
			err     error
			done    bool
		)
		r.lk.Lock()
		if r.mem != nil {
			start := uint64(c) << chunkShift
			b := r.mem[start : start+r.chunkBytes(c)]
			if want {
				if err = s.lockChunkFn(b); err == nil {
					present = populatePresent(r, start, start+uint64(len(b)))
				}
			} else {
				_ = unix.Munlock(b)
			}
			done = true
		}
		r.lk.Unlock()

		s.mu.Lock()
		if done && !r.unmapped {
			a, cb := r.acct, r.chunkBytes(c)
			switch {
			case want && err == nil:
				if r.locked == nil {
					r.locked = make(map[uint32]uint64)
				}
				r.locked[c] = present
				a.u.LockedBytes += cb
				a.u.PresentBytes += present
			case want:
				s.lockFails++
				if s.lockFails == 1 || errors.Is(err, unix.EPERM) && s.lockFails%1024 == 0 {
					s.log.Warn("dma: cannot lock pinned host memory; it stays pageable", "err", err, "memlock_limit", memlockLimit(), "failures", s.lockFails)
				}
			default:
				a.u.LockedBytes -= cb
				a.u.PresentBytes -= r.locked[c]
				delete(r.locked, c)
				s.maybeDropAccount(a)
			}
		}
		s.mu.Unlock()
	}
}

// populatePresent maps (and so, in a locked range, locks) the pages of
// [start, end) that the memfd holds, and returns their bytes. Holes are
// left alone. Caller holds r.lk with r.mem mapped.
func populatePresent(r *region, start, end uint64) uint64 {
	if r.seekFd < 0 {
		return 0
	}
	var present uint64
	for off := start; off < end; {
		d, err := unix.Seek(r.seekFd, int64(off), unix.SEEK_DATA)
		if err != nil || uint64(d) >= end { // ENXIO: no data after off
			break
		}
		h, err := unix.Seek(r.seekFd, d, unix.SEEK_HOLE)
		if err != nil {
			h = int64(end)
		}
		lo, hi := uint64(d), min(uint64(h), end)
		if err := unix.Madvise(r.mem[lo:hi], unix.MADV_POPULATE_READ); err != nil {
			// Kernels before 5.14: fault the pages in by reading them.
			var sum byte
			for p := lo; p < hi; p += MinPage {
				sum += r.mem[p]
			}
			touchSink = sum
		}
		present += hi - lo
		off = hi
	}
	return present
}

// touchSink keeps the reads of the fallback in populatePresent.
var touchSink byte

// LockStats reports the pinner's work: bytes pinned (charged), bytes
// locked now, and locks that failed (RLIMIT_MEMLOCK without
// CAP_IPC_LOCK: the memory stays pageable and works the same).
func (s *Space) LockStats() (pinned, locked, failures uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.byPA {
		for c := range r.locked {
			locked += r.chunkBytes(c)
		}
	}
	return s.pinned, locked, s.lockFails
}

// WaitPinned waits until the pinner has no work left (tests and
// measurements: locks follow pins asynchronously).
func (s *Space) WaitPinned() {
	for {
		s.mu.Lock()
		idle := !s.pinRunning
		s.mu.Unlock()
		if idle {
			return
		}
		backoff(100)
	}
}
