package device

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/cm"
	"github.com/vrnic/vrnic/roce"
)

// The communication manager (ABI 1.2, vrnic_abi.h "Communication
// manager").
//
// One cm.Manager per device carries the CM MADs on the device's QP1
// (Config.GSI): the Manager's Sender is QP1, and QP1 hands it every MAD of
// class 0x07. Clients drive it through CM IDs, handles of their context;
// the device never touches a client's QP for the CM (the client moves it
// with MODIFY_QP, rdma_cm style), it only carries the handshake and
// reports it on the context's event socket (struct vrnic_cm_event).
//
// Locks, in order: Device.mu (commands) → cmState.mu → the Manager's own.
// The Manager's Handler only queues the event (evQ) for the dispatcher
// goroutine, which takes cmState.mu and never Device.mu: so a command may
// call the Manager with cmState.mu held, and an event is never handled
// before the command that created its connection has recorded it.
type cmState struct {
	d   *Device
	mgr *cm.Manager
	gsi GSI

	mu        sync.Mutex
	byConn    map[cm.ConnID]*cmID
	listeners map[uint64]*cmID // by service ID

	evMu   sync.Mutex
	evQ    []cm.Event
	evWake chan struct{}
	stop   chan struct{}
	done   chan struct{}
}

// GSI is the device's QP1 as the CM uses it (dataplane.QP1).
type GSI interface {
	// SendMAD sends a 256-byte MAD to QP1 of the port with GID dst.
	SendMAD(dst [16]byte, mad []byte) error
	// RegisterAgent makes h receive the MADs of a management class.
	RegisterAgent(class uint8, h func(src [16]byte, mad []byte))
	// Stats returns QP1's counters.
	Stats() admin.QP1Stats
}

// maxCMIDs bounds the CM IDs of a context.
const maxCMIDs = 4096

// cmID is one CM ID of a context.
type cmID struct {
	cx     *Context
	handle uint32
	qpType abi.QPType
	conn   cm.ConnID // 0: none
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
	last   string // the last event reported (operator view)
}

func newCMState(d *Device, gsi GSI) (*cmState, error) {
	s := &cmState{d: d, gsi: gsi, byConn: map[cm.ConnID]*cmID{}, listeners: map[uint64]*cmID{},
		evWake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	mgr, err := cm.NewManager(cm.Config{
		CAGUID:   nodeGUID(d.cfg.Name),
		AckDelay: 15,
		Sender:   cm.SenderFunc(func(dst cm.GID, mad []byte) error { return gsi.SendMAD(dst, mad) }),
		Clock:    cm.SystemClock{},
		Handler:  s.queue,
		Logger:   d.log,
	})
	if err != nil {
		return nil, err
	}
	s.mgr = mgr
	gsi.RegisterAgent(cm.MgmtClassCM, func(src [16]byte, mad []byte) { _ = mgr.HandleMAD(cm.GID(src), mad) })
	go s.run()
	return s, nil
}

func (s *cmState) close() {
	s.mgr.Close()
	close(s.stop)
	<-s.done
}

// queue is the Manager's Handler: it never blocks.
func (s *cmState) queue(ev cm.Event) {
	s.evMu.Lock()
	s.evQ = append(s.evQ, ev)
	s.evMu.Unlock()
	select {
	case s.evWake <- struct{}{}:
	default:
	}
}

func (s *cmState) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-s.evWake:
		}
		for {
			s.evMu.Lock()
			q := s.evQ
			s.evQ = nil
			s.evMu.Unlock()
			if len(q) == 0 {
				break
			}
			for i := range q {
				s.handle(&q[i])
			}
		}
	}
}

