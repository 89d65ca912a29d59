package dma

import (
	"fmt"
	"runtime/debug"
)

// AccountID names whom pinned host memory and MR page tables are charged
// to. The device uses the uid of the client's connection, so every
// context of one user shares one account.
type AccountID uint32

// AccountLimits bound an account; a zero field is no bound.
type AccountLimits struct {
	// PinnedBytes bounds the host memory its MRs and rings pin, counted
	// in the 2 MiB chunks the daemon locks (see the package comment).
	PinnedBytes uint64
	// TableBytes bounds the storage of its MRs' page tables.
	TableBytes uint64
}

// AccountUsage is what an account holds now.
type AccountUsage struct {
	// Owners bound to the account (SetAccount) and not released.
	Owners int
	// PinnedBytes: the chunks under its MRs and rings, charged when the
	// pin is taken and refunded when the last pin on a chunk goes.
	PinnedBytes uint64
	// LockedBytes: of those, the chunks locked now (the pinner catches up
	// with pins asynchronously; see pin.go).
	LockedBytes uint64
	// PresentBytes: the pages of the locked chunks that the memfd held
	// when they were locked (SEEK_DATA), which the lock populated and
	// keeps resident; the rest of a locked chunk is locked as it is
	// first touched.
	PresentBytes uint64
	// TableBytes: storage of its MRs' page tables.
	TableBytes uint64
}

// account is one AccountID's usage and limits. Guarded by Space.mu.
type account struct {
	id     AccountID
	shared bool // in Space.accounts (SetAccount); else private to one owner
	lim    AccountLimits
	u      AccountUsage
}

// SetAccount charges owner o's pinned memory and page tables to account
// id with limits lim (which replace the account's limits). Call it before
// the owner adds memory; an owner that already holds pins or page tables
// keeps its account (ErrBusy).
func (s *Space) SetAccount(o Owner, id AccountID, lim AccountLimits) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	st := s.owner(o)
	if st.acct.shared && st.acct.id == id {
		st.acct.lim = lim
		return nil
	}
	if u := st.acct.u; u.PinnedBytes+u.LockedBytes+u.TableBytes != 0 {
		return fmt.Errorf("%w: owner %d already holds memory of account %d", ErrBusy, o, st.acct.id)
	}
	st.acct.u.Owners--
	s.maybeDropAccount(st.acct)
	a := s.accounts[id]
	if a == nil {
		a = &account{id: id, shared: true}
		s.accounts[id] = a
	}
	a.lim = lim
	a.u.Owners++
	st.acct = a
	for _, r := range st.regions {
		r.acct = a
	}
	return nil
}

// AccountUsage returns what account id holds (zero for an unknown id).
func (s *Space) AccountUsage(id AccountID) AccountUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.accounts[id]; a != nil {
		return a.u
	}
	return AccountUsage{}
}

// PinnedBytes returns the bytes pinned by all owners together.
func (s *Space) PinnedBytes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pinned
}

// maybeDropAccount forgets a shared account that holds nothing. Caller
// holds mu.
func (s *Space) maybeDropAccount(a *account) {
	if a.shared && a.u == (AccountUsage{}) {
		delete(s.accounts, a.id)
	}
}

// chargeTables charges n bytes of page tables to a. Caller holds mu.
func (s *Space) chargeTables(a *account, n uint64) error {
	if a.lim.TableBytes != 0 && a.u.TableBytes+n > a.lim.TableBytes {
		return fmt.Errorf("%w: MR page tables of account %d would take %d bytes, over its limit of %d bytes (this MR: %d)",
			ErrQuota, a.id, a.u.TableBytes+n, a.lim.TableBytes, n)
	}
	a.u.TableBytes += n
	return nil
}

func (s *Space) refundTables(a *account, n uint64) {
	a.u.TableBytes -= n
	s.maybeDropAccount(a)
}

// chargePinned charges n bytes of newly pinned chunks to a. Caller holds
// mu.
func (s *Space) chargePinned(a *account, n uint64) error {
	if n == 0 {
		return nil
	}
	if a.lim.PinnedBytes != 0 && a.u.PinnedBytes+n > a.lim.PinnedBytes {
		return fmt.Errorf("%w: account %d would pin %d bytes of host memory, over its limit of %d bytes (this registration: %d more)",
			ErrQuota, a.id, a.u.PinnedBytes+n, a.lim.PinnedBytes, n)
	}
	if s.pinned+n > s.cfg.MaxPinnedBytes {
		return fmt.Errorf("%w: the device would pin %d bytes of host memory, over its limit of %d bytes", ErrQuota, s.pinned+n, s.cfg.MaxPinnedBytes)
	}
	a.u.PinnedBytes += n
	s.pinned += n
	return nil
}

func (s *Space) refundPinned(a *account, n uint64) {
	a.u.PinnedBytes -= n
	s.pinned -= n
	s.maybeDropAccount(a)
}

// heapReturnMin is the amount of page-table memory freed to the Go heap
// after which the heap is returned to the operating system: Go keeps freed
// heap memory for reuse, so without this a client that built large tables
// and left would leave the daemon's RSS high for minutes.
const heapReturnMin = 4 << 20

// freeOSMemory collects the Go heap and returns its free memory to the
// operating system; tests replace it.
var freeOSMemory = debug.FreeOSMemory

// maybeReturnHeap returns the Go heap's free memory to the operating
// system, in the background, once heapReturnMin bytes of page tables went
// back to the heap. Tables freed while a return runs may miss its
// collection (a client's MRs are deregistered one by one, and the first
// heapReturnMin bytes start the return): the background goroutine goes
// again while heapReturnMin bytes or more were freed since it last began,
// else those tables would stay on the heap, as garbage, until the next
// collection, which a heap grown by them puts far off. Caller does not
// hold mu.
func (s *Space) maybeReturnHeap() {
	if s.heapFreed.Load() < heapReturnMin || !s.bgRunning.CompareAndSwap(false, true) {
		return
	}
	s.pinWG.Add(1)
	go func() {
		defer s.pinWG.Done()
		for {
			s.heapFreed.Store(0)
			freeOSMemory()
			s.bgRunning.Store(false)
			if s.heapFreed.Load() < heapReturnMin || !s.bgRunning.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}
