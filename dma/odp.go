package dma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// On-demand paging (ODP).
//
// An ODP MR (RegisterODPMR) names a range of a client process's virtual
// address space, not host memory: registration maps, pins and remaps
// nothing, and the MR has no page table. Every access resolves the
// client's pages at that moment, through the kernel's own page tables:
// the accessor reads and writes the process's memory with
// process_vm_readv(2) and process_vm_writev(2). That is the page fault
// of a hardware ODP NIC (the kernel faults the page in for the read or
// the write, with the protection of the mapping), and invalidation comes
// for free: memory the program maps, unmaps or replaces after the
// registration is seen as it is at the time of each access. An address
// the program has not mapped, or not writable for a write, fails the
// access with ErrFault (the engine's local protection error, or a remote
// access error NAK). kernel-notes/odp.md says why this mechanism and not
// another.
//
// The process is named by pid. A Process is opened once per client
// context (OpenProcess): the daemon holds a pidfd of it, proves that the
// pid's memory is the client's (the client writes a random nonce in its
// memory and names the address; the daemon reads it back through the
// pid while the pidfd says the process is alive), and marks the Process
// dead as soon as the pidfd reports its exit, so that a pid reused by
// another process is never accessed. Reaching the memory needs ptrace
// access (PTRACE_MODE_ATTACH_REALCREDS: the same uid or CAP_SYS_PTRACE,
// and Yama's rules): OpenProcess fails with EPERM otherwise.
//
// Atomics on an ODP MR are a read and a write of the word under one lock
// of the Space: atomic against every other atomic of the device on ODP
// memory (IBV_ATOMIC_HCA), not against the client's own CPU stores.

// Process is a client process whose memory on-demand paging MRs reach.
type Process struct {
	pid  int
	dead atomic.Bool
	f    *os.File // the pidfd
	done chan struct{}
	once sync.Once
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.pid }

// Alive tells whether the process has not exited (as far as the pidfd
// said when it was last seen) and the Process is not closed.
func (p *Process) Alive() bool { return !p.dead.Load() }

// NonceLen is the length of the nonce OpenProcess verifies.
const NonceLen = 16

// OpenProcess opens process pid for on-demand paging, after checking
// that the NonceLen bytes at address nonceAddr of its memory equal nonce
// (the client wrote them there: the pid's memory is the client's). The
// caller closes the Process when the client goes.
//
// Errors: ErrInvalid (pid not positive, bad nonce length); ESRCH (no such
// process); EPERM (no ptrace access to it); EACCES (the nonce differs or
// cannot be read: the pid is not the client).
func OpenProcess(pid int, nonceAddr uint64, nonce []byte) (*Process, error) {
	if pid <= 0 || len(nonce) != NonceLen {
		return nil, fmt.Errorf("%w: pid %d, nonce of %d bytes", ErrInvalid, pid, len(nonce))
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("dma: pidfd_open(%d): %w", pid, err)
	}
	p := &Process{pid: pid, f: os.NewFile(uintptr(fd), "pidfd"), done: make(chan struct{})}
	var got [NonceLen]byte
	n, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &got[0], Len: NonceLen}},
		[]unix.RemoteIovec{{Base: uintptr(nonceAddr), Len: NonceLen}}, 0)
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.ESRCH):
		p.f.Close()
		return nil, fmt.Errorf("dma: process %d memory: %w", pid, err)
	case err != nil || n != NonceLen || !bytes.Equal(got[:], nonce):
		p.f.Close()
		return nil, fmt.Errorf("dma: process %d: nonce at %#x not found: %w", pid, nonceAddr, unix.EACCES)
	}
	// The read went to the pidfd's process only if it was alive after it:
	// a pid is not reused while its process has not exited.
	if exited(fd) {
		p.f.Close()
		return nil, fmt.Errorf("dma: process %d exited: %w", pid, unix.ESRCH)
	}
	go p.watch()
	return p, nil
}

// exited polls the pidfd: readable once the process has exited.
func exited(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err == nil && n > 0
}

// watch marks the process dead when its pidfd becomes readable (exit) or
// is closed. It waits in the runtime's poller, holding no thread.
func (p *Process) watch() {
	defer close(p.done)
	rc, err := p.f.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
	}
	p.dead.Store(true)
}

// Close marks the process dead for every MR that names it and releases
// the pidfd. Idempotent.
func (p *Process) Close() {
	p.once.Do(func() {
		p.dead.Store(true)
		p.f.Close()
		<-p.done
	})
}

// ODPImplicit is the length of an implicit on-demand paging MR: with iova
// 0 it covers the whole address space (ibv_reg_mr(pd, NULL, SIZE_MAX,
// IBV_ACCESS_ON_DEMAND)).
const ODPImplicit = math.MaxUint64

