package verbs

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// CMID is a communication manager ID (ABI 1.2): the daemon carries the
// CM handshake on its QP1 for it, and the client moves its QP with the
// attributes the events carry (ApplyQPAttr), as librdmacm does. Events
// arrive on the context's event socket (Context.OpenAsyncEvents; see
// AsyncEvents.GetCM).
type CMID struct {
	ctx    *Context
	Handle uint32
	Type   abi.QPType
}

// CreateCMID creates a CM ID for a QP of type t (RC, UC; UD for SIDR).
func (c *Context) CreateCMID(t abi.QPType) (*CMID, error) {
	var r abi.RespCMID
	if _, _, err := c.k.call(abi.CmdCMCreateID, &abi.CmdCMCreateIDReq{QPType: t}, nil, nil, &r); err != nil {
		return nil, err
	}
	return &CMID{ctx: c, Handle: r.CMID, Type: t}, nil
}

// CMIDFromEvent returns the CM ID a CONNECT_REQUEST created.
func (c *Context) CMIDFromEvent(ev *abi.CMEvent) *CMID {
	return &CMID{ctx: c, Handle: ev.CMID, Type: abi.QPType(ev.QPType)}
}

// Destroy ends the ID's connection (as rdma_destroy_id) and frees it.
func (id *CMID) Destroy() error {
	_, _, err := id.ctx.k.call(abi.CmdCMDestroyID, &abi.CmdHandleReq{Handle: id.Handle}, nil, nil, nil)
	return err
}

// Listen makes connection requests for serviceID raise CONNECT_REQUEST.
func (id *CMID) Listen(serviceID uint64, backlog int) error {
	_, _, err := id.ctx.k.call(abi.CmdCMListen, &abi.CmdCMListenReq{CMID: id.Handle, ServiceID: serviceID, Backlog: uint32(backlog)}, nil, nil, nil)
	return err
}

// ConnectParams are what Connect sends (see struct vrnic_cmd_cm_connect).
type ConnectParams struct {
	QPN uint32
	// StartingPSN is the first PSN the QP expects to receive: its RQ PSN,
	// which the RTR attributes after CONNECT_RESPONSE carry, and the
	// PSN the peer sends from (Linux semantics: rdma_cm puts the ID's
	// random seq_num here). The QP sends from the PSN in the peer's REP
	// (the RTS attributes' SQPSN).
	StartingPSN        uint32
	ServiceID          uint64
	DGID               [16]byte
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	SRQ                bool
	PathMTU            abi.MTU // 0: the port's; the REQ offers at most the port's active MTU
	// ResponseTimeout (exponent, 0: 20) and MaxCMRetries (0: 15) bound
	// how long the request waits for an answer.
	ResponseTimeout uint8
	MaxCMRetries    uint8
	PrivateData     []byte
}

func putPrivate(dst *[abi.CMMaxPrivateData]byte, pd []byte) (uint8, error) {
	if len(pd) > abi.CMMaxPrivateData {
		return 0, fmt.Errorf("verbs: %d bytes of private data, at most %d", len(pd), abi.CMMaxPrivateData)
	}
	return uint8(copy(dst[:], pd)), nil
}

// Connect sends the REQ (RC, UC) or the SIDR_REQ (UD).
func (id *CMID) Connect(p ConnectParams) error {
	req := abi.CmdCMConnectReq{CMID: id.Handle, QPN: p.QPN, StartingPSN: p.StartingPSN, ServiceID: p.ServiceID, DGID: p.DGID,
		PathMTU: uint8(p.PathMTU), ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RetryCount: p.RetryCount, RNRRetryCount: p.RNRRetryCount, SRQ: b2u8(p.SRQ),
		CMResponseTimeout: p.ResponseTimeout, MaxCMRetries: p.MaxCMRetries}
	n, err := putPrivate(&req.PrivateData, p.PrivateData)
	if err != nil {
		return err
	}
	req.PrivateDataLen = n
	_, _, err = id.ctx.k.call(abi.CmdCMConnect, &req, nil, nil, nil)
	return err
}

// AcceptParams are what Accept sends (struct vrnic_cmd_cm_accept).
type AcceptParams struct {
	QPN uint32
	// StartingPSN is the first PSN the QP expects to receive: the RQPSN
	// of its RTR attributes (the CONNECT_REQUEST's QPAttr, or
	// InitQPAttr(abi.QPSRTR)), which the daemon drew when the REQ
	// arrived; the peer sends from it. The QP sends from the PSN the
	// REQ announced (the RTS attributes' SQPSN, the event's PeerPSN).
	StartingPSN        uint32
	QKey               uint32 // UD
	ResponderResources uint8
	InitiatorDepth     uint8
	RNRRetryCount      uint8
	SRQ                bool
	PrivateData        []byte
}

// Accept answers a CONNECT_REQUEST with the REP (UD: the SIDR_REP).
func (id *CMID) Accept(p AcceptParams) error {
	req := abi.CmdCMAcceptReq{CMID: id.Handle, QPN: p.QPN, StartingPSN: p.StartingPSN, QKey: p.QKey,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth, RNRRetryCount: p.RNRRetryCount, SRQ: b2u8(p.SRQ)}
	n, err := putPrivate(&req.PrivateData, p.PrivateData)
	if err != nil {
		return err
	}
	req.PrivateDataLen = n
	_, _, err = id.ctx.k.call(abi.CmdCMAccept, &req, nil, nil, nil)
	return err
}

