package verbs

import (
	"errors"
	"fmt"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// Rereg MR, resize CQ, device memory and QUERY_DEVICE_EX (ABI 1.4), with
// the semantics libibverbs programs get from the project's C library
// (ibverbs/src/mrdm.c).

// Rereg re-registers the MR (ibv_rereg_mr): flags (abi.ReregChange*)
// name what changes. With abi.ReregChangeTranslation the MR covers buf at
// its process virtual address (as RegMR), with abi.ReregChangePD it
// belongs to pd, with abi.ReregChangeAccess its access is access
// (abi.Access*). pd and access are ignored without their flag, as
// libibverbs ignores them; buf must be nil without CHANGE_TRANSLATION. The
// keys stay as they are (the daemon keeps them); on success LKey, RKey,
// Addr and Length are the reply's and the new range's. On error the MR is
// unchanged: invalid input is refused with EINVAL before any command, the
// daemon refuses what it refuses with its errno (ENOENT for a handle it
// does not know, EINVAL for bad flags or access, or a device memory MR).
func (m *MR) Rereg(flags uint32, pd *PD, buf *Buffer, access uint32) error {
	var iova uint64
	if buf != nil {
		iova = buf.Addr()
	}
	return m.ReregAt(flags, pd, buf, iova, access)
}

// ReregAt is Rereg with the IOVA of a new translation chosen, as RegMRAt
// (iova and buf.PA at the same offset in a 4 KiB page).
func (m *MR) ReregAt(flags uint32, pd *PD, buf *Buffer, iova uint64, access uint32) error {
	trans := flags&abi.ReregChangeTranslation != 0
	switch {
	case flags&^abi.ReregAll != 0:
		return fmt.Errorf("verbs: Rereg flags %#x: unknown bits: %w", flags, unix.EINVAL)
	case trans != (buf != nil):
		return fmt.Errorf("verbs: Rereg: a buffer goes with CHANGE_TRANSLATION and only with it: %w", unix.EINVAL)
	case flags&abi.ReregChangePD != 0 && (pd == nil || pd.ctx != m.ctx):
		return fmt.Errorf("verbs: Rereg: CHANGE_PD needs a PD of the MR's context: %w", unix.EINVAL)
	}
	req := abi.CmdReregMRReq{MRHandle: m.Handle, Flags: flags}
	if flags&abi.ReregChangePD != 0 {
		req.PDHandle = pd.Handle
	}
	if flags&abi.ReregChangeAccess != 0 {
		req.Access = access
	}
	var pl pageList
	if trans {
		var err error
		if pl, err = m.ctx.pageList(buf, iova); err != nil {
			return err
		}
		defer pl.free() // the daemon copies the list
		req.IOVA, req.Length, req.PageShift, req.NPages, req.PBLPA = iova, pl.length, pageShift, pl.npages, pl.pblPA()
	}
	var r abi.RespRegMR
	if _, _, err := m.ctx.k.call(abi.CmdReregMR, &req, pl.inline, nil, &r); err != nil {
		return err
	}
	m.LKey, m.RKey = r.LKey, r.RKey
	if trans {
		m.Addr, m.Length = iova, pl.length
	}
	return nil
}

// Resize gives the CQ at least cqe entries (ibv_resize_cq; a power of
// two, at least 2): a new ring is allocated and the daemon moves the CQ to
// it, carrying the completions not yet polled over at the same
// free-running indices (with their timestamps), so polling goes on from
// the same consumer index, in order, with the new size; the old ring is
// freed. Fewer entries than the completions not yet polled: EINVAL from
// the daemon, and the CQ keeps its ring. Resize must not run while the
// CQ is polled or armed (the CQ's one-goroutine rule).
func (cq *CQ) Resize(cqe int) error {
	if cqe <= 0 || cqe > abi.MaxCQE {
		return fmt.Errorf("verbs: Resize(%d): 1..%d entries: %w", cqe, abi.MaxCQE, unix.EINVAL)
	}
	c := cq.ctx
	n := cqSlots(cqe)
	ts := cq.ts != nil
	ring, err := c.Alloc(cqRingBytes(n, ts), 64)
	if err != nil {
		return err
	}
	var r abi.RespResizeCQ
	if _, _, err := c.k.call(abi.CmdResizeCQ, &abi.CmdResizeCQReq{RingPA: ring.PA, CQHandle: cq.Handle, CQECount: n}, nil, nil, &r); err != nil {
		ring.Free()
		return err
	}
	old := cq.ring
	cq.setRing(ring, n, ts)
	old.Free() // the daemon released it: it writes the new ring only
	if r.CQECount != n || r.Outstanding > n {
		return fmt.Errorf("%w: RESIZE_CQ to %d entries replied %d entries, %d outstanding", ErrProtocol, n, r.CQECount, r.Outstanding)
	}
	return nil
}

// DM is device memory (ibv_dm, ABI 1.4): memory the daemon allocates
// for the device and this process maps (the memfd of the ALLOC_DM reply).
// The process reaches it only with CopyTo and CopyFrom; the device reaches
// it through MRs registered on it with PD.RegDMMR, whose addresses start
// at 0 (zero-based).
type DM struct {
	ctx    *Context
	Handle uint32
	mem    []byte // the mapping, map_length bytes
	length uint64 // as allocated
}

// AllocDM allocates length bytes of device memory (ibv_alloc_dm). A
// device without device memory (max_dm_size 0): EOPNOTSUPP; length 0 or
// beyond max_dm_size: EINVAL; the device's memory used up: ENOMEM. The
// memory starts zeroed.
func (c *Context) AllocDM(length uint64) (*DM, error) {
	a, err := c.queryDeviceEx()
	if err != nil {
		return nil, err
	}
	if a.MaxDMSize == 0 {
		return nil, fmt.Errorf("verbs: AllocDM: the device has no device memory: %w", unix.EOPNOTSUPP)
	}
	if length == 0 || length > a.MaxDMSize {
		return nil, fmt.Errorf("verbs: AllocDM(%d): 1..%d bytes (max_dm_size): %w", length, a.MaxDMSize, unix.EINVAL)
	}
	var r abi.RespAllocDM
	fds, _, err := c.k.call(abi.CmdAllocDM, &abi.CmdAllocDMReq{Length: length}, nil, nil, &r)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*DM, error) {
		closeAll(fds)
		c.destroy(abi.CmdFreeDM, r.DMHandle)
		return nil, err
	}
	if len(fds) != 1 {
		return fail(fmt.Errorf("%w: ALLOC_DM reply carried %d fds, want 1", ErrProtocol, len(fds)))
	}
	if r.MapLength < length || r.MapLength%pageSize != 0 || r.MapLength-length >= pageSize {
		return fail(fmt.Errorf("%w: ALLOC_DM of %d bytes mapped as %d", ErrProtocol, length, r.MapLength))
	}
	mem, err := unix.Mmap(fds[0], 0, int(r.MapLength), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("verbs: map device memory: %w", err))
	}
	unix.Close(fds[0])
	return &DM{ctx: c, Handle: r.DMHandle, mem: mem, length: length}, nil
}