// handle reports one event of the Manager to the context of its CM ID.
func (s *cmState) handle(ev *cm.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out abi.CMEvent
	switch ev.Type {
	case cm.EventConnectRequest, cm.EventSIDRRequest:
		l := s.listeners[ev.ServiceID]
		sidr := ev.Type == cm.EventSIDRRequest
		// No check of l.pending against l.backlog: the Manager holds the
		// listener to its backlog (ListenBacklog), shedding its oldest
		// half-open requests (they come here as EventRejected) rather
		// than turning the newest away.
		if l == nil || len(l.cx.cmIDs) >= maxCMIDs || (l.qpType == abi.QPTUD) != sidr {
			if sidr {
				_ = s.mgr.SIDRReply(ev.Conn, cm.SIDRReplyParams{Status: cm.SIDRReject})
			} else {
				_ = s.mgr.Reject(ev.Conn, cm.RejectNoResources, nil, nil)
			}
			return
		}
		id := l.cx.newCMID(l.qpType)
		id.conn, id.parent, id.peer, id.serviceID = ev.Conn, l, ev.Peer, ev.ServiceID
		l.pending++
		s.byConn[ev.Conn] = id
		out = abi.CMEvent{Type: abi.CMEventConnectRequest, CMID: id.handle, ListenID: l.handle}
		if r := ev.REQ; r != nil {
			out.PeerQPN, out.PeerPSN = r.LocalQPN, r.StartingPSN
			out.ResponderResources, out.InitiatorDepth = r.ResponderResources, r.InitiatorDepth
			out.RetryCount, out.RNRRetryCount, out.SRQ = r.RetryCount, r.RNRRetryCount, b2u(r.SRQ)
			s.qpAttr(&out, ev.Conn, cm.QPStateInit, cm.QPStateRTR)
		}
		s.post(id, &out, ev)
		if !sidr {
			// As rdma_cm (cma_ib_req_handler): while the program has
			// not answered, a repeated REQ gets an MRA that extends the
			// peer's wait by the service timeout (about 69 s), so a
			// listener that falls behind a burst of requests is not
			// taken for an unreachable one.
			_ = s.mgr.MRA(ev.Conn, cm.CMAMRAServiceTimeout, true, nil)
		}
		return
	}
	id := s.byConn[ev.Conn]
	if id == nil {
		return
	}
	out.CMID = id.handle
	forget := false
	switch ev.Type {
	case cm.EventREPReceived:
		out.Type = abi.CMEventConnectResponse
		if r := ev.REP; r != nil {
			out.PeerQPN, out.PeerPSN = r.LocalQPN, r.StartingPSN
			out.ResponderResources, out.InitiatorDepth = r.ResponderResources, r.InitiatorDepth
			out.RNRRetryCount, out.SRQ = r.RNRRetryCount, b2u(r.SRQ)
		}
		s.qpAttr(&out, ev.Conn, cm.QPStateInit, cm.QPStateRTR, cm.QPStateRTS)
	case cm.EventEstablished:
		out.Type = abi.CMEventEstablished
	case cm.EventRejected:
		out.Type, out.Status = abi.CMEventRejected, uint32(ev.Reason)
		st, err := s.mgr.State(ev.Conn)
		forget = err != nil || st == cm.StateIdle
	case cm.EventDisconnectRequest:
		out.Type, out.Status = abi.CMEventDisconnected, abi.CMDisconnectRequest
	case cm.EventDisconnected:
		out.Type, out.Status = abi.CMEventDisconnected, abi.CMDisconnectReply
		if ev.TimedOut {
			out.Status = abi.CMDisconnectTimedOut
		}
	case cm.EventTimeWaitExit:
		out.Type, forget = abi.CMEventTimeWaitExit, true
	case cm.EventUnreachable:
		out.Type, out.Status, forget = abi.CMEventUnreachable, uint32(unix.ETIMEDOUT), true
	case cm.EventSIDRReply:
		forget = true
		out.Type = abi.CMEventConnectResponse
		if r := ev.SIDRRep; r != nil {
			if r.Status != cm.SIDRSuccess {
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
	s.post(id, &out, ev)
}

// post fills what every event carries and sends it to id's context.
func (s *cmState) post(id *cmID, out *abi.CMEvent, ev *cm.Event) {
	out.ServiceID, out.PeerGID, out.QPType = ev.ServiceID, ev.Peer, uint8(id.qpType)
	if out.ServiceID == 0 {
		out.ServiceID = id.serviceID
	}
	if out.PeerGID == ([16]byte{}) {
		out.PeerGID = id.peer
	}
	out.PrivateDataLen = uint8(copy(out.PrivateData[:], ev.PrivateData))
	id.last = out.Type.String()
	id.cx.postCMEvent(out)
}

// qpAttr fills the event's QP attributes for the states given.
func (s *cmState) qpAttr(out *abi.CMEvent, conn cm.ConnID, states ...cm.QPState) {
	for _, st := range states {
		a, err := s.mgr.QPAttr(conn, st)
		if err != nil {
			continue
		}
		mergeQPAttr(&out.QPAttr, &a)
	}
}

// mergeQPAttr adds the attributes of one transition to dst.
func mergeQPAttr(dst *abi.CMQPAttr, a *cm.QPAttr) {
	dst.AttrMask |= abi.QPAttrState
	switch a.State {
	case cm.QPStateInit:
		dst.QPState = abi.QPSInit
		dst.AttrMask |= abi.QPAttrAccessFlags | abi.QPAttrPKeyIndex | abi.QPAttrPort
		var acc uint32
		if a.AccessFlags&cm.AccessRemoteWrite != 0 {
			acc |= abi.AccessRemoteWrite
		}
		if a.AccessFlags&cm.AccessRemoteRead != 0 {
			acc |= abi.AccessRemoteRead
		}
		if a.AccessFlags&cm.AccessRemoteAtomic != 0 {
			acc |= abi.AccessRemoteAtomic
		}
		dst.QPAccessFlags, dst.PortNum, dst.PKeyIndex = acc, 1, 0
	case cm.QPStateRTR:
		dst.QPState = abi.QPSRTR
		dst.AttrMask |= abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN |
			abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
		dst.PathMTU, dst.DestQPNum, dst.RQPSN = abi.MTU(a.PathMTU), a.DestQPN, a.RQPSN
		dst.DGID, dst.FlowLabel, dst.HopLimit = a.AH.DGID, a.AH.FlowLabel, a.AH.HopLimit
		dst.TrafficClass, dst.SL, dst.SGIDIndex = a.AH.TrafficClass, a.AH.SL, 0
		dst.MaxDestRdAtomic, dst.MinRNRTimer = a.MaxDestRdAtomic, a.MinRNRTimer
	case cm.QPStateRTS:
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

// forget detaches id from its connection (the Manager forgot it or will
// report nothing more for it).
func (s *cmState) forget(id *cmID) {
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

// postCMEvent sends a CM event to cx's event socket (if open).
func (cx *Context) postCMEvent(ev *abi.CMEvent) {
	s := cx.events.Load()
	if s == nil {
		return
	}
	b := make([]byte, abi.SizeofCMEvent)
	if _, err := abi.Marshal(b, ev); err != nil {
		return
	}
	s.postBytes(b)
}

// newCMID creates a CM ID of cx (cmState.mu held).
func (cx *Context) newCMID(t abi.QPType) *cmID {
	if cx.cmIDs == nil {
		cx.cmIDs = map[uint32]*cmID{}
	}
	for {
		cx.nextCMID++
		if _, used := cx.cmIDs[cx.nextCMID]; cx.nextCMID != 0 && !used {
			break
		}
	}
	id := &cmID{cx: cx, handle: cx.nextCMID, qpType: t}
	cx.cmIDs[id.handle] = id
	return id
}

// destroyLocked ends id as rdma_destroy_id does (cmState.mu held).
func (s *cmState) destroyLocked(id *cmID) {
	if id.listening {
		if s.listeners[id.serviceID] == id {
			delete(s.listeners, id.serviceID)
		}
		_ = s.mgr.Unlisten(id.serviceID, 0)
		id.listening = false
	}
	if id.conn != 0 {
		_ = s.mgr.Destroy(id.conn)
	}
	s.forget(id)
	for _, c := range id.cx.cmIDs {
		if c.parent == id {
			c.parent = nil
		}
	}
	delete(id.cx.cmIDs, id.handle)
}

// releaseCM ends every CM ID of a context that is going.
func (d *Device) releaseCM(cx *Context) {
	s := d.cm
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range cx.cmIDs {
		s.destroyLocked(id)
	}
}

// cmCommand runs f with the CM ID of the request (cmState.mu held).
func (cn *conn) cmCommand(handle uint32, f func(s *cmState, id *cmID) error) error {
	s := cn.d.cm
	if s == nil {
		return errorf(errNotSup, "this device has no communication manager (no QP1)")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := cn.ctx.cmIDs[handle]
	if id == nil {
		return errorf(errNoEnt, "no CM ID %d", handle)
	}
	return f(s, id)
}

// cmErr maps the Manager's errors to command errors.
func cmErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, cm.ErrListening):
		return errorf(errAddrInUse, "%v", err)
	case errors.Is(err, cm.ErrUnknownConn), errors.Is(err, cm.ErrState):
		return errorf(errInval, "%v", err)
	case errors.Is(err, cm.ErrClosed):
		return errorf(errNotSup, "%v", err)
	}
	return errorf(errInval, "%v", err)
}

func (cn *conn) cmCreateID(r *request) (reply, error) {
	var c abi.CmdCMCreateIDReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	s := cn.d.cm
	if s == nil {
		return reply{}, errorf(errNotSup, "this device has no communication manager (no QP1)")
	}
	switch c.QPType {
	case abi.QPTRC, abi.QPTUC, abi.QPTUD:
	default:
		return reply{}, errorf(errInval, "CM ID for QP type %d", c.QPType)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(cn.ctx.cmIDs) >= maxCMIDs {
		return reply{}, errorf(errAgain, "context holds %d CM IDs, the limit", maxCMIDs)
	}
	id := cn.ctx.newCMID(c.QPType)
	return reply{body: &abi.RespCMID{CMID: id.handle}}, nil
}

func (cn *conn) cmDestroyID(r *request) (reply, error) {
	var c abi.CmdHandleReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.Handle, func(s *cmState, id *cmID) error {
		s.destroyLocked(id)
		return nil
	})
}

func (cn *conn) cmListen(r *request) (reply, error) {
	var c abi.CmdCMListenReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.cx.events.Load() == nil {
			return errorf(errInval, "CM_LISTEN needs the context's event socket (OPEN_EVENTS)")
		}
		if id.listening || id.conn != 0 || id.active {
			return errorf(errInval, "CM ID %d is in use", id.handle)
		}
		if s.listeners[c.ServiceID] != nil {
			return errorf(errAddrInUse, "service ID %#x has a listener", c.ServiceID)
		}
		backlog := int(c.Backlog)
		if backlog <= 0 {
			backlog = abi.CMDefaultBacklog
		}
		if err := s.mgr.ListenBacklog(c.ServiceID, 0, backlog); err != nil {
			return cmErr(err)
		}
		id.listening, id.serviceID, id.backlog = true, c.ServiceID, backlog
		id.last = "LISTEN"
		s.listeners[c.ServiceID] = id
		return nil
	})
}

func (cn *conn) cmConnect(r *request) (reply, error) {
	var c abi.CmdCMConnectReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	d := cn.d
	return reply{}, cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.cx.events.Load() == nil {
			return errorf(errInval, "CM_CONNECT needs the context's event socket (OPEN_EVENTS)")
		}
		if id.listening || id.conn != 0 {
			return errorf(errInval, "CM ID %d is in use", id.handle)
		}
		if int(c.SGIDIndex) >= len(d.cfg.Link.GIDs) {
			return errorf(errInval, "GID index %d", c.SGIDIndex)
		}
		pd, err := privateData(&c.PrivateData, c.PrivateDataLen)
		if err != nil {
			return err
		}
		timeout, retries := c.CMResponseTimeout, c.MaxCMRetries
		if timeout == 0 {
			timeout = cm.CMAResponseTimeout
		}
		if retries == 0 {
			retries = cm.CMAMaxCMRetries
		}
		var conn cm.ConnID
		if id.qpType == abi.QPTUD {
			conn, err = s.mgr.SIDRRequest(cm.SIDRParams{Peer: cm.GID(c.DGID), ServiceID: c.ServiceID, PKey: cm.DefaultPKey,
				Timeout: cm.IBADuration(timeout), MaxRetries: retries, PrivateData: pd})
		} else {
			mtu := c.PathMTU
			if mtu == 0 || abi.MTU(mtu) > d.cfg.Link.MaxMTU {
				mtu = uint8(d.cfg.Link.MaxMTU)
			}
			hop := c.HopLimit
			if hop == 0 {
				hop = 64
			}
			tt := cm.TransportRC
			if id.qpType == abi.QPTUC {
				tt = cm.TransportUC
			}
			conn, err = s.mgr.Connect(cm.ConnectParams{
				Path: cm.PathParams{SGID: cm.GID(d.cfg.Link.GIDs[c.SGIDIndex]), DGID: cm.GID(c.DGID),
					FlowLabel: c.FlowLabel & 0xfffff, TrafficClass: c.TrafficClass, HopLimit: hop,
					PKey: cm.DefaultPKey, MTU: roceMTU(abi.MTU(mtu)), Rate: 0, PacketLifeTime: cm.CMAIBoEPacketLifeTime},
				ServiceID: c.ServiceID, QPN: c.QPN, QPType: tt, StartingPSN: c.StartingPSN & 0xffffff,
				ResponderResources: c.ResponderResources, InitiatorDepth: c.InitiatorDepth,
				RetryCount: c.RetryCount & 7, RNRRetryCount: c.RNRRetryCount & 7,
				RemoteCMResponseTimeout: timeout, LocalCMResponseTimeout: timeout, MaxCMRetries: retries,
				SRQ: c.SRQ != 0, PrivateData: pd,
			})
		}
		if err != nil {
			return cmErr(err)
		}
		id.conn, id.active, id.serviceID, id.peer = conn, true, c.ServiceID, c.DGID
		id.last = "CONNECT"
		s.byConn[conn] = id
		return nil
	})
}

