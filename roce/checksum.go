package roce

import (
	"encoding/binary"
	"math/bits"
)

// checksumAdd adds b to the one's complement sum s (RFC 1071) and returns
// the new, unfolded sum. Odd-length b is padded with a zero byte; only the
// last chunk of a sum may have odd length.
func checksumAdd(s uint64, b []byte) uint64 {
	var c uint64
	for len(b) >= 32 {
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint32(b[0:]))<<32|uint64(binary.BigEndian.Uint32(b[4:])), c)
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint32(b[8:]))<<32|uint64(binary.BigEndian.Uint32(b[12:])), c)
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint32(b[16:]))<<32|uint64(binary.BigEndian.Uint32(b[20:])), c)
		s, c = bits.Add64(s, uint64(binary.BigEndian.Uint32(b[24:]))<<32|uint64(binary.BigEndian.Uint32(b[28:])), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		s, c = bits.Add64(s, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	var t uint64
	for len(b) >= 2 {
		t += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		t += uint64(b[0]) << 8
	}
	s, c = bits.Add64(s, t, c)
	s, c = bits.Add64(s, 0, c)
	return s + c // c is 1 only when s wrapped to 0: no overflow
}

// checksumFold folds a 64-bit one's complement sum to 16 bits (not
// inverted).
func checksumFold(s uint64) uint16 {
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 32) + (s & 0xffffffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	s = (s >> 16) + (s & 0xffff)
	return uint16(s)
}

// Checksum returns the Internet checksum (RFC 1071) of b: the one's
// complement of the one's complement sum.
func Checksum(b []byte) uint16 {
	return ^checksumFold(checksumAdd(0, b))
}
