package dma

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Sentinel errors, each carrying the errno of a control reply. Functions
// wrap them with %w and context on the control path; the hot path
// (Accessor methods) returns them unwrapped so that an error costs no
// allocation. Test with errors.Is.
var (
	// Host memory (AddRegion, RemoveRegion, Slice).

	// ErrInvalid: a malformed argument (zero or unaligned length, unknown
	// flag bits, bad page shift).
	ErrInvalid error = &sentinel{"dma: invalid argument", unix.EINVAL}
	// ErrNotMemfd: the fd is not a memfd (F_GET_SEALS refused it) or not a
	// regular file.
	ErrNotMemfd error = &sentinel{"dma: fd is not a memfd", unix.EBADF}
	// ErrUnsealed: the memfd is not sealed with F_SEAL_SHRINK (or cannot be
	// sealed at all: created without MFD_ALLOW_SEALING).
	ErrUnsealed error = &sentinel{"dma: memfd not sealed against shrinking", unix.EPERM}
	// ErrWriteSealed: the memfd carries F_SEAL_WRITE or F_SEAL_FUTURE_WRITE,
	// so it cannot be mapped writable by the device.
	ErrWriteSealed error = &sentinel{"dma: memfd sealed against writing", unix.EPERM}
	// ErrTooShort: the memfd is shorter than the length asked for.
	ErrTooShort error = &sentinel{"dma: memfd shorter than length", unix.EINVAL}
	// ErrTooLarge: a length beyond the configured maximum.
	ErrTooLarge error = &sentinel{"dma: length too large", unix.E2BIG}
	// ErrNoRegion: no live region with that handle for that owner.
	ErrNoRegion error = &sentinel{"dma: no such host memory region", unix.ENOENT}
	// ErrBusy: the region is pinned by an MR or a ring view.
	ErrBusy error = &sentinel{"dma: host memory region in use", unix.EBUSY}
	// ErrLimit: a table is full (regions per owner, MR keys, PA space).
	ErrLimit error = &sentinel{"dma: resource limit reached", unix.ENOSPC}
	// ErrQuota: pinning host memory or storing an MR's page table would
	// exceed the owner's account limit or the device's (ENOMEM, as the
	// kernel refuses ibv_reg_mr beyond RLIMIT_MEMLOCK).
	ErrQuota error = &sentinel{"dma: memory limit reached", unix.ENOMEM}
	// ErrClosed: the Space was closed.
	ErrClosed error = &sentinel{"dma: space closed", unix.ESHUTDOWN}

	// Physical addresses (Slice, RegisterMR page lists).

	// ErrPAOutside: a physical range is not wholly inside one region of
	// any owner (unassigned PA, guard gap, or straddling a region end).
	ErrPAOutside error = &sentinel{"dma: physical address outside host memory", unix.EFAULT}
	// ErrNotOwner: a physical range lies in a region of another owner.
	ErrNotOwner error = &sentinel{"dma: physical address in another owner's memory", unix.EACCES}

	// Memory registration.

	// ErrPageSize: page shift other than 12 (4 KiB) or 21 (2 MiB).
	ErrPageSize error = &sentinel{"dma: unsupported page size", unix.EINVAL}
	// ErrPageCount: the page list length does not match the pages that
	// [iova, iova+length) touches.
	ErrPageCount error = &sentinel{"dma: page count does not match the range", unix.EINVAL}
	// ErrPageAlign: a page address not aligned to the page size.
	ErrPageAlign error = &sentinel{"dma: page address not aligned to the page size", unix.EINVAL}
	// ErrOverflow: iova+length wraps, or length exceeds the MR maximum.
	ErrOverflow error = &sentinel{"dma: address range overflows", unix.EOVERFLOW}
	// ErrAccessFlags: unknown access bits, or remote write / remote atomic
	// without local write (IBTA C10-83).
	ErrAccessFlags error = &sentinel{"dma: invalid access flags", unix.EINVAL}
	// ErrNoMR: DeregisterMR of a key that is not a live MR of that owner.
	ErrNoMR error = &sentinel{"dma: no such memory region", unix.ENOENT}
	// ErrMRBound: DeregisterMR or Invalidate of an MR that memory windows
	// are bound to (EINVAL, as Linux rxe refuses it).
	ErrMRBound error = &sentinel{"dma: memory windows are bound to the MR", unix.EINVAL}

	// Memory windows (mw.go).

	// ErrNoMW: DeallocMW of a handle that is not a live window of that owner.
	ErrNoMW error = &sentinel{"dma: no such memory window", unix.ENOENT}
	// ErrMWBind: a bind refused (the work request completes with
	// MW_BIND_ERR); wrapped with the rule it broke.
	ErrMWBind error = &sentinel{"dma: memory window bind refused", unix.EINVAL}
	// ErrMWType: invalidation of a type 1 window's rkey.
	ErrMWType error = &sentinel{"dma: a type 1 memory window cannot be invalidated", unix.EINVAL}
	// ErrWrongQP: a type 2 window's rkey used through another QP than the
	// one it is bound to.
	ErrWrongQP error = &sentinel{"dma: memory window bound to another QP", unix.EACCES}

	// Translation (hot path). Each maps to one completion status.

	// ErrBadKey: unknown, stale (index reused) or invalidated key.
	ErrBadKey error = &sentinel{"dma: bad key", unix.EINVAL}
	// ErrWrongPD: the key belongs to another protection domain.
	ErrWrongPD error = &sentinel{"dma: key of another protection domain", unix.EACCES}
	// ErrAccess: the MR does not grant the access asked for (EACCES).
	ErrAccess error = &sentinel{"dma: access not permitted by the MR", unix.EACCES}
	// ErrBounds: the range is not inside the MR.
	ErrBounds error = &sentinel{"dma: range outside the MR", unix.EFAULT}
	// ErrLength: the SGE list and the buffer lengths disagree (a receive
	// longer than the posted buffers, a gather past the end of the list).
	ErrLength error = &sentinel{"dma: length mismatch with the SGE list", unix.EMSGSIZE}
	// ErrMisaligned: an atomic on an address not aligned to 8 bytes.
	ErrMisaligned error = &sentinel{"dma: atomic address not 8-byte aligned", unix.EINVAL}
	// ErrFault: an on-demand paging MR reached an address the client has
	// not mapped (or not with the protection asked for), or its process
	// is gone: the page fault could not be resolved (odp.go).
	ErrFault error = &sentinel{"dma: page fault on client memory not resolved", unix.EFAULT}
	// ErrSegments: the caller's scatter list is too short for the range.
	ErrSegments error = &sentinel{"dma: scatter list too short", unix.ENOSPC}
	// ErrNoSection: Translate called outside Enter/Exit.
	ErrNoSection error = &sentinel{"dma: translate outside an Enter/Exit section", unix.EINVAL}
)

// sentinel is an error with the errno a control reply carries for it. It
// unwraps to that errno, so errors.Is(err, unix.EBUSY) holds for ErrBusy
// and abi.ErrnoOf finds the status of any error wrapping a sentinel.
type sentinel struct {
	msg   string
	errno unix.Errno
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.errno }

// Errno returns the errno of a control reply for err: the errno of the
// sentinel (or errno) err wraps, 0 for nil, EIO otherwise.
func Errno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var en unix.Errno
	if errors.As(err, &en) && en != 0 {
		return en
	}
	return unix.EIO
}