func (cn *conn) cmAccept(r *request) (reply, error) {
	var c abi.CmdCMAcceptReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.conn == 0 || id.active {
			return errorf(errInval, "CM ID %d has no connection request", id.handle)
		}
		pd, err := privateData(&c.PrivateData, c.PrivateDataLen)
		if err != nil {
			return err
		}
		if id.qpType == abi.QPTUD {
			err = s.mgr.SIDRReply(id.conn, cm.SIDRReplyParams{Status: cm.SIDRSuccess, QPN: c.QPN, QKey: c.QKey, PrivateData: pd})
			if err == nil {
				s.forget(id)
			}
		} else {
			err = s.mgr.Accept(id.conn, cm.AcceptParams{QPN: c.QPN, StartingPSN: c.StartingPSN & 0xffffff,
				ResponderResources: c.ResponderResources, InitiatorDepth: c.InitiatorDepth,
				RNRRetryCount: c.RNRRetryCount & 7, SRQ: c.SRQ != 0, PrivateData: pd})
		}
		if err != nil {
			return cmErr(err)
		}
		if id.parent != nil {
			id.parent.pending--
			id.parent = nil
		}
		id.last = "ACCEPT"
		return nil
	})
}

func (cn *conn) cmPrivate(r *request) (abi.CmdCMPrivateReq, error) {
	var c abi.CmdCMPrivateReq
	if err := decode(r, &c); err != nil {
		return c, err
	}
	_, err := privateData(&c.PrivateData, c.PrivateDataLen)
	return c, err
}

