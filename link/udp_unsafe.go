package link

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The only unsafe code of the UDP link: the two batched socket calls. The
// mmsghdr, iovec and sockaddr arrays they point to are preallocated per
// port (udpBatch) and hold ordinary Go pointers, so the buffers they name
// stay alive and in place during the call.

// sendmmsg sends msgs on fd (sendmmsg(2)): the number of datagrams sent,
// or -1 and the error of the first one.
func sendmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, unix.Errno) {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	return int(r), e
}

// recvmmsg receives up to len(msgs) datagrams from fd (recvmmsg(2), no
// timeout): the number received, or -1 and the error.
func recvmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, unix.Errno) {
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), uintptr(flags), 0, 0)
	return int(r), e
}
