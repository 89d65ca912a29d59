package cm

import (
	"fmt"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// The CM IDs of the clients (ABI 1.2, vrnic_abi.h "Communication
// manager"): handles of a context that name a listener, a connection or a
// SIDR request. The Service carries the handshake and reports it on the
// context's event socket (struct vrnic_cm_event); it never touches a
// client's QP (the client moves it with MODIFY_QP, rdma_cm style, with the
// attributes of CM_INIT_QP_ATTR).

// clientIDs are the CM IDs of one client.
type clientIDs struct {
	c    Client
	ids  map[uint32]*cmID
	next uint32
}

// cmID is one CM ID of a client.
type cmID struct {
	cl     *clientIDs
	handle uint32
	qpType abi.QPType
	conn   ConnID // 0: none
	// active: the connection was made by CM_CONNECT.
	active bool
	// Listener: service ID, backlog and the requests not yet answered.
	listening bool
	serviceID uint64
	backlog   int
	pending   int
	// parent is the listener of a request not yet answered (CM_ACCEPT,
	// CM_REJECT).
	parent *cmID
	peer   [16]byte
	// init holds the INIT attributes of the ID's last connection: a
	// program may create the QP of a request whose peer has given up
	// already (rdma_create_qp after the connect request event), and gets
	// its QP; the accept then fails.
	init    abi.CMQPAttr
	hasInit bool
	last    string // the last event reported (operator view)
	// ece: created with abi.CMIDFlagECE (a listener's requests inherit
	// it): the client negotiates ECE (ece.go); its events are
	// abi.CMEventECE and its RC RTR attributes carry the agreed options.
	ece bool
}

// client returns the IDs of c, creating them.
func (s *Service) client(c Client) *clientIDs {
	cl := s.clients[c]
	if cl == nil {
		cl = &clientIDs{c: c, ids: map[uint32]*cmID{}}
		s.clients[c] = cl
	}
	return cl
}

// newID creates a CM ID of cl, charged to its uid.
func (s *Service) newID(cl *clientIDs, t abi.QPType) (*cmID, error) {
	if len(cl.ids) >= s.cfg.MaxIDsPerClient {
		return nil, errnoErr(unix.EAGAIN, "context holds %d CM IDs, the limit", s.cfg.MaxIDsPerClient)
	}
	if err := cl.c.CMChargeID(1); err != nil {
		return nil, err
	}
	for {
		cl.next++
		if _, used := cl.ids[cl.next]; cl.next != 0 && !used {
			break
		}
	}
	id := &cmID{cl: cl, handle: cl.next, qpType: t}
	cl.ids[id.handle] = id
	return id, nil
}

// destroy ends id as rdma_destroy_id does.
func (s *Service) destroy(id *cmID) {
	if id.listening {
		if s.listeners[id.serviceID] == id {
			delete(s.listeners, id.serviceID)
		}
		_ = s.mgr.Unlisten(id.serviceID, 0)
		id.listening = false
		for _, c := range id.cl.ids {
			if c.parent == id {
				c.parent = nil
			}
		}
	}
	if id.conn != 0 {
		_ = s.mgr.Destroy(id.conn)
	}
	s.forget(id)
	if id.cl.ids[id.handle] == id {
		delete(id.cl.ids, id.handle)
		_ = id.cl.c.CMChargeID(-1)
	}
}

// forget detaches id from its connection (the Manager forgot it or will
// report nothing more for it).
func (s *Service) forget(id *cmID) {
	if id.conn != 0 {
		if s.byConn[id.conn] == id {
			delete(s.byConn, id.conn)
		}
		id.conn = 0
	}
	if id.parent != nil {
		id.parent.pending--
		id.parent = nil
	}
}

// handle is the Manager's Handler: it reports one event to the context of
// its CM ID.
func (s *Service) handle(ev Event) {
	var out abi.CMEvent
	switch ev.Type {
	case EventConnectRequest, EventSIDRRequest:
		s.connectRequest(&ev)
		return
	}
	id := s.byConn[ev.Conn]
	if id == nil {
		return
	}
	out.CMID = id.handle
	forget := false
	switch ev.Type {
	case EventREPReceived:
		out.Type = abi.CMEventConnectResponse
		if r := ev.REP; r != nil {
			// The REP's Starting PSN: the PSN the peer expects, this
			// side's SQ PSN (the RTS sq_psn).
			out.PeerQPN, out.PeerPSN = r.LocalQPN, r.StartingPSN
			out.ResponderResources, out.InitiatorDepth = r.ResponderResources, r.InitiatorDepth
			out.RNRRetryCount, out.SRQ = r.RNRRetryCount, b2u(r.SRQ)
		}
		s.qpAttr(id, &out.QPAttr, ev.Conn, QPStateInit, QPStateRTR, QPStateRTS)
	case EventEstablished:
		out.Type = abi.CMEventEstablished
	case EventRejected:
		out.Type, out.Status = abi.CMEventRejected, uint32(ev.Reason)
		st, err := s.mgr.State(ev.Conn)
		forget = err != nil || st == StateIdle
	case EventDisconnectRequest:
		out.Type, out.Status = abi.CMEventDisconnected, abi.CMDisconnectRequest
	case EventDisconnected:
		out.Type, out.Status = abi.CMEventDisconnected, abi.CMDisconnectReply
		if ev.TimedOut {
			out.Status = abi.CMDisconnectTimedOut
		}
	case EventTimeWaitExit:
		out.Type, forget = abi.CMEventTimeWaitExit, true
	case EventUnreachable:
		out.Type, out.Status, forget = abi.CMEventUnreachable, uint32(unix.ETIMEDOUT), true
	case EventSIDRReply:
		forget = true
		out.Type = abi.CMEventConnectResponse
		if r := ev.SIDRRep; r != nil {
			if r.Status != SIDRSuccess {
				out.Type, out.Status = abi.CMEventUnreachable, uint32(r.Status)
			}
			out.PeerQPN, out.PeerQKey = r.QPN, r.QKey
		}
	default:
		return
	}
	if forget {
		s.forget(id)
	}
	s.post(id, &out, &ev)
}

// connectRequest gives a REQ or SIDR_REQ to its listener as a new CM ID,
// or refuses it (no listener, backlog full, the context at its limit).
func (s *Service) connectRequest(ev *Event) {
	sidr := ev.Type == EventSIDRRequest
	refuse := func() {
		if sidr {
			_ = s.mgr.SIDRReply(ev.Conn, SIDRReplyParams{Status: SIDRReject})
		} else {
			_ = s.mgr.Reject(ev.Conn, RejectNoResources, nil, nil)
		}
	}
	// No check of l.pending against l.backlog: the Manager holds the
	// listener to its backlog (ListenBacklog), shedding its oldest
	// half-open requests (they come here as EventRejected) rather than
	// turning the newest away.
	l := s.listeners[ev.ServiceID]
	if l == nil || (l.qpType == abi.QPTUD) != sidr {
		refuse()
		return
	}
	id, err := s.newID(l.cl, l.qpType)
	if err != nil {
		s.log.Debug("cm: connect request refused", "service", ev.ServiceID, "err", err)
		refuse()
		return
	}
	id.conn, id.parent, id.peer, id.serviceID = ev.Conn, l, ev.Peer, ev.ServiceID
	id.ece = l.ece
	l.pending++
	s.byConn[ev.Conn] = id
	out := abi.CMEvent{Type: abi.CMEventConnectRequest, CMID: id.handle, ListenID: l.handle}
	if r := ev.REQ; r != nil {
		// PeerPSN is the REQ's Starting PSN: the PSN the peer expects,
		// this side's SQ PSN (the RTS sq_psn); the RTR rq_psn is this
		// side's own, which CM_ACCEPT announces.
		out.PeerQPN, out.PeerPSN = r.LocalQPN, r.StartingPSN
		out.ResponderResources, out.InitiatorDepth = r.ResponderResources, r.InitiatorDepth
		out.RetryCount, out.RNRRetryCount, out.SRQ = r.RetryCount, r.RNRRetryCount, b2u(r.SRQ)
		s.qpAttr(id, &out.QPAttr, ev.Conn, QPStateInit, QPStateRTR, QPStateRTS)
	}
	s.post(id, &out, ev)
	if !sidr {
		// As rdma_cm (cma_ib_req_handler): while the program has not
		// answered, a repeated REQ gets an MRA that extends the peer's
		// wait by the service timeout, so a listener that falls behind a
		// burst of requests is not taken for an unreachable one.
		_ = s.mgr.MRA(ev.Conn, CMAMRAServiceTimeout, true, nil)
	}
}

// post fills what every event carries and sends it to id's context.
func (s *Service) post(id *cmID, out *abi.CMEvent, ev *Event) {
	out.ServiceID, out.PeerGID, out.QPType = ev.ServiceID, ev.Peer, uint8(id.qpType)
	if out.ServiceID == 0 {
		out.ServiceID = id.serviceID
	}
	if out.PeerGID == ([16]byte{}) {
		out.PeerGID = id.peer
	}
	out.PrivateDataLen = uint8(copy(out.PrivateData[:], ev.PrivateData))
	id.last = out.Type.String()
	var v any = out
	if id.ece {
		// ABI 1.5: the event and the ECE of the REQ or REP it reports.
		v = &abi.CMEventECE{Ev: *out, PeerECE: abi.CMECE{VendorID: ev.ECE.VendorID, Options: ev.ECE.Options}}
	}
	b := make([]byte, abi.Sizeof(v))
	if _, err := abi.Marshal(b, v); err != nil {
		s.log.Error("cm: cannot encode event", "event", out.Type, "err", err)
		return
	}
	id.cl.c.CMPostEvent(b)
}

// qpAttr fills dst with the connection's QP attributes for the states
// given, and keeps the INIT ones on the ID.
func (s *Service) qpAttr(id *cmID, dst *abi.CMQPAttr, conn ConnID, states ...QPState) {
	for _, st := range states {
		a, err := s.mgr.QPAttr(conn, st)
		if err != nil {
			continue
		}
		mergeQPAttr(dst, &a, id.takesECE())
		if st == QPStateInit {
			id.init, id.hasInit = abi.CMQPAttr{}, true
			mergeQPAttr(&id.init, &a, false)
		}
	}
}

// takesECE reports whether id's RTR attributes carry the agreed ECE
// options: an RC ID of a client that negotiates them.
func (id *cmID) takesECE() bool { return id.ece && id.qpType == abi.QPTRC }

// mergeQPAttr adds the attributes of one transition to dst, with ece the
// agreed ECE options of an RTR (abi.QPAttrECE).
func mergeQPAttr(dst *abi.CMQPAttr, a *QPAttr, ece bool) {
	dst.AttrMask |= abi.QPAttrState
	switch a.State {
	case QPStateInit:
		dst.QPState = abi.QPSInit
		dst.AttrMask |= abi.QPAttrAccessFlags | abi.QPAttrPKeyIndex | abi.QPAttrPort
		var acc uint32
		if a.AccessFlags&AccessRemoteWrite != 0 {
			acc |= abi.AccessRemoteWrite
		}
		if a.AccessFlags&AccessRemoteRead != 0 {
			acc |= abi.AccessRemoteRead
		}
		if a.AccessFlags&AccessRemoteAtomic != 0 {
			acc |= abi.AccessRemoteAtomic
		}
		dst.QPAccessFlags, dst.PortNum, dst.PKeyIndex = acc, 1, 0
	case QPStateRTR:
		dst.QPState = abi.QPSRTR
		dst.AttrMask |= abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN |
			abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
		dst.PathMTU, dst.DestQPNum, dst.RQPSN = abi.MTU(a.PathMTU), a.DestQPN, a.RQPSN
		dst.DGID, dst.FlowLabel, dst.HopLimit = a.AH.DGID, a.AH.FlowLabel, a.AH.HopLimit
		dst.TrafficClass, dst.SL, dst.SGIDIndex = a.AH.TrafficClass, a.AH.SL, 0
		dst.MaxDestRdAtomic, dst.MinRNRTimer = a.MaxDestRdAtomic, a.MinRNRTimer
		if ece {
			dst.AttrMask |= abi.QPAttrECE
			dst.ECEOptions = uint16(a.ECE & abi.ECEOptions)
		}
	case QPStateRTS:
		dst.QPState = abi.QPSRTS
		dst.AttrMask |= abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic
		dst.SQPSN, dst.Timeout, dst.RetryCnt, dst.RNRRetry, dst.MaxRdAtomic = a.SQPSN, a.Timeout, a.RetryCount, a.RNRRetry, a.MaxRdAtomic
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Info is the operator's view of the communication manager (vrnicctl cm):
// the counters and every CM ID, ordered by context and handle.
func (s *Service) Info() admin.CMInfo {
	var info admin.CMInfo
	err := s.call(func() error {
		info.Enabled = true
		info.QP1 = s.cfg.GSI.Stats()
		info.QP1.Dropped += s.madDrops.Load()
		st := s.mgr.Stats()
		for i := range st.Sent {
			info.MADsSent += st.Sent[i]
			info.Retransmissions += st.Retries[i]
			info.MADsReceived += st.Received[i]
			info.Duplicates += st.Duplicates[i]
		}
		info.Invalid, info.Unmatched = st.Invalid+st.Unsupported, st.Unmatched
		info.HalfOpen, info.Shed, info.Expired = st.HalfOpen, st.Shed, st.Expired
		info.RejectsSent, info.RejectsReceived = rejectNamesOf(st.RejectsSent), rejectNamesOf(st.RejectsReceived)
		info.IDs = []admin.CMIDInfo{}
		info.Connections = len(s.byConn)
		for _, cl := range s.clients {
			for _, id := range cl.ids {
				info.IDs = append(info.IDs, s.idInfo(id))
			}
		}
		return nil
	})
	if err != nil {
		return admin.CMInfo{}
	}
	sort.Slice(info.IDs, func(i, j int) bool {
		a, b := info.IDs[i], info.IDs[j]
		return a.Ctx < b.Ctx || a.Ctx == b.Ctx && a.ID < b.ID
	})
	info.Total = len(info.IDs)
	return info
}

func (s *Service) idInfo(id *cmID) admin.CMIDInfo {
	e := admin.CMIDInfo{Ctx: id.cl.c.CMContext(), ID: id.handle, QPType: id.qpType.String(),
		LastEvent: id.last, ServiceID: id.serviceID}
	switch {
	case id.listening:
		e.Role, e.Backlog, e.Pending = "listen", id.backlog, id.pending
	case id.active:
		e.Role = "active"
	case id.conn != 0 || id.parent != nil:
		e.Role = "passive"
	default:
		e.Role = "idle"
	}
	if id.conn != 0 {
		e.Conn = uint32(id.conn)
		if cs, err := s.mgr.State(id.conn); err == nil {
			e.State = cs.String()
		}
		e.Peer = fmt.Sprint(GID(id.peer))
		if ece := s.mgr.ConnECE(id.conn); ece != 0 {
			e.ECE = abi.ECEString(ece)
		}
	}
	return e
}

// rejectNamesOf keys REJ counts by the reason's words ("other" for a
// reason the IBTA does not define); nil for none.
func rejectNamesOf(m map[RejectReason]uint64) map[string]uint64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(m))
	for r, n := range m {
		name := "other"
		if _, ok := rejectNames[r]; ok {
			name = r.String()
		}
		out[name] += n
	}
	return out
}
