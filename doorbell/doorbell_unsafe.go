package doorbell

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// word returns the 32-bit atomic at b[off:off+4]. off must be a multiple of
// 4 and b page-aligned (it is a mapping), so the word is aligned.
func word(b []byte, off uint32) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off : off+4][0]))
}

// readNowait is preadv2(fd, iov, 1, -1, RWF_NOWAIT): a read at the file
// position (an eventfd has none) that fails with EAGAIN instead of
// blocking, whatever the file's O_NONBLOCK flag. x/sys's Preadv2 builds
// its iovec array per call; this one allocates nothing.
func readNowait(fd int, iov *unix.Iovec) error {
	_, _, errno := unix.Syscall6(unix.SYS_PREADV2, uintptr(fd), uintptr(unsafe.Pointer(iov)), 1,
		^uintptr(0), ^uintptr(0), unix.RWF_NOWAIT)
	if errno != 0 {
		return errno
	}
	return nil
}
