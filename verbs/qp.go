package verbs

import (
	"fmt"

	"github.com/vrnic/vrnic/abi"
)

// QPInitAttr describes a QP to create (ibv_qp_init_attr).
type QPInitAttr struct {
	// Type: abi.QPTRC, abi.QPTUC, abi.QPTUD, or abi.QPTXRCSend (an XRC
	// initiator: no receive queue, RecvCQ and SRQ nil; each send WR names
	// the target's XRC SRQ number in RemoteQPN). XRC targets:
	// XRCD.CreateTargetQP.
	Type   abi.QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ // nil: the QP has its own receive queue
	SigAll bool // every send WR completes signaled
	// Cap: the WR counts are rounded up to powers of two.
	Cap abi.QPCap
}

// QP is a queue pair. Its send and receive rings live in host memory the
// library allocates; PostSend and PostRecv write WQEs there and publish
// the producer index in the QP's doorbell record.
type QP struct {
	ctx    *Context
	QPN    uint32
	Type   abi.QPType
	Cap    abi.QPCap // as granted
	sq, rq workQueue // rq has no ring with an SRQ
	rec    []byte    // the QP's doorbell record
}

func roundPow2(v uint32) uint32 {
	n := uint32(1)
	for n < v {
		n <<= 1
	}
	return n
}

// CreateQP creates a QP in the RESET state.
func (pd *PD) CreateQP(a QPInitAttr) (*QP, error) {
	if a.Type == abi.QPTXRCRecv {
		return nil, fmt.Errorf("verbs: CreateQP: an XRC target QP is XRCD.CreateTargetQP's")
	}
	return pd.createQP(a, nil)
}

// createQP creates a QP with CREATE_QP, or with xrcd (an XRC target QP)
// with CREATE_XRC_QP in that domain.
func (pd *PD) createQP(a QPInitAttr, xrcd *XRCD) (*QP, error) {
	c := pd.ctx
	// An XRC QP has no receive queue and no receive CQ; what a caller
	// gives anyway goes to the daemon, which refuses it (EINVAL).
	xrc := a.Type == abi.QPTXRCSend || a.Type == abi.QPTXRCRecv
	if a.SendCQ == nil || (a.RecvCQ == nil && !xrc) {
		return nil, fmt.Errorf("verbs: CreateQP needs a send CQ, and a receive CQ unless an XRC QP (which has none)")
	}
	cp := a.Cap
	cp.MaxSendWR = roundPow2(max(cp.MaxSendWR, 1))
	sqBlocks := abi.SQWQEBlocks(cp.MaxSendSGE, cp.MaxInlineData)
	req := abi.CmdCreateQPReq{QPType: a.Type, PDHandle: pd.Handle, SendCQ: a.SendCQ.Handle, SRQHandle: abi.NoSRQ}
	if a.RecvCQ != nil {
		req.RecvCQ = a.RecvCQ.Handle
	} else {
		req.RecvCQ = a.SendCQ.Handle
	}
	if a.SigAll {
		req.SQSigAll = 1
	}
	sq, err := c.Alloc(int(cp.MaxSendWR*sqBlocks*abi.WQEBlock), 64)
	if err != nil {
		return nil, err
	}
	req.SQPA = sq.PA
	var rq *Buffer
	switch {
	case xrc && a.SRQ == nil && cp.MaxRecvWR == 0 && cp.MaxRecvSGE == 0:
	case a.SRQ != nil:
		req.SRQHandle = a.SRQ.Handle
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, 0
	default:
		cp.MaxRecvWR = roundPow2(max(cp.MaxRecvWR, 1))
		if rq, err = c.Alloc(int(cp.MaxRecvWR*abi.RQWQESize(cp.MaxRecvSGE)), 64); err != nil {
			sq.Free()
			return nil, err
		}
		req.RQPA = rq.PA
	}
	req.Cap = cp
	var r abi.RespCreateQP
	if xrcd != nil {
		_, _, err = c.k.call(abi.CmdCreateXRCQP, &abi.CmdCreateXRCQPReq{QP: req, XRCDHandle: xrcd.Handle}, nil, nil, &r)
	} else {
		_, _, err = c.k.call(abi.CmdCreateQP, &req, nil, nil, &r)
	}
	if err != nil {
		freeBuffers(sq, rq)
		return nil, err
	}
	rec, err := c.createdRecord(r.DBIndex, abi.CmdDestroyQP, r.QPN, sq, rq)
	if err != nil {
		return nil, err
	}
	return &QP{ctx: c, QPN: r.QPN, Type: a.Type, Cap: r.Cap,
		sq:  newWorkQueue(sq, r.Cap.MaxSendWR, r.SQWQEBlocks*abi.WQEBlock, rec, abi.OffDBSQPI, abi.OffDBSQCI, c.summaryOf(r.DBIndex)),
		rq:  newWorkQueue(rq, r.Cap.MaxRecvWR, r.RQWQESize, rec, abi.OffDBRQPI, abi.OffDBRQCI, c.summaryOf(r.DBIndex)),
		rec: rec}, nil
}

