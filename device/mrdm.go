package device

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/dma"
)

// Rereg MR, resize CQ and device memory (ABI 1.4).

// DefaultDMSize is a device's memory for ibv_alloc_dm when Config.DMSize
// is 0 (max_dm_size).
const DefaultDMSize = 256 << 10

// dm is device memory (ALLOC_DM): a memfd the daemon made, mapped by the
// daemon as a host memory region of the context (so MRs, copies and
// atomics reach it as any memory) and by the client, which reads and
// writes it with ibv_memcpy_to_dm and ibv_memcpy_from_dm. The client
// never learns its physical addresses: only REG_DM_MR names it.
type dm struct {
	handle uint32
	length uint64 // as allocated
	mapLen uint64 // length rounded up to a page: what it costs
	region uint32 // its host memory region
	pa     uint64
	users  int // MRs on it
}

func (d *Device) dmSize() uint64 {
	if d.cfg.DMSize != 0 {
		return d.cfg.DMSize
	}
	return DefaultDMSize
}

// DMInUse returns the device memory allocated, in bytes (whole pages).
func (d *Device) DMInUse() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dmUsed
}

func (m memory) reregisterMR(o Owner, key uint32, ch dma.Rereg) (dma.MRInfo, error) {
	info, err := m.s.ReregisterMR(o, key, ch)
	return info, wrapDMA(err)
}

func (m memory) registerZeroBased(o Owner, pd uint32, pa, length uint64, access uint32) (dma.MRInfo, error) {
	info, err := m.s.RegisterZeroBased(o, pd, pa, length, dma.Access(access))
	return info, wrapDMA(err)
}

// checkAccess applies REG_MR's access rules to a (REG_MR, REREG_MR and
// REG_DM_MR): known bits, remote write or atomic only with local write,
// and no persistence the memory cannot give.
func checkAccess(a uint32) error {
	if a&^abi.AccessMRAll != 0 {
		return errorf(errInval, "access %#x: unknown bits %#x", a, a&^abi.AccessMRAll)
	}
	if a&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && a&abi.AccessLocalWrite == 0 {
		return errorf(errInval, "access %#x: remote write or remote atomic requires local write (IBTA C10-83)", a)
	}
	if a&abi.AccessFlushPersistent != 0 {
		// Client memory is memfd (shmem) pages: RAM with no persistence
		// domain, so no FLUSH can make it persistent (dma.Accessor.Flush;
		// Linux rxe refuses the flag for memory that is not pmem).
		return errorf(errNotSup, "access %#x: FLUSH_PERSISTENT: the device has no persistent memory", a)
	}
	return nil
}

func (cn *conn) reregMR(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdReregMRReq
	fixed := abi.Sizeof(&c)
	if len(r.payload) < fixed {
		return reply{}, errorf(errMsgSize, "REREG_MR: payload is %d bytes, want at least %d", len(r.payload), fixed)
	}
	if _, err := abi.Unmarshal(r.payload[:fixed], &c); err != nil {
		return reply{}, errorf(errMsgSize, "REREG_MR: %v", err)
	}
	m, ok := cx.mrs[c.MRHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "MR %d not found", c.MRHandle)
	}
	if c.Flags == 0 || c.Flags&^abi.ReregAll != 0 {
		return reply{}, errorf(errInval, "flags %#x: want a non-empty set of CHANGE_TRANSLATION, CHANGE_PD, CHANGE_ACCESS", c.Flags)
	}
	if m.dm != nil {
		return reply{}, errorf(errInval, "MR %d is a device memory MR: it cannot be re-registered", c.MRHandle)
	}
	var ch dma.Rereg
	p := m.pd
	if c.Flags&abi.ReregChangePD != 0 {
		if p, ok = cx.pds[c.PDHandle]; !ok {
			return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
		}
		ch.PD = &c.PDHandle
	} else if c.PDHandle != 0 {
		return reply{}, errorf(errInval, "pd_handle %d without CHANGE_PD: must be 0", c.PDHandle)
	}
	access := m.access
	if c.Flags&abi.ReregChangeAccess != 0 {
		if err := checkAccess(c.Access); err != nil {
			return reply{}, err
		}
		access = c.Access
		a := dma.Access(c.Access)
		ch.Access = &a
	} else if c.Access != 0 {
		return reply{}, errorf(errInval, "access %#x without CHANGE_ACCESS: must be 0", c.Access)
	}
	if c.Flags&abi.ReregChangeTranslation != 0 {
		t, err := d.translation(r.payload[fixed:], c.IOVA, c.Length, c.PBLPA, c.PageShift, c.NPages)
		if err != nil {
			return reply{}, err
		}
		ch.Translation = t
	} else if c.IOVA != 0 || c.Length != 0 || c.PBLPA != 0 || c.PageShift != 0 || c.NPages != 0 || len(r.payload) != fixed {
		return reply{}, errorf(errInval, "iova, length, pbl_pa, page_shift, npages and pages without CHANGE_TRANSLATION: must be 0 and absent")
	}
	info, err := d.mem.reregisterMR(cx.owner, m.lkey, ch)
	if errors.Is(err, dma.ErrQuota) {
		return reply{}, fmt.Errorf("uid %d: %w (limits mr_table_bytes_per_uid %d, pinned_bytes_per_uid %d)",
			cx.uid, err, d.cfg.Limits.MRTableBytesPerUID, d.cfg.Limits.PinnedBytesPerUID)
	}
	if err != nil {
		return reply{}, err
	}
	if p != m.pd {
		m.pd.users--
		p.users++
		m.pd = p
	}
	m.access = access
	m.rkey = info.RKey
	if t := ch.Translation; t != nil {
		m.iova, m.length, m.shift = t.IOVA, t.Length, uint32(t.PageShift)
		m.npages = c.NPages
	}
	return reply{body: &abi.RespRegMR{MRHandle: m.handle, LKey: info.LKey, RKey: info.RKey}}, nil
}

