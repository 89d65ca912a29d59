package device

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/doorbell"
)

// Handlers run with Device.mu held and cn.ctx set (except openContext).

// limit checks a per-client and a per-device count against the limits.
func (d *Device) limit(cx *Context, what string, client, device int, maxClient, maxDevice int) error {
	if client >= maxClient {
		return errorf(errAgain, "per-client limit of %d %s reached", maxClient, what)
	}
	if device >= maxDevice {
		return errorf(errNoMem, "device limit of %d %s reached", maxDevice, what)
	}
	return nil
}

func decode(r *request, v any) error {
	if _, err := abi.Unmarshal(r.payload, v); err != nil {
		return errorf(errMsgSize, "%v: %v", r.hdr.Opcode, err)
	}
	return nil
}

func isPow2(v uint32) bool { return v != 0 && v&(v-1) == 0 }

func (cn *conn) openContext(r *request) (reply, error) {
	d := cn.d
	var c abi.CmdOpenContextReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if cn.ctx != nil {
		return reply{}, errorf(errBusy, "context %d already open on this connection", cn.ctx.handle)
	}
	if c.Flags != 0 {
		return reply{}, errorf(errInval, "flags %#x: reserved, must be 0", c.Flags)
	}
	if !abi.VersionCompatible(c.ABIVersion, abi.Version) {
		return reply{}, errorf(errProto, "client ABI %d.%d, daemon ABI %d.%d", c.ABIVersion>>16, c.ABIVersion&0xffff, abi.VersionMajor, abi.VersionMinor)
	}
	acct := d.accounts[cn.uid]
	if lim := d.cfg.Limits.PerUID.Contexts; acct.contexts >= lim {
		return reply{}, errorf(errAgain, "uid %d holds %d contexts, its limit (limits.per_uid.contexts)", cn.uid, acct.contexts)
	}
	if len(d.contexts) >= d.cfg.Limits.PerDevice.Contexts {
		return reply{}, errorf(errNoMem, "device limit of %d contexts reached", d.cfg.Limits.PerDevice.Contexts)
	}
	db, err := doorbell.New()
	if err != nil {
		return reply{}, errorf(errNoMem, "doorbell page: %v", err)
	}
	var h uint32
	for {
		d.nextCtx++
		if _, used := d.contexts[d.nextCtx]; d.nextCtx != 0 && !used {
			h = d.nextCtx
			break
		}
	}
	cx := &Context{
		handle: h,
		dev:    d,
		// The owner id is unique for the daemon's lifetime (handles are
		// reused, owners must not be: a dead client's memory must never
		// be attributed to a new one).
		owner:   Owner(d.counters.ContextsOpened.Add(1)),
		name:    cString(c.ClientName[:]),
		pid:     cn.pid,
		uid:     cn.uid,
		opened:  time.Now(),
		db:      db,
		hostMem: map[uint32]*hostMem{},
		pds:     map[uint32]*pd{},
		mrs:     map[uint32]*mr{},
		mws:     map[uint32]*mw{},
		cqs:     map[uint32]*CQ{},
		qps:     qpnTable(),
		srqs:    map[uint32]*SRQ{},
		ahs:     map[uint32]*AH{},
		xrcds:   map[uint32]*xrcdRef{},
		dms:     map[uint32]*dm{},
	}
	// Pinned memory and page tables are charged to the uid: a user's
	// contexts share one budget, so opening more contexts gains nothing.
	if err := d.mem.setAccount(cx.owner, cx.uid, d.cfg.Limits); err != nil {
		db.Close()
		return reply{}, err
	}
	d.contexts[h] = cx
	d.totals.Contexts++
	acct.contexts++
	cn.ctx = cx
	d.log.Info("context opened", "ctx", h, "client", cx.name, "pid", cx.pid, "uid", cx.uid)
	return reply{
		body: &abi.RespOpenContext{ABIVersion: abi.Version, CtxHandle: h, DBPageSize: db.Size(), DBRecords: db.Records()},
		fds:  []int{db.MemFd(), db.KickFd()},
	}, nil
}

