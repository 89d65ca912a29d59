//go:build amd64

package roce

import (
	"math/bits"

	"golang.org/x/sys/cpu"
)

// icrcFoldMin and icrcFoldWideMin are the shortest buffers icrcFold
// takes, narrow and wide (the four 64-byte lane groups): narrow, one
// 64-byte block when the mask's span is within it, two (icrcFoldMin2)
// otherwise. crcMasked hands it buffers from icrcFoldMin2 bytes; shorter
// ones go to icrcShort (from icrcShortMin bytes) or the portable path.
const (
	icrcFoldMin     = 64
	icrcFoldMin2    = 2 * 64
	icrcFoldWideMin = 4 * 64
)

// useFold reports whether the CPU has what the narrow icrcFold needs:
// PCLMULQDQ for the multiplies, SSE4.1 for PEXTRQ. useFoldWide adds the
// AVX-512 foundation and its VPCLMULQDQ (x/sys/cpu reports AVX-512 only
// when the OS saves the zmm state).
var (
	useFold     = cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE41
	useFoldWide = useFold && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ
)

// icrcK are icrcFold's constants, pairs (x^(D+32), x^(D-32)) mod P for a
// fold over D bits in the bit-reflected 33-bit form foldK gives: D = 512
// (narrow loop, folding wide lane groups together), D = 128 (folding
// lanes together, 16-byte steps), D = 2048 (wide loop).
//
// The last three are the final reduction's (REDUCE): x^64 mod P in
// foldK's form, then, for the Barrett step, the bit-reflected P (33
// bits) and floor(x^64 / P) bit-reflected (33 bits), the values
// hash/crc32's amd64 code uses (TestFoldConstants derives them).
var icrcK = [10]uint64{
	foldK(4*128 + 32), foldK(4*128 - 32),
	foldK(128 + 32), foldK(128 - 32),
	foldK(16*128 + 32), foldK(16*128 - 32),
	foldK(64), 0,
	0x1db710641, 0x1f7011641,
}

// xPowMod returns x^n mod P for the IEEE polynomial P (0x104c11db7), bit
// d of the result the coefficient of x^d: the source of the fold
// constants (foldK).
func xPowMod(n int) uint32 {
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= 0x104c11db7
		}
	}
	return uint32(r)
}

// foldK returns x^n mod P with the coefficient of x^d at bit 32-d, the
// form in which a carry-less multiply by a bit-reflected 64-bit half of a
// data block (bit i the coefficient of x^(63-i)) yields the product
// aligned as a bit-reflected 128-bit block.
//
// Why: a 128-bit block R, bit j the coefficient of x^(127-j), is
// H*x^64 + L with H in its low and L in its high quadword. Moved D bits
// further along the message, R*x^D = H*x^(64+D) + L*x^D, and modulo P
// that is H*(x^(D+32) mod P)*x^32 + L*(x^(D-32) mod P)*x^32. Multiplying
// a half (bit i ~ x^(63-i)) by a constant in this form (bit j ~ x^(32-j))
// puts x^(95-k) at product bit k, which as a 128-bit block (bit k ~
// x^(127-k)) is the product times x^32: exactly the terms above.
func foldK(n int) uint64 {
	return uint64(bits.Reverse32(xPowMod(n))) << 1
}

// icrcFold returns the raw CRC-32 state after c over p, with
// p[i]|mk[i] in place of p[i] for i < min(len(p)&^63, icrcMaskLen) (mask
// bytes past the 64-byte blocks of p are not applied). The mask is OR-ed
// into registers as the bytes are loaded; p is only read. len(p) must be
// a multiple of 16 and at least icrcFoldMin, or icrcFoldWideMin when wide
// (the AVX-512 path, which needs useFoldWide).
//
//go:noescape
func icrcFold(c uint32, p []byte, mk *icrcMask, wide bool) uint32

// icrcShort returns the raw CRC-32 state after c over the first nh
// 16-byte blocks of h (nh may be 0, h then unused) followed by p, with
// p[i]|mk[i] in place of p[i]; c is added to the first 4 bytes of the
// first of them. len(p) must be 0 (with nh > 0) or from icrcShortMin to
// icrcShortMax. Unlike icrcFold it keeps a single lane, folding 16 bytes
// a step, and it takes the tail under 16 bytes in the assembly too. p is
// only read.
//
//go:noescape
func icrcShort(c uint32, h *pseudoHdr, nh int, p []byte, mk *icrcMask) uint32

