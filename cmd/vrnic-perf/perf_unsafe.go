package main

import (
	"sync/atomic"
	"unsafe"
)

// loadByte reads byte i of b, which the daemon writes from another
// process (a latency test polls the last byte of an incoming RDMA WRITE),
// with an atomic load of the aligned 32-bit word holding it, so the
// compiler neither caches nor tears the read. b's first byte must be
// 4-byte aligned (host memory buffers are page aligned).
func loadByte(b []byte, i int) byte {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[i&^3])))
	return byte(w >> (8 * (i & 3)))
}
