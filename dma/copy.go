package dma

import (
	"math"

	"github.com/vrnic/vrnic/abi"
)

// SGE is a scatter/gather element as posted in a WQE (struct vrnic_sge):
// Length bytes at virtual address Addr of the MR named by LKey. It is the
// abi type, so WQE decoding fills it directly.
type SGE = abi.SGE

// Index values returned in "bad" alongside an error.
const (
	// BadRemote: the remote (rkey, va) side failed, not an SGE.
	BadRemote = -1
)

// The copy methods below return (bad, err): on failure err is a sentinel
// (unwrapped: no allocation) and bad is the index of the first failing
// SGE, len(sges) when the SGE list is too short for the data (ErrLength),
// or BadRemote when the (rkey, va) side failed. The engine maps these to
// completion statuses: a local SGE error to LOC_PROT_ERR, ErrLength to
// LOC_LEN_ERR, a remote error to REM_ACCESS_ERR on the responder side.
// Zero-length SGEs are skipped without a key check. Bytes before the
// failure point have been copied.

// Validate checks every SGE of a list (key, PD, want access, bounds) and
// returns the total length. Engines call it once per WQE, before any
// packet goes out, so a bad SGE fails the WQE at once.
func (a *Accessor) Validate(pd PD, sges []SGE, want Access) (total uint64, bad int, err error) {
	for i := range sges {
		sg := &sges[i]
		if sg.Length == 0 {
			continue
		}
		if _, err := a.sgeRegion(pd, sg, 0, uint64(sg.Length), want); err != nil {
			return total, i, err
		}
		total += uint64(sg.Length)
	}
	return total, 0, nil
}

// sgeRegion checks n bytes at offset off of one SGE (bounds, key, PD,
// want access) and returns the MR that holds them.
func (a *Accessor) sgeRegion(pd PD, sg *SGE, off, n uint64, want Access) (*memRegion, error) {
	if sg.Addr > math.MaxUint64-uint64(sg.Length) {
		return nil, ErrBounds
	}
	m := a.s.lookupLocal(sg.LKey)
	if m == nil {
		return nil, ErrBadKey
	}
	if err := m.check(pd, sg.Addr+off, n, want); err != nil {
		return nil, err
	}
	return m, nil
}

// GatherAt copies len(dst) bytes of the message described by sges,
// starting at message offset off, into dst (local read access). A
// requester builds each packet's payload with one call.
func (a *Accessor) GatherAt(pd PD, sges []SGE, off uint64, dst []byte) (bad int, err error) {
	return a.copyAt(pd, sges, off, dst, false)
}

// Sink takes the bytes of a message in order (GatherInto): each Put is
// the next piece, a slice of client memory valid only during the call,
// which the sink reads (the client may write it meanwhile) and must not
// keep or write.
type Sink interface {
	Put(b []byte)
}

// GatherInto is GatherAt handing the n bytes to s instead of copying
// them: one Put per piece contiguous in the mapping, in message order,
// inside the accessor's read-side section. The sink copies each piece
// where it goes and computes over it on the way (a requester places a
// packet's payload and its ICRC in one read). Checks, errors and bad as
// GatherAt's; the pieces before a failure have been put.
func (a *Accessor) GatherInto(pd PD, sges []SGE, off, n uint64, s Sink) (bad int, err error) {
	return a.walkSGEs(pd, sges, off, n, 0, func(m *memRegion, iova, k uint64) error {
		return a.putMR(m, iova, k, s)
	})
}

// putMR hands the k bytes at iova of m to s: slices of the mapping, or
// of the accessor's bounce buffer for an on-demand paging MR (odp.go).
// Checked range.
func (a *Accessor) putMR(m *memRegion, iova, k uint64, s Sink) error {
	if m.proc != nil {
		return a.putODP(m, iova, k, s)
	}
	for k > 0 {
		b := m.span(iova, k)
		s.Put(b)
		iova += uint64(len(b))
		k -= uint64(len(b))
	}
	return nil
}

// ScatterAt copies src into the message described by sges at message
// offset off (local write access). A responder places each incoming SEND
// packet, and a completer each READ response, with one call.
func (a *Accessor) ScatterAt(pd PD, sges []SGE, off uint64, src []byte) (bad int, err error) {
	return a.copyAt(pd, sges, off, src, true)
}