func (id *CMID) private(op abi.Cmd, pd []byte) error {
	req := abi.CmdCMPrivateReq{CMID: id.Handle}
	n, err := putPrivate(&req.PrivateData, pd)
	if err != nil {
		return err
	}
	req.PrivateDataLen = n
	_, _, err = id.ctx.k.call(op, &req, nil, nil, nil)
	return err
}

// Reject rejects a connection request (REJ consumer defined, or a SIDR
// reject) with private data.
func (id *CMID) Reject(pd []byte) error { return id.private(abi.CmdCMReject, pd) }

// Disconnect sends the DREQ (or the DREP answering the peer's).
func (id *CMID) Disconnect(pd []byte) error { return id.private(abi.CmdCMDisconnect, pd) }

// Establish sends the RTU (active side, after CONNECT_RESPONSE) or marks
// the connection established (passive side).
func (id *CMID) Establish() error {
	_, _, err := id.ctx.k.call(abi.CmdCMEstablish, &abi.CmdHandleReq{Handle: id.Handle}, nil, nil, nil)
	return err
}

// InitQPAttr returns the attributes for moving the ID's QP to state (what
// rdma_init_qp_attr returns).
func (id *CMID) InitQPAttr(state abi.QPState) (abi.CMQPAttr, error) {
	var r abi.CMQPAttr
	_, _, err := id.ctx.k.call(abi.CmdCMInitQPAttr, &abi.CmdCMInitQPAttrReq{CMID: id.Handle, QPState: state}, nil, nil, &r)
	return r, err
}

// ApplyQPAttr moves qp to a.QPState with the attributes of a (the
// result of InitQPAttr), the agreed ECE options included.
func (qp *QP) ApplyQPAttr(a *abi.CMQPAttr) error {
	q := abi.QPAttr{QPState: a.QPState, QPAccessFlags: a.QPAccessFlags, PKeyIndex: a.PKeyIndex, PortNum: a.PortNum,
		PathMTU: a.PathMTU, DestQPNum: a.DestQPNum, RQPSN: a.RQPSN, SQPSN: a.SQPSN,
		MaxDestRdAtomic: a.MaxDestRdAtomic, MinRNRTimer: a.MinRNRTimer, Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, MaxRdAtomic: a.MaxRdAtomic,
		AHAttr: abi.AHAttr{DGID: a.DGID, FlowLabel: a.FlowLabel, SGIDIndex: a.SGIDIndex, HopLimit: a.HopLimit,
			TrafficClass: a.TrafficClass, SL: a.SL, PortNum: 1}}
	return qp.ModifyECE(&q, a.AttrMask, uint32(a.ECEOptions))
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// GetCM returns the next CM event (struct vrnic_cm_event), waiting up
// to timeout (negative: no bound). Asynchronous verbs events read on the
// way are kept for Get.
func (e *AsyncEvents) GetCM(timeout time.Duration) (abi.CMEvent, error) {
	if len(e.cmQ) > 0 {
		ev := e.cmQ[0]
		e.cmQ = e.cmQ[1:]
		return ev, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		async, cmev, isCM, err := e.readBy(deadline, timeout)
		if err != nil {
			return abi.CMEvent{}, err
		}
		if isCM {
			return cmev, nil
		}
		e.asyncQ = append(e.asyncQ, async)
		if async.Type == abi.EventDeviceFatal {
			return abi.CMEvent{}, ErrClosed
		}
	}
}

// readBy is read waiting until deadline, the end of a wait of timeout
// (negative: no bound) that began earlier.
func (e *AsyncEvents) readBy(deadline time.Time, timeout time.Duration) (abi.AsyncEvent, abi.CMEvent, bool, error) {
	left := time.Duration(-1)
	if timeout >= 0 {
		left = max(time.Until(deadline), 0)
	}
	return e.read(left)
}

// read reads one datagram of the event socket, waiting up to timeout.
func (e *AsyncEvents) read(timeout time.Duration) (ev abi.AsyncEvent, cmev abi.CMEvent, isCM bool, err error) {
	if e.fd < 0 || e.fatal {
		return ev, cmev, false, ErrClosed
	}
	ms := -1
	if timeout >= 0 {
		ms = int(timeout.Milliseconds())
	}
	pfd := []unix.PollFd{{Fd: int32(e.fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ev, cmev, false, fmt.Errorf("verbs: poll event socket: %w", err)
		}
		if n == 0 {
			return ev, cmev, false, ErrNoEvent
		}
		break
	}
	var b [abi.SizeofCMEvent]byte
	n, err := unix.Read(e.fd, b[:])
	switch {
	case err == unix.EAGAIN:
		return ev, cmev, false, ErrNoEvent
	case err != nil:
		return ev, cmev, false, fmt.Errorf("verbs: read event socket: %w", err)
	case n == 0: // end of file: the daemon is gone
		e.fatal = true
		ev.Type = abi.EventDeviceFatal
		return ev, cmev, false, nil
	}
	if n == abi.SizeofCMEvent {
		if _, err := abi.Unmarshal(b[:n], &cmev); err != nil {
			return ev, cmev, false, fmt.Errorf("%w: CM event: %v", ErrProtocol, err)
		}
		return ev, cmev, true, nil
	}
	if _, err := abi.Unmarshal(b[:n], &ev); err != nil {
		return ev, cmev, false, fmt.Errorf("%w: event of %d bytes: %v", ErrProtocol, n, err)
	}
	return ev, cmev, false, nil
}
