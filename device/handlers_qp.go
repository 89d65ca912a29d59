package device

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

func closeFd(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

func checkCapReserved(c abi.QPCap) error {
	if c.Reserved != 0 {
		return errorf(errInval, "cap.reserved must be 0")
	}
	return nil
}

func (cn *conn) createQP(r *request) (reply, error) {
	var c abi.CmdCreateQPReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	return cn.createQPWith(&c, nil)
}

// createQPWith creates a QP of CREATE_QP, or with x (CREATE_XRC_QP) an
// XRC target QP of that domain.
func (cn *conn) createQPWith(cp0 *abi.CmdCreateQPReq, x *xrcdRef) (reply, error) {
	d, cx := cn.d, cn.ctx
	c := *cp0
	switch {
	case x == nil && (c.QPType == QPTypeRC || c.QPType == QPTypeUC || c.QPType == QPTypeUD || c.QPType == abi.QPTXRCSend):
	case x != nil && c.QPType == abi.QPTXRCRecv:
	case c.QPType == abi.QPTXRCRecv:
		return reply{}, errorf(errInval, "qp_type %d: an XRC target QP is created with CREATE_XRC_QP", c.QPType)
	default:
		return reply{}, errorf(errInval, "qp_type %d: want RC (2), UC (3), UD (4) or XRC_SEND (9)", c.QPType)
	}
	xrc := c.QPType == abi.QPTXRCSend || c.QPType == abi.QPTXRCRecv
	if xrc {
		// No receive queue: an initiator only sends, a target's
		// receives are its domain's SRQs'; neither has a receive CQ.
		if c.RQPA != 0 || c.Cap.MaxRecvWR != 0 || c.Cap.MaxRecvSGE != 0 || c.SRQHandle != abi.NoSRQ {
			return reply{}, errorf(errInval, "an XRC QP has no receive queue: rq_pa, max_recv_wr, max_recv_sge must be 0 and srq_handle none")
		}
		c.RecvCQ = c.SendCQ
	}
	if err := checkCapReserved(c.Cap); err != nil {
		return reply{}, err
	}
	p, err := lookup(cx.pds, "PD", c.PDHandle)
	if err != nil {
		return reply{}, err
	}
	scq, err := lookup(cx.cqs, "send CQ", c.SendCQ)
	if err != nil {
		return reply{}, err
	}
	rcq, err := lookup(cx.cqs, "receive CQ", c.RecvCQ)
	if err != nil {
		return reply{}, err
	}
	var s *SRQ
	if c.SRQHandle != abi.NoSRQ {
		if s, err = lookup(cx.srqs, "SRQ", c.SRQHandle); err != nil {
			return reply{}, err
		}
	}
	if c.SQSigAll > 1 {
		return reply{}, errorf(errInval, "sq_sig_all %d: must be 0 or 1", c.SQSigAll)
	}
	cp := c.Cap
	if !isPow2(cp.MaxSendWR) || cp.MaxSendWR > abi.MaxQPWR {
		return reply{}, errorf(errInval, "max_send_wr %d: must be a power of two in 1..%d", cp.MaxSendWR, abi.MaxQPWR)
	}
	if cp.MaxSendSGE > abi.MaxSGE {
		return reply{}, errorf(errInval, "max_send_sge %d: at most %d", cp.MaxSendSGE, abi.MaxSGE)
	}
	if cp.MaxInlineData > abi.MaxInline {
		return reply{}, errorf(errInval, "max_inline_data %d: at most %d", cp.MaxInlineData, abi.MaxInline)
	}
	if s != nil {
		if c.RQPA != 0 || cp.MaxRecvWR != 0 || cp.MaxRecvSGE != 0 {
			return reply{}, errorf(errInval, "with an SRQ, rq_pa, max_recv_wr and max_recv_sge must be 0")
		}
	} else if !xrc {
		if !isPow2(cp.MaxRecvWR) || cp.MaxRecvWR > abi.MaxQPWR {
			return reply{}, errorf(errInval, "max_recv_wr %d: must be a power of two in 1..%d", cp.MaxRecvWR, abi.MaxQPWR)
		}
		if cp.MaxRecvSGE > abi.MaxSGE {
			return reply{}, errorf(errInval, "max_recv_sge %d: at most %d", cp.MaxRecvSGE, abi.MaxSGE)
		}
	}
	if err := d.limit(cx, "QPs", cx.counts.QP, d.totals.QP, d.cfg.Limits.PerClient.QP, d.cfg.Limits.PerDevice.QP); err != nil {
		return reply{}, err
	}
	q := &QP{ctx: cx, typ: c.QPType, pd: p, sendCQ: scq, recvCQ: rcq, srq: s, sigAll: c.SQSigAll == 1, xrcd: x}
	q.state.store(StateReset)
	q.state.q = q
	q.sqBlocks = abi.SQWQEBlocks(cp.MaxSendSGE, cp.MaxInlineData)
	if s == nil && !xrc {
		q.rqSize = abi.RQWQESize(cp.MaxRecvSGE)
	}
	if q.sqRing, err = d.pinRing(cx, "SQ", c.SQPA, uint64(cp.MaxSendWR)*uint64(q.sqBlocks)*abi.WQEBlock); err != nil {
		return reply{}, err
	}
	if s == nil && !xrc {
		if q.rqRing, err = d.pinRing(cx, "RQ", c.RQPA, uint64(cp.MaxRecvWR)*uint64(q.rqSize)); err != nil {
			q.sqRing.release()
			return reply{}, err
		}
	}
	if q.dbIndex, err = cx.db.Alloc(); err != nil {
		d.unpinQP(q)
		return reply{}, errorf(errNoMem, "doorbell records exhausted: %v", err)
	}
	q.qpn = d.allocQPN()
	q.portMTU = d.cfg.Link.MaxMTU
	q.attr.PortNum = 1
	q.attr.Cap = cp
	if err := d.dp.CreateQP(q); err != nil {
		cx.db.Free(q.dbIndex)
		d.unpinQP(q)
		return reply{}, errorf(errNoMem, "data plane: %v", err)
	}
	d.qps.put(q)
	cx.qps.put(q)
	p.users++
	scq.users++
	rcq.users++
	if s != nil {
		s.users++
	}
	if x != nil {
		x.users++
	}
	cx.counts.QP++
	d.totals.QP++
	return reply{body: &abi.RespCreateQP{QPN: q.qpn, DBIndex: q.dbIndex, SQWQEBlocks: q.sqBlocks, RQWQESize: q.rqSize, Cap: cp}}, nil
}

// allocQPN returns an unused 24-bit QPN >= firstQPN, drawn at random: an
// off-path host that wants to inject into a connection must guess the QPN
// too (besides the PSN and the rkey), and a destroyed QP's number is not
// reused at once (a late packet for the old QP then finds no QP rather
// than the new one). The device holds at most Limits.PerDevice.QP QPs of
// the 16M numbers, so a draw is free with high probability.
func (d *Device) allocQPN() uint32 {
	for {
		n := firstQPN + d.qpnRand.Uint32N(roce.QPNMask+1-firstQPN)
		if d.qps.get(n) == nil {
			return n
		}
	}
}

func (d *Device) unpinQP(q *QP) {
	if q.sqRing != nil {
		q.sqRing.release()
	}
	if q.rqRing != nil {
		q.rqRing.release()
	}
}

// lookup finds handle h in one of a context's tables; what names the
// resource in the errNoEnt error ("PD 7 not found").
func lookup[T any](table map[uint32]T, what string, h uint32) (T, error) {
	v, ok := table[h]
	if !ok {
		var zero T
		return zero, errorf(errNoEnt, "%s %d not found", what, h)
	}
	return v, nil
}

// lookupArg is lookup of the handle that is a request's whole argument.
func lookupArg[T any](r *request, table map[uint32]T, what string) (T, error) {
	h, err := handleArg(r)
	if err != nil {
		var zero T
		return zero, err
	}
	return lookup(table, what, h)
}

// lookupQP finds QP qpn of the context (errNoEnt as lookup's).
func (cx *Context) lookupQP(qpn uint32) (*QP, error) {
	if q := cx.qps.get(qpn); q != nil {
		return q, nil
	}
	return nil, errorf(errNoEnt, "QP %d not found", qpn)
}

// lookupQPArg is lookupArg for the context's QPs.
func lookupQPArg(r *request, cx *Context) (*QP, error) {
	h, err := handleArg(r)
	if err != nil {
		return nil, err
	}
	return cx.lookupQP(h)
}

func (cn *conn) modifyQP(r *request) (reply, error) {
	var c abi.CmdModifyQPReq
	switch len(r.payload) {
	case abi.Sizeof(&c):
		if err := decode(r, &c); err != nil {
			return reply{}, err
		}
		if c.Reserved != 0 {
			return reply{}, errorf(errInval, "reserved must be 0")
		}
	case abi.OffModifyQPECE:
		// A client of ABI 1.4: the command without ece_options.
		full := make([]byte, abi.Sizeof(&c))
		copy(full, r.payload)
		if _, err := abi.Unmarshal(full, &c); err != nil {
			return reply{}, errorf(errMsgSize, "%v: %v", r.hdr.Opcode, err)
		}
		if c.AttrMask&abi.QPAttrECE != 0 {
			return reply{}, errorf(errInval, "VRNIC_QP_ECE needs the ABI 1.5 command (%d bytes, with ece_options), not %d bytes",
				abi.Sizeof(&c), len(r.payload))
		}
	default:
		return reply{}, errorf(errMsgSize, "%v: payload is %d bytes, want %d (ABI 1.5) or %d (ABI 1.4)", r.hdr.Opcode,
			len(r.payload), abi.Sizeof(&c), abi.OffModifyQPECE)
	}
	q, err := cn.ctx.lookupQP(c.QPN)
	if err != nil {
		return reply{}, err
	}
	if err := cn.d.modifyQPLocked(q, AttrMask(c.AttrMask), &c.Attr, c.ECEOptions); err != nil {
		return reply{}, err
	}
	return reply{}, nil
}

// modifyQPLocked validates and applies one MODIFY_QP. The transport may
// move the QP to ERR at any moment (StateWord); a transition validated
// against a state the QP left meanwhile fails, and the client can query
// the QP and try again from ERR.
func (d *Device) modifyQPLocked(q *QP, mask AttrMask, a *abi.QPAttr, ece uint32) error {
	cur := q.state.Load()
	next := cur
	if mask&AttrState != 0 {
		if !validState(a.QPState) {
			return errorf(errInval, "qp_state %d: not a QP state", uint32(a.QPState))
		}
		next = a.QPState
	}
	if err := checkTransition(q.typ, cur, next, mask&^AttrECE); err != nil {
		return err
	}
	if err := d.checkAttrValues(q, cur, mask, a); err != nil {
		return err
	}
	if err := d.checkECE(q, cur, next, mask, ece); err != nil {
		return err
	}
	if err := d.dp.CheckModifyQP(q, cur, next, mask, a); err != nil {
		return err
	}
	if err := d.claimPeer(q, cur, next, mask, a); err != nil {
		return err
	}
	if !q.state.CompareAndSwap(cur, next) {
		if cur == StateInit {
			d.releasePeer(q)
		}
		return errorf(errInval, "QP %d left %v during MODIFY_QP (now %v: a transport error)", q.qpn, cur, q.state.Load())
	}
	if next == StateReset {
		d.releasePeer(q)
	}
	d.applyAttr(q, next, mask, a)
	if next == StateReset {
		q.ece = 0
	} else if mask&AttrECE != 0 {
		q.ece = ece
	}
	d.dp.ModifyQP(q, cur, mask)
	if next == StateErr && cur != StateErr {
		q.qpEnteredError(0, false) // the client's own move: no affiliated error
	}
	return nil
}

func (cn *conn) queryQP(r *request) (reply, error) {
	q, err := lookupQPArg(r, cn.ctx)
	if err != nil {
		return reply{}, err
	}
	ctr := cn.d.dp.Counters(q)
	resp := &abi.RespQueryQP{
		Attr:            q.attr,
		QPType:          q.typ,
		SendCQ:          q.sendCQ.handle,
		RecvCQ:          q.recvCQ.handle,
		SRQHandle:       abi.NoSRQ,
		PDHandle:        q.pd.handle,
		ECEOptions:      q.ece,
		PacketsSent:     ctr.PacketsSent,
		PacketsReceived: ctr.PacketsReceived,
		Retransmits:     ctr.Retransmits,
		RNRNAKsReceived: ctr.RNRNAKsReceived,
	}
	st := q.state.Load()
	resp.Attr.QPState = st
	resp.Attr.CurQPState = st
	resp.Attr.Cap = q.attr.Cap
	if q.sigAll {
		resp.SQSigAll = 1
	}
	if q.srq != nil {
		resp.SRQHandle = q.srq.handle
	}
	return reply{body: resp}, nil
}

func (cn *conn) destroyQP(r *request) (reply, error) {
	q, err := lookupQPArg(r, cn.ctx)
	if err != nil {
		return reply{}, err
	}
	return reply{wait: cn.d.freeQP(cn.ctx, q)}, nil
}

// freeQP destroys q; the returned channel (nil without a data plane) is
// closed once the data plane removed it: from then on no completion of
// q is written.
func (d *Device) freeQP(cx *Context, q *QP) <-chan struct{} {
	final := d.dp.DestroyQP(q)
	d.releasePeer(q)
	var applied chan struct{}
	if final != nil {
		applied = make(chan struct{})
		d.startRelease(cx, final, applied)
	}
	d.releaseLater(cx, func() {
		d.unpinQP(q)
		cx.db.Free(q.dbIndex)
	})
	d.qps.delete(q.qpn)
	cx.qps.delete(q.qpn)
	q.pd.users--
	q.sendCQ.users--
	q.recvCQ.users--
	if q.srq != nil {
		q.srq.users--
	}
	if q.xrcd != nil {
		q.xrcd.users--
	}
	cx.counts.QP--
	d.totals.QP--
	return applied
}

func (cn *conn) createSRQ(r *request) (reply, error) {
	var c abi.CmdCreateSRQReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	rep, _, err := cn.createSRQWith(&c, nil)
	if err != nil {
		return reply{}, err
	}
	return reply{body: &rep}, nil
}

// createSRQWith creates an SRQ of CREATE_SRQ, or with x an XRC SRQ.
func (cn *conn) createSRQWith(cp *abi.CmdCreateSRQReq, x *xrcSRQ) (abi.RespCreateSRQ, *SRQ, error) {
	d, cx, c := cn.d, cn.ctx, *cp
	p, err := lookup(cx.pds, "PD", c.PDHandle)
	if err != nil {
		return abi.RespCreateSRQ{}, nil, err
	}
	if !isPow2(c.MaxWR) || c.MaxWR > abi.MaxSRQWR {
		return abi.RespCreateSRQ{}, nil, errorf(errInval, "max_wr %d: must be a power of two in 1..%d", c.MaxWR, abi.MaxSRQWR)
	}
	if c.MaxSGE > abi.MaxSGE {
		return abi.RespCreateSRQ{}, nil, errorf(errInval, "max_sge %d: at most %d", c.MaxSGE, abi.MaxSGE)
	}
	// srq_limit is not checked at creation, as rxe (rxe_srq_chk_init)
	// does not: the SRQ is armed with it, whatever it is (a limit above
	// max_wr raises SRQ_LIMIT_REACHED at the first receive).
	if err := d.limit(cx, "SRQs", cx.counts.SRQ, d.totals.SRQ, d.cfg.Limits.PerClient.SRQ, d.cfg.Limits.PerDevice.SRQ); err != nil {
		return abi.RespCreateSRQ{}, nil, err
	}
	size := abi.RQWQESize(c.MaxSGE)
	pin, err := d.pinRing(cx, "SRQ", c.RingPA, uint64(c.MaxWR)*uint64(size))
	if err != nil {
		return abi.RespCreateSRQ{}, nil, err
	}
	idx, err := cx.db.Alloc()
	if err != nil {
		pin.release()
		return abi.RespCreateSRQ{}, nil, errorf(errNoMem, "doorbell records exhausted: %v", err)
	}
	s := &SRQ{handle: cx.newHandle(), pd: p, ringPA: c.RingPA, maxWR: c.MaxWR, maxSGE: c.MaxSGE,
		wqeSize: size, dbIndex: idx, ring: pin, cx: cx, xrc: x}
	s.armed.Store(c.SRQLimit)
	cx.srqs[s.handle] = s
	p.users++
	cx.counts.SRQ++
	d.totals.SRQ++
	return abi.RespCreateSRQ{SRQHandle: s.handle, DBIndex: idx, RQWQESize: size}, s, nil
}

func (cn *conn) modifySRQ(r *request) (reply, error) {
	var c abi.CmdModifySRQReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	s, err := lookup(cn.ctx.srqs, "SRQ", c.SRQHandle)
	if err != nil {
		return reply{}, err
	}
	// As rxe_srq_chk_attr: at most what the SRQ holds (max_wr).
	if c.SRQLimit > s.maxWR {
		return reply{}, errorf(errInval, "srq_limit %d: above max_wr %d", c.SRQLimit, s.maxWR)
	}
	s.armed.Store(c.SRQLimit)
	return reply{}, nil
}

func (cn *conn) querySRQ(r *request) (reply, error) {
	s, err := lookupArg(r, cn.ctx.srqs, "SRQ")
	if err != nil {
		return reply{}, err
	}
	return reply{body: &abi.RespQuerySRQ{MaxWR: s.maxWR, MaxSGE: s.maxSGE, SRQLimit: s.armed.Load()}}, nil
}

func (cn *conn) destroySRQ(r *request) (reply, error) {
	s, err := lookupArg(r, cn.ctx.srqs, "SRQ")
	if err != nil {
		return reply{}, err
	}
	if s.users > 0 {
		return reply{}, errorf(errBusy, "SRQ %d is in use by %d QPs", s.handle, s.users)
	}
	cn.d.freeSRQ(cn.ctx, s)
	return reply{}, nil
}

func (d *Device) freeSRQ(cx *Context, s *SRQ) {
	if s.xrc != nil {
		d.freeXRCSRQLocked(cx, s)
	}
	d.dp.ReleaseSRQ(s)
	d.releaseLater(cx, func() {
		s.ring.release()
		cx.db.Free(s.dbIndex)
	})
	s.pd.users--
	delete(cx.srqs, s.handle)
	cx.counts.SRQ--
	d.totals.SRQ--
}

func (cn *conn) createAH(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	var c abi.CmdCreateAHReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	if c.Reserved != 0 {
		return reply{}, errorf(errInval, "reserved field must be 0")
	}
	p, err := lookup(cx.pds, "PD", c.PDHandle)
	if err != nil {
		return reply{}, err
	}
	if err := d.checkAH(&c.Attr); err != nil {
		return reply{}, err
	}
	if err := d.limit(cx, "AHs", cx.counts.AH, d.totals.AH, d.cfg.Limits.PerClient.AH, d.cfg.Limits.PerDevice.AH); err != nil {
		return reply{}, err
	}
	a := &AH{handle: cx.newHandle(), pd: p, attr: c.Attr, cx: cx,
		// checkAH made sure the source GID index is in the table.
		local: netip.AddrFrom16(d.cfg.Link.GIDs[c.Attr.SGIDIndex]).Unmap(), remote: netip.AddrFrom16(c.Attr.DGID).Unmap()}
	if a.local.Is4() != a.remote.Is4() {
		return reply{}, errorf(errInval, "ah_attr: source GID %v and destination GID %v are of different IP versions", a.local, a.remote)
	}
	// The data plane may resolve the destination's link address here
	// (TAP: ARP or neighbour discovery, bounded): an error (wrapping
	// EHOSTUNREACH) fails CREATE_AH, as the kernel's ib_create_ah fails
	// for a RoCE destination it cannot resolve.
	if err := d.dp.AddAH(a); err != nil {
		return reply{}, err
	}
	cx.ahs[a.handle] = a
	p.users++
	cx.counts.AH++
	d.totals.AH++
	return reply{body: &abi.RespCreateAH{AHHandle: a.handle}}, nil
}

func (cn *conn) destroyAH(r *request) (reply, error) {
	a, err := lookupArg(r, cn.ctx.ahs, "AH")
	if err != nil {
		return reply{}, err
	}
	cn.d.freeAH(cn.ctx, a)
	return reply{}, nil
}

func (d *Device) freeAH(cx *Context, a *AH) {
	d.dp.RemoveAH(a)
	a.pd.users--
	delete(cx.ahs, a.handle)
	cx.counts.AH--
	d.totals.AH--
}

// releaseContextLocked destroys everything a context owns, in dependency
// order, and closes its doorbell page. Called when the connection ends
// (client exit or death) and at shutdown, after the CM released the
// context's CM IDs (without the device lock: serveConn).
func (d *Device) releaseContextLocked(cx *Context, why string) {
	cx.closeEvents()
	for _, q := range cx.qps.list() {
		d.freeQP(cx, q)
	}
	for _, a := range cx.ahs {
		d.freeAH(cx, a)
	}
	for _, s := range cx.srqs {
		d.freeSRQ(cx, s)
	}
	d.releaseXRCDsLocked(cx)
	for _, q := range cx.cqs {
		d.freeCQ(cx, q)
	}
	for _, w := range cx.mws { // before the MRs they are bound to
		if err := d.freeMW(cx, w); err != nil {
			d.log.Warn("release MW", "ctx", cx.handle, "mw", w.handle, "err", err)
		}
	}
	for h, m := range cx.mrs {
		if err := d.mem.deregisterMR(cx.owner, h); err != nil {
			d.log.Warn("release MR", "ctx", cx.handle, "mr", h, "err", err)
		}
		m.pd.users--
		if m.dm != nil {
			m.dm.users--
		}
		delete(cx.mrs, h)
		cx.counts.MR--
		d.totals.MR--
	}
	for h := range cx.pds {
		delete(cx.pds, h)
		cx.counts.PD--
		d.totals.PD--
	}
	// The host memory goes once the engine's workers no longer touch the
	// context's QPs (their rings pin it until then: releaseLater).
	d.releaseLater(cx, func() {
		d.releaseDMs(cx)
		for h := range cx.hostMem {
			if err := d.mem.removeRegion(cx.owner, h); err != nil {
				d.log.Warn("release host memory", "ctx", cx.handle, "region", h, "err", err)
			}
			delete(cx.hostMem, h)
			cx.counts.HostMem--
			d.totals.HostMem--
		}
		// Backstop: whatever the space still holds for this owner goes too.
		d.mem.releaseOwner(cx.owner)
		if cx.odp != nil {
			cx.odp.Close()
		}
		if err := cx.db.Close(); err != nil {
			d.log.Warn("close doorbell page", "ctx", cx.handle, "err", err)
		}
	})
	delete(d.contexts, cx.handle)
	d.totals.Contexts--
	if a := d.accounts[cx.uid]; a != nil {
		a.contexts--
	}
	d.counters.ContextsClosed.Add(1)
	d.log.Info("context closed", "ctx", cx.handle, "client", cx.name, "pid", cx.pid, "uid", cx.uid, "reason", why)
}

// releaseLater runs f, which releases memory an engine worker may touch
// in cx (see Context.lingering), now, or once every QP of cx whose removal
// the data plane has not confirmed is confirmed.
func (d *Device) releaseLater(cx *Context, f func()) {
	if cx.lingering > 0 {
		cx.deferred = append(cx.deferred, f)
		return
	}
	f()
}

// startRelease counts one more removal of cx the data plane has not
// confirmed and waits for it in a goroutine of its own (awaitRelease),
// which Close waits for. Called under the device lock.
func (d *Device) startRelease(cx *Context, final <-chan QPCounters, applied chan<- struct{}) {
	cx.lingering++
	d.releases.Add(1)
	go func() {
		defer d.releases.Done()
		d.awaitRelease(cx, final, applied)
	}()
}

// awaitRelease waits for the data plane to confirm a QP removal of cx
// (at the latest when the engine closes), adds the QP's final counters to
// the device's totals and, after the last of cx's removals, runs what was
// deferred for cx, under the device lock.
func (d *Device) awaitRelease(cx *Context, final <-chan QPCounters, applied chan<- struct{}) {
	ctr := <-final
	close(applied)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dpRetired.Add(ctr)
	if cx.lingering--; cx.lingering > 0 {
		return
	}
	fs := cx.deferred
	cx.deferred = nil
	for _, f := range fs {
		f()
	}
}