// copyAt is GatherAt (toSGEs false: the SGEs' memory into buf) and
// ScatterAt (toSGEs true: buf into the SGEs' memory, which needs local
// write access).
func (a *Accessor) copyAt(pd PD, sges []SGE, off uint64, buf []byte, toSGEs bool) (int, error) {
	want := Access(0)
	if toSGEs {
		want = AccessLocalWrite
	}
	return a.walkSGEs(pd, sges, off, uint64(len(buf)), want, func(m *memRegion, iova, k uint64) error {
		var err error
		if toSGEs {
			err = a.writeMR(m, iova, buf[:k])
		} else {
			err = a.readMR(m, iova, buf[:k])
		}
		buf = buf[k:]
		return err
	})
}

// walkSGEs hands visit, in message order and inside the accessor's
// read-side section, each SGE's part of the n bytes at message offset
// off of the message sges describes: its region (checked for pd and the
// access bits want, sgeRegion) and the part's address and length. The
// parts before a failing SGE have been visited; it returns that SGE's
// index and the error, or len(sges) and ErrLength when the SGEs hold
// fewer than off+n bytes. A visit fails only on an on-demand paging MR
// whose page fault is not resolved (ErrFault): that SGE fails. GatherInto,
// GatherAt and ScatterAt are its visits.
func (a *Accessor) walkSGEs(pd PD, sges []SGE, off, n uint64, want Access, visit func(m *memRegion, iova, k uint64) error) (int, error) {
	a.Enter()
	defer a.Exit()
	for i := range sges {
		if n == 0 {
			return 0, nil
		}
		sg := &sges[i]
		l := uint64(sg.Length)
		if off >= l {
			off -= l
			continue
		}
		k := min(l-off, n)
		m, err := a.sgeRegion(pd, sg, off, k, want)
		if err != nil {
			return i, err
		}
		if err := visit(m, sg.Addr+off, k); err != nil {
			return i, err
		}
		n -= k
		off = 0
	}
	if n != 0 {
		return len(sges), ErrLength
	}
	return 0, nil
}

// CheckRemote validates [va, va+length) of the MR named by rkey for pd and
// the access bits want, without touching memory: a responder checks a
// whole RDMA WRITE or READ request on its first packet.
func (a *Accessor) CheckRemote(rkey uint32, pd PD, va, length uint64, want Access) error {
	_, _, err := a.remoteRegion(rkey, pd, va, length, want)
	return err
}

// remoteRegion returns the MR named by rkey, or by the memory window
// of rkey (mw.go), once [va, va+n) of it is checked for pd and the access
// bits want, and the iova of va in that MR: ErrBadKey for no such key,
// the check's error otherwise.
func (a *Accessor) remoteRegion(rkey uint32, pd PD, va, n uint64, want Access) (*memRegion, uint64, error) {
	return a.resolveRemote(rkey, pd, va, n, want)
}

// ReadRemote copies len(dst) bytes at va of the MR named by rkey into dst
// (REMOTE_READ required): an RDMA READ responder.
func (a *Accessor) ReadRemote(rkey uint32, pd PD, va uint64, dst []byte) error {
	return a.remoteAt(rkey, pd, va, dst, false)
}

// ReadRemoteInto is ReadRemote handing the n bytes to s instead of
// copying them: one Put per piece contiguous in the mapping, in order,
// inside the accessor's read-side section (an RDMA READ responder puts
// them into its response frame, computing the ICRC on the way). Nothing
// is put unless the whole range passes the checks.
func (a *Accessor) ReadRemoteInto(rkey uint32, pd PD, va, n uint64, s Sink) error {
	a.Enter()
	defer a.Exit()
	m, va, err := a.remoteRegion(rkey, pd, va, n, AccessRemoteRead)
	if err != nil {
		return err
	}
	return a.putMR(m, va, n, s)
}

// WriteRemote copies src to va of the MR named by rkey (REMOTE_WRITE
// required): an RDMA WRITE responder.
func (a *Accessor) WriteRemote(rkey uint32, pd PD, va uint64, src []byte) error {
	return a.remoteAt(rkey, pd, va, src, true)
}

// remoteAt is ReadRemote (toMR false: the MR's bytes into buf) and
// WriteRemote (toMR true: buf into the MR).
func (a *Accessor) remoteAt(rkey uint32, pd PD, va uint64, buf []byte, toMR bool) error {
	a.Enter()
	defer a.Exit()
	want := AccessRemoteRead
	if toMR {
		want = AccessRemoteWrite
	}
	m, va, err := a.remoteRegion(rkey, pd, va, uint64(len(buf)), want)
	if err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	if toMR {
		return a.writeMR(m, va, buf)
	}
	return a.readMR(m, va, buf)
}