// privateData is the first n bytes of a command's private data field, or
// EINVAL when n is past the field.
func privateData(pd *[abi.CMMaxPrivateData]byte, n uint8) ([]byte, error) {
	if int(n) > len(pd) {
		return nil, errorf(errInval, "private data of %d bytes", n)
	}
	return pd[:n], nil
}

func (cn *conn) cmReject(r *request) (reply, error) {
	c, err := cn.cmPrivate(r)
	if err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.conn == 0 {
			return errorf(errInval, "CM ID %d has no connection", id.handle)
		}
		pd := c.PrivateData[:c.PrivateDataLen]
		var err error
		if id.qpType == abi.QPTUD {
			err = s.mgr.SIDRReply(id.conn, cm.SIDRReplyParams{Status: cm.SIDRReject, PrivateData: pd})
		} else {
			err = s.mgr.Reject(id.conn, cm.RejectConsumerDefined, nil, pd)
		}
		if err != nil {
			return cmErr(err)
		}
		if st, err := s.mgr.State(id.conn); err != nil || st == cm.StateIdle {
			s.forget(id)
		}
		id.last = "REJECT"
		return nil
	})
}

func (cn *conn) cmEstablish(r *request) (reply, error) {
	var c abi.CmdHandleReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.Handle, func(s *cmState, id *cmID) error {
		if id.conn == 0 {
			return errorf(errInval, "CM ID %d has no connection", id.handle)
		}
		if id.active {
			return cmErr(s.mgr.RTU(id.conn, nil))
		}
		return cmErr(s.mgr.NotifyEstablished(id.conn))
	})
}

