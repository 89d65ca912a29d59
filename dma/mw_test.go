package dma

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mwEnv is one owner with 16 KiB of host memory and an MR over it that
// windows may be bound to (iova 0x10000, 4 pages in order).
type mwEnv struct {
	s   *Space
	h   hostMem
	mr  MRInfo
	pd  PD
	acc *Accessor // runs for QP 1, which binds and uses the windows
}

func newMWEnv(t *testing.T, access Access) *mwEnv {
	t.Helper()
	s := newSpace(t, Config{})
	h := addHostMem(t, s, 1, 16*kib)
	mr, err := s.RegisterMR(1, 1, 0x10000, 16*kib, access, PageShift4K, []uint64{h.pa(0), h.pa(4096), h.pa(8192), h.pa(12288)})
	require.NoError(t, err)
	acc := s.NewAccessor()
	t.Cleanup(acc.Close)
	acc.SetQP(1)
	return &mwEnv{s: s, h: h, mr: mr, pd: PD{1, 1}, acc: acc}
}

func (e *mwEnv) alloc(t *testing.T, typ MWType) MWInfo {
	t.Helper()
	w, err := e.s.AllocMW(1, 1, typ)
	require.NoError(t, err)
	return w
}

// next returns key with the next 8-bit variant (ibv_inc_rkey).
func next(key uint32) uint32 { return key&^0xff | (key+1)&0xff }

func TestMWAlloc(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	for _, typ := range []MWType{0, 3, 255} {
		_, err := e.s.AllocMW(1, 1, typ)
		assert.ErrorIs(t, err, ErrInvalid, "type %d", typ)
	}
	w1 := e.alloc(t, MWType1)
	w2 := e.alloc(t, MWType2)
	assert.Equal(t, w1.Handle, w1.RKey)
	assert.NotEqual(t, w1.RKey>>8, w2.RKey>>8, "windows have key indices of their own")
	assert.NotEqual(t, e.mr.LKey>>8, w1.RKey>>8, "and share none with MRs")
	// An unbound window's rkey names nothing, and its key never names an MR.
	assert.ErrorIs(t, e.acc.WriteRemote(w1.RKey, e.pd, 0x10000, []byte{1}), ErrBadKey)
	assert.ErrorIs(t, e.acc.WriteRemote(w2.RKey, e.pd, 0x10000, []byte{1}), ErrBadKey)
	// Another owner cannot deallocate them; a stale handle is refused.
	assert.ErrorIs(t, e.s.DeallocMW(2, w1.Handle), ErrNoMW)
	require.NoError(t, e.s.DeallocMW(1, w1.Handle))
	assert.ErrorIs(t, e.s.DeallocMW(1, w1.Handle), ErrNoMW)
	require.NoError(t, e.s.DeallocMW(1, w2.Handle))
}

