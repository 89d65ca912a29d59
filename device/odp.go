package device

import (
	"errors"
	"math"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/dma"
)

// On-demand paging (ABI 1.4; dma/odp.go and kernel-notes/odp.md): a
// context attaches its process (ODP_ATTACH), registers MRs over its
// virtual memory (REG_MR_ODP) and advises prefetches (ADVISE_MR).

// odpCaps is what on-demand paging covers: every transport reaches memory
// through the same dma accessors, so every operation it has works on ODP
// memory. XRC runs RC's engine and its receives take XRC SRQs.
var odpCaps = abi.RespODPAttach{
	GeneralCaps: abi.ODPSupport | abi.ODPSupportImplicit,
	RCODPCaps: abi.ODPSupportSend | abi.ODPSupportRecv | abi.ODPSupportWrite | abi.ODPSupportRead |
		abi.ODPSupportAtomic | abi.ODPSupportSRQRecv,
	UCODPCaps: abi.ODPSupportSend | abi.ODPSupportRecv | abi.ODPSupportWrite | abi.ODPSupportSRQRecv,
	UDODPCaps: abi.ODPSupportSend | abi.ODPSupportRecv | abi.ODPSupportSRQRecv,
	XRCODPCaps: abi.ODPSupportSend | abi.ODPSupportWrite | abi.ODPSupportRead | abi.ODPSupportAtomic |
		abi.ODPSupportSRQRecv,
}

func (cn *conn) odpAttach(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdODPAttachReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Flags != 0 || c.Reserved != 0 {
		return reply{}, errorf(errInval, "ODP_ATTACH: flags %#x, reserved %#x: must be 0", c.Flags, c.Reserved)
	}
	if cx.odp != nil {
		return reply{body: &odpCaps}, nil
	}
	if cn.pid <= 0 {
		return reply{}, errorf(errNotSup, "ODP_ATTACH: the client's pid is not visible to the daemon (another pid namespace)")
	}
	if err := d.fdLimit(cx, "ODP_ATTACH"); err != nil {
		return reply{}, err
	}
	p, err := dma.OpenProcess(int(cn.pid), c.NonceAddr, c.Nonce[:])
	if err != nil {
		return reply{}, errorf(dma.Errno(err), "ODP_ATTACH: %v", err)
	}
	cx.odp = p
	return reply{body: &odpCaps}, nil
}

func (cn *conn) regMRODP(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdRegMRODPReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if cx.odp == nil {
		return reply{}, errorf(errNotSup, "REG_MR_ODP before ODP_ATTACH")
	}
	p, ok := cx.pds[c.PDHandle]
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
	}
	if c.Reserved != 0 || c.Flags&^abi.ODPFlagImplicit != 0 {
		return reply{}, errorf(errInval, "REG_MR_ODP: flags %#x, reserved %#x", c.Flags, c.Reserved)
	}
	if c.Access&^abi.AccessAll != 0 {
		return reply{}, errorf(errInval, "access %#x: unknown bits %#x", c.Access, c.Access&^abi.AccessAll)
	}
	if c.Access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && c.Access&abi.AccessLocalWrite == 0 {
		return reply{}, errorf(errInval, "access %#x: remote write or remote atomic requires local write (IBTA C10-83)", c.Access)
	}
	if c.Flags&abi.ODPFlagImplicit != 0 {
		if c.Addr != 0 || c.IOVA != 0 || c.Length != math.MaxUint64 {
			return reply{}, errorf(errInval, "implicit ODP MR: addr %#x iova %#x length %#x (want 0, 0, UINT64_MAX)", c.Addr, c.IOVA, c.Length)
		}
	} else if c.Length == 0 || c.Length > abi.MaxMRSize {
		return reply{}, errorf(errInval, "length %d: must be 1..%d", c.Length, uint64(abi.MaxMRSize))
	}
	if err := d.limit(cx, "MRs", cx.counts.MR, d.totals.MR, d.cfg.Limits.PerClient.MR, d.cfg.Limits.PerDevice.MR); err != nil {
		return reply{}, err
	}
	info, err := d.mem.s.RegisterODPMR(cx.owner, c.PDHandle, c.IOVA, c.Addr, c.Length, dma.Access(c.Access), cx.odp)
	if err != nil {
		return reply{}, wrapDMA(err)
	}
	m := &mr{handle: info.LKey, pd: p, iova: c.IOVA, length: c.Length, access: c.Access,
		lkey: info.LKey, rkey: info.RKey, odp: true}
	cx.mrs[m.handle] = m
	p.users++
	cx.counts.MR++
	d.totals.MR++
	return reply{body: &abi.RespRegMR{MRHandle: m.handle, LKey: m.lkey, RKey: m.rkey}}, nil
}

