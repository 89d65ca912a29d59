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

// Linux AIO (KernelSignaller), as include/uapi/linux/aio_abi.h and
// fs/aio.c define it.
const (
	iocbCmdPoll   = 5 // IOCB_CMD_POLL
	iocbFlagResfd = 1 // IOCB_FLAG_RESFD
	aioRingMagic  = 0xa10a10a1
	aioRingHeader = 32 // sizeof(struct aio_ring) before io_events
	sizeofIocb    = 64
	sizeofAIORing = 32
)

// iocb is struct iocb in its little-endian layout (aio_key before
// aio_rw_flags; amd64, arm64).
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64 // IOCB_CMD_POLL: the poll events
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// aioRing is the header of struct aio_ring, which the kernel maps into
// the process at the address io_setup returns as the context id. The
// process may consume completions by moving head (libaio does).
type aioRing struct {
	id, nr, head, tail, magic, compatFeatures, incompatFeatures, headerLength uint32
}

var (
	_ [sizeofIocb - unsafe.Sizeof(iocb{})]byte
	_ [unsafe.Sizeof(iocb{}) - sizeofIocb]byte
	_ [sizeofAIORing - unsafe.Sizeof(aioRing{})]byte
	// io_submit's array holds native pointers (compat_uptr_t for a 32-bit
	// process on a 64-bit kernel), which is what [1]*iocb is everywhere.
)

// ioSetup is io_setup(2) for nr events; it returns the context id.
func ioSetup(nr int) (uintptr, error) {
	var id uintptr
	if _, _, errno := unix.Syscall(unix.SYS_IO_SETUP, uintptr(nr), uintptr(unsafe.Pointer(&id)), 0); errno != 0 {
		return 0, errno
	}
	return id, nil
}

// ioSubmit is io_submit(2) of the one iocb *cbs points to.
func ioSubmit(id uintptr, cbs **iocb) error {
	n, _, errno := unix.Syscall(unix.SYS_IO_SUBMIT, id, 1, uintptr(unsafe.Pointer(cbs)))
	if errno != 0 {
		return errno
	}
	if n != 1 {
		return unix.EAGAIN
	}
	return nil
}

// ioDestroy is io_destroy(2).
func ioDestroy(id uintptr) error {
	if _, _, errno := unix.Syscall(unix.SYS_IO_DESTROY, id, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// ringAt is the ring header at the context id's address: memory the
// kernel mapped, outside the Go heap. (The uintptr is reinterpreted
// rather than converted, which go vet would flag: the address is not
// derived from a Go pointer.)
func ringAt(id uintptr) *aioRing { return *(**aioRing)(unsafe.Pointer(&id)) }