// translation checks a page list as REG_MR does (rest: the inline pages
// after the fixed struct) and returns it for the dma space.
func (d *Device) translation(rest []byte, iova, length, pblPA uint64, shift, npages uint32) (*dma.Translation, error) {
	if shift != abi.PageShift4K && shift != abi.PageShift2M {
		return nil, errorf(errInval, "page_shift %d: must be %d or %d", shift, abi.PageShift4K, abi.PageShift2M)
	}
	if length == 0 || length > abi.MaxMRSize {
		return nil, errorf(errInval, "length %d: must be 1..%d", length, uint64(abi.MaxMRSize))
	}
	want, ok := mrPages(iova, length, shift)
	if !ok {
		return nil, errorf(errInval, "iova %#x + length %d wraps", iova, length)
	}
	if uint64(npages) != want {
		return nil, errorf(errInval, "npages %d: [iova, iova+length) spans %d pages", npages, want)
	}
	if npages > d.cfg.Limits.MaxMRPages {
		return nil, errorf(errInval, "npages %d exceeds the limit of %d pages per MR", npages, d.cfg.Limits.MaxMRPages)
	}
	t := &dma.Translation{IOVA: iova, Length: length, PageShift: uint(shift), NPages: npages}
	if npages <= abi.InlinePages {
		if pblPA != 0 {
			return nil, errorf(errInval, "pbl_pa must be 0 when npages (%d) <= %d", npages, abi.InlinePages)
		}
		if len(rest) != 8*int(npages) {
			return nil, errorf(errMsgSize, "%d bytes of inline pages, want %d for %d pages", len(rest), 8*npages, npages)
		}
		t.Pages = make([]uint64, npages)
		for i := range t.Pages {
			t.Pages[i] = leU64(rest[8*i:])
		}
		return t, nil
	}
	if pblPA == 0 {
		return nil, errorf(errInval, "npages %d > %d needs pbl_pa", npages, abi.InlinePages)
	}
	if len(rest) != 0 {
		return nil, errorf(errMsgSize, "%d bytes of inline pages with pbl_pa", len(rest))
	}
	if pblPA%8 != 0 {
		return nil, errorf(errInval, "pbl_pa %#x not 8-byte aligned", pblPA)
	}
	t.ListPA = pblPA
	return t, nil
}

func (cn *conn) resizeCQ(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdResizeCQReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	q, ok := cx.cqs[c.CQHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "CQ %d not found", c.CQHandle)
	}
	if !isPow2(c.CQECount) || c.CQECount < 2 || c.CQECount > abi.MaxCQE {
		return reply{}, errorf(errInval, "cqe_count %d: must be a power of two in 2..%d", c.CQECount, abi.MaxCQE)
	}
	pin, err := d.pinRing(cx, "CQ", c.RingPA, cqRingBytes(c.CQECount, q.ts))
	if err != nil {
		return reply{}, err
	}
	n, err := d.dp.ResizeCQ(q, pin.bytes(), c.CQECount)
	if err != nil {
		pin.release()
		return reply{}, errorf(errInval, "CQ %d: resize to %d entries: %v", c.CQHandle, c.CQECount, err)
	}
	// The data plane writes the new ring only: the old one goes.
	old := q.ring
	q.ring, q.ringPA, q.cqeCount = pin, c.RingPA, c.CQECount
	old.release()
	return reply{body: &abi.RespResizeCQ{CQECount: c.CQECount, Outstanding: n}}, nil
}