// TestMWType1: bind, access through the window's rkey only, rebind with a
// new key, unbind with length 0; a type 1 window is never invalidated.
func TestMWType1(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	w := e.alloc(t, MWType1)
	k1 := next(w.RKey)
	require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k1, MR: e.mr.LKey, Addr: 0x11000, Length: 4096,
		Access: AccessRemoteWrite | AccessRemoteRead | AccessLocalWrite}))
	assert.ErrorIs(t, e.acc.WriteRemote(w.RKey, e.pd, 0x11000, []byte{1}), ErrBadKey, "the old key")
	assert.ErrorIs(t, e.acc.WriteRemote(e.mr.RKey, e.pd, 0x11000, []byte{1}), ErrAccess, "the MR itself grants no remote access")

	require.NoError(t, e.acc.WriteRemote(k1, e.pd, 0x11000+100, []byte("through the window")))
	assert.Equal(t, "through the window", string(e.h.client[4096+100:4096+118]), "bytes land at the MR's iova")
	got := make([]byte, 18)
	require.NoError(t, e.acc.ReadRemote(k1, e.pd, 0x11000+100, got))
	assert.Equal(t, "through the window", string(got))

	for _, tc := range []struct {
		name string
		pd   PD
		va   uint64
		n    int
		err  error
	}{
		{"first byte", e.pd, 0x11000, 1, nil},
		{"last byte", e.pd, 0x11fff, 1, nil},
		{"before the window", e.pd, 0x10fff, 1, ErrBounds},
		{"past the window", e.pd, 0x12000, 1, ErrBounds},
		{"straddles the end", e.pd, 0x11ff0, 32, ErrBounds},
		{"inside the MR, outside the window", e.pd, 0x13000, 8, ErrBounds},
		{"wrong PD", PD{1, 2}, 0x11000, 1, ErrWrongPD},
		{"another owner", PD{2, 1}, 0x11000, 1, ErrWrongPD},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.acc.WriteRemote(k1, tc.pd, tc.va, make([]byte, tc.n))
			if tc.err == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, tc.err)
			}
		})
	}
	_, err := e.acc.FetchAdd(k1, e.pd, 0x11000, 1)
	assert.ErrorIs(t, err, ErrAccess, "no REMOTE_ATOMIC on the window")
	// Any QP of the PD may use a type 1 window's rkey, and any accessor.
	other := e.s.NewAccessor()
	defer other.Close()
	other.SetQP(2)
	assert.NoError(t, other.CheckRemote(k1, e.pd, 0x11000, 4096, AccessRemoteWrite))

	// Type 1: no invalidation (o10-37.2.26).
	assert.ErrorIs(t, e.s.Invalidate(k1, e.pd), ErrMWType)
	assert.NoError(t, other.CheckRemote(k1, e.pd, 0x11000, 1, AccessRemoteWrite), "still bound")
	// The MR cannot go, nor be invalidated, while the window is bound.
	assert.ErrorIs(t, e.s.DeregisterMR(1, e.mr.LKey), ErrMRBound)
	assert.ErrorIs(t, e.s.Invalidate(e.mr.LKey, e.pd), ErrMRBound)

	// Rebind elsewhere with the next key: the old key is dead.
	k2 := next(k1)
	require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k2, MR: e.mr.LKey, Addr: 0x13000, Length: 8, Access: AccessRemoteRead}))
	assert.ErrorIs(t, e.acc.CheckRemote(k1, e.pd, 0x11000, 1, AccessRemoteWrite), ErrBadKey)
	assert.NoError(t, e.acc.CheckRemote(k2, e.pd, 0x13000, 8, AccessRemoteRead))
	assert.ErrorIs(t, e.acc.CheckRemote(k2, e.pd, 0x13000, 8, AccessRemoteWrite), ErrAccess)

	// Unbind: length 0. The MR is free to go then.
	k3 := next(k2)
	require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k3}))
	assert.ErrorIs(t, e.acc.CheckRemote(k2, e.pd, 0x13000, 1, AccessRemoteRead), ErrBadKey)
	assert.ErrorIs(t, e.acc.CheckRemote(k3, e.pd, 0x13000, 1, AccessRemoteRead), ErrBadKey)
	require.NoError(t, e.s.DeregisterMR(1, e.mr.LKey))
	require.NoError(t, e.s.DeallocMW(1, w.Handle))
}

// TestMWType2: bound to the binding QP only, zero-based windows, freed by
// invalidation (then bindable again) and by deallocation.
func TestMWType2(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	w := e.alloc(t, MWType2)
	k := next(w.RKey)
	bind := MWBind{MW: w.Handle, RKey: k, MR: e.mr.LKey, Addr: 0x12000, Length: 8192, Access: AccessRemoteWrite | AccessRemoteAtomic}
	require.NoError(t, e.acc.BindMW(e.pd, bind))
	require.NoError(t, e.acc.WriteRemote(k, e.pd, 0x12000, []byte{0xaa}))
	assert.Equal(t, byte(0xaa), e.h.client[8192])
	old, err := e.acc.FetchAdd(k, e.pd, 0x13ff8, 2)
	require.NoError(t, err)
	assert.Zero(t, old)

	other := e.s.NewAccessor() // another QP of the same PD
	defer other.Close()
	other.SetQP(2)
	assert.ErrorIs(t, other.WriteRemote(k, e.pd, 0x12000, []byte{1}), ErrWrongQP)
	// QPs of one worker share an accessor: what counts is the QP it runs for.
	e.acc.SetQP(3)
	assert.ErrorIs(t, e.acc.WriteRemote(k, e.pd, 0x12000, []byte{1}), ErrWrongQP, "another QP on the same accessor")
	other.SetQP(1)
	assert.NoError(t, other.WriteRemote(k, e.pd, 0x12000, []byte{0xaa}), "the bound QP on another accessor")
	e.acc.SetQP(1)
	other.SetQP(2)
	assert.ErrorIs(t, other.BindMW(e.pd, MWBind{MW: w.Handle, RKey: next(k), MR: e.mr.LKey, Addr: 0x10000, Length: 1}),
		ErrMWBind, "a bound type 2 window is not bound again (o10-37.2.30)")

	// Invalidation frees it; the key is dead, the window can be bound again.
	assert.ErrorIs(t, e.s.Invalidate(k, PD{1, 2}), ErrWrongPD)
	assert.ErrorIs(t, e.s.Invalidate(w.RKey, e.pd), ErrBadKey, "the window's previous key")
	require.NoError(t, e.s.Invalidate(k, e.pd))
	assert.ErrorIs(t, e.acc.WriteRemote(k, e.pd, 0x12000, []byte{1}), ErrBadKey)
	assert.ErrorIs(t, e.s.Invalidate(k, e.pd), ErrBadKey, "twice")

	// Zero-based: remote addresses are offsets into the window.
	kz := next(k)
	require.NoError(t, other.BindMW(e.pd, MWBind{MW: w.Handle, RKey: kz, MR: e.mr.LKey, Addr: 0x10800, Length: 100,
		Access: AccessRemoteRead | AccessZeroBased}))
	copy(e.h.client[0x800:], "zero-based")
	got := make([]byte, 10)
	require.NoError(t, other.ReadRemote(kz, e.pd, 0, got))
	assert.Equal(t, "zero-based", string(got))
	assert.ErrorIs(t, other.ReadRemote(kz, e.pd, 91, got), ErrBounds)
	assert.ErrorIs(t, other.ReadRemote(kz, e.pd, 0x10800, got), ErrBounds, "a VA is not an offset")
	assert.ErrorIs(t, e.acc.ReadRemote(kz, e.pd, 0, got), ErrWrongQP, "bound to the other QP now")

	// Deallocation of a bound window kills its key and releases the MR.
	require.NoError(t, e.s.DeallocMW(1, w.Handle))
	assert.ErrorIs(t, other.ReadRemote(kz, e.pd, 0, got), ErrBadKey)
	require.NoError(t, e.s.DeregisterMR(1, e.mr.LKey))
}

