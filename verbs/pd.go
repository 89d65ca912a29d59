package verbs

import "github.com/vrnic/vrnic/abi"

// PD is a protection domain.
type PD struct {
	ctx    *Context
	Handle uint32
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	var r abi.RespAllocPD
	if _, _, err := c.k.call(abi.CmdAllocPD, nil, nil, nil, &r); err != nil {
		return nil, err
	}
	return &PD{ctx: c, Handle: r.PDHandle}, nil
}

// Dealloc frees the PD (EBUSY while MRs, QPs, SRQs or AHs use it).
func (pd *PD) Dealloc() error { return pd.ctx.destroy(abi.CmdDeallocPD, pd.Handle) }

// MR is a registered memory region.
type MR struct {
	ctx    *Context
	Handle uint32
	LKey   uint32
	RKey   uint32
	Addr   uint64 // IOVA of the first byte
	Length uint64
}

const pageShift = abi.PageShift4K
const pageSize = 1 << pageShift

// RegMR registers buf with the given access flags (abi.Access*), its IOVA
// being the buffer's virtual address in this process (Buffer.Addr), as
// with ibv_reg_mr.
func (pd *PD) RegMR(buf *Buffer, access uint32) (*MR, error) {
	return pd.RegMRAt(buf, buf.Addr(), access)
}

// RegMRAt registers buf at a chosen IOVA; iova and buf.PA must have the
// same offset inside a 4 KiB page. It builds the page list from the
// buffer's physical address: inline in the command for up to 64 pages,
// otherwise in a temporary host memory buffer named by pbl_pa.
func (pd *PD) RegMRAt(buf *Buffer, iova uint64, access uint32) (*MR, error) {
	c := pd.ctx
	pl, err := c.pageList(buf, iova)
	if err != nil {
		return nil, err
	}
	defer pl.free() // the daemon copies the list at registration
	req := abi.CmdRegMRReq{IOVA: iova, Length: pl.length, PDHandle: pd.Handle, Access: access,
		PageShift: pageShift, NPages: pl.npages, PBLPA: pl.pblPA()}
	var r abi.RespRegMR
	if _, _, err := c.k.call(abi.CmdRegMR, &req, pl.inline, nil, &r); err != nil {
		return nil, err
	}
	return &MR{ctx: c, Handle: r.MRHandle, LKey: r.LKey, RKey: r.RKey, Addr: iova, Length: pl.length}, nil
}

// Dereg deregisters the MR.
func (m *MR) Dereg() error { return m.ctx.destroy(abi.CmdDeregMR, m.Handle) }

// SGE returns a scatter/gather entry for [off, off+n) of the MR.
func (m *MR) SGE(off, n uint32) abi.SGE {
	return abi.SGE{Addr: m.Addr + uint64(off), Length: n, LKey: m.LKey}
}

// AH is an address handle for UD sends.
type AH struct {
	ctx    *Context
	Handle uint32
	Attr   abi.AHAttr
}

// CreateAH creates an address handle.
func (pd *PD) CreateAH(attr abi.AHAttr) (*AH, error) {
	var r abi.RespCreateAH
	if _, _, err := pd.ctx.k.call(abi.CmdCreateAH, &abi.CmdCreateAHReq{PDHandle: pd.Handle, Attr: attr}, nil, nil, &r); err != nil {
		return nil, err
	}
	return &AH{ctx: pd.ctx, Handle: r.AHHandle, Attr: attr}, nil
}

// Destroy destroys the AH.
func (a *AH) Destroy() error { return a.ctx.destroy(abi.CmdDestroyAH, a.Handle) }
