package tap

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxParts is the most buffers one readv or writev of a queue takes: a
// virtio-net header with the first frame's headers, then two parts (body,
// ICRC) for each of up to 128 segments (the kernel's UDP_MAX_SEGMENTS).
const maxParts = 2 + 2*128

// iovecs fills iov with parts and returns how many it used (empty parts
// are left out: the kernel does not need them). It never allocates.
func iovecs(iov *[maxParts]unix.Iovec, parts [][]byte) int {
	n := 0
	for _, p := range parts {
		if len(p) == 0 {
			continue
		}
		iov[n].Base = &p[0]
		iov[n].SetLen(len(p))
		n++
	}
	return n
}

// writev is writev(2) of iov[:n] on fd. The caller keeps the buffers the
// iovecs point to alive (they are its arguments) for the call.
func writev(fd uintptr, iov *[maxParts]unix.Iovec, n int) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if e != 0 {
		return int(r), e
	}
	return int(r), nil
}

// readv is readv(2) of iov[:n] on fd.
func readv(fd uintptr, iov *[maxParts]unix.Iovec, n int) (int, error) {
	r, _, e := unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(n))
	if e != 0 {
		return int(r), e
	}
	return int(r), nil
}
