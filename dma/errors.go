package dma

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Sentinel errors. Functions wrap them with %w and context on the control
// path; the hot path (Accessor methods) returns them unwrapped so that an
// error costs no allocation. Test with errors.Is.
var (
	// Host memory (AddRegion, RemoveRegion, Slice).

	// ErrInvalid: a malformed argument (zero or unaligned length, unknown
	// flag bits, bad page shift).
	ErrInvalid = errors.New("dma: invalid argument")
	// ErrNotMemfd: the fd is not a memfd (F_GET_SEALS refused it) or not a
	// regular file.
	ErrNotMemfd = errors.New("dma: fd is not a memfd")
	// ErrUnsealed: the memfd is not sealed with F_SEAL_SHRINK (or cannot be
	// sealed at all: created without MFD_ALLOW_SEALING).
	ErrUnsealed = errors.New("dma: memfd not sealed against shrinking")
	// ErrWriteSealed: the memfd carries F_SEAL_WRITE or F_SEAL_FUTURE_WRITE,
	// so it cannot be mapped writable by the device.
	ErrWriteSealed = errors.New("dma: memfd sealed against writing")
	// ErrTooShort: the memfd is shorter than the length asked for.
	ErrTooShort = errors.New("dma: memfd shorter than length")
	// ErrTooLarge: a length beyond the configured maximum.
	ErrTooLarge = errors.New("dma: length too large")
	// ErrNoRegion: no live region with that handle for that owner.
	ErrNoRegion = errors.New("dma: no such host memory region")
	// ErrBusy: the region is pinned by an MR or a ring view.
	ErrBusy = errors.New("dma: host memory region in use")
	// ErrLimit: a table is full (regions per owner, MR keys, PA space).
	ErrLimit = errors.New("dma: resource limit reached")
	// ErrClosed: the Space was closed.
	ErrClosed = errors.New("dma: space closed")

	// Physical addresses (Slice, RegisterMR page lists).

	// ErrPAOutside: a physical range is not wholly inside one region of
	// any owner (unassigned PA, guard gap, or straddling a region end).
	ErrPAOutside = errors.New("dma: physical address outside host memory")
	// ErrNotOwner: a physical range lies in a region of another owner.
	ErrNotOwner = errors.New("dma: physical address in another owner's memory")

	// Memory registration.

	// ErrPageSize: page shift other than 12 (4 KiB) or 21 (2 MiB).
	ErrPageSize = errors.New("dma: unsupported page size")
	// ErrPageCount: the page list length does not match the pages that
	// [iova, iova+length) touches.
	ErrPageCount = errors.New("dma: page count does not match the range")
	// ErrPageAlign: a page address not aligned to the page size.
	ErrPageAlign = errors.New("dma: page address not aligned to the page size")
	// ErrOverflow: iova+length wraps, or length exceeds the MR maximum.
	ErrOverflow = errors.New("dma: address range overflows")
	// ErrAccessFlags: unknown access bits, or remote write / remote atomic
	// without local write (IBTA C10-83).
	ErrAccessFlags = errors.New("dma: invalid access flags")
	// ErrNoMR: DeregisterMR of a key that is not a live MR of that owner.
	ErrNoMR = errors.New("dma: no such memory region")

	// Translation (hot path). Each maps to one completion status.

	// ErrBadKey: unknown, stale (index reused) or invalidated key.
	ErrBadKey = errors.New("dma: bad key")
	// ErrWrongPD: the key belongs to another protection domain.
	ErrWrongPD = errors.New("dma: key of another protection domain")
	// ErrAccess: the MR does not grant the access asked for (EACCES).
	ErrAccess = errors.New("dma: access not permitted by the MR")
	// ErrBounds: the range is not inside the MR.
	ErrBounds = errors.New("dma: range outside the MR")
	// ErrLength: the SGE list and the buffer lengths disagree (a receive
	// longer than the posted buffers, a gather past the end of the list).
	ErrLength = errors.New("dma: length mismatch with the SGE list")
	// ErrMisaligned: an atomic on an address not aligned to 8 bytes.
	ErrMisaligned = errors.New("dma: atomic address not 8-byte aligned")
	// ErrSegments: the caller's scatter list is too short for the range.
	ErrSegments = errors.New("dma: scatter list too short")
	// ErrNoSection: Translate called outside Enter/Exit.
	ErrNoSection = errors.New("dma: translate outside an Enter/Exit section")
)

// errnoTable maps every sentinel to the errno the control protocol
// replies with (vrnic_msg_hdr.status).
var errnoTable = []struct {
	err   error
	errno unix.Errno
}{
	{ErrInvalid, unix.EINVAL},
	{ErrNotMemfd, unix.EBADF},
	{ErrUnsealed, unix.EPERM},
	{ErrWriteSealed, unix.EPERM},
	{ErrTooShort, unix.EINVAL},
	{ErrTooLarge, unix.E2BIG},
	{ErrNoRegion, unix.ENOENT},
	{ErrBusy, unix.EBUSY},
	{ErrLimit, unix.ENOSPC},
	{ErrClosed, unix.ESHUTDOWN},
	{ErrPAOutside, unix.EFAULT},
	{ErrNotOwner, unix.EACCES},
	{ErrPageSize, unix.EINVAL},
	{ErrPageCount, unix.EINVAL},
	{ErrPageAlign, unix.EINVAL},
	{ErrOverflow, unix.EOVERFLOW},
	{ErrAccessFlags, unix.EINVAL},
	{ErrNoMR, unix.ENOENT},
	{ErrBadKey, unix.EINVAL},
	{ErrWrongPD, unix.EACCES},
	{ErrAccess, unix.EACCES},
	{ErrBounds, unix.EFAULT},
	{ErrLength, unix.EMSGSIZE},
	{ErrMisaligned, unix.EINVAL},
	{ErrSegments, unix.ENOSPC},
	{ErrNoSection, unix.EINVAL},
}

// Errno returns the errno a control reply carries for err: the entry of
// the first sentinel err wraps, an errno err wraps itself, or EIO.
func Errno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	for _, e := range errnoTable {
		if errors.Is(err, e.err) {
			return e.errno
		}
	}
	var en unix.Errno
	if errors.As(err, &en) {
		return en
	}
	return unix.EIO
}
