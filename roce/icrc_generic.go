//go:build !amd64

package roce

// crcMasked returns the raw (not inverted) CRC-32 state after c over p,
// with p[i]|mk[i] in place of p[i] for i < m: m, a multiple of 8 no
// larger than icrcMaskLen or len(p), covers every nonzero byte of mk.
// p is only read.
func crcMasked(c uint32, p []byte, mk *icrcMask, m int) uint32 {
	return crcMaskedGeneric(c, p, mk, m)
}

// crcHead is crcMasked for the headers of a packet, in slicing steps.
func crcHead(c uint32, p []byte, mk *icrcMask, m int) uint32 { return crcHeadGeneric(c, p, mk, m) }

// useFold: no assembly kernels here.
const useFold = false

// icrcShort is the amd64 kernel, which useFold keeps from being called.
func icrcShort(c uint32, h *pseudoHdr, nh int, p []byte, mk *icrcMask) uint32 {
	panic("roce: icrcShort without an assembly kernel")
}

// crcPseudoLong returns the raw CRC-32 state after c over the first nh
// blocks of the pseudo header h and then body (at least BTHLen bytes,
// BTH byte 4 masked).
func crcPseudoLong(c uint32, h *pseudoHdr, nh int, body []byte) uint32 {
	return crcPseudoGeneric(c, h, nh, body)
}

// crcCopy copies src to dst (len(dst) >= len(src)) and returns the raw
// CRC-32 state after c over the bytes stored.
func crcCopy(c uint32, dst, src []byte) uint32 { return crcCopyGeneric(c, dst, src) }
