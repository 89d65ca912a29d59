package verbs

import (
	"fmt"

	"github.com/vrnic/vrnic/abi"
)

// QPInitAttr describes a QP to create (ibv_qp_init_attr).
type QPInitAttr struct {
	Type   abi.QPType // abi.QPTRC, abi.QPTUC or abi.QPTUD
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
	c := pd.ctx
	if a.SendCQ == nil || a.RecvCQ == nil {
		return nil, fmt.Errorf("verbs: CreateQP needs a send and a receive CQ")
	}
	cp := a.Cap
	cp.MaxSendWR = roundPow2(max(cp.MaxSendWR, 1))
	sqBlocks := abi.SQWQEBlocks(cp.MaxSendSGE, cp.MaxInlineData)
	req := abi.CmdCreateQPReq{QPType: a.Type, PDHandle: pd.Handle, SendCQ: a.SendCQ.Handle,
		RecvCQ: a.RecvCQ.Handle, SRQHandle: abi.NoSRQ}
	if a.SigAll {
		req.SQSigAll = 1
	}
	sq, err := c.Alloc(int(cp.MaxSendWR*sqBlocks*abi.WQEBlock), 64)
	if err != nil {
		return nil, err
	}
	req.SQPA = sq.PA
	var rq *Buffer
	if a.SRQ != nil {
		req.SRQHandle = a.SRQ.Handle
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, 0
	} else {
		cp.MaxRecvWR = roundPow2(max(cp.MaxRecvWR, 1))
		if rq, err = c.Alloc(int(cp.MaxRecvWR*abi.RQWQESize(cp.MaxRecvSGE)), 64); err != nil {
			sq.Free()
			return nil, err
		}
		req.RQPA = rq.PA
	}
	req.Cap = cp
	var r abi.RespCreateQP
	if _, _, err := c.k.call(abi.CmdCreateQP, &req, nil, nil, &r); err != nil {
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
	_, _, err := qp.ctx.k.call(abi.CmdModifyQP, &abi.CmdModifyQPReq{QPN: qp.QPN, AttrMask: mask, Attr: *attr}, nil, nil, nil)
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
	if qp.Type == abi.QPTRC {
		a.MaxDestRdAtomic, a.MinRNRTimer = r.MaxDestRdAtomic, r.MinRNRTimer
		mask |= abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
	}
	return qp.Modify(&a, mask)
}

// RTSAttr are the attributes of the RTR→RTS step.
type RTSAttr struct {
	SQPSN       uint32
	Timeout     uint8
	RetryCnt    uint8
	RNRRetry    uint8
	MaxRdAtomic uint8
}

// ToRTS moves an RTR QP to RTS (UD, UC: only the SQ PSN is used).
func (qp *QP) ToRTS(r RTSAttr) error {
	a := abi.QPAttr{QPState: abi.QPSRTS, SQPSN: r.SQPSN}
	mask := abi.QPAttrState | abi.QPAttrSQPSN
	if qp.Type == abi.QPTRC {
		a.Timeout, a.RetryCnt, a.RNRRetry, a.MaxRdAtomic = r.Timeout, r.RetryCnt, r.RNRRetry, r.MaxRdAtomic
		mask |= abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic
	}
	return qp.Modify(&a, mask)
}

// SRQ is a shared receive queue.
type SRQ struct {
	ctx    *Context
	Handle uint32
	rq     workQueue
	maxSGE uint32
	rec    []byte // the SRQ's doorbell record
}

// CreateSRQ creates an SRQ of maxWR (rounded up to a power of two) WQEs
// of up to maxSGE SGEs each.
func (pd *PD) CreateSRQ(maxWR, maxSGE, limit uint32) (*SRQ, error) {
	c := pd.ctx
	maxWR = roundPow2(max(maxWR, 1))
	stride := abi.RQWQESize(maxSGE)
	ring, err := c.Alloc(int(maxWR*stride), 64)
	if err != nil {
		return nil, err
	}
	var r abi.RespCreateSRQ
	req := abi.CmdCreateSRQReq{RingPA: ring.PA, PDHandle: pd.Handle, MaxWR: maxWR, MaxSGE: maxSGE, SRQLimit: limit}
	if _, _, err := c.k.call(abi.CmdCreateSRQ, &req, nil, nil, &r); err != nil {
		ring.Free()
		return nil, err
	}
	rec, err := c.createdRecord(r.DBIndex, abi.CmdDestroySRQ, r.SRQHandle, ring)
	if err != nil {
		return nil, err
	}
	return &SRQ{ctx: c, Handle: r.SRQHandle, maxSGE: maxSGE, rec: rec,
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