// TestMWBindErrors: every rule of rxe_check_bind_mw, each refusal wrapping
// ErrMWBind and changing nothing.
func TestMWBindErrors(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	noBind, err := e.s.RegisterMR(1, 1, 0x10000, 4096, AccessLocalWrite|AccessRemoteWrite, PageShift4K, []uint64{e.h.pa(0)})
	require.NoError(t, err)
	ro, err := e.s.RegisterMR(1, 1, 0x10000, 4096, AccessMWBind, PageShift4K, []uint64{e.h.pa(0)})
	require.NoError(t, err)
	otherPD, err := e.s.RegisterMR(1, 2, 0x10000, 4096, AccessLocalWrite|AccessMWBind, PageShift4K, []uint64{e.h.pa(0)})
	require.NoError(t, err)
	w1 := e.alloc(t, MWType1)
	w2 := e.alloc(t, MWType2)
	foreign, err := e.s.AllocMW(2, 1, MWType1)
	require.NoError(t, err)
	ok := func(w MWInfo) MWBind {
		return MWBind{MW: w.Handle, RKey: next(w.RKey), MR: e.mr.LKey, Addr: 0x10000, Length: 4096, Access: AccessRemoteWrite}
	}
	for _, tc := range []struct {
		name string
		pd   PD
		b    func() MWBind
	}{
		{"no such window", e.pd, func() MWBind { b := ok(w1); b.MW = 0x7fff00; return b }},
		{"a stale handle", e.pd, func() MWBind { b := ok(w1); b.MW = next(w1.Handle); return b }},
		{"an MR's key as window", e.pd, func() MWBind { b := ok(w1); b.MW = e.mr.LKey; return b }},
		{"another owner's window", e.pd, func() MWBind { return ok(foreign) }},
		{"window of another PD", PD{1, 2}, func() MWBind { b := ok(w1); b.MR = otherPD.LKey; return b }},
		{"rkey of another index", e.pd, func() MWBind { b := ok(w1); b.RKey = w2.RKey; return b }},
		{"unknown access bit", e.pd, func() MWBind { b := ok(w1); b.Access |= AccessMWBind; return b }},
		{"type 1 zero-based", e.pd, func() MWBind { b := ok(w1); b.Access |= AccessZeroBased; return b }},
		{"type 2 empty", e.pd, func() MWBind { b := ok(w2); b.Length = 0; return b }},
		{"type 2 for no QP", e.pd, func() MWBind { e.acc.SetQP(0); return ok(w2) }},
		{"no such MR", e.pd, func() MWBind { b := ok(w1); b.MR = 0x7fff01; return b }},
		{"MR of another PD", e.pd, func() MWBind { b := ok(w1); b.MR = otherPD.LKey; return b }},
		{"MR without MW_BIND", e.pd, func() MWBind { b := ok(w1); b.MR = noBind.LKey; return b }},
		{"writable window on a read-only MR", e.pd, func() MWBind { b := ok(w1); b.MR = ro.LKey; return b }},
		{"past the MR's end", e.pd, func() MWBind { b := ok(w1); b.Length = 16*kib + 1; return b }},
		{"before the MR", e.pd, func() MWBind { b := ok(w1); b.Addr = 0xffff; return b }},
		{"wraps", e.pd, func() MWBind { b := ok(w1); b.Addr = ^uint64(0) - 10; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b()
			assert.ErrorIs(t, e.acc.BindMW(tc.pd, b), ErrMWBind)
			e.acc.SetQP(1)
			assert.ErrorIs(t, e.acc.CheckRemote(b.RKey, tc.pd, 0x10000, 1, AccessRemoteWrite), ErrBadKey, "nothing bound")
		})
	}
	// A read-only window on that MR is fine (C10-74 is about write rights).
	require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w1.Handle, RKey: next(w1.RKey), MR: ro.LKey, Addr: 0x10000, Length: 10, Access: AccessRemoteRead}))
	// An invalidated MR cannot be bound to.
	require.NoError(t, e.s.Invalidate(noBind.LKey, e.pd))
	_ = e.s.DeallocMW(2, foreign.Handle)
}

