package device

import (
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/dma"
)

// Memory windows (ABI 1.4): ALLOC_MW and DEALLOC_MW. The windows
// themselves, their binds (BIND_MW work requests, executed by the engine)
// and their rkeys live in package dma (mw.go); the device counts them per
// context and per device and keeps each in its PD's user count, so that a
// PD with windows cannot be deallocated.

type mw struct {
	handle uint32 // dma's handle: the rkey it was allocated with
	pd     *pd
	typ    abi.MWType
}

func (cn *conn) allocMW(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdAllocMWReq
	if _, err := abi.Unmarshal(r.payload, &c); err != nil {
		return reply{}, errorf(errMsgSize, "ALLOC_MW: %v", err)
	}
	p, ok := cx.pds[c.PDHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
	}
	// ib_uverbs_alloc_mw: a type other than 1 and 2 is EINVAL.
	if c.Type != abi.MWType1 && c.Type != abi.MWType2 {
		return reply{}, errorf(errInval, "memory window type %d: must be 1 or 2", c.Type)
	}
	if err := d.limit(cx, "MWs", cx.counts.MW, d.totals.MW, d.cfg.Limits.PerClient.MW, d.cfg.Limits.PerDevice.MW); err != nil {
		return reply{}, err
	}
	info, err := d.mem.s.AllocMW(cx.owner, c.PDHandle, dma.MWType(c.Type))
	if err != nil {
		return reply{}, wrapDMA(err)
	}
	cx.mws[info.Handle] = &mw{handle: info.Handle, pd: p, typ: c.Type}
	p.users++
	cx.counts.MW++
	d.totals.MW++
	return reply{body: &abi.RespAllocMW{MWHandle: info.Handle, RKey: info.RKey}}, nil
}

func (cn *conn) deallocMW(r *request) (reply, error) {
	w, err := lookupArg(r, cn.ctx.mws, "MW")
	if err != nil {
		return reply{}, err
	}
	return reply{}, cn.d.freeMW(cn.ctx, w)
}

// freeMW deallocates w: unbound first if bound, its rkey dead from then on.
func (d *Device) freeMW(cx *Context, w *mw) error {
	if err := d.mem.s.DeallocMW(cx.owner, w.handle); err != nil {
		return wrapDMA(err)
	}
	delete(cx.mws, w.handle)
	w.pd.users--
	cx.counts.MW--
	d.totals.MW--
	return nil
}
