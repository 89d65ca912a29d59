package queues

import (
	"sync/atomic"
	"unsafe"
)

// storeU32 atomically stores v at b[off:off+4] (release: every earlier
// store is visible before it). off must be 4-aligned in memory.
func storeU32(b []byte, off int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])), v)
}

// loadU32 atomically loads the 32-bit word at b[off:off+4].
func loadU32(b []byte, off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])))
}

// aligned reports whether &b[0] is a multiple of n bytes.
func aligned(b []byte, n uintptr) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%n == 0
}
