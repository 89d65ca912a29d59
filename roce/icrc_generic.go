//go:build !amd64

package roce

// crcMasked returns the raw (not inverted) CRC-32 state after c over p,
// with p[i]|mk[i] in place of p[i] for i < m: m, a multiple of 8 no
// larger than icrcMaskLen or len(p), covers every nonzero byte of mk.
// p is only read.
func crcMasked(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	return crcMaskedGeneric(c, p, mk, m)
}

// crcCopy copies src to dst (len(dst) >= len(src)) and returns the raw
// CRC-32 state after c over the bytes stored.
func crcCopy(c uint32, dst, src []byte) uint32 { return crcCopyGeneric(c, dst, src) }
