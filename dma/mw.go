package dma

import (
	"fmt"
	"math"
	"sync/atomic"
)

// Memory windows (IBTA 10.6.7).
//
// A memory window gives remote access to a range of an MR that was
// registered with AccessMWBind, under an rkey of its own, without
// registering anything: the consumer allocates the window once
// (AllocMW) and binds it to a range with a BIND_MW work request, which
// the QP's worker executes in order with the QP's other work requests
// (Accessor.BindMW). As Linux rxe_mw.c:
//
//   - Type 1 windows belong to a PD. A bind (ibv_bind_mw) gives the window
//     a new rkey, replacing any earlier binding; a bind of length 0
//     unbinds it. They cannot be invalidated (LOCAL_INV, SEND with
//     Invalidate fail) and cannot be zero-based.
//   - Type 2 windows (2B: bound to a QP and checked against its PD) are
//     bound with a BIND_MW work request only when free (not bound),
//     always to a non-empty range, and only their QP may use their rkey;
//     LOCAL_INV, SEND with Invalidate or DeallocMW frees them again.
//
// The rkey's upper 24 bits are the window's key index, fixed at
// allocation; the consumer chooses the low 8 bits at each bind (Linux
// ib_inc_rkey). Windows share the key index space and the slot table with
// MRs: a window's slot holds a stub memRegion whose win field points to
// it and whose lkey and rkey are 0, so the MR lookups never match it.
//
// Concurrency: a window's binding is an immutable mwBinding published
// with one atomic store; the responder's lookup is lock-free
// (resolveRemote). Binds, invalidations, DeallocMW and the MR operations
// that must see whether windows are bound to an MR (DeregisterMR,
// Invalidate of an MR) serialize on Space.mwMu, which the control path
// takes after Space.mu.

// MWType is a memory window type (enum ibv_mw_type, VRNIC_MW_TYPE_*).
type MWType uint8

// Memory window types.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// AccessMWAll is what a bind may ask for: the remote rights, zero-based
// addressing, and local write (meaningless for a window, accepted and
// ignored as rxe does).
const AccessMWAll = AccessLocalWrite | AccessRemote | AccessZeroBased

// memWindow is one allocated window. typ, pd, handle are immutable; rkey,
// bound MR counts and dead are guarded by Space.mwMu; bind is read
// lock-free.
type memWindow struct {
	typ    MWType
	pd     PD
	handle uint32 // the rkey it was allocated with: DeallocMW's handle
	rkey   uint32 // current rkey (guarded by mwMu)
	bind   atomic.Pointer[mwBinding]
	stub   *memRegion // its slot entry
}

// mwBinding is a window's current binding, immutable once published.
type mwBinding struct {
	rkey   uint32
	mr     *memRegion
	addr   uint64 // the window's first byte, an iova of mr
	length uint64
	access Access
	qp     QPID // type 2: the QP it is bound to
}

// MWInfo is the result of AllocMW. Handle names the window for DeallocMW
// and for a bind; RKey is its key before the first bind.
type MWInfo struct {
	Handle, RKey uint32
}

// AllocMW allocates a memory window of type typ in protection domain pd
// of owner: ErrInvalid for another type, ErrLimit when every key index is
// in use.
func (s *Space) AllocMW(o Owner, pd uint32, typ MWType) (MWInfo, error) {
	if typ != MWType1 && typ != MWType2 {
		return MWInfo{}, fmt.Errorf("%w: memory window type %d", ErrInvalid, typ)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return MWInfo{}, ErrClosed
	}
	idx, _, rv, ok := s.keys.alloc()
	if !ok {
		return MWInfo{}, fmt.Errorf("%w: %d MR and MW keys in use", ErrLimit, len(s.slots)-1)
	}
	key := idx<<8 | uint32(rv)
	w := &memWindow{typ: typ, pd: PD{Owner: o, Handle: pd}, handle: key, rkey: key}
	w.stub = &memRegion{win: w}
	st := s.owner(o)
	st.mws[key] = w
	s.slots[idx].Store(w.stub)
	return MWInfo{Handle: key, RKey: key}, nil
}

// DeallocMW frees the window of owner whose handle is h (ErrNoMW if there
// is none). A bound window is unbound first: its rkey fails every access
// from then on (IBTA 10.6.7.1: deallocation invalidates the window).
func (s *Space) DeallocMW(o Owner, h uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.owners[o]
	var w *memWindow
	if st != nil {
		w = st.mws[h]
	}
	if w == nil {
		return fmt.Errorf("%w: owner %d handle %#x", ErrNoMW, o, h)
	}
	s.dropMW(st, w)
	return nil
}

// dropMW unbinds and unpublishes w and frees its index. Caller holds mu.
func (s *Space) dropMW(st *ownerState, w *memWindow) {
	s.mwMu.Lock()
	s.unbindLocked(w)
	idx := w.handle >> 8
	s.slots[idx].Store(nil)
	s.mwMu.Unlock()
	delete(st.mws, w.handle)
	s.keys.free(idx)
}

// unbindLocked drops w's binding. Caller holds mwMu.
func (s *Space) unbindLocked(w *memWindow) {
	if b := w.bind.Load(); b != nil {
		b.mr.numMW--
		w.bind.Store(nil)
	}
}

// MWBind is a BIND_MW work request (struct ibv_mw_bind_info and the
// window and key of struct ibv_send_wr's bind_mw).
type MWBind struct {
	MW     uint32 // the window's handle (AllocMW)
	RKey   uint32 // its rkey after the bind: the window's index, the consumer's 8-bit key
	MR     uint32 // lkey of the MR to bind to (unused with Length 0)
	Addr   uint64 // first byte of the window, an iova of the MR
	Length uint64 // 0: unbind (type 1 only)
	Access Access // AccessMWAll bits
}

