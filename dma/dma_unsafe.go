package dma

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
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

// storeWord stores v into the aligned word b with one atomic store.
func storeWord(b []byte, v uint64) { atomic.StoreUint64(word64(b), v) }

// barrierWord is the target of fullBarrier's locked operation.
var barrierWord uint64

// fullBarrier is a full memory barrier: a sequentially consistent atomic
// read-modify-write (a locked instruction on amd64).
func fullBarrier() { atomic.AddUint64(&barrierWord, 1) }

// addrOf is the address of b's first byte (tests compare it with the
// mapping's bounds).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// lockOnFault is mlock2(b, MLOCK_ONFAULT): the pages of b mapped now are
// locked, the others as they are faulted in; nothing is populated.
func lockOnFault(b []byte) error {
	_, _, e := unix.Syscall(unix.SYS_MLOCK2, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), unix.MLOCK_ONFAULT)
	if e != 0 {
		return e
	}
	return nil
}

// u64sOf views mmap'd bytes (page aligned) as []uint64.
func u64sOf(b []byte) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// runsOf views mmap'd bytes (page aligned) as []pteRun.
func runsOf(b []byte) []pteRun {
	return unsafe.Slice((*pteRun)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(pteRun{})))
}