func (cn *conn) queryDevice(r *request) (reply, error) {
	d := cn.d
	l := d.cfg.Limits
	a := &abi.DeviceAttr{
		NodeGUID:        NodeGUID(d.cfg.Name),
		SysImageGUID:    NodeGUID(d.cfg.Name),
		MaxMRSize:       abi.MaxMRSize,
		PageSizeCap:     1<<abi.PageShift4K | 1<<abi.PageShift2M,
		VendorID:        0x1ded, // Alibaba's PCI vendor id, as eRDMA reports
		VendorPartID:    0x7672,
		HWVer:           1,
		MaxQP:           uint32(l.PerDevice.QP),
		MaxQPWR:         abi.MaxQPWR,
		MaxSGE:          abi.MaxSGE,
		MaxInline:       abi.MaxInline,
		MaxCQ:           uint32(l.PerDevice.CQ),
		MaxCQE:          abi.MaxCQE,
		MaxMR:           uint32(l.PerDevice.MR),
		MaxPD:           uint32(l.PerDevice.PD),
		MaxQPRdAtom:     uint32(d.cfg.MaxRdAtomic),
		MaxQPInitRdAtom: uint32(d.cfg.MaxRdAtomic),
		MaxSRQ:          uint32(l.PerDevice.SRQ),
		MaxSRQWR:        abi.MaxSRQWR,
		MaxSRQSGE:       abi.MaxSGE,
		MaxAH:           uint32(l.PerDevice.AH),
		MaxHostMem:      uint32(l.PerClient.HostMem),
		NumWorkers:      uint32(d.cfg.NumWorkers),
		AtomicCap:       1,
		PhysPortCnt:     1,
		// IBTA 1.5 Memory Placement Extensions: ATOMIC WRITE and FLUSH
		// to global visibility (no persistence: see REG_MR).
		PlacementCaps: abi.PlacementAtomicWrite | abi.PlacementFlushGlobal,
		// XRC (xrc.go); memory windows of type 1 and 2B, as Linux rxe
		// (mw.go).
		DeviceCapFlags: abi.DeviceXRC | abi.DeviceMemWindow | abi.DeviceMemWindowType2B,
		MaxMW:          uint32(l.PerDevice.MW),
	}
	copy(a.FWVer[:], fmt.Sprintf("vrnic %d.%d", abi.VersionMajor, abi.VersionMinor))
	return reply{body: a}, nil
}