// CopyToRemote copies the message described by sges (local read, in PD
// pd) to va of the MR named by rkey (REMOTE_WRITE, in PD rpd): an RDMA
// WRITE between two QPs of the same device. It returns the bytes copied.
func (a *Accessor) CopyToRemote(pd PD, sges []SGE, rkey uint32, rpd PD, va uint64) (n uint64, bad int, err error) {
	return a.copyRemote(pd, sges, rkey, rpd, va, true)
}

// CopyFromRemote copies from va of the MR named by rkey (REMOTE_READ, in
// PD rpd) into the buffers described by sges (local write, in PD pd): an
// RDMA READ between two QPs of the same device. It returns the bytes
// copied.
func (a *Accessor) CopyFromRemote(pd PD, sges []SGE, rkey uint32, rpd PD, va uint64) (n uint64, bad int, err error) {
	return a.copyRemote(pd, sges, rkey, rpd, va, false)
}

func (a *Accessor) copyRemote(pd PD, sges []SGE, rkey uint32, rpd PD, va uint64, toRemote bool) (uint64, int, error) {
	a.Enter()
	defer a.Exit()
	lwant, rwant := Access(0), AccessRemoteWrite
	if !toRemote {
		lwant, rwant = AccessLocalWrite, AccessRemoteRead
	}
	total, bad, err := a.Validate(pd, sges, lwant)
	if err != nil {
		return 0, bad, err
	}
	rm, va, err := a.remoteRegion(rkey, rpd, va, total, rwant)
	if err != nil {
		return 0, BadRemote, err
	}
	done := uint64(0)
	for i := range sges {
		sg := &sges[i]
		if sg.Length == 0 {
			continue
		}
		lm := a.s.lookupLocal(sg.LKey) // validated above; re-read is the same MR or nil
		if lm == nil {
			return done, i, ErrBadKey
		}
		k := uint64(sg.Length)
		var err error
		if toRemote {
			err = a.moveMR(lm, sg.Addr, rm, va, k)
		} else {
			err = a.moveMR(rm, va, lm, sg.Addr, k)
		}
		if err != nil {
			// The fault is on one side; the local SGE's when its own
			// MR is on demand and the remote one is not.
			if (lm.proc != nil) && (rm.proc == nil) {
				return done, i, err
			}
			return done, BadRemote, err
		}
		va += k
		done += k
	}
	return done, 0, nil
}

// moveMR copies k bytes at siova of src to diova of dst; checked ranges.
// Mapped to mapped is one copy per contiguous piece; an on-demand paging
// side goes through the accessor's bounce buffer.
func (a *Accessor) moveMR(src *memRegion, siova uint64, dst *memRegion, diova, k uint64) error {
	if src.proc == nil && dst.proc == nil {
		for k > 0 {
			b := src.span(siova, k)
			copyIn(dst, diova, b)
			siova += uint64(len(b))
			diova += uint64(len(b))
			k -= uint64(len(b))
		}
		return nil
	}
	buf := a.bounceBuf()
	for k > 0 {
		c := min(k, uint64(len(buf)))
		if err := a.readMR(src, siova, buf[:c]); err != nil {
			return err
		}
		if err := a.writeMR(dst, diova, buf[:c]); err != nil {
			return err
		}
		siova += c
		diova += c
		k -= c
	}
	return nil
}

// readMR copies len(dst) bytes at iova of m into dst; checked range.
func (a *Accessor) readMR(m *memRegion, iova uint64, dst []byte) error {
	if m.proc != nil {
		return a.odpCopy(m, iova, dst, false)
	}
	copyOut(m, iova, dst)
	return nil
}

// writeMR copies src to iova of m; checked range.
func (a *Accessor) writeMR(m *memRegion, iova uint64, src []byte) error {
	if m.proc != nil {
		return a.odpCopy(m, iova, src, true)
	}
	copyIn(m, iova, src)
	return nil
}

// copyOut copies len(dst) bytes at iova of m into dst; checked range.
func copyOut(m *memRegion, iova uint64, dst []byte) {
	for len(dst) > 0 {
		c := copy(dst, m.span(iova, uint64(len(dst))))
		dst = dst[c:]
		iova += uint64(c)
	}
}

// copyIn copies src to iova of m; checked range.
func copyIn(m *memRegion, iova uint64, src []byte) {
	for len(src) > 0 {
		c := copy(m.span(iova, uint64(len(src))), src)
		src = src[c:]
		iova += uint64(c)
	}
}
