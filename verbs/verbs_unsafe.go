package verbs

import (
	"sync/atomic"
	"unsafe"
)

// Atomic 32-bit access to shared memory (doorbell records, CQE tail
// words). b must hold at least 4 bytes at a 4-byte aligned address (every
// doorbell word and CQE tail is). sync/atomic operations are sequentially
// consistent, as the ABI requires for the producer-index store and the
// kick_needed load.

func word32(b []byte) *uint32 { return (*uint32)(unsafe.Pointer(unsafe.SliceData(b))) }

func load32(b []byte) uint32 { return atomic.LoadUint32(word32(b)) }

func store32(b []byte, v uint32) { atomic.StoreUint32(word32(b), v) }

func or32(b []byte, v uint32) { atomic.OrUint32(word32(b), v) }

// addrOf returns the virtual address of b's first byte.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
