package device

import (
	"fmt"

	"github.com/vrnic/vrnic/dma"
)

// dmaSpace adapts *dma.Space to MemorySpace. Errors keep the dma sentinel
// and carry the errno dma.Errno assigns, so replies get dma's errno (EFAULT
// for a PA outside host memory, EACCES for another owner's memory, ...).
type dmaSpace struct{ s *dma.Space }

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

type dmaPin struct {
	b []byte
	p *dma.Pin
}

func (p *dmaPin) Bytes() []byte { return p.b }
func (p *dmaPin) Release()      { p.p.Release() }

func (m dmaSpace) AddRegion(o Owner, fd int, length uint64) (HostRegion, error) {
	r, err := m.s.AddRegion(o, fd, length)
	if err != nil {
		return HostRegion{}, wrapDMA(err)
	}
	return HostRegion{Handle: r.Handle, PABase: r.PA, Length: r.Length, Locked: r.Locked}, nil
}

func (m dmaSpace) RemoveRegion(o Owner, handle uint32) error {
	return wrapDMA(m.s.RemoveRegion(o, handle))
}

func (m dmaSpace) PinRange(o Owner, pa, length uint64) (Pin, error) {
	b, p, err := m.s.Slice(o, pa, length)
	if err != nil {
		return nil, wrapDMA(err)
	}
	return &dmaPin{b: b, p: p}, nil
}

func (m dmaSpace) RegisterMR(o Owner, pd uint32, iova, length uint64, access uint32, pageShift uint32, pages []uint64) (MRInfo, error) {
	info, err := m.s.RegisterMR(o, pd, iova, length, dma.Access(access), uint(pageShift), pages)
	if err != nil {
		return MRInfo{}, wrapDMA(err)
	}
	// The lkey names the MR for DEREG_MR.
	return MRInfo{Handle: info.LKey, LKey: info.LKey, RKey: info.RKey}, nil
}

func (m dmaSpace) DeregisterMR(o Owner, handle uint32) error {
	return wrapDMA(m.s.DeregisterMR(o, handle))
}

func (m dmaSpace) ReadPageList(o Owner, pa uint64, n uint32) ([]uint64, error) {
	p, err := m.s.ReadPageList(o, pa, n)
	return p, wrapDMA(err)
}

func (m dmaSpace) ReleaseOwner(o Owner) { m.s.ReleaseOwner(o) }

var _ MemorySpace = dmaSpace{}

// String helps debugging.
func (m dmaSpace) String() string { return fmt.Sprintf("dma space %p", m.s) }