// BindMW executes a BIND_MW work request posted on the QP the accessor
// runs for (SetQP), of protection domain pd: a type 2 window is bound to
// that QP (a QP of none, 0, binds no type 2 window). On
// success the window's rkey is b.RKey. Every refusal wraps ErrMWBind (the
// work request completes with MW_BIND_ERR), with the rule it broke, as
// rxe_check_bind_mw.
func (a *Accessor) BindMW(pd PD, b MWBind) error {
	s := a.s
	s.mwMu.Lock()
	defer s.mwMu.Unlock()
	m := s.slot(b.MW)
	if m == nil || m.win == nil || m.win.handle != b.MW {
		return fmt.Errorf("%w: no memory window %#x", ErrMWBind, b.MW)
	}
	w := m.win
	if w.pd != pd {
		return fmt.Errorf("%w: window %#x is in another PD than the QP", ErrMWBind, b.MW) // C10-72
	}
	if b.RKey>>8 != w.handle>>8 {
		return fmt.Errorf("%w: rkey %#x does not keep the window's index %#x", ErrMWBind, b.RKey, w.handle>>8)
	}
	if b.Access&^AccessMWAll != 0 {
		return fmt.Errorf("%w: access %#x: unknown bits", ErrMWBind, uint32(b.Access))
	}
	switch w.typ {
	case MWType1:
		if b.Access&AccessZeroBased != 0 {
			return fmt.Errorf("%w: a type 1 window cannot be zero-based", ErrMWBind) // o10-36.2.2
		}
	case MWType2:
		if a.qp == 0 {
			return fmt.Errorf("%w: a type 2 window is bound to a QP", ErrMWBind)
		}
		if w.bind.Load() != nil {
			return fmt.Errorf("%w: type 2 window %#x is already bound", ErrMWBind, b.MW) // o10-37.2.30
		}
		if b.Length == 0 {
			return fmt.Errorf("%w: a type 2 window cannot be bound to an empty range", ErrMWBind) // o10-37.2.40
		}
	}
	var nb *mwBinding
	if b.Length > 0 {
		mr := s.lookupLocal(b.MR)
		switch {
		case mr == nil:
			return fmt.Errorf("%w: no MR of lkey %#x", ErrMWBind, b.MR)
		case mr.pd != pd:
			return fmt.Errorf("%w: MR %#x is in another PD than the QP", ErrMWBind, b.MR)
		case mr.access&AccessMWBind == 0:
			return fmt.Errorf("%w: MR %#x was registered without MW_BIND access", ErrMWBind, b.MR) // C10-73
		case b.Access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && mr.access&AccessLocalWrite == 0:
			return fmt.Errorf("%w: a writable window needs an MR with local write", ErrMWBind) // C10-74
		case b.Addr > math.MaxUint64-b.Length || b.Addr < mr.iova || b.Addr+b.Length > mr.iova+mr.length:
			return fmt.Errorf("%w: [%#x, +%#x) is not inside MR %#x [%#x, +%#x)", ErrMWBind, b.Addr, b.Length, b.MR, mr.iova, mr.length) // C10-75
		}
		nb = &mwBinding{rkey: b.RKey, mr: mr, addr: b.Addr, length: b.Length, access: b.Access}
		if w.typ == MWType2 {
			nb.qp = a.qp
		}
		mr.numMW++
	}
	s.unbindLocked(w)
	w.rkey = b.RKey
	if nb != nil {
		w.bind.Store(nb)
	}
	return nil
}

// invalidateMW is Invalidate for a window's rkey: type 2 windows bound
// under that rkey in pd become free. Caller holds mwMu.
func (s *Space) invalidateMWLocked(w *memWindow, key uint32, pd PD) error {
	b := w.bind.Load()
	if b == nil || b.rkey != key {
		return ErrBadKey
	}
	if w.typ != MWType2 {
		return ErrMWType // o10-37.2.26
	}
	if w.pd != pd {
		return ErrWrongPD
	}
	s.unbindLocked(w)
	return nil
}

// resolveRemote is the responder's check of an rkey (rxe check_rkey):
// for an MR, its MR and the request's va; for a window, the window's MR
// and the iova of the request in it, once the window is found bound under
// rkey in pd, to the QP a runs for if type 2, granting want over [va, va+n) of the
// window (va an offset into the window when it is zero-based). Lock-free.
func (a *Accessor) resolveRemote(rkey uint32, pd PD, va, n uint64, want Access) (*memRegion, uint64, error) {
	m := a.s.slot(rkey)
	if m == nil {
		return nil, 0, ErrBadKey
	}
	w := m.win
	if w == nil {
		if m.rkey != rkey || m.invalid.Load() {
			return nil, 0, ErrBadKey
		}
		return m, va, m.check(pd, va, n, want)
	}
	b := w.bind.Load()
	switch {
	case b == nil || b.rkey != rkey:
		return nil, 0, ErrBadKey
	case w.pd != pd:
		return nil, 0, ErrWrongPD
	case w.typ == MWType2 && b.qp != a.qp:
		return nil, 0, ErrWrongQP
	case b.access&want != want:
		return nil, 0, ErrAccess
	}
	off := va
	if b.access&AccessZeroBased == 0 {
		if va < b.addr {
			return nil, 0, ErrBounds
		}
		off = va - b.addr
	}
	if n > b.length || off > b.length-n {
		return nil, 0, ErrBounds
	}
	return b.mr, b.addr + off, nil
}
