package roce

import (
	"encoding/binary"
	"math/bits"
)

// checksumAdd adds b to the one's complement sum s (RFC 1071) and returns
// the new, unfolded sum, in network byte order. Odd-length b is padded
// with a zero byte; only the last chunk of a sum may have odd length. s
// stays far below 2^64 for any realistic chain of calls (each adds less
// than 2^18).
//
// The bulk is summed as native little-endian 64-bit words with a carry
// chain, folded to 16 bits and byte-swapped: the one's complement sum does
// not depend on byte order except for that final swap (RFC 1071, 2.B).
func checksumAdd(s uint64, b []byte) uint64 {
	le := binary.LittleEndian
	var acc, c uint64
	for len(b) >= 32 {
		acc, c = bits.Add64(acc, le.Uint64(b[0:]), c)
		acc, c = bits.Add64(acc, le.Uint64(b[8:]), c)
		acc, c = bits.Add64(acc, le.Uint64(b[16:]), c)
		acc, c = bits.Add64(acc, le.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, c = bits.Add64(acc, le.Uint64(b), c)
		b = b[8:]
	}
	acc, c = bits.Add64(acc, 0, c)
	acc += c // c is 1 only when acc wrapped to 0: no overflow
	t := uint64(bits.ReverseBytes16(checksumFold(acc)))
	for len(b) >= 2 {
		t += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		t += uint64(b[0]) << 8
	}
	return s + t
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