func (cn *conn) allocDM(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdAllocDMReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Flags != 0 {
		return reply{}, errorf(errInval, "flags (comp_mask) %#x: must be 0", c.Flags)
	}
	size := d.dmSize()
	if c.Length == 0 || c.Length > size {
		return reply{}, errorf(errInval, "length %d: must be 1..%d (max_dm_size)", c.Length, size)
	}
	if c.LogAlign > abi.DMMaxLogAlign {
		return reply{}, errorf(errInval, "log_align %d: at most %d", c.LogAlign, abi.DMMaxLogAlign)
	}
	mapLen := (c.Length + dma.MinPage - 1) &^ (dma.MinPage - 1)
	if d.dmUsed+mapLen > size {
		return reply{}, errorf(errNoMem, "device memory: %d of %d bytes in use, %d more wanted", d.dmUsed, size, mapLen)
	}
	if err := d.fdLimit(cx, "device memory"); err != nil {
		return reply{}, err
	}
	fd, err := unix.MemfdCreate("vrnic-dm", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return reply{}, errorf(errNoMem, "device memory: memfd: %v", err)
	}
	if err := unix.Ftruncate(fd, int64(mapLen)); err != nil {
		_ = unix.Close(fd)
		return reply{}, errorf(errNoMem, "device memory: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		_ = unix.Close(fd)
		return reply{}, errorf(errNoMem, "device memory: seals: %v", err)
	}
	reg, err := d.mem.addRegion(cx.owner, fd, mapLen)
	if err != nil {
		_ = unix.Close(fd)
		return reply{}, err
	}
	m := &dm{handle: cx.newHandle(), length: c.Length, mapLen: mapLen, region: reg.Handle, pa: reg.PA}
	cx.dms[m.handle] = m
	d.dmUsed += mapLen
	return reply{body: &abi.RespAllocDM{DMHandle: m.handle, MapLength: mapLen}, fds: []int{fd}, handOff: true}, nil
}

func (cn *conn) freeDM(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	h, err := handleArg(r)
	if err != nil {
		return reply{}, err
	}
	m, ok := cx.dms[h]
	if !ok {
		return reply{}, errorf(errNoEnt, "DM %d not found", h)
	}
	if m.users > 0 {
		return reply{}, errorf(errBusy, "DM %d is in use by %d MRs", h, m.users)
	}
	if err := d.mem.removeRegion(cx.owner, m.region); err != nil {
		return reply{}, fmt.Errorf("DM %d: %w", h, err)
	}
	delete(cx.dms, h)
	d.dmUsed -= m.mapLen
	return reply{}, nil
}

// releaseDMs frees the DMs of a context that goes (its MRs are gone).
func (d *Device) releaseDMs(cx *Context) {
	for h, m := range cx.dms {
		if err := d.mem.removeRegion(cx.owner, m.region); err != nil {
			d.log.Warn("release device memory", "ctx", cx.handle, "dm", h, "err", err)
		}
		delete(cx.dms, h)
		d.dmUsed -= m.mapLen
	}
}

func (cn *conn) regDMMR(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdRegDMMRReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Reserved != 0 {
		return reply{}, errorf(errInval, "reserved field must be 0")
	}
	m, ok := cx.dms[c.DMHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "DM %d not found", c.DMHandle)
	}
	p, ok := cx.pds[c.PDHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
	}
	if c.Access&abi.DMMRZeroBased == 0 {
		return reply{}, errorf(errInval, "access %#x: a device memory MR must be zero-based (IBV_ACCESS_ZERO_BASED)", c.Access)
	}
	access := c.Access &^ abi.DMMRZeroBased
	if err := checkAccess(access); err != nil {
		return reply{}, err
	}
	if c.Offset > m.length || c.Length > m.length-c.Offset {
		return reply{}, errorf(errInval, "offset %d + length %d beyond the DM's %d bytes", c.Offset, c.Length, m.length)
	}
	if err := d.limit(cx, "MRs", cx.counts.MR, d.totals.MR, d.cfg.Limits.PerClient.MR, d.cfg.Limits.PerDevice.MR); err != nil {
		return reply{}, err
	}
	info, err := d.mem.registerZeroBased(cx.owner, c.PDHandle, m.pa+c.Offset, c.Length, access)
	if err != nil {
		return reply{}, err
	}
	mr := &mr{handle: info.LKey, pd: p, iova: 0, length: c.Length, access: access,
		lkey: info.LKey, rkey: info.RKey, shift: abi.PageShift4K, dm: m}
	cx.mrs[mr.handle] = mr
	p.users++
	m.users++
	cx.counts.MR++
	d.totals.MR++
	return reply{body: &abi.RespRegMR{MRHandle: mr.handle, LKey: mr.lkey, RKey: mr.rkey}}, nil
}

func (cn *conn) queryDeviceEx(r *request) (reply, error) {
	return reply{body: &abi.DeviceAttrEx{MaxDMSize: cn.d.dmSize(), DMMaxLogAlign: abi.DMMaxLogAlign,
		ECEOptions: cn.d.ECEOptions()}}, nil
}
