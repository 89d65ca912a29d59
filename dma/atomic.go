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
	w, err := a.word(rkey, pd, va)
	if err != nil {
		return 0, err
	}
	return casWord(w, compare, swap), nil
}

// FetchAdd adds add to the word at va.
func (a *Accessor) FetchAdd(rkey uint32, pd PD, va, add uint64) (uint64, error) {
	a.Enter()
	defer a.Exit()
	w, err := a.word(rkey, pd, va)
	if err != nil {
		return 0, err
	}
	return addWord(w, add), nil
}

// word returns the 8 mapped bytes at va. Mappings are page aligned and so
// is every page of the MR, so (va-base)%8 is the host address' alignment
// (base is va's page start, a multiple of 8, for all but zero-based MRs).
func (a *Accessor) word(rkey uint32, pd PD, va uint64) ([]byte, error) {
	m, err := a.remoteRegion(rkey, pd, va, 8, AccessRemoteAtomic)
	if err != nil {
		return nil, err
	}
	// A zero-based MR's address x is its first page's byte x-base: the
	// host alignment is that of va-base.
	if (va-m.base)%8 != 0 {
		return nil, ErrMisaligned
	}
	return m.span(va, 8), nil // never crosses a page: aligned
}