// Destroy destroys the QP and frees its rings.
func (qp *QP) Destroy() error {
	if err := qp.ctx.destroy(abi.CmdDestroyQP, qp.QPN); err != nil {
		return err
	}
	freeBuffers(qp.sq.ring, qp.rq.ring)
	return nil
}

// Modify changes the QP's attributes and state (ibv_modify_qp); mask is a
// set of abi.QPAttr* bits.
func (qp *QP) Modify(attr *abi.QPAttr, mask uint32) error {
	return qp.ModifyECE(attr, mask, 0)
}

// ModifyECE is Modify with the QP's ECE options (abi.ECE* bits), which
// it sets when mask has abi.QPAttrECE: on an RC or XRC QP, from RESET to
// INIT, in INIT or from INIT to RTR (vrnic_abi.h "Enhanced Connection
// Establishment"). Set only options both ends agreed on.
func (qp *QP) ModifyECE(attr *abi.QPAttr, mask, ece uint32) error {
	_, _, err := qp.ctx.k.call(abi.CmdModifyQP, &abi.CmdModifyQPReq{QPN: qp.QPN, AttrMask: mask, Attr: *attr, ECEOptions: ece}, nil, nil, nil)
	return err
}

// Query returns the QP's attributes, state and counters.
func (qp *QP) Query() (abi.RespQueryQP, error) {
	var r abi.RespQueryQP
	_, _, err := qp.ctx.k.call(abi.CmdQueryQP, &abi.CmdHandleReq{Handle: qp.QPN}, nil, nil, &r)
	return r, err
}

// ToInit moves a RESET QP to INIT on port 1, P_Key index 0. access is the
// remote access (RC, UC: UC honours only remote write) and qkey the Q_Key
// (UD); the other is ignored.
func (qp *QP) ToInit(access, qkey uint32) error {
	a := abi.QPAttr{QPState: abi.QPSInit, PortNum: 1}
	mask := abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort
	if qp.Type == abi.QPTUD {
		a.QKey = qkey
		mask |= abi.QPAttrQKey
	} else {
		a.QPAccessFlags = access
		mask |= abi.QPAttrAccessFlags
	}
	return qp.Modify(&a, mask)
}

// RTRAttr are the attributes of the INIT→RTR step of an RC or UC QP (UC
// takes the address vector, path MTU, destination QPN and receive PSN).
type RTRAttr struct {
	AV              abi.AHAttr
	PathMTU         abi.MTU
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8
	// ECE are vrnic's ECE options for the connection (abi.ECE* bits: the
	// transport options the two ends agreed on, e.g. over the channel
	// they exchanged their QP numbers on; at most those
	// DeviceAttrEx.ECEOptions has); 0 sets none. RC and XRC QPs only.
	ECE uint32
}

// ToRTR moves an INIT QP to RTR. For a UD QP the attributes are unused:
// every send names its destination (SendWR.AH, RemoteQPN, RemoteQKey).
func (qp *QP) ToRTR(r RTRAttr) error {
	a := abi.QPAttr{QPState: abi.QPSRTR}
	mask := abi.QPAttrState
	if qp.Type != abi.QPTUD {
		a.AHAttr, a.PathMTU, a.DestQPNum, a.RQPSN = r.AV, r.PathMTU, r.DestQPN, r.RQPSN
		mask |= abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN
	}
	if qp.Type == abi.QPTRC || qp.Type == abi.QPTXRCRecv { // the responders (the kernel's qp_state_table)
		a.MaxDestRdAtomic, a.MinRNRTimer = r.MaxDestRdAtomic, r.MinRNRTimer
		mask |= abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
	}
	if r.ECE != 0 {
		mask |= abi.QPAttrECE
	}
	return qp.ModifyECE(&a, mask, r.ECE)
}

// RTSAttr are the attributes of the RTR→RTS step.
type RTSAttr struct {
	SQPSN       uint32
	Timeout     uint8
	RetryCnt    uint8
	RNRRetry    uint8
	MaxRdAtomic uint8
}