// NodeGUID is the node (and CA) GUID of the device named name, as
// QUERY_DEVICE reports it and the communication manager sends it.
func NodeGUID(name string) uint64 {
	// FNV-1a of the device name: stable across restarts, distinct per name.
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

func (cn *conn) queryPort(r *request) (reply, error) {
	var c abi.CmdQueryPortReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.PortNum != 1 {
		return reply{}, errorf(errInval, "port_num %d: the device has port 1 only", c.PortNum)
	}
	if c.Reserved != 0 {
		return reply{}, errorf(errInval, "reserved field must be 0")
	}
	li := cn.d.cfg.Link
	return reply{body: &abi.PortAttr{
		State:           cn.d.portState(),
		MaxMTU:          li.MaxMTU,
		ActiveMTU:       li.MaxMTU,
		GIDTblLen:       abi.GIDTableLen,
		MaxMsgSz:        abi.MaxMsgBytes,
		LinkLayer:       2, // IBV_LINK_LAYER_ETHERNET
		LinkType:        li.Type,
		MAC:             li.MAC,
		ActiveSpeedMbps: li.SpeedMbps,
	}}, nil
}

func (cn *conn) queryGID(r *request) (reply, error) {
	var c abi.CmdQueryGIDReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.PortNum != 1 {
		return reply{}, errorf(errInval, "port_num %d: the device has port 1 only", c.PortNum)
	}
	if c.Index >= abi.GIDTableLen {
		return reply{}, errorf(errInval, "GID index %d out of range (table has %d entries)", c.Index, abi.GIDTableLen)
	}
	var g abi.RespQueryGID
	if gids := cn.d.cfg.Link.GIDs; int(c.Index) < len(gids) {
		g.GID = gids[c.Index]
		g.GIDType = 2 // IBV_GID_TYPE_ROCE_V2
		g.Valid = 1
	}
	return reply{body: &g}, nil
}

func (cn *conn) addHostMem(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdAddHostMemReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Flags != 0 || c.Reserved != 0 {
		return reply{}, errorf(errInval, "flags and reserved must be 0")
	}
	if c.Length == 0 || c.Length%4096 != 0 {
		return reply{}, errorf(errInval, "length %d: must be a non-zero multiple of 4096", c.Length)
	}
	if err := d.limit(cx, "host memory regions", cx.counts.HostMem, d.totals.HostMem, d.cfg.Limits.PerClient.HostMem, d.cfg.Limits.PerDevice.HostMem); err != nil {
		return reply{}, err
	}
	if err := d.fdLimit(cx, "host memory"); err != nil {
		return reply{}, err
	}
	// The space keeps its own duplicate; the received fd is closed with
	// the message.
	reg, err := d.mem.addRegion(cx.owner, r.msg.fds[0], c.Length)
	if err != nil {
		return reply{}, err
	}
	cx.hostMem[reg.Handle] = &hostMem{handle: reg.Handle, pa: reg.PA, length: reg.Length, locked: reg.Locked}
	cx.counts.HostMem++
	d.totals.HostMem++
	locked := uint32(0)
	if reg.Locked {
		locked = 1
	}
	return reply{body: &abi.RespAddHostMem{PABase: reg.PA, Handle: reg.Handle, Locked: locked}}, nil
}

func handleArg(r *request) (uint32, error) {
	var c abi.CmdHandleReq
	if err := decode(r, &c); err != nil {
		return 0, err
	}
	if c.Reserved != 0 {
		return 0, errorf(errInval, "reserved field must be 0")
	}
	return c.Handle, nil
}

func (cn *conn) removeHostMem(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	h, err := handleArg(r)
	if err != nil {
		return reply{}, err
	}
	if _, ok := cx.hostMem[h]; !ok {
		return reply{}, errorf(errNoEnt, "host memory handle %d not found", h)
	}
	if err := d.mem.removeRegion(cx.owner, h); err != nil {
		return reply{}, err
	}
	delete(cx.hostMem, h)
	cx.counts.HostMem--
	d.totals.HostMem--
	return reply{}, nil
}

func (cn *conn) allocPD(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	if err := d.limit(cx, "PDs", cx.counts.PD, d.totals.PD, d.cfg.Limits.PerClient.PD, d.cfg.Limits.PerDevice.PD); err != nil {
		return reply{}, err
	}
	p := &pd{handle: cx.newHandle()}
	cx.pds[p.handle] = p
	cx.counts.PD++
	d.totals.PD++
	return reply{body: &abi.RespAllocPD{PDHandle: p.handle}}, nil
}

func (cn *conn) deallocPD(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	h, err := handleArg(r)
	if err != nil {
		return reply{}, err
	}
	p, ok := cx.pds[h]
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", h)
	}
	if p.users > 0 {
		return reply{}, errorf(errBusy, "PD %d is in use by %d MRs/MWs/QPs/SRQs/AHs", h, p.users)
	}
	delete(cx.pds, h)
	cx.counts.PD--
	d.totals.PD--
	return reply{}, nil
}

// mrPages returns how many pages of 2^shift bytes [iova, iova+length)
// touches, or false if the range wraps.
func mrPages(iova, length uint64, shift uint32) (uint64, bool) {
	end, carry := bits.Add64(iova, length, 0)
	if carry != 0 || length == 0 {
		return 0, false
	}
	first := iova >> shift
	last := (end - 1) >> shift
	return last - first + 1, true
}

