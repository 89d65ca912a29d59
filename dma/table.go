package dma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MR page tables.
//
// A table maps page i of an MR to a PTE, regs index << pteRegShift | byte
// offset in that region, in one of two forms, chosen per MR by size:
//
//   - flat: pages[i] is page i's PTE (8 bytes a page);
//   - runs: runs[k] is a maximal run of pages contiguous in one region,
//     starting at MR page runs[k].first with PTE runs[k].pte and ending
//     where runs[k+1] starts (16 bytes a run). An honest MR over memory
//     contiguous in its memfd is one run, whatever its length.
//
// Runs are used when they take at most half the flat form's bytes.
// Translation is one index in the flat form and a binary search over the
// runs (one step for one run) in the other; either way a span covers a
// whole run at once.
//
// Storage: tables of tableMmapMin bytes or more live in anonymous
// mappings of their own, unmapped after the MR's grace period, so a
// client that leaves gives their memory back to the system at once;
// smaller ones live on the Go heap (see maybeReturnHeap). The bytes a
// table takes are charged to the owner's account.

// pteRun is one run of a runs-form table.
type pteRun struct {
	first uint64 // MR page index where the run starts
	pte   uint64 // PTE of that page
}

// tableMmapMin is the size from which a table gets a mapping of its own.
const tableMmapMin = 256 << 10

// allocPages returns a flat table of n entries, and its mapping when it
// has one (else nil).
func allocPages(n uint64) ([]uint64, []byte, error) {
	if n*8 < tableMmapMin {
		return make([]uint64, n), nil, nil
	}
	b, err := mapTable(n * 8)
	if err != nil {
		return nil, nil, err
	}
	return u64sOf(b)[:n], b, nil
}

// allocRuns is allocPages for a runs-form table.
func allocRuns(n uint64) ([]pteRun, []byte, error) {
	if n*16 < tableMmapMin {
		return make([]pteRun, n), nil, nil
	}
	b, err := mapTable(n * 16)
	if err != nil {
		return nil, nil, err
	}
	return runsOf(b)[:n], b, nil
}

func mapTable(size uint64) ([]byte, error) {
	size = alignUp(size, MinPage)
	b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("dma: page table of %d bytes: %w", size, err)
	}
	return b, nil
}

// tableCost is what a table of n bytes costs: n on the Go heap, its
// mapping from tableMmapMin on (allocPages, allocRuns).
func tableCost(n uint64) uint64 {
	if n < tableMmapMin {
		return n
	}
	return alignUp(n, MinPage)
}

// scratchPages returns the Space's scratch table with room for n entries,
// mapped once, at the largest size an MR may have. Caller holds mu.
func (s *Space) scratchPages(n uint64) ([]uint64, error) {
	if s.scratch == nil {
		b, err := mapTable(uint64(s.cfg.MaxPagesPerMR) * 8)
		if err != nil {
			return nil, err
		}
		s.scratch = b
	}
	return u64sOf(s.scratch)[:n], nil
}

// releaseScratch gives the pages of a large scratch use back to the
// system, so the daemon keeps no more than tableMmapMin of it resident.
// Caller holds mu.
func (s *Space) releaseScratch(n uint64) {
	if end := alignUp(n*8, MinPage); end > tableMmapMin {
		_ = unix.Madvise(s.scratch[tableMmapMin:end], unix.MADV_DONTNEED)
	}
}

// freeStore unmaps a table's mapping (nil: a heap table, left to the GC).
func freeStore(b []byte) {
	if b != nil {
		_ = unix.Munmap(b)
	}
}

// runAt returns the index of the run holding MR page i (runs non-empty,
// runs[0].first == 0).
func (m *memRegion) runAt(i uint64) int {
	lo, hi := 0, len(m.runs)
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if m.runs[mid].first <= i {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// eachRun calls fn for every maximal run of the table: the region, the
// byte offset in it and the run's length in bytes.
func (m *memRegion) eachRun(fn func(r *region, off, n uint64)) {
	ps := uint64(1) << m.shift
	emit := func(pte, pages uint64) { fn(m.regs[pte>>pteRegShift], pte&pteOffMask, pages<<m.shift) }
	if m.runs != nil {
		for k, r := range m.runs {
			next := m.npages
			if k+1 < len(m.runs) {
				next = m.runs[k+1].first
			}
			emit(r.pte, next-r.first)
		}
		return
	}
	start, cnt := m.pages[0], uint64(1)
	for _, pte := range m.pages[1:] {
		if pte == start+cnt*ps {
			cnt++
			continue
		}
		emit(start, cnt)
		start, cnt = pte, 1
	}
	emit(start, cnt)
}

// walkChunks calls fn for every chunk under every run, skipping a chunk
// equal to the one just visited (runs of aliasing pages). Deterministic
// for a given table, so pinMR and unpinMR visit the same chunks.
func (m *memRegion) walkChunks(fn func(r *region, c uint32)) {
	var lastR *region
	var lastC uint32
	m.eachRun(func(r *region, off, n uint64) {
		rangeChunks(off, n, func(c uint32) {
			if r == lastR && c == lastC {
				return
			}
			lastR, lastC = r, c
			fn(r, c)
		})
	})
}