// TestMWReleaseOwner: an owner's windows go before its MRs, bound or not,
// and nothing stays in the key table.
func TestMWReleaseOwner(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	w := e.alloc(t, MWType2)
	k := next(w.RKey)
	require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k, MR: e.mr.LKey, Addr: 0x10000, Length: 64, Access: AccessRemoteWrite}))
	mrs, _ := e.s.ReleaseOwner(1)
	assert.Equal(t, 1, mrs)
	assert.ErrorIs(t, e.acc.WriteRemote(k, e.pd, 0x10000, []byte{1}), ErrBadKey)
	for i := range e.s.slots {
		assert.Nil(t, e.s.slots[i].Load(), "slot %d", i)
	}
	assert.True(t, e.s.keys.available())
}

// TestMWConcurrent races binds and unbinds of a type 1 window (one
// worker), remote writes through its current key (another worker) and the
// MR's deregistration (the control path): a write either lands inside the
// window or fails with ErrBadKey, the MR goes only while no window is
// bound, and after it went no bind finds it.
func TestMWConcurrent(t *testing.T) {
	e := newMWEnv(t, AccessLocalWrite|AccessMWBind)
	w := e.alloc(t, MWType1)
	var key atomic.Uint32
	const rounds = 2000
	done := make(chan struct{})
	var binds atomic.Int64
	var writes, landed int
	var wg sync.WaitGroup
	wg.Add(2)
	writing := make(chan struct{})
	go func() { // the binding QP's worker
		defer wg.Done()
		defer close(done)
		<-writing
		k := w.RKey
		for i := range rounds {
			k = next(k)
			if e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k, MR: e.mr.LKey, Addr: 0x11000, Length: 4096, Access: AccessRemoteWrite}) == nil {
				key.Store(k)
				binds.Add(1)
			}
			if i%2 == 0 {
				k = next(k)
				assert.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: k}), "unbind")
			}
		}
	}()
	go func() { // a requester's worker
		defer wg.Done()
		acc := e.s.NewAccessor()
		defer acc.Close()
		close(writing)
		for {
			select {
			case <-done:
				return
			default:
			}
			writes++
			err := acc.WriteRemote(key.Load(), e.pd, 0x11000+uint64(writes%4000), []byte{0x5a})
			if err == nil {
				landed++
			} else {
				assert.ErrorIs(t, err, ErrBadKey)
			}
		}
	}()
	gone := false // the control path: deregister whenever no window is bound
	for binds.Load() < rounds/4 {
		runtime.Gosched()
	}
	for finished := false; !gone && !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		err := e.s.DeregisterMR(1, e.mr.LKey)
		if err == nil {
			gone = true
		} else {
			assert.ErrorIs(t, err, ErrMRBound)
		}
	}
	wg.Wait()
	t.Logf("%d binds, %d writes, %d landed, MR deregistered during the binds: %v", binds.Load(), writes, landed, gone)
	for i, b := range e.h.client {
		if b == 0x5a {
			assert.True(t, i >= 0x1000 && i < 0x2000, "a write landed at %#x, outside the window", i)
		}
	}
	if !gone { // the binder finished first, the window maybe bound
		require.NoError(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: next(key.Load())}))
		require.NoError(t, e.s.DeregisterMR(1, e.mr.LKey))
	}
	assert.ErrorIs(t, e.acc.BindMW(e.pd, MWBind{MW: w.Handle, RKey: next(w.RKey), MR: e.mr.LKey, Addr: 0x11000, Length: 1}), ErrMWBind,
		"a deregistered MR")
}