func (cn *conn) regMR(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdRegMRReq
	fixed := abi.Sizeof(&c)
	if len(r.payload) < fixed {
		return reply{}, errorf(errMsgSize, "REG_MR: payload is %d bytes, want at least %d", len(r.payload), fixed)
	}
	if _, err := abi.Unmarshal(r.payload[:fixed], &c); err != nil {
		return reply{}, errorf(errMsgSize, "REG_MR: %v", err)
	}
	p, ok := cx.pds[c.PDHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
	}
	if err := checkAccess(c.Access); err != nil {
		return reply{}, err
	}
	if c.PageShift != abi.PageShift4K && c.PageShift != abi.PageShift2M {
		return reply{}, errorf(errInval, "page_shift %d: must be %d or %d", c.PageShift, abi.PageShift4K, abi.PageShift2M)
	}
	if c.Length == 0 || c.Length > abi.MaxMRSize {
		return reply{}, errorf(errInval, "length %d: must be 1..%d", c.Length, uint64(abi.MaxMRSize))
	}
	want, ok := mrPages(c.IOVA, c.Length, c.PageShift)
	if !ok {
		return reply{}, errorf(errInval, "iova %#x + length %d wraps", c.IOVA, c.Length)
	}
	if uint64(c.NPages) != want {
		return reply{}, errorf(errInval, "npages %d: [iova, iova+length) spans %d pages", c.NPages, want)
	}
	if c.NPages > d.cfg.Limits.MaxMRPages {
		return reply{}, errorf(errInval, "npages %d exceeds the limit of %d pages per MR", c.NPages, d.cfg.Limits.MaxMRPages)
	}
	if err := d.limit(cx, "MRs", cx.counts.MR, d.totals.MR, d.cfg.Limits.PerClient.MR, d.cfg.Limits.PerDevice.MR); err != nil {
		return reply{}, err
	}
	var (
		info dma.MRInfo
		err  error
	)
	if c.NPages <= abi.InlinePages {
		if c.PBLPA != 0 {
			return reply{}, errorf(errInval, "pbl_pa must be 0 when npages (%d) <= %d", c.NPages, abi.InlinePages)
		}
		if want := fixed + 8*int(c.NPages); len(r.payload) != want {
			return reply{}, errorf(errMsgSize, "REG_MR: payload is %d bytes, want %d for %d inline pages", len(r.payload), want, c.NPages)
		}
		pages := make([]uint64, c.NPages)
		for i := range pages {
			pages[i] = leU64(r.payload[fixed+8*i:])
		}
		info, err = d.mem.registerMR(cx.owner, c.PDHandle, c.IOVA, c.Length, c.Access, c.PageShift, pages)
	} else {
		if c.PBLPA == 0 {
			return reply{}, errorf(errInval, "npages %d > %d needs pbl_pa", c.NPages, abi.InlinePages)
		}
		if len(r.payload) != fixed {
			return reply{}, errorf(errMsgSize, "REG_MR: payload is %d bytes, want %d with pbl_pa", len(r.payload), fixed)
		}
		if c.PBLPA%8 != 0 {
			return reply{}, errorf(errInval, "pbl_pa %#x not 8-byte aligned", c.PBLPA)
		}
		// Each entry is read once from client memory into the table.
		info, err = d.mem.registerMRList(cx.owner, c.PDHandle, c.IOVA, c.Length, c.Access, c.PageShift, c.PBLPA, c.NPages)
		if err != nil && !errors.Is(err, dma.ErrQuota) {
			err = fmt.Errorf("pbl_pa %#x (%d pages): %w", c.PBLPA, c.NPages, err)
		}
	}
	if errors.Is(err, dma.ErrQuota) {
		return reply{}, fmt.Errorf("uid %d: %w (limits mr_table_bytes_per_uid %d, pinned_bytes_per_uid %d)",
			cx.uid, err, d.cfg.Limits.MRTableBytesPerUID, d.cfg.Limits.PinnedBytesPerUID)
	}
	if err != nil {
		return reply{}, err
	}
	m := &mr{handle: info.LKey, pd: p, iova: c.IOVA, length: c.Length, access: c.Access,
		lkey: info.LKey, rkey: info.RKey, npages: c.NPages, shift: c.PageShift}
	cx.mrs[m.handle] = m
	p.users++
	cx.counts.MR++
	d.totals.MR++
	return reply{body: &abi.RespRegMR{MRHandle: m.handle, LKey: m.lkey, RKey: m.rkey}}, nil
}

