package dma

import (
	"sync/atomic"
	"unsafe"
)

// This file holds the package's only uses of unsafe.

// word64 views 8 bytes of a mapping as a *uint64. b must be 8 bytes long
// and 8-byte aligned (word checks both).
func word64(b []byte) *uint64 { return (*uint64)(unsafe.Pointer(unsafe.SliceData(b))) }

func casWord(b []byte, old, new uint64) uint64 {
	p := word64(b)
	for {
		cur := atomic.LoadUint64(p)
		if cur != old {
			return cur
		}
		if atomic.CompareAndSwapUint64(p, old, new) {
			return old
		}
	}
}

func addWord(b []byte, d uint64) uint64 { return atomic.AddUint64(word64(b), d) - d }

// addrOf is the address of b's first byte (tests compare it with the
// mapping's bounds).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
