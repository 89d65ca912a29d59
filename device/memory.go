package device

import (
	"github.com/vrnic/vrnic/dma"
)

// memory is the device's use of its physical address space and MR table
// (package dma), under the device lock. Every error keeps the dma sentinel
// and carries the errno dma.Errno assigns, so replies get dma's errno
// (EFAULT for a PA outside host memory, EACCES for another owner's memory,
// ...).
type memory struct{ s *dma.Space }

// Owner identifies the client (context) that owns memory in the address
// space; dead-client cleanup releases everything of one owner at once.
type Owner = dma.Owner

// dmaError is a dma error with its reply errno attached.
type dmaError struct {
	err   error
	errno error
}

func (e *dmaError) Error() string   { return e.err.Error() }
func (e *dmaError) Unwrap() []error { return []error{e.err, e.errno} }

func wrapDMA(err error) error {
	if err == nil {
		return nil
	}
	return &dmaError{err: err, errno: dma.Errno(err)}
}

// pin holds a range of host memory (a ring) in place: while it is held the
// region cannot be removed. release is idempotent. It is the dma pin
// itself, which gives the bytes back (no copy of the slice beside it: a
// QP holds two).
type pin dma.Pin

// bytes is the pinned range as mapped in the daemon (while it is held).
func (p *pin) bytes() []byte { return (*dma.Pin)(p).Bytes() }
func (p *pin) release()      { (*dma.Pin)(p).Release() }

// addRegion registers the memfd fd (length bytes) for owner. The space
// duplicates fd; the caller still owns (and closes) fd.
func (m memory) addRegion(o Owner, fd int, length uint64) (dma.RegionInfo, error) {
	r, err := m.s.AddRegion(o, fd, length)
	return r, wrapDMA(err)
}

// removeRegion unregisters a region; it fails (EBUSY class) while an MR or
// a ring pins it.
func (m memory) removeRegion(o Owner, handle uint32) error {
	return wrapDMA(m.s.RemoveRegion(o, handle))
}

// pinRange pins [pa, pa+length), which must lie in one region of owner.
func (m memory) pinRange(o Owner, pa, length uint64) (*pin, error) {
	_, p, err := m.s.Slice(o, pa, length)
	if err != nil {
		return nil, wrapDMA(err)
	}
	return (*pin)(p), nil
}

// registerMR registers an MR from a page list; its lkey names it for
// DEREG_MR.
func (m memory) registerMR(o Owner, pd uint32, iova, length uint64, access uint32, pageShift uint32, pages []uint64) (dma.MRInfo, error) {
	info, err := m.s.RegisterMR(o, pd, iova, length, dma.Access(access), uint(pageShift), pages)
	return info, wrapDMA(err)
}

// deregisterMR drops an MR and its pins.
func (m memory) deregisterMR(o Owner, handle uint32) error {
	return wrapDMA(m.s.DeregisterMR(o, handle))
}

// registerMRList registers an MR whose page list is n u64 page addresses
// at pa in the owner's host memory (REG_MR pbl_pa), read straight into
// the MR's table.
func (m memory) registerMRList(o Owner, pd uint32, iova, length uint64, access uint32, pageShift uint32, pa uint64, n uint32) (dma.MRInfo, error) {
	info, err := m.s.RegisterMRList(o, pd, iova, length, dma.Access(access), uint(pageShift), pa, n)
	return info, wrapDMA(err)
}

// setAccount charges owner's pinned memory and page tables to its uid.
func (m memory) setAccount(o Owner, uid uint32, l Limits) error {
	return wrapDMA(m.s.SetAccount(o, dma.AccountID(uid), dma.AccountLimits{PinnedBytes: l.PinnedBytesPerUID, TableBytes: l.MRTableBytesPerUID}))
}

// releaseOwner drops every MR and region of owner (client death).
func (m memory) releaseOwner(o Owner) { m.s.ReleaseOwner(o) }