// adviseMR is served outside the device lock (dispatch): it checks the
// PD under the lock, and the prefetch reads the client's memory without
// it, so that a long prefetch holds up no other client.
func (cn *conn) adviseMR(r *request) (reply, error) {
	d := cn.d
	var c abi.CmdAdviseMRReq
	fixed := abi.Sizeof(&c)
	if len(r.payload) < fixed {
		return reply{}, errorf(errMsgSize, "ADVISE_MR: payload is %d bytes, want at least %d", len(r.payload), fixed)
	}
	if _, err := abi.Unmarshal(r.payload[:fixed], &c); err != nil {
		return reply{}, errorf(errMsgSize, "ADVISE_MR: %v", err)
	}
	// The kernel's order: the SGE list (its attribute), the flags
	// (uverbs_get_flags32), the PD, the advice (the driver's).
	if c.NumSGE == 0 || c.NumSGE > abi.MaxSGE {
		return reply{}, errorf(errInval, "ADVISE_MR: num_sge %d: must be 1..%d", c.NumSGE, abi.MaxSGE)
	}
	sgeSize := abi.Sizeof(&abi.SGE{})
	if want := fixed + int(c.NumSGE)*sgeSize; len(r.payload) != want {
		return reply{}, errorf(errMsgSize, "ADVISE_MR: payload is %d bytes, want %d for %d SGEs", len(r.payload), want, c.NumSGE)
	}
	if c.Flags&^abi.AdviseMRFlagFlush != 0 {
		return reply{}, errorf(errInval, "ADVISE_MR: unknown flags %#x", c.Flags&^abi.AdviseMRFlagFlush)
	}
	sges := make([]abi.SGE, c.NumSGE)
	for i := range sges {
		if _, err := abi.Unmarshal(r.payload[fixed+i*sgeSize:fixed+(i+1)*sgeSize], &sges[i]); err != nil {
			return reply{}, errorf(errMsgSize, "ADVISE_MR: SGE %d: %v", i, err)
		}
	}
	d.mu.Lock()
	cx := cn.ctx
	_, ok := cx.pds[c.PDHandle]
	owner := cx.owner
	d.mu.Unlock()
	if !ok {
		return reply{}, errorf(errNoEnt, "PD %d not found", c.PDHandle)
	}
	if c.Advice > abi.AdvicePrefetchNoPF {
		return reply{}, errorf(errNotSup, "ADVICE_MR: advice %d not supported", c.Advice)
	}
	err := d.mem.s.Prefetch(owner, c.PDHandle, c.Advice, sges)
	switch {
	case err == nil:
		return reply{}, nil
	case c.Flags&abi.AdviseMRFlagFlush != 0:
		return reply{}, errorf(dma.Errno(err), "ADVISE_MR: %v", err)
	case errors.Is(err, dma.ErrNotPrefetchable):
		// mlx5's asynchronous prefetch: an SGE without an MR is EINVAL.
		return reply{}, errorf(errInval, "ADVISE_MR: %v", err)
	}
	return reply{}, nil // asynchronous: the fault-in's errors are not reported
}