// ToRTS moves an RTR QP to RTS (UD, UC: only the SQ PSN is used; an XRC
// target QP, which sends nothing but responses, takes the timeout too).
func (qp *QP) ToRTS(r RTSAttr) error {
	a := abi.QPAttr{QPState: abi.QPSRTS, SQPSN: r.SQPSN}
	mask := abi.QPAttrState | abi.QPAttrSQPSN
	switch qp.Type {
	case abi.QPTRC, abi.QPTXRCSend: // the requesters (the kernel's qp_state_table)
		a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic = r.Timeout, r.RetryCnt, r.RNRRetry, r.MaxRdAtomic
		mask |= abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic
	case abi.QPTXRCRecv:
		a.Timeout = r.Timeout
		mask |= abi.QPAttrTimeout
	}
	return qp.Modify(&a, mask)
}

// SRQ is a shared receive queue.
type SRQ struct {
	ctx    *Context
	Handle uint32
	// XRCNum is an XRC SRQ's number (ibv_get_srq_num), which initiators
	// name in their WRs; 0 for an ordinary SRQ.
	XRCNum uint32
	rq     workQueue
	maxSGE uint32
	rec    []byte // the SRQ's doorbell record
}

// CreateSRQ creates an SRQ of maxWR (rounded up to a power of two) WQEs
// of up to maxSGE SGEs each.
func (pd *PD) CreateSRQ(maxWR, maxSGE, limit uint32) (*SRQ, error) {
	return pd.createSRQ(maxWR, maxSGE, limit, nil, nil)
}

// createSRQ creates an SRQ with CREATE_SRQ, or with xrcd (and the CQ of
// its completions) an XRC SRQ with CREATE_XRC_SRQ.
func (pd *PD) createSRQ(maxWR, maxSGE, limit uint32, xrcd *XRCD, cq *CQ) (*SRQ, error) {
	c := pd.ctx
	maxWR = roundPow2(max(maxWR, 1))
	stride := abi.RQWQESize(maxSGE)
	ring, err := c.Alloc(int(maxWR*stride), 64)
	if err != nil {
		return nil, err
	}
	req := abi.CmdCreateSRQReq{RingPA: ring.PA, PDHandle: pd.Handle, MaxWR: maxWR, MaxSGE: maxSGE, SRQLimit: limit}
	var r abi.RespCreateSRQ
	var num uint32
	if xrcd != nil {
		var rx abi.RespCreateXRCSRQ
		_, _, err = c.k.call(abi.CmdCreateXRCSRQ, &abi.CmdCreateXRCSRQReq{SRQ: req, XRCDHandle: xrcd.Handle, CQHandle: cq.Handle}, nil, nil, &rx)
		r, num = rx.SRQ, rx.SRQNum
	} else {
		_, _, err = c.k.call(abi.CmdCreateSRQ, &req, nil, nil, &r)
	}
	if err != nil {
		ring.Free()
		return nil, err
	}
	rec, err := c.createdRecord(r.DBIndex, abi.CmdDestroySRQ, r.SRQHandle, ring)
	if err != nil {
		return nil, err
	}
	return &SRQ{ctx: c, Handle: r.SRQHandle, XRCNum: num, maxSGE: maxSGE, rec: rec,
		rq: newWorkQueue(ring, maxWR, r.RQWQESize, rec, abi.OffDBSRQPI, abi.OffDBSRQCI, c.summaryOf(r.DBIndex))}, nil
}

// Modify sets the SRQ limit.
func (s *SRQ) Modify(limit uint32) error {
	_, _, err := s.ctx.k.call(abi.CmdModifySRQ, &abi.CmdModifySRQReq{SRQHandle: s.Handle, SRQLimit: limit}, nil, nil, nil)
	return err
}

// Query returns the SRQ's attributes.
func (s *SRQ) Query() (abi.RespQuerySRQ, error) {
	var r abi.RespQuerySRQ
	_, _, err := s.ctx.k.call(abi.CmdQuerySRQ, &abi.CmdHandleReq{Handle: s.Handle}, nil, nil, &r)
	return r, err
}

// Destroy destroys the SRQ (EBUSY while a QP uses it).
func (s *SRQ) Destroy() error {
	if err := s.ctx.destroy(abi.CmdDestroySRQ, s.Handle); err != nil {
		return err
	}
	s.rq.ring.Free()
	return nil
}