func (cn *conn) cmDisconnect(r *request) (reply, error) {
	c, err := cn.cmPrivate(r)
	if err != nil {
		return reply{}, err
	}
	return reply{}, cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.conn == 0 {
			return errorf(errInval, "CM ID %d has no connection", id.handle)
		}
		return cmErr(s.mgr.Disconnect(id.conn, c.PrivateData[:c.PrivateDataLen]))
	})
}

func (cn *conn) cmInitQPAttr(r *request) (reply, error) {
	var c abi.CmdCMInitQPAttrReq
	if err := decode(r, &c); err != nil {
		return reply{}, err
	}
	var out abi.CMQPAttr
	err := cn.cmCommand(c.CMID, func(s *cmState, id *cmID) error {
		if id.conn == 0 {
			return errorf(errInval, "CM ID %d has no connection", id.handle)
		}
		var st cm.QPState
		switch c.QPState {
		case abi.QPSInit:
			st = cm.QPStateInit
		case abi.QPSRTR:
			st = cm.QPStateRTR
		case abi.QPSRTS:
			st = cm.QPStateRTS
		default:
			return errorf(errInval, "QP state %d", c.QPState)
		}
		a, err := s.mgr.QPAttr(id.conn, st)
		if err != nil {
			return cmErr(err)
		}
		mergeQPAttr(&out, &a)
		return nil
	})
	if err != nil {
		return reply{}, err
	}
	return reply{body: &out}, nil
}

