//go:build amd64

package roce

import (
	"bytes"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// archICRCVariants forces each icrcFold kernel this CPU runs.
func archICRCVariants() []icrcVariant {
	var vs []icrcVariant
	if useFold {
		vs = append(vs, icrcVariant{"short", func(n, _ int) bool {
			return n >= icrcShortMin && n <= icrcShortMax
		}, func(c uint32, p []byte, mk *icrcMask, _ int) uint32 {
			return icrcShort(c, nil, 0, p, mk)
		}})
		vs = append(vs, icrcVariant{"narrow", func(n, m int) bool {
			return n >= icrcFoldMin2 || n >= icrcFoldMin && m <= icrcFoldMin
		}, func(c uint32, p []byte, mk *icrcMask, _ int) uint32 {
			return crcFolded(c, p, mk, false)
		}})
	}
	if useFoldWide {
		vs = append(vs, icrcVariant{"wide", func(n, _ int) bool { return n >= icrcFoldWideMin }, func(c uint32, p []byte, mk *icrcMask, _ int) uint32 {
			return crcFolded(c, p, mk, true)
		}})
	}
	return vs
}

// TestFoldConstants checks xPowMod, from which the fold constants come,
// against hash/crc32: the raw CRC of k bytes whose first bit alone is set
// is x^(8k-1+32) mod P, bit-reflected.
func TestFoldConstants(t *testing.T) {
	for k := 1; k <= 300; k++ {
		msg := make([]byte, k)
		msg[0] = 1
		raw := ^crc32.Update(^uint32(0), crc32.IEEETable, msg)
		require.Equal(t, bits.Reverse32(raw), xPowMod(8*k+31), "k=%d", k)
	}
	// REDUCE's Barrett constants: P bit-reflected, and floor(x^64 / P)
	// bit-reflected, both 33 bits.
	require.Equal(t, uint64(bits.Reverse64(0x104c11db7)>>31), icrcK[8])
	q := uint64(0) // x^64 / P by long division over GF(2)
	r := uint64(1) << 32
	for i := 32; i >= 0; i-- { // quotient bit i: x^(32+i) term
		if r&(1<<32) != 0 {
			q |= 1 << i
			r ^= 0x104c11db7
		}
		if i > 0 {
			r <<= 1
		}
	}
	require.Equal(t, bits.Reverse64(q)>>31, icrcK[9])
}

// archCopyVariants forces each icrcFoldCopy kernel this CPU runs.
func archCopyVariants() []copyVariant {
	var vs []copyVariant
	fold := func(wide bool) func(c uint32, dst, src []byte) uint32 {
		return func(c uint32, dst, src []byte) uint32 {
			k := len(src) &^ 15
			c = icrcFoldCopy(c, dst[:k], src[:k], wide)
			copy(dst[k:], src[k:])
			return crcTail(c, dst[k:len(src)])
		}
	}
	if useFold {
		vs = append(vs, copyVariant{"narrow", icrcFoldMin, fold(false)})
	}
	if useFoldWide {
		vs = append(vs, copyVariant{"wide", icrcFoldWideMin, fold(true)})
	}
	return vs
}

// TestICRCShortKernel checks icrcShort against the portable code for
// every length 0..200, with no pseudo header and with the IPv4 (2
// blocks) and IPv6 (3 blocks) ones, under every mask the package uses
// (and none, all ones, a random one), from random start states, at every
// misalignment, on random bytes: where it takes the length, the kernel
// itself; elsewhere the dispatching functions that choose it (crcMasked,
// crcHead, crcPseudoLong). It also checks that the kernel reads nothing
// outside p and h: the bytes around p are changed and the CRC recomputed.
func TestICRCShortKernel(t *testing.T) {
	if !useFold {
		t.Skip("no PCLMULQDQ")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, 200+64)
	fill := func(b []byte) {
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	for _, l := range icrcLayouts(rng) {
		for n := 0; n <= 200; n++ {
			for _, nh := range []int{0, 2, 3} {
				fill(buf)
				off := rng.IntN(32)
				p := buf[off : off+n]
				orig := bytes.Clone(p)
				c := rng.Uint32()
				var h pseudoHdr
				for i := range h {
					h[i] = rng.Uint64()
				}
				hc := h
				// The portable reference: the header in slicing steps, then
				// p masked by crcMaskedGeneric (which needs the mask's span
				// within p) or, shorter, the masked copy through hash/crc32.
				ch := crcPseudoWords(c, &h, nh)
				want := refMasked(ch, p, l.mk)
				if n >= l.span {
					require.Equal(t, want, crcMaskedGeneric(ch, p, l.mk, l.span), "reference")
				}
				var got []uint32
				var what []string
				if n == 0 && nh > 0 || n >= icrcShortMin && n <= icrcShortMax {
					got = append(got, icrcShort(c, &h, nh, p, l.mk))
					what = append(what, "icrcShort")
				}
				if nh == 0 && n >= l.span {
					got = append(got, crcMasked(c, p, l.mk, l.span))
					what = append(what, "crcMasked")
					if n <= icrcShortMax {
						got = append(got, crcHead(c, p, l.mk, l.span))
						what = append(what, "crcHead")
					}
				}
				if nh > 0 && l.mk == &icrcBTHMask && n >= BTHLen {
					got = append(got, crcPseudoLong(c, &h, nh, p))
					what = append(what, "crcPseudoLong")
					require.Equal(t, want, crcPseudoGeneric(c, &h, nh, p), "crcPseudoGeneric")
				}
				for i, g := range got {
					if !assert.Equal(t, want, g, "%s: %s len %d nh %d off %d", what[i], l.name, n, nh, off) {
						return
					}
				}
				require.Equal(t, orig, p, "p written")
				require.Equal(t, hc, h, "h written")
				if len(got) > 0 && what[0] == "icrcShort" {
					fill(buf[:off])
					fill(buf[off+n:])
					require.Equal(t, want, icrcShort(c, &h, nh, p, l.mk), "icrcShort read outside p: %s len %d nh %d", l.name, n, nh)
				}
			}
		}
	}
}

// TestICRCWithoutPCLMUL runs the ICRC tests against references and
// captures with the assembly kernels switched off, as on an amd64 CPU
// without PCLMULQDQ: the portable path the dispatchers fall back to.
func TestICRCWithoutPCLMUL(t *testing.T) {
	defer func(f, w bool) { useFold, useFoldWide = f, w }(useFold, useFoldWide)
	useFold, useFoldWide = false, false
	t.Run("pseudo", TestICRCPseudoMatchesReference)
	t.Run("ip", TestICRCIPRandom)
	t.Run("golden", TestICRCMatchesReference)
	t.Run("golden-udp", TestGoldenUDPFrames)
	t.Run("framer", TestFramerMatchesBuild)
}