// RegisterODPMR registers an on-demand paging MR of owner in protection
// domain pd: [iova, iova+length) is [addr, addr+length) of proc's
// memory. iova 0, addr 0 and length ODPImplicit is the implicit MR over
// the whole address space. Nothing is mapped, pinned or charged; the
// accesses resolve the pages (see above).
//
// Errors: ErrAccessFlags; ErrInvalid (zero length, no process, iova and
// addr at different offsets in a page, an implicit MR with an address);
// ErrOverflow (a range that wraps, an explicit MR longer than
// Config.MaxMRBytes); ErrLimit (no key left).
func (s *Space) RegisterODPMR(o Owner, pd uint32, iova, addr, length uint64, access Access, proc *Process) (MRInfo, error) {
	if err := validateAccess(access); err != nil {
		return MRInfo{}, err
	}
	if proc == nil || length == 0 {
		return MRInfo{}, fmt.Errorf("%w: on-demand MR without a process or of length 0", ErrInvalid)
	}
	if length == ODPImplicit {
		if iova != 0 || addr != 0 {
			return MRInfo{}, fmt.Errorf("%w: implicit MR at iova %#x addr %#x (both must be 0)", ErrInvalid, iova, addr)
		}
	} else {
		if length > s.cfg.MaxMRBytes {
			return MRInfo{}, fmt.Errorf("%w: MR length %#x > %#x", ErrOverflow, length, s.cfg.MaxMRBytes)
		}
		if iova > math.MaxUint64-length || addr > math.MaxUint64-length {
			return MRInfo{}, fmt.Errorf("%w: iova %#x or addr %#x + length %#x wraps", ErrOverflow, iova, addr, length)
		}
		if iova%MinPage != addr%MinPage {
			return MRInfo{}, fmt.Errorf("%w: iova %#x and addr %#x at different offsets in a page", ErrInvalid, iova, addr)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return MRInfo{}, ErrClosed
	}
	if !s.keys.available() {
		return MRInfo{}, fmt.Errorf("%w: %d MR keys in use", ErrLimit, len(s.slots)-1)
	}
	m := &memRegion{
		pd: PD{Owner: o, Handle: pd}, access: access,
		iova: iova, length: length, base: iova, proc: proc, vaDelta: addr - iova,
	}
	st := s.owner(o)
	idx, lv, rv, _ := s.keys.alloc()
	m.lkey = idx<<8 | uint32(lv)
	if access&AccessRemote != 0 {
		m.rkey = idx<<8 | uint32(rv)
	}
	st.mrs[m.lkey] = m
	s.slots[idx].Store(m)
	return MRInfo{LKey: m.lkey, RKey: m.rkey}, nil
}

// odpCopy moves len(b) bytes between b and iova of the on-demand MR m:
// from the client's memory into b (write false) or from b into it (write
// true), faulting its pages in as the kernel does for the process. A
// transfer that stops short (a page not mapped, or not writable) or a
// process that is gone is ErrFault. Checked range.
func (a *Accessor) odpCopy(m *memRegion, iova uint64, b []byte, write bool) error {
	p := m.proc
	addr := iova + m.vaDelta
	defer func() { a.liov[0].Base = nil }() // keep no pointer to b
	for len(b) > 0 {
		if p.dead.Load() {
			return ErrFault
		}
		a.liov[0].Base = &b[0]
		a.liov[0].SetLen(len(b))
		a.riov[0] = unix.RemoteIovec{Base: uintptr(addr), Len: len(b)}
		var (
			n   int
			err error
		)
		if write {
			n, err = unix.ProcessVMWritev(p.pid, a.liov[:], a.riov[:], 0)
		} else {
			n, err = unix.ProcessVMReadv(p.pid, a.liov[:], a.riov[:], 0)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return ErrFault
		}
		b = b[n:]
		addr += uint64(n)
	}
	return nil
}

// bounceSize is the accessor's bounce buffer: an on-demand MR's bytes
// pass through it on their way to a sink or to another MR.
const bounceSize = 16 << 10

func (a *Accessor) bounceBuf() []byte {
	if a.bounce == nil {
		a.bounce = make([]byte, bounceSize)
	}
	return a.bounce
}

// putODP reads k bytes at iova of the on-demand MR m into the bounce
// buffer, a piece at a time, and puts each piece.
func (a *Accessor) putODP(m *memRegion, iova, k uint64, s Sink) error {
	buf := a.bounceBuf()
	for k > 0 {
		c := min(k, uint64(len(buf)))
		if err := a.odpCopy(m, iova, buf[:c], false); err != nil {
			return err
		}
		s.Put(buf[:c])
		iova += c
		k -= c
	}
	return nil
}

// odpAtomic applies op to the 8-byte word at va of the on-demand MR m
// (checked and aligned) under the Space's ODP atomic lock and returns
// the original value, in host byte order.
func (a *Accessor) odpAtomic(m *memRegion, va uint64, op func(old uint64) uint64) (uint64, error) {
	w := &a.word
	mu := &a.s.odpAtomic
	mu.Lock()
	defer mu.Unlock()
	if err := a.odpCopy(m, va, w[:], false); err != nil {
		return 0, err
	}
	old := binary.NativeEndian.Uint64(w[:])
	binary.NativeEndian.PutUint64(w[:], op(old))
	if err := a.odpCopy(m, va, w[:], true); err != nil {
		return 0, err
	}
	return old, nil
}

// Advice values of Prefetch (enum ibv_advise_mr_advice).
const (
	AdvicePrefetch        = 0 // IBV_ADVISE_MR_ADVICE_PREFETCH
	AdvicePrefetchWrite   = 1 // IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE
	AdvicePrefetchNoFault = 2 // IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT
)

// ErrNotPrefetchable: an SGE of an advice names no on-demand MR of the
// owner in that PD (or one without local write for PREFETCH_WRITE), as
// mlx5's get_prefetchable_mr finds no MR.
var ErrNotPrefetchable error = &sentinel{"dma: no on-demand paging MR of this PD with that lkey", unix.ENOENT}

// Prefetch is ibv_advise_mr's prefetch for owner's PD pd: every SGE must
// name (by lkey) an on-demand paging MR of owner in pd, with local write
// for AdvicePrefetchWrite (else ErrNotPrefetchable). Unless the advice is
// AdvicePrefetchNoFault (which resolves nothing: only pages already
// present would be used, and the device keeps none), the pages of each
// SGE are then faulted in in the client, a read of one byte per page, in
// order: the first one outside the MR (ErrBounds) or not mapped
// (ErrFault) stops it. Faulting for read serves PREFETCH_WRITE too: a
// write access resolves its page again at the time of the write.
//
// The MRs are looked up under the control lock and the client's memory
// read outside it; a concurrent deregistration only ends the prefetch
// early (the process's memory stays the process's).
func (s *Space) Prefetch(o Owner, pd uint32, advice uint32, sges []SGE) error {
	ms := make([]*memRegion, len(sges))
	s.mu.Lock()
	st := s.owners[o]
	for i := range sges {
		var m *memRegion
		if st != nil {
			m = st.mrs[sges[i].LKey]
		}
		if m == nil || m.proc == nil || m.pd != (PD{Owner: o, Handle: pd}) ||
			(advice == AdvicePrefetchWrite && m.access&AccessLocalWrite == 0) {
			s.mu.Unlock()
			return fmt.Errorf("%w: SGE %d lkey %#x", ErrNotPrefetchable, i, sges[i].LKey)
		}
		ms[i] = m
	}
	s.mu.Unlock()
	if advice == AdvicePrefetchNoFault {
		return nil
	}
	for i := range sges {
		sg, m := &sges[i], ms[i]
		n := uint64(sg.Length)
		if n == 0 {
			continue
		}
		if sg.Addr > math.MaxUint64-n {
			return fmt.Errorf("SGE %d: %w", i, ErrBounds)
		}
		if err := m.check(m.pd, sg.Addr, n, 0); err != nil {
			return fmt.Errorf("SGE %d [%#x, +%#x): %w", i, sg.Addr, n, err)
		}
		if err := faultIn(m, sg.Addr, n); err != nil {
			return fmt.Errorf("SGE %d [%#x, +%#x): %w", i, sg.Addr, n, err)
		}
	}
	return nil
}

// faultIn reads one byte of every page of [iova, iova+n) of the
// on-demand MR m, up to faultBatch pages per system call.
func faultIn(m *memRegion, iova, n uint64) error {
	const faultBatch = 512
	var (
		sink [faultBatch]byte
		liov [1]unix.Iovec
		riov [faultBatch]unix.RemoteIovec
	)
	liov[0].Base = &sink[0]
	addr, end := iova+m.vaDelta, iova+m.vaDelta+(n-1) // end inclusive: no wrap
	for done := false; !done; {
		k := 0
		for k < faultBatch && !done {
			riov[k] = unix.RemoteIovec{Base: uintptr(addr), Len: 1}
			k++
			next := addr&^(MinPage-1) + MinPage
			done = next == 0 || next > end
			addr = next
		}
		liov[0].SetLen(k)
		for {
			if m.proc.dead.Load() {
				return ErrFault
			}
			got, err := unix.ProcessVMReadv(m.proc.pid, liov[:], riov[:k], 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil || got != k {
				return ErrFault
			}
			break
		}
	}
	return nil
}