func leU64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func (cn *conn) deregMR(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	h, err := handleArg(r)
	if err != nil {
		return reply{}, err
	}
	m, ok := cx.mrs[h]
	if !ok {
		return reply{}, errorf(errNoEnt, "MR %d not found", h)
	}
	if err := d.mem.deregisterMR(cx.owner, h); err != nil {
		return reply{}, err
	}
	delete(cx.mrs, h)
	m.pd.users--
	if m.dm != nil {
		m.dm.users--
	}
	cx.counts.MR--
	d.totals.MR--
	return reply{}, nil
}

// pinRing pins a ring of size bytes at pa after checking its alignment.
func (d *Device) pinRing(cx *Context, what string, pa, size uint64) (*pin, error) {
	if pa%64 != 0 {
		return nil, errorf(errInval, "%s ring at PA %#x is not 64-byte aligned", what, pa)
	}
	pin, err := d.mem.pinRange(cx.owner, pa, size)
	if err != nil {
		// Keeps the dma errno: EFAULT outside host memory, EACCES in
		// another client's memory.
		return nil, fmt.Errorf("%s ring at PA %#x (%d bytes): %w", what, pa, size, err)
	}
	return pin, nil
}

func (cn *conn) createCQ(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdCreateCQReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Flags&^abi.CQFlagTimestamp != 0 {
		return reply{}, errorf(errInval, "flags %#x: unknown bits %#x", c.Flags, c.Flags&^abi.CQFlagTimestamp)
	}
	ts := c.Flags&abi.CQFlagTimestamp != 0
	if !isPow2(c.CQECount) || c.CQECount < 2 || c.CQECount > abi.MaxCQE {
		return reply{}, errorf(errInval, "cqe_count %d: must be a power of two in 2..%d", c.CQECount, abi.MaxCQE)
	}
	if err := d.limit(cx, "CQs", cx.counts.CQ, d.totals.CQ, d.cfg.Limits.PerClient.CQ, d.cfg.Limits.PerDevice.CQ); err != nil {
		return reply{}, err
	}
	efd := -1
	if len(r.msg.fds) == 1 {
		if err := fdIsEventfd(r.msg.fds[0]); err != nil {
			return reply{}, errorf(errBadFd, "completion channel: %v", err)
		}
		if err := d.fdLimit(cx, "completion channel"); err != nil {
			return reply{}, err
		}
	}
	pin, err := d.pinRing(cx, "CQ", c.RingPA, cqRingBytes(c.CQECount, ts))
	if err != nil {
		return reply{}, err
	}
	idx, err := cx.db.Alloc()
	if err != nil {
		pin.release()
		return reply{}, errorf(errNoMem, "doorbell records exhausted: %v", err)
	}
	if len(r.msg.fds) == 1 {
		efd = r.msg.takeFd(0)
		cx.eventfds++
	}
	q := &CQ{handle: cx.newHandle(), ringPA: c.RingPA, cqeCount: c.CQECount, dbIndex: idx, eventfd: efd, ring: pin, cx: cx, ts: ts}
	cx.cqs[q.handle] = q
	cx.counts.CQ++
	d.totals.CQ++
	return reply{body: &abi.RespCreateCQ{CQHandle: q.handle, DBIndex: idx}}, nil
}

// cqeSize is sizeof(struct vrnic_cqe).
const cqeSize = 32

func (cn *conn) destroyCQ(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	h, err := handleArg(r)
	if err != nil {
		return reply{}, err
	}
	q, ok := cx.cqs[h]
	if !ok {
		return reply{}, errorf(errNoEnt, "CQ %d not found", h)
	}
	if q.users > 0 {
		return reply{}, errorf(errBusy, "CQ %d is in use by %d QPs", h, q.users)
	}
	d.freeCQ(cx, q)
	return reply{}, nil
}

func (d *Device) freeCQ(cx *Context, q *CQ) {
	d.dp.ReleaseCQ(q)
	d.releaseLater(cx, func() {
		q.ring.release()
		cx.db.Free(q.dbIndex)
	})
	if q.eventfd >= 0 {
		closeFd(q.eventfd)
		q.eventfd = -1
		cx.eventfds--
	}
	delete(cx.cqs, q.handle)
	cx.counts.CQ--
	d.totals.CQ--
}
