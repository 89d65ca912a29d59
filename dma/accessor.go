package dma

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Accessor is one worker's handle for the hot path: translation, copies
// and atomics. It is not safe for concurrent use; give each worker
// goroutine its own (NewAccessor) and Close it when the worker stops.
// Since a QP is served by one worker for its whole life, an accessor per
// QP (closed when the QP is destroyed) works as well: a grace period scans
// every accessor with one atomic load each, so thousands cost microseconds.
//
// Every method runs inside a read-side section (Enter/Exit): while an
// accessor is inside, no region it may have reached is unmapped. Copy and
// atomic methods enter and exit by themselves; Translate hands out slices
// of client memory, so its caller brackets Translate and every use of the
// slices with Enter and Exit. Sections nest and must be short (one WQE or
// one packet): RemoveRegion, DeregisterMR's unmapping and ReleaseOwner
// wait for them.
type Accessor struct {
	s     *Space
	_     [56]byte      // keep state off other accessors' cache lines
	state atomic.Uint64 // 0 idle, else the epoch seen at Enter
	_     [56]byte
	depth int

	// On-demand paging (odp.go): the bounce buffer (allocated at the
	// first use) and the iovecs of process_vm_readv/writev.
	bounce []byte
	word   [8]byte // an atomic's operand
	liov   [1]unix.Iovec
	riov   [1]unix.RemoteIovec
	// qp is the QP the accessor's calls run for (SetQP): type 2 memory
	// windows are bound to one QP and usable only by it.
	qp QPID
}

// QPID names a QP to the memory windows of type 2 bound to it (mw.go):
// non-zero and never reused by the caller (QP numbers are reused, so the
// device numbers its QPs for this). 0 names no QP.
type QPID uint64

// SetQP makes the accessor's following calls run for QP q: BindMW binds a
// type 2 window to q, and only calls made for q reach through it. An
// accessor shared by the QPs of one worker is set before each QP's calls.
func (a *Accessor) SetQP(q QPID) { a.qp = q }

// NewAccessor returns a new accessor registered with s.
func (s *Space) NewAccessor() *Accessor {
	a := &Accessor{s: s}
	s.mu.Lock()
	old := *s.accessors.Load()
	next := make([]*Accessor, len(old), len(old)+1)
	copy(next, old)
	next = append(next, a)
	s.accessors.Store(&next)
	s.mu.Unlock()
	return a
}

// Close unregisters the accessor. It must not be inside a section.
func (a *Accessor) Close() {
	s := a.s
	s.mu.Lock()
	old := *s.accessors.Load()
	next := make([]*Accessor, 0, len(old))
	for _, x := range old {
		if x != a {
			next = append(next, x)
		}
	}
	s.accessors.Store(&next)
	s.mu.Unlock()
}

// Enter starts (or nests) a read-side section.
func (a *Accessor) Enter() {
	if a.depth == 0 {
		a.state.Store(a.s.epoch.Load())
	}
	a.depth++
}

// Exit ends the innermost section; slices from Translate are invalid
// after the outermost Exit.
func (a *Accessor) Exit() {
	if a.depth == 0 {
		return
	}
	a.depth--
	if a.depth == 0 {
		a.state.Store(0)
	}
}

// Translate resolves [iova, iova+length) of the MR named by key (an lkey,
// or an rkey with remote bits in want) for protection domain pd and access
// want (0 for a local read, AccessLocalWrite for a local write,
// AccessRemoteRead/Write/Atomic for remote requests) into segs: it fills
// segs[0:n] with slices of the mapping, merging pages that are
// contiguous, and returns n. It allocates nothing. The slices are valid
// until the accessor's outermost Exit; Translate outside Enter/Exit
// returns ErrNoSection.
//
// Errors: ErrBadKey (unknown, stale or invalidated key), ErrWrongPD,
// ErrAccess, ErrBounds, ErrSegments (segs too short; segs is then full
// and the range only partly resolved).
func (a *Accessor) Translate(key uint32, pd PD, iova, length uint64, want Access, segs [][]byte) (int, error) {
	if a.depth == 0 {
		return 0, ErrNoSection
	}
	var m *memRegion
	if want&AccessRemote != 0 {
		var err error
		if m, iova, err = a.resolveRemote(key, pd, iova, length, want); err != nil {
			return 0, err
		}
	} else {
		m = a.s.lookupLocal(key)
		if m == nil {
			return 0, ErrBadKey
		}
		if err := m.check(pd, iova, length, want); err != nil {
			return 0, err
		}
	}
	if m.proc != nil {
		return 0, ErrFault // nothing of an on-demand MR is mapped here
	}
	n := 0
	for length > 0 {
		if n == len(segs) {
			return n, ErrSegments
		}
		b := m.span(iova, length)
		segs[n] = b
		n++
		iova += uint64(len(b))
		length -= uint64(len(b))
	}
	return n, nil
}

// backoff waits a little while a grace period is pending.
func backoff(spins int) {
	switch {
	case spins < 16:
		runtime.Gosched()
	default:
		time.Sleep(20 * time.Microsecond)
	}
}