// cmInfoLocked is the operator's view of the communication manager
// (vrnicctl cm; Device.mu held).
func (d *Device) cmInfoLocked() admin.CMInfo {
	var info admin.CMInfo
	s := d.cm
	if s == nil {
		return info
	}
	info.Enabled = true
	info.QP1 = s.gsi.Stats()
	st := s.mgr.Stats()
	for i := range st.Sent {
		info.MADsSent += st.Sent[i]
		info.Retransmissions += st.Retries[i]
		info.MADsReceived += st.Received[i]
		info.Duplicates += st.Duplicates[i]
	}
	info.Invalid, info.Unmatched = st.Invalid+st.Unsupported, st.Unmatched
	info.HalfOpen, info.Shed, info.Expired = st.HalfOpen, st.Shed, st.Expired
	info.IDs = []admin.CMIDInfo{}
	s.mu.Lock()
	defer s.mu.Unlock()
	info.Connections = len(s.byConn)
	for _, cx := range d.contexts {
		for _, id := range cx.cmIDs {
			e := admin.CMIDInfo{Ctx: cx.handle, ID: id.handle, QPType: qpTypeName(id.qpType), LastEvent: id.last,
				ServiceID: id.serviceID}
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
				e.Peer = fmt.Sprint(cm.GID(id.peer))
			}
			info.IDs = append(info.IDs, e)
		}
	}
	sort.Slice(info.IDs, func(i, j int) bool {
		a, b := info.IDs[i], info.IDs[j]
		return a.Ctx < b.Ctx || a.Ctx == b.Ctx && a.ID < b.ID
	})
	return info
}

// roceMTU converts an MTU code (the same numbering).
func roceMTU(m abi.MTU) roce.MTU { return roce.MTU(m) }

// cmReply serves admin.CMCmd (Device.mu held): the CM IDs from start on,
// as many as fit one reply.
func (d *Device) cmReply(start int) (reply, error) {
	info := d.cmInfoLocked()
	all := info.IDs
	info.Total = len(all)
	info.IDs = []admin.CMIDInfo{}
	size := 1024
	for i := start; i < len(all); i++ {
		b, err := json.Marshal(all[i])
		if err != nil {
			return reply{}, err
		}
		if size+len(b)+1 > adminReplyBudget && len(info.IDs) > 0 {
			info.Next = i
			break
		}
		size += len(b) + 1
		info.IDs = append(info.IDs, all[i])
	}
	b, err := json.Marshal(info)
	if err != nil {
		return reply{}, err
	}
	return reply{raw: b}, nil
}
