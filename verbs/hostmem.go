package verbs

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// HostMem is one host memory region: a memfd created, sealed against
// shrinking and mapped by this process, registered with the daemon
// (ADD_HOST_MEM), which maps it too and gives it the physical address range
// [PA, PA+Len). Buffers are carved from it with Alloc.
type HostMem struct {
	ctx    *Context
	fd     int
	mem    []byte
	pa     uint64
	handle uint32
	locked bool

	mu   sync.Mutex
	free []span // sorted by offset, coalesced
}

type span struct{ off, n int }

// Buffer is a piece of host memory: Bytes is this process's mapping, PA
// its device physical address. Rings, page lists and data buffers are
// Buffers.
type Buffer struct {
	Bytes []byte
	PA    uint64
	hm    *HostMem
	off   int
	n     int // reserved length (size rounded up to the alignment)
}

// ErrNoSpace is returned by Alloc when the region has no free range large
// enough.
var ErrNoSpace = errors.New("verbs: host memory exhausted")

// AddHostMem creates a memfd of size bytes (rounded up to 4 KiB), seals it
// against shrinking, maps it and registers it with the daemon.
func (c *Context) AddHostMem(size int) (*HostMem, error) {
	if size <= 0 {
		return nil, fmt.Errorf("verbs: host memory size %d", size)
	}
	size = (size + 4095) &^ 4095
	fd, err := unix.MemfdCreate("vrnic-hostmem", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("verbs: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("verbs: ftruncate memfd: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("verbs: seal memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("verbs: mmap memfd: %w", err)
	}
	var resp abi.RespAddHostMem
	if _, _, err := c.k.call(abi.CmdAddHostMem, &abi.CmdAddHostMemReq{Length: uint64(size)}, nil, []int{fd}, &resp); err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, err
	}
	return &HostMem{ctx: c, fd: fd, mem: mem, pa: resp.PABase, handle: resp.Handle, locked: resp.Locked == 1,
		free: []span{{0, size}}}, nil
}

// PA returns the physical address of byte 0 of the region.
func (h *HostMem) PA() uint64 { return h.pa }

// Len returns the region's size in bytes.
func (h *HostMem) Len() int { return len(h.mem) }

// Bytes returns the whole mapping.
func (h *HostMem) Bytes() []byte { return h.mem }

// Locked reports whether the daemon locks (mlock) what MRs and rings pin
// in the region, as they pin it; adding the region locks nothing.
func (h *HostMem) Locked() bool { return h.locked }

// Handle returns the daemon's handle of the region.
func (h *HostMem) Handle() uint32 { return h.handle }

// Alloc carves size bytes aligned to align (a power of two, at least 64)
// from the region, zeroed. First fit.
func (h *HostMem) Alloc(size, align int) (*Buffer, error) {
	if size <= 0 || align <= 0 || align&(align-1) != 0 {
		return nil, fmt.Errorf("verbs: Alloc(%d, %d): bad size or alignment", size, align)
	}
	align = max(align, 64)
	n := (size + 63) &^ 63
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, s := range h.free {
		start := (s.off + align - 1) &^ (align - 1)
		if start+n > s.off+s.n {
			continue
		}
		// Split s into [s.off,start) and [start+n, end).
		end := s.off + s.n
		var repl []span
		if start > s.off {
			repl = append(repl, span{s.off, start - s.off})
		}
		if start+n < end {
			repl = append(repl, span{start + n, end - start - n})
		}
		h.free = append(h.free[:i], append(repl, h.free[i+1:]...)...)
		b := h.mem[start : start+size : start+size]
		clear(b)
		return &Buffer{Bytes: b, PA: h.pa + uint64(start), hm: h, off: start, n: n}, nil
	}
	return nil, fmt.Errorf("%w: no %d-byte range aligned to %d in a %d-byte region", ErrNoSpace, size, align, len(h.mem))
}

// Free returns b to its region. b must not be used by the daemon (no MR,
// ring or page list still naming it).
func (b *Buffer) Free() {
	h := b.hm
	if h == nil {
		return
	}
	b.hm = nil
	h.mu.Lock()
	defer h.mu.Unlock()
	h.free = append(h.free, span{b.off, b.n})
	sort.Slice(h.free, func(i, j int) bool { return h.free[i].off < h.free[j].off })
	out := h.free[:0]
	for _, s := range h.free {
		if k := len(out); k > 0 && out[k-1].off+out[k-1].n == s.off {
			out[k-1].n += s.n
			continue
		}
		out = append(out, s)
	}
	h.free = out
}

// Addr returns the process virtual address of the buffer's first byte,
// which is also the IOVA RegMR uses by default (as libibverbs does).
func (b *Buffer) Addr() uint64 { return addrOf(b.Bytes) }

// Remove unregisters the region (REMOVE_HOST_MEM; EBUSY while an MR or a
// ring uses it) and unmaps it.
func (h *HostMem) Remove() error {
	if err := h.ctx.destroy(abi.CmdRemoveHostMem, h.handle); err != nil {
		return err
	}
	h.unmap()
	return nil
}

func (h *HostMem) unmap() {
	if h.mem != nil {
		unix.Munmap(h.mem)
		h.mem = nil
	}
	if h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
}

// arenaSize is the size of each host memory region the Context's default
// allocator adds.
const arenaSize = 4 << 20

// Alloc allocates size bytes aligned to align from the context's default
// host memory, adding regions of at least 4 MiB as needed. The regions
// live until the Context is closed.
func (c *Context) Alloc(size, align int) (*Buffer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	for _, h := range c.arenas {
		if b, err := h.Alloc(size, align); err == nil {
			return b, nil
		}
	}
	h, err := c.AddHostMem(max(arenaSize, size+align))
	if err != nil {
		return nil, err
	}
	c.arenas = append(c.arenas, h)
	return h.Alloc(size, align)
}
