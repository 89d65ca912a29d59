package dma

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// newMemfd returns a memfd of size bytes created as a client would
// (MFD_ALLOW_SEALING), sealed with seals (0: unsealed). Closed at cleanup.
func newMemfd(t testing.TB, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("vrnic-test", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, size))
	if seals != 0 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals)
		require.NoError(t, err)
	}
	return fd
}

// clientMap maps fd a second time, as the client process does, so tests
// check data through the client's view of the memory.
func clientMap(t testing.TB, fd int, size int) []byte {
	t.Helper()
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

// hostMem is one registered region with the client's own mapping of it.
type hostMem struct {
	info   RegionInfo
	client []byte
	fd     int
}

// pa returns the PA of byte off of the region.
func (h hostMem) pa(off uint64) uint64 { return h.info.PA + off }

func newSpace(t testing.TB, cfg Config) *Space {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := NewSpace(cfg)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func addHostMem(t testing.TB, s *Space, o Owner, size int) hostMem {
	t.Helper()
	fd := newMemfd(t, int64(size), unix.F_SEAL_SHRINK)
	info, err := s.AddRegion(o, fd, uint64(size))
	require.NoError(t, err)
	return hostMem{info: info, client: clientMap(t, fd, size), fd: fd}
}

// fill writes a position-dependent pattern (distinct per seed) into b.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7+i>>8*13) ^ seed
	}
}

// inMapping reports whether b lies wholly inside one live region mapping
// of s (tests hold no lock: regions are not being removed concurrently).
func inMapping(s *Space, b []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := addrOf(b)
	for _, r := range s.byPA {
		lo := addrOf(r.mem)
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(r.mem)) && p+uintptr(len(b)) >= p {
			return true
		}
	}
	return false
}