// Len returns the DM's size in bytes, as allocated.
func (dm *DM) Len() uint64 { return dm.length }

// ErrDMRange is returned by CopyTo and CopyFrom for a range not inside
// the DM; it wraps EFAULT, what ibv_memcpy_to_dm returns for it.
var ErrDMRange = fmt.Errorf("verbs: range beyond the device memory: %w", unix.EFAULT)

// span checks a copy of n bytes at off as the C library does (mlx5's
// rules): within the DM (else ErrDMRange, EFAULT), offset and length
// multiples of 4 (else EINVAL).
func (dm *DM) span(off uint64, n int) ([]byte, error) {
	if dm.mem == nil {
		return nil, fmt.Errorf("verbs: DM %d was freed: %w", dm.Handle, unix.EINVAL)
	}
	if off > dm.length || uint64(n) > dm.length-off {
		return nil, fmt.Errorf("%w: %d bytes at %d of %d", ErrDMRange, n, off, dm.length)
	}
	if off%4 != 0 || n%4 != 0 {
		return nil, fmt.Errorf("verbs: DM copy of %d bytes at %d: not multiples of 4: %w", n, off, unix.EINVAL)
	}
	return dm.mem[off : off+uint64(n)], nil
}

// CopyTo copies src into the DM at off (ibv_memcpy_to_dm). Work posted
// afterwards sees it: the doorbell store of the post orders the copy
// before the device's reads.
func (dm *DM) CopyTo(off uint64, src []byte) error {
	d, err := dm.span(off, len(src))
	if err != nil {
		return err
	}
	copy(d, src)
	return nil
}

// CopyFrom copies len(dst) bytes of the DM at off into dst
// (ibv_memcpy_from_dm). Call it after the completion of the work that
// wrote them was polled (the poll's owner load orders the copy after).
func (dm *DM) CopyFrom(off uint64, dst []byte) error {
	s, err := dm.span(off, len(dst))
	if err != nil {
		return err
	}
	copy(dst, s)
	return nil
}

// Free frees the DM (ibv_free_dm; EBUSY while an MR is registered on it)
// and unmaps it.
func (dm *DM) Free() error {
	if err := dm.ctx.destroy(abi.CmdFreeDM, dm.Handle); err != nil {
		return err
	}
	if dm.mem != nil {
		unix.Munmap(dm.mem)
		dm.mem = nil
	}
	return nil
}

