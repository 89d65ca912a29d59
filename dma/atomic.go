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
	m, err := a.atomicRegion(rkey, pd, va)
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
	m, err := a.atomicRegion(rkey, pd, va)
	if err != nil {
		return 0, err
	}
	if m.proc != nil {
		return a.odpAtomic(m, va, func(old uint64) uint64 { return old + add })
	}
	return addWord(m.span(va, 8), add), nil
}

// atomicRegion returns the MR of the 8-byte word at va, checked for
// REMOTE_ATOMIC and alignment. Mappings are page aligned and so is every
// page of the MR, so va%8 is the host address' alignment (m.span(va, 8)
// never crosses a page); an on-demand paging MR's iova and address share
// their offset in the page (RegisterODPMR).
func (a *Accessor) atomicRegion(rkey uint32, pd PD, va uint64) (*memRegion, error) {
	m, err := a.remoteRegion(rkey, pd, va, 8, AccessRemoteAtomic)
	if err != nil {
		return nil, err
	}
	if va%8 != 0 {
		return nil, ErrMisaligned
	}
	return m, nil
}