// icrcShuf are icrcShort's byte shuffles for a tail of r bytes (1..15),
// two 32-byte tables each loaded at offset r: icrcShuf[r:r+16] moves
// bytes r..15 of a block to 0..15-r and has the high bit set (PSHUFB
// writes a zero, PBLENDVB takes its other operand) at 16-r..15;
// icrcShuf[32+r:48+r] moves bytes 0..r-1 to 16-r..15, zeros below.
var icrcShuf = func() (t [64]byte) {
	for k := range 32 {
		if k < 16 {
			t[k], t[32+k] = byte(k), 0x80
		} else {
			t[k], t[32+k] = 0x80, byte(k-16)
		}
	}
	return t
}()

// crcMasked returns the raw (not inverted) CRC-32 state after c over p,
// with p[i]|mk[i] in place of p[i] for i < m: m, a multiple of 8 no
// larger than icrcMaskLen or len(p), covers every nonzero byte of mk.
// p is only read.
func crcMasked(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	if !useFold || len(p) < icrcShortMin {
		return crcMaskedGeneric(c, p, mk, m)
	}
	if len(p) < icrcFoldMin2 {
		return icrcShort(c, nil, 0, p, mk)
	}
	return crcFolded(c, p, mk, useFoldWide && len(p) >= icrcFoldWideMin)
}

// crcHead is crcMasked for the headers of a packet, at most icrcMaskLen
// bytes: through icrcShort from icrcShortMin bytes, in slicing steps
// below that (crcHeadGeneric).
func crcHead(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	if !useFold || len(p) < icrcShortMin || len(p) > icrcShortMax {
		return crcHeadGeneric(c, p, mk, m)
	}
	return icrcShort(c, nil, 0, p, mk)
}

// crcPseudoLong returns the raw CRC-32 state after c over the first nh
// blocks of the pseudo header h and then body (at least BTHLen bytes,
// BTH byte 4 masked), for a body icrcShort does not take with the header:
// the header through icrcShort, body through crcMasked; or all in
// portable Go without PCLMULQDQ.
func crcPseudoLong(c uint32, h *pseudoHdr, nh int, body []byte) uint32 {
	if !useFold {
		return crcPseudoGeneric(c, h, nh, body)
	}
	return crcMasked(icrcShort(c, h, nh, nil, &icrcBTHMask), body, &icrcBTHMask, 8)
}

// crcFolded is crcMasked through icrcFold (wide or narrow, which the
// caller has checked the CPU, len(p) and the mask's span allow) and
// crcTail for the last len(p)%16 bytes.
func crcFolded(c uint32, p []byte, mk *icrcMask, wide bool) uint32 {
	n := len(p) &^ 15
	return crcTail(icrcFold(c, p[:n], mk, wide), p[n:])
}

// icrcFoldCopy is icrcFold without a mask that also copies src to dst
// (len(dst) >= len(src)), block by block as it loads them: the CRC covers
// exactly the bytes stored. len(src) must be a multiple of 16 and at
// least icrcFoldMin, or icrcFoldWideMin when wide.
//
//go:noescape
func icrcFoldCopy(c uint32, dst, src []byte, wide bool) uint32

// crcCopy copies src to dst (len(dst) >= len(src)) and returns the raw
// CRC-32 state after c over the bytes stored, reading src once: through
// icrcFoldCopy from icrcFoldMin bytes (the last len(src)%16 bytes copied
// and then read back from dst), through crcCopyGeneric below that.
func crcCopy(c uint32, dst, src []byte) uint32 {
	n := len(src)
	if !useFold || n < icrcFoldMin {
		return crcCopyGeneric(c, dst, src)
	}
	dst = dst[:n]
	k := n &^ 15
	c = icrcFoldCopy(c, dst[:k], src[:k], useFoldWide && k >= icrcFoldWideMin)
	t := dst[k:]
	copy(t, src[k:])
	return crcTail(c, t)
}