// RegDMMR registers [off, off+length) of dm as an MR of the PD
// (ibv_reg_dm_mr). access must include abi.DMMRZeroBased (the MR's
// address 0 is the DM's byte off), with any of abi.AccessLocalWrite and
// the remote access bits; the MR's Addr is 0. A range beyond the DM, or
// access without ZERO_BASED: EINVAL. A DM MR cannot be re-registered.
func (pd *PD) RegDMMR(dm *DM, off, length uint64, access uint32) (*MR, error) {
	if dm == nil || dm.ctx != pd.ctx {
		return nil, fmt.Errorf("verbs: RegDMMR: a DM of the PD's context: %w", unix.EINVAL)
	}
	var r abi.RespRegMR
	req := abi.CmdRegDMMRReq{Offset: off, Length: length, DMHandle: dm.Handle, PDHandle: pd.Handle, Access: access}
	if _, _, err := pd.ctx.k.call(abi.CmdRegDMMR, &req, nil, nil, &r); err != nil {
		return nil, err
	}
	return &MR{ctx: pd.ctx, Handle: r.MRHandle, LKey: r.LKey, RKey: r.RKey, Addr: 0, Length: length}, nil
}

// DeviceAttrEx is the extended device attributes (ibv_device_attr_ex) as
// the C library reports them: the QUERY_DEVICE attributes, the device
// memory of QUERY_DEVICE_EX and the device's clock.
type DeviceAttrEx struct {
	abi.DeviceAttr
	// MaxDMSize is the device memory AllocDM may allocate, in bytes (0:
	// none, a daemon without QUERY_DEVICE_EX); DMMaxLogAlign the
	// largest alignment (log2) it gives.
	MaxDMSize     uint64
	DMMaxLogAlign uint32
	// CompletionTimestampMask is the bits of a completion timestamp that
	// count (all 64) and HCACoreClock the clock's frequency in kHz
	// (HCACoreClockKHz: timestamps are nanoseconds).
	CompletionTimestampMask uint64
	HCACoreClock            uint64
	// DeviceCapFlagsEx is DeviceCapFlags with the IBTA 1.5 memory
	// placement capabilities the daemon executes (DeviceCapEx*).
	DeviceCapFlagsEx uint64
	PhysPortCntEx    uint32
	// ECEOptions are the ECE options the device supports (abi.ECE*
	// bits; 0: none, the operator switched them off, or a daemon before
	// ABI 1.5): what RTRAttr.ECE may ask for.
	ECEOptions uint32
}

// Extended device capability bits (enum ibv_device_cap_flags_ex beyond
// the 32 of device_cap_flags).
const (
	DeviceCapExFlushGlobal     uint64 = 1 << 38 // IB_UVERBS_DEVICE_FLUSH_GLOBAL
	DeviceCapExFlushPersistent uint64 = 1 << 39 // IB_UVERBS_DEVICE_FLUSH_PERSISTENT
	DeviceCapExAtomicWrite     uint64 = 1 << 40 // IB_UVERBS_DEVICE_ATOMIC_WRITE
)

// QueryDeviceEx returns the extended device attributes
// (ibv_query_device_ex): QUERY_DEVICE and QUERY_DEVICE_EX. A daemon that
// refuses QUERY_DEVICE_EX has no device memory (MaxDMSize 0), as the C
// library takes it.
func (c *Context) QueryDeviceEx() (DeviceAttrEx, error) {
	var a DeviceAttrEx
	var err error
	if a.DeviceAttr, err = c.QueryDevice(); err != nil {
		return DeviceAttrEx{}, err
	}
	x, err := c.queryDeviceEx()
	if err != nil {
		return DeviceAttrEx{}, err
	}
	a.MaxDMSize, a.DMMaxLogAlign, a.ECEOptions = x.MaxDMSize, x.DMMaxLogAlign, x.ECEOptions
	a.CompletionTimestampMask = ^uint64(0)
	a.HCACoreClock = HCACoreClockKHz
	a.PhysPortCntEx = uint32(a.PhysPortCnt)
	a.DeviceCapFlagsEx = uint64(a.DeviceCapFlags)
	for _, p := range []struct {
		cap uint8
		ex  uint64
	}{{abi.PlacementAtomicWrite, DeviceCapExAtomicWrite}, {abi.PlacementFlushGlobal, DeviceCapExFlushGlobal},
		{abi.PlacementFlushPersistent, DeviceCapExFlushPersistent}} {
		if a.PlacementCaps&p.cap != 0 {
			a.DeviceCapFlagsEx |= p.ex
		}
	}
	return a, nil
}

// queryDeviceEx sends QUERY_DEVICE_EX; a daemon that refuses it has no
// device memory (all zero).
func (c *Context) queryDeviceEx() (abi.DeviceAttrEx, error) {
	var x abi.DeviceAttrEx
	if _, _, err := c.k.call(abi.CmdQueryDeviceEx, nil, nil, nil, &x); err != nil {
		if ce := (*abi.ControlError)(nil); !errors.As(err, &ce) {
			return abi.DeviceAttrEx{}, err
		}
		return abi.DeviceAttrEx{}, nil
	}
	return x, nil
}
