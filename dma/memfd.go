package dma

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// checkMemfd validates a client's host memory fd before it is mapped:
//
//   - F_GET_SEALS must succeed: only shmem files (memfd_create, and
//     hugetlbfs memfds) answer it; any other fd gets EINVAL -> ErrNotMemfd.
//   - F_SEAL_SHRINK must be set, so the client cannot ftruncate the file
//     under the device's mapping (which would turn device accesses into
//     SIGBUS). A memfd created without MFD_ALLOW_SEALING carries only
//     F_SEAL_SEAL and fails here too -> ErrUnsealed.
//   - F_SEAL_WRITE / F_SEAL_FUTURE_WRITE forbid the device's writable
//     shared mapping -> ErrWriteSealed.
//   - fstat: a regular file at least length bytes long -> ErrTooShort.
//
// Because the file cannot shrink once F_SEAL_SHRINK is set, the size
// checked here stays valid for the life of the mapping.
func checkMemfd(fd int, length uint64) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: F_GET_SEALS: %v", ErrNotMemfd, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return fmt.Errorf("%w (seals %#x)", ErrUnsealed, seals)
	}
	if seals&(unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE) != 0 {
		return fmt.Errorf("%w (seals %#x)", ErrWriteSealed, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%w: fstat: %v", ErrNotMemfd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: not a regular file (mode %#o)", ErrNotMemfd, st.Mode)
	}
	if st.Size < 0 || uint64(st.Size) < length {
		return fmt.Errorf("%w: size %d < length %d", ErrTooShort, st.Size, length)
	}
	return nil
}

// mapShared maps length bytes of fd read/write MAP_SHARED, so device stores
// are seen by the client's own mapping of the same file and vice versa.
func mapShared(fd int, length uint64) ([]byte, error) {
	mem, err := unix.Mmap(fd, 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("dma: mmap %d bytes: %w", length, err)
	}
	return mem, nil
}

// reopen opens the memfd fd again, read-only, through /proc/self/fd: a
// file description of the daemon's own, whose file offset the seeks of
// populatePresent may move without moving the client's (a descriptor
// received by SCM_RIGHTS or duplicated shares the client's). -1 if the
// kernel refuses.
func reopen(fd int) int {
	nfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return nfd
}

// memlockLimit returns the soft RLIMIT_MEMLOCK (RLIM_INFINITY as ^0).
func memlockLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		return 0
	}
	return rl.Cur
}
