package dma

// Atomic operations (IBTA 9.4.5: CmpSwap and FetchAdd on an 8-byte
// aligned 64-bit word). They are real CPU atomics on the mapped word, so
// they are atomic against the client's own atomic stores to it and against
// other workers. The MR must grant REMOTE_ATOMIC. Values are in host byte
// order, as the client's CPU sees the word (the engine converts from the
// big-endian wire). Both return the original value.

// CompareSwap: if the word at va equals compare, store swap.
func (a *Accessor) CompareSwap(rkey uint32, pd PD, va, compare, swap uint64) (uint64, error) {
	a.Enter()
	defer a.Exit()
	m, va, err := a.atomicRegion(rkey, pd, va)
	if err != nil {
		return 0, err
	}
	if m.proc != nil {
		return a.odpAtomic(m, va, func(old uint64) uint64 {
			if old == compare {
				return swap
			}
			return old
		})
	}
	return casWord(m.span(va, 8), compare, swap), nil
}

// FetchAdd adds add to the word at va.
func (a *Accessor) FetchAdd(rkey uint32, pd PD, va, add uint64) (uint64, error) {
	a.Enter()
	defer a.Exit()
	m, va, err := a.atomicRegion(rkey, pd, va)
	if err != nil {
		return 0, err
	}
	if m.proc != nil {
		return a.odpAtomic(m, va, func(old uint64) uint64 { return old + add })
	}
	return addWord(m.span(va, 8), add), nil
}

// AtomicWrite is the responder of an ATOMIC WRITE (IBTA 1.5 Memory
// Placement Extensions; Linux rxe_mr_do_atomic_write): the 8 bytes of v as
// they lie in host memory (the engine takes them from the wire in order)
// are stored at the aligned word at va with one atomic store, so that no
// reader, local CPU or remote READ, sees a torn value. The MR must grant
// REMOTE_WRITE, as rxe requires.
func (a *Accessor) AtomicWrite(rkey uint32, pd PD, va, v uint64) error {
	a.Enter()
	defer a.Exit()
	m, va, err := a.atomicRegionFor(rkey, pd, va, AccessRemoteWrite)
	if err != nil {
		return err
	}
	if m.proc != nil {
		_, err := a.odpAtomic(m, va, func(uint64) uint64 { return v })
		return err
	}
	storeWord(m.span(va, 8), v)
	return nil
}

// Flush is the responder of a FLUSH (IBTA 1.5 Memory Placement
// Extensions): it checks the MR of rkey for the flush rights in want
// (AccessFlushGlobal and/or AccessFlushPersistent), over [va, va+n) or,
// when whole is set (selectivity level "memory region"), over the whole
// MR, and returns once every store placed before it is globally visible.
//
// What placement means here: the daemon places RDMA WRITE and ATOMIC WRITE
// data with CPU stores into the client's own memfd pages, synchronously
// and in PSN order, so by the time a FLUSH is executed the data before it
// is in the memory the client and every other mapping see; the full
// barrier below orders it before the FLUSH's response. Persistence would
// need a persistence domain beyond RAM: memfd (shmem) pages have none
// (msync on them does nothing), so the device offers no
// FLUSH_PERSISTENT (REG_MR refuses the flag with EOPNOTSUPP, as Linux rxe
// refuses it for memory that is not pmem) and a FLUSH asking for
// persistence fails the access check.
func (a *Accessor) Flush(rkey uint32, pd PD, va, n uint64, whole bool, want Access) error {
	a.Enter()
	defer a.Exit()
	if whole {
		// The whole MR the rkey names. A window's rkey with this
		// selectivity is refused (vrnic flushes by MR only).
		m := a.s.slot(rkey)
		if m == nil || m.win != nil || m.rkey != rkey || m.invalid.Load() {
			return ErrBadKey
		}
		if err := m.check(pd, m.iova, m.length, want); err != nil {
			return err
		}
	} else if _, _, err := a.remoteRegion(rkey, pd, va, n, want); err != nil {
		return err
	}
	fullBarrier()
	return nil
}

// atomicRegion returns the MR of the 8-byte word at va, checked for
// REMOTE_ATOMIC and alignment. Mappings are page aligned and so is every
// page of the MR, so va%8 is the host address' alignment (m.span(va, 8)
// never crosses a page); an on-demand paging MR's iova and address share
// their offset in the page (RegisterODPMR).
func (a *Accessor) atomicRegion(rkey uint32, pd PD, va uint64) (*memRegion, uint64, error) {
	return a.atomicRegionFor(rkey, pd, va, AccessRemoteAtomic)
}

// atomicRegionFor is atomicRegion for the access bits want.
// The rkey may name a memory window: va comes back as the MR's address.
func (a *Accessor) atomicRegionFor(rkey uint32, pd PD, va uint64, want Access) (*memRegion, uint64, error) {
	m, va, err := a.remoteRegion(rkey, pd, va, 8, want)
	if err != nil {
		return nil, 0, err
	}
	// A zero-based MR's address x is its first page's byte x-base: the
	// host alignment is that of va-base.
	if (va-m.base)%8 != 0 {
		return nil, 0, ErrMisaligned
	}
	return m, va, nil
}
