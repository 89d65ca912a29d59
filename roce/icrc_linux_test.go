//go:build linux

package roce

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestCRCMaskedStaysInBounds runs every implementation over buffers that
// start or end at a page boundary next to an inaccessible page: a read
// outside p faults instead of passing unnoticed.
func TestCRCMaskedStaysInBounds(t *testing.T) {
	pg := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 3*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, unix.Munmap(mem)) })
	require.NoError(t, unix.Mprotect(mem[:pg], unix.PROT_NONE))
	require.NoError(t, unix.Mprotect(mem[2*pg:], unix.PROT_NONE))
	page := mem[pg : 2*pg]
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range page {
		page[i] = byte(rng.Uint32())
	}
	for _, l := range icrcLayouts(rng) {
		for _, n := range icrcLengths(0, 300) {
			if n > pg {
				continue
			}
			if !checkVariants(t, rng.Uint32(), page[:n:n], l) || !checkVariants(t, rng.Uint32(), page[pg-n:], l) {
				return
			}
		}
	}
}
