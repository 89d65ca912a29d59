package dataplane

import (
	"errors"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
)

// qpMemory is the engine's view of one QP's memory (engine.Memory): the
// dma key table scoped to the QP's protection domain.
//
// Accessor ownership: the QPs of one engine worker share the worker's
// *dma.Accessor (DataPlane.accs). Only the QP's owning engine worker
// calls these methods (the engine runs every QP on one worker for its
// whole life, control operations included), so the accessor is never
// used by two goroutines, and a grace period of the dma space (region
// removal) waits at most for the one copy in progress. The methods that
// reach memory through an rkey, and BindMW, first tell the accessor which
// QP they run for (qp): type 2 memory windows are bound to one QP.
// The copy and atomic methods of dma.Accessor enter and leave their
// read-side section themselves; CheckRemote and Invalidate touch no
// mapped memory and need none.
//
// Errors: the dma sentinels are mapped to the engine's sentinels by
// memErrOf without allocation (see memErr).
type qpMemory struct {
	acc *dma.Accessor
	pd  dma.PD
	mem *dma.Space
	qp  dma.QPID // unique for the data plane's life (QP numbers are reused)
}

var _ engine.Memory = (*qpMemory)(nil)

func (m *qpMemory) GatherTo(sges []abi.SGE, off uint64, n int, s engine.Sink) error {
	_, err := m.acc.GatherInto(m.pd, sges, off, uint64(n), s)
	return memErrOf(err)
}

func (m *qpMemory) Scatter(sges []abi.SGE, off uint64, src []byte) error {
	_, err := m.acc.ScatterAt(m.pd, sges, off, src)
	return memErrOf(err)
}

func (m *qpMemory) WriteRemote(rkey uint32, va uint64, src []byte) error {
	m.acc.SetQP(m.qp)
	return memErrOf(m.acc.WriteRemote(rkey, m.pd, va, src))
}

func (m *qpMemory) ReadRemoteTo(rkey uint32, va uint64, n int, s engine.Sink) error {
	m.acc.SetQP(m.qp)
	return memErrOf(m.acc.ReadRemoteInto(rkey, m.pd, va, uint64(n), s))
}

func (m *qpMemory) CheckRemote(rkey uint32, va uint64, length uint64, access uint32) error {
	m.acc.SetQP(m.qp)
	return memErrOf(m.acc.CheckRemote(rkey, m.pd, va, length, dma.Access(access)))
}

func (m *qpMemory) Atomic(rkey uint32, va uint64, cas bool, compare, swap uint64) (uint64, error) {
	var (
		v   uint64
		err error
	)
	m.acc.SetQP(m.qp)
	if cas {
		v, err = m.acc.CompareSwap(rkey, m.pd, va, compare, swap)
	} else {
		v, err = m.acc.FetchAdd(rkey, m.pd, va, compare)
	}
	return v, memErrOf(err)
}

func (m *qpMemory) AtomicWrite(rkey uint32, va uint64, v uint64) error {
	return memErrOf(m.acc.AtomicWrite(rkey, m.pd, va, v))
}

func (m *qpMemory) Flush(rkey uint32, va, length uint64, whole bool, access uint32) error {
	return memErrOf(m.acc.Flush(rkey, m.pd, va, length, whole, dma.Access(access)))
}

func (m *qpMemory) Invalidate(key uint32) error {
	return memErrOf(m.mem.Invalidate(key, m.pd))
}

// BindMW binds for this QP: a type 2 window is bound to it.
func (m *qpMemory) BindMW(b abi.BindMW) error {
	m.acc.SetQP(m.qp)
	return m.acc.BindMW(m.pd, dma.MWBind{MW: b.MWHandle, RKey: b.RKey, MR: b.MRLKey,
		Addr: b.Addr, Length: b.Length, Access: dma.Access(b.Access)})
}

// memErr is a dma error seen through the engine: errors.Is matches both
// the engine sentinel (which picks the completion status or NAK) and the
// dma sentinel (which says what exactly failed). The values are built
// once; returning one allocates nothing.
type memErr struct {
	eng, dma error
}

func (e *memErr) Error() string   { return e.eng.Error() + ": " + e.dma.Error() }
func (e *memErr) Unwrap() []error { return []error{e.eng, e.dma} }

// memErrTable maps every dma sentinel the hot path returns. The engine's
// classes (iface.go): protection (bad key, wrong PD, access right),
// length (SGE list shorter than the message), bounds (outside the MR,
// misaligned atomic).
var memErrTable = [...]*memErr{
	{engine.ErrMemProtection, dma.ErrBadKey},
	{engine.ErrMemProtection, dma.ErrWrongPD},
	{engine.ErrMemProtection, dma.ErrAccess},
	{engine.ErrMemProtection, dma.ErrFault}, // on-demand paging: page not mapped
	{engine.ErrMemProtection, dma.ErrWrongQP},
	{engine.ErrMemProtection, dma.ErrMWType},
	{engine.ErrMemProtection, dma.ErrMRBound},
	{engine.ErrMemLength, dma.ErrLength},
	{engine.ErrMemBounds, dma.ErrBounds},
	{engine.ErrMemBounds, dma.ErrMisaligned},
}

// memErrOther wraps an unexpected dma error (ErrSegments, ErrNoSection:
// daemon bugs, never client input) as a protection error, so the
// operation fails without touching memory.
var memErrOther = errors.New("dma: unexpected error")

func memErrOf(err error) error {
	if err == nil {
		return nil
	}
	for _, e := range memErrTable {
		if err == e.dma {
			return e
		}
	}
	for _, e := range memErrTable {
		if errors.Is(err, e.dma) {
			return e
		}
	}
	return &memErr{engine.ErrMemProtection, errors.Join(memErrOther, err)}
}
