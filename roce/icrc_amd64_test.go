//go:build amd64

package roce

import (
	"hash/crc32"
	"math/bits"
	"testing"

	"github.com/stretchr/testify/require"
)

// archICRCVariants forces each icrcFold kernel this CPU runs.
func archICRCVariants() []icrcVariant {
	var vs []icrcVariant
	if useFold {
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
