package doorbell

import (
	"sync/atomic"
	"unsafe"
)

// word returns the 32-bit atomic at b[off:off+4]. off must be a multiple of
// 4 and b page-aligned (it is a mapping), so the word is aligned.
func word(b []byte, off uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off : off+4][0]))
}
