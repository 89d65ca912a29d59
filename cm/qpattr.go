package cm

import "github.com/vrnic/vrnic/roce"

import "fmt"

// QPState is a QP state the owner asks attributes for.
type QPState uint8

// QP states QPAttr serves.
const (
	QPStateInit QPState = iota + 1
	QPStateRTR
	QPStateRTS
)

// Access flags of a connected QP.
const (
	AccessRemoteWrite  = 1 << 1 // IB_ACCESS_REMOTE_WRITE
	AccessRemoteRead   = 1 << 2 // IB_ACCESS_REMOTE_READ
	AccessRemoteAtomic = 1 << 3 // IB_ACCESS_REMOTE_ATOMIC
)

// AHAttr is the address vector of a connected QP (the RoCE v2 GRH).
type AHAttr struct {
	DGID, SGID   GID
	FlowLabel    uint32
	HopLimit     uint8
	TrafficClass uint8
	SL           uint8
	StaticRate   uint8
}

// QPAttr holds the attributes of one QP transition, as Linux
// ib_cm_init_qp_attr (and so rdma_init_qp_attr) returns them. Only the
// fields of the requested state are set.
type QPAttr struct {
	State QPState

	// INIT.
	AccessFlags int
	PKey        uint16 // the partition (index 0 on RoCE: 0xFFFF)
	Port        uint8

	// RTR.
	AH              AHAttr
	PathMTU         roce.MTU
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic uint8 // RC
	MinRNRTimer     uint8 // RC
	// ECE are the ECE options agreed with the peer (RC; ece.go): on the
	// passive side before Accept, those of the REQ this CM supports.
	ECE uint32

	// RTS.
	SQPSN       uint32
	Timeout     uint8 // local ACK timeout exponent
	RetryCount  uint8 // RC
	RNRRetry    uint8 // RC
	MaxRdAtomic uint8 // RC
}

// QPAttr returns the attributes the owner applies to the connection's QP
// to move it to state: INIT in any handshake state or ESTABLISHED, RTR
// and RTS once the peer's QPN is known (REQ_RCVD onwards on the passive
// side, REP_RCVD onwards on the active side), as Linux allows
// (ib_cm_init_qp_attr: cm_init_qp_init_attr, cm_init_qp_rtr_attr,
// cm_init_qp_rts_attr; rdma_init_qp_attr on top).
//
// PSNs, as in Linux: the Starting PSN a side puts in its REQ or REP is
// the PSN it expects to receive. So RTR's RQPSN is this side's own
// (active: ConnectParams.StartingPSN, which its REQ announced; passive:
// the PSN the Manager drew when the REQ arrived, as rdma_cm draws a
// connection ID's seq_num, which Accept must announce in the REP), and
// RTS's SQPSN is the peer's: the REQ's Starting PSN on the passive side
// (known from REQ_RCVD on, so RTS may precede the REP), the REP's on the
// active side.
//
// Limits: the path MTU is at most Config.PortMTU (the passive side's QP
// uses the smaller of the REQ's MTU and its port's), and MaxDestRdAtomic
// and MaxRdAtomic are at most Config.MaxRdAtomic and
// Config.MaxInitRdAtomic: what the peer offers is clamped to what the
// device supports, not refused (librdmacm clamps in rdma_accept; the
// kernel's rxe refuses a max_rd_atomic past the device's).
func (m *Manager) QPAttr(id ConnID, state QPState) (QPAttr, error) {
	c := m.conns[uint32(id)]
	if c == nil || c.destroyed {
		return QPAttr{}, fmt.Errorf("%w: %d", ErrUnknownConn, id)
	}
	a := QPAttr{State: state}
	known := false
	switch c.state {
	case StateREQRcvd, StateMRAREQSent, StateREPRcvd, StateMRAREPSent, StateREPSent, StateMRAREPRcvd, StateEstablished:
		known = true
	case StateREQSent, StateMRAREQRcvd:
	default:
		return QPAttr{}, fmt.Errorf("%w: QPAttr in %v", ErrState, c.state)
	}
	switch state {
	case QPStateInit:
		a.AccessFlags = AccessRemoteWrite
		if c.responderResources > 0 {
			a.AccessFlags |= AccessRemoteRead | AccessRemoteAtomic
		}
		a.PKey = c.pkey
		a.Port = 1
	case QPStateRTR:
		if !known {
			return QPAttr{}, fmt.Errorf("%w: RTR attributes in %v", ErrState, c.state)
		}
		p := &c.path
		a.AH = AHAttr{DGID: p.DGID, SGID: p.SGID, FlowLabel: p.FlowLabel, HopLimit: p.HopLimit,
			TrafficClass: p.TrafficClass, SL: p.SL, StaticRate: p.Rate}
		a.PathMTU = m.portMTU(c.pathMTU)
		a.DestQPN = c.remoteQPN
		a.RQPSN = c.rqPSN
		if c.qpType == TransportRC {
			a.MaxDestRdAtomic = clampDepth(c.responderResources, m.cfg.MaxRdAtomic)
			a.ECE = c.ece
		}
	case QPStateRTS:
		if !known {
			return QPAttr{}, fmt.Errorf("%w: RTS attributes in %v", ErrState, c.state)
		}
		a.SQPSN = c.sqPSN
		a.Timeout = c.ackTimeout
		if c.qpType == TransportRC {
			a.RetryCount = c.retryCount
			a.RNRRetry = c.rnrRetryCount
			a.MaxRdAtomic = clampDepth(c.initiatorDepth, m.cfg.MaxInitRdAtomic)
		}
	default:
		return QPAttr{}, fmt.Errorf("%w: QP state %d", ErrInvalidParam, state)
	}
	return a, nil
}

// clampDepth returns v, at most limit (0: no limit).
func clampDepth(v, limit uint8) uint8 {
	if limit != 0 && v > limit {
		return limit
	}
	return v
}
