package cm

import (
	"encoding/binary"
	"errors"
)

// HandleMAD processes a MAD received on QP1 from the port whose GID is
// src (the GRH / IP source address). A MAD that is not a valid CM message
// is counted and returned as an error; it changes nothing. A message acts
// on a connection only if src is the connection's peer (see doc.go,
// Demultiplexing).
func (m *Manager) HandleMAD(src GID, mad []byte) error {
	h, msg, err := Decode(mad)
	if err := m.lock(); err != nil {
		return err
	}
	defer m.unlock()
	if err != nil {
		if errors.Is(err, ErrUnsupportedAttribute) {
			// LAP and APR: Linux ignores them on RoCE ports
			// (cm_lap_handler, cm_apr_handler), and so does this CM.
			m.stats.Unsupported++
		} else {
			m.stats.Invalid++
		}
		return err
	}
	m.stats.Received[attrIndex(h.AttrID)]++
	switch msg := msg.(type) {
	case *REQ:
		m.recvREQ(src, &h, msg)
	case *MRA:
		m.recvMRA(src, msg)
	case *REJ:
		countREJ(&m.stats.RejectsReceived, msg.Reason)
		m.recvREJ(src, msg)
	case *REP:
		m.recvREP(src, &h, msg)
	case *RTU:
		m.recvRTU(src, msg)
	case *DREQ:
		m.recvDREQ(src, &h, msg)
	case *DREP:
		m.recvDREP(src, msg)
	case *SIDRReq:
		m.recvSIDRReq(src, &h, msg)
	case *SIDRRep:
		m.recvSIDRRep(src, msg)
	}
	return nil
}

func (m *Manager) dup(a AttrID) { m.stats.Duplicates[attrIndex(a)]++ }

// lookup returns the connection with local ID local whose peer ID is
// remote (Linux cm_acquire_id) and whose peer is src, nil if none. Linux
// does not look at the source: here a message from any other address is
// not the peer's, whatever IDs it names.
func (m *Manager) lookup(src GID, local, remote uint32) *conn {
	c := m.conns[local]
	if c == nil || c.remoteID != remote || c.peer != src {
		return nil
	}
	return c
}

// issueREJ answers a message that has no connection of its own with a
// REJ built from it (Linux cm_issue_rej): comm IDs swapped, the peer's
// transaction ID.
func (m *Manager) issueREJ(dst GID, tid uint64, local, remote uint32, reason RejectReason, msgType MsgType) {
	m.send(dst, tid, &REJ{LocalCommID: local, RemoteCommID: remote, MessageRejected: msgType, Reason: reason})
}

func (m *Manager) recvREQ(src GID, h *Header, req *REQ) {
	// A repeat of a REQ this side already knows (Linux cm_match_req and
	// cm_dup_req_handler), answered per state. Only a REQ from the
	// connection's peer is a repeat (or a stale connection, below): the
	// same IDs from another address are a new request.
	if c := m.byRemote[remoteKey{req.LocalCommID, req.LocalCAGUID, src}]; c != nil {
		m.dup(AttrREQ)
		switch c.state {
		case StateMRAREQSent:
			m.sendMRA(c)
		case StateREPSent, StateMRAREPRcvd:
			// The REP may have been lost: send it again now rather
			// than when its own timer fires.
			m.sendMAD(c.peer, c.out, true)
		case StateTimeWait:
			m.sendREJ(c, RejectStaleConn, nil, nil)
		}
		return
	}
	// The peer's QP already has a connection here: the peer must have
	// lost it. Reject the REQ and tear the old one down (Linux: REJ
	// stale connection, DREQ for the old connection).
	if old := m.byRemoteQP[qpKey{req.LocalQPN, req.LocalCAGUID, src}]; old != nil {
		m.issueREJ(src, h.TID, 0, req.LocalCommID, RejectStaleConn, MsgREQ)
		if old.state == StateEstablished {
			m.sendDREQ(old, nil)
		}
		return
	}
	ln := m.listenerFor(req.ServiceID)
	if ln == nil {
		m.issueREJ(src, h.TID, 0, req.LocalCommID, RejectInvalidServiceID, MsgREQ)
		return
	}
	if req.TransportServiceType != TransportRC && req.TransportServiceType != TransportUC {
		m.issueREJ(src, h.TID, 0, req.LocalCommID, RejectInvalidTransportType, MsgREQ)
		return
	}
	m.admit(ln)
	p := &req.Primary
	// The passive side's view of the path (Linux cm_format_paths_from_req):
	// the GIDs swapped, the packet life time one below the ACK timeout.
	plt := p.LocalACKTimeout
	if plt > 0 {
		plt--
	}
	c := &conn{
		id: m.allocID(), remoteID: req.LocalCommID, state: StateREQRcvd, peer: src,
		serviceID: req.ServiceID, qpType: req.TransportServiceType, tid: h.TID,
		remoteQPN: req.LocalQPN, remoteCAGUID: req.LocalCAGUID,
		// The REQ's Starting PSN is the PSN the peer expects: this
		// side sends from it (Linux cm_req_handler: sq_psn). This side
		// expects a PSN of its own, drawn as rdma_cm draws the new
		// connection ID's seq_num (rdma_init_qp_attr puts it in RTR);
		// Accept announces it in the REP.
		sqPSN: req.StartingPSN, rqPSN: m.randPSN(), pathMTU: req.PathMTU, pkey: req.PKey,
		// This side's initiator depth is the peer's responder
		// resources and the other way round.
		initiatorDepth: req.ResponderResources, responderResources: req.InitiatorDepth,
		retryCount: req.RetryCount, rnrRetryCount: req.RNRRetryCount,
		path: PathParams{
			SGID: p.RemoteGID, DGID: p.LocalGID, FlowLabel: p.FlowLabel, TrafficClass: p.TrafficClass,
			HopLimit: p.HopLimit, SL: p.SL, PKey: req.PKey, MTU: req.PathMTU, Rate: p.PacketRate,
			PacketLifeTime: plt,
		},
		ackTimeout: plt + 1,
		ln:         ln, arrived: m.clock.Now(),
		reqAttempt: reqTimeout(plt, req.RemoteCMResponseTimeout), reqTries: int(req.MaxCMRetries) + 1,
	}
	c.peerECE = ECE{VendorID: req.VendorID, Options: h.AttrModifier}
	if c.qpType == TransportRC {
		c.ece = vrnicECE(c.peerECE) & m.cfg.ECE
	}
	// The REP and the DREQ are repeated as the REQ asks, within bounds.
	c.timeout, c.maxRetries = peerResponse(req.LocalCMResponseTimeout, req.MaxCMRetries, m.maxHalfOpenTime)
	m.conns[c.id] = c
	m.byRemote[remoteKey{c.remoteID, c.remoteCAGUID, c.peer}] = c
	m.byRemoteQP[qpKey{c.remoteQPN, c.remoteCAGUID, c.peer}] = c
	c.inRemote, c.inRemoteQP = true, true
	m.hoUpdate(c)
	r := *req
	m.emit(c, Event{Type: EventConnectRequest, REQ: &r, ECE: c.peerECE, PrivateData: append([]byte(nil), req.PrivateData[:]...)})
}

func (m *Manager) recvMRA(src GID, mra *MRA) {
	var c *conn
	switch mra.MessageMRAed {
	case MsgREQ:
		c = m.lookup(src, mra.RemoteCommID, 0)
	default:
		c = m.lookup(src, mra.RemoteCommID, mra.LocalCommID)
	}
	if c == nil {
		m.stats.Unmatched++
		return
	}
	// Wait for the service timeout plus the path's round trip (Linux
	// cm_mra_handler, clamped); only the first MRA for a message extends.
	timeout := mraWait(mra.ServiceTimeout, c.ackTimeout)
	switch {
	case c.state == StateREQSent && mra.MessageMRAed == MsgREQ:
		c.state = StateMRAREQRcvd
	case c.state == StateREPSent && mra.MessageMRAed == MsgREP:
		c.state = StateMRAREPRcvd
	case c.state == StateMRAREQRcvd || c.state == StateMRAREPRcvd:
		m.dup(AttrMRA)
		return
	default:
		m.stats.Unmatched++
		return
	}
	m.extendOut(c, timeout)
}

func (m *Manager) recvREJ(src GID, rej *REJ) {
	var c *conn
	switch {
	case rej.Reason == RejectTimeout:
		// The peer gave up on its REQ before knowing this side's comm
		// ID; it names itself by its CA GUID in the ARI.
		c = m.byRemote[remoteKey{rej.LocalCommID, binary.BigEndian.Uint64(rej.ARI[:8]), src}]
	case rej.MessageRejected == MsgREQ:
		// Until the REP, this side does not know the peer's ID.
		c = m.lookup(src, rej.RemoteCommID, 0)
	default:
		c = m.lookup(src, rej.RemoteCommID, rej.LocalCommID)
	}
	if c == nil {
		m.stats.Unmatched++
		return
	}
	ev := Event{Type: EventRejected, Reason: rej.Reason,
		ARI: append([]byte(nil), rej.ARI[:rej.RejectInfoLen]...), PrivateData: append([]byte(nil), rej.PrivateData[:]...)}
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateREQRcvd, StateMRAREQSent:
		if rej.Reason == RejectStaleConn {
			m.enterTimeWait(c)
		} else {
			m.toIdle(c)
		}
	case StateDREQSent, StateREPRcvd, StateMRAREPSent, StateEstablished:
		m.enterTimeWait(c)
	default:
		m.stats.Unmatched++
		return
	}
	m.emit(c, ev)
}

func (m *Manager) recvREP(src GID, h *Header, rep *REP) {
	c := m.lookup(src, rep.RemoteCommID, 0)
	if c == nil || (c.state != StateREQSent && c.state != StateMRAREQRcvd) {
		// A repeat: the RTU (or MRA) that answered it was lost (Linux
		// cm_dup_rep_handler).
		if c = m.lookup(src, rep.RemoteCommID, rep.LocalCommID); c == nil {
			m.stats.Unmatched++
			return
		}
		m.dup(AttrREP)
		switch c.state {
		case StateEstablished:
			m.sendRTU(c)
		case StateMRAREPSent:
			m.sendMRA(c)
		}
		return
	}
	if m.byRemote[remoteKey{rep.LocalCommID, rep.LocalCAGUID, src}] != nil {
		m.stats.Unmatched++
		return
	}
	if old := m.byRemoteQP[qpKey{rep.LocalQPN, rep.LocalCAGUID, src}]; old != nil {
		// Stale connection: as for a REQ (Linux cm_rep_handler). This
		// connection keeps waiting; the peer rejects its repeated REQ.
		m.issueREJ(src, h.TID, rep.RemoteCommID, rep.LocalCommID, RejectStaleConn, MsgREP)
		if old.state == StateEstablished {
			m.sendDREQ(old, nil)
		}
		return
	}
	m.cancelOut(c)
	c.state = StateREPRcvd
	c.remoteID = rep.LocalCommID
	c.remoteCAGUID = rep.LocalCAGUID
	c.remoteQPN = rep.LocalQPN
	// The REP's Starting PSN is the PSN the peer expects: this side
	// sends from it (Linux cm_rep_handler: sq_psn).
	c.sqPSN = rep.StartingPSN
	c.initiatorDepth = rep.ResponderResources
	c.responderResources = rep.InitiatorDepth
	c.rnrRetryCount = rep.RNRRetryCount
	c.ackTimeout = AckTimeout(rep.TargetACKDelay, c.ackTimeout-1)
	// The options agreed: those the REP answers of the ones offered.
	c.peerECE = ECE{VendorID: rep.VendorID, Options: h.AttrModifier}
	c.ece = vrnicECE(c.peerECE) & c.eceOffer
	m.byRemote[remoteKey{c.remoteID, c.remoteCAGUID, c.peer}] = c
	m.byRemoteQP[qpKey{c.remoteQPN, c.remoteCAGUID, c.peer}] = c
	c.inRemote, c.inRemoteQP = true, true
	r := *rep
	m.emit(c, Event{Type: EventREPReceived, REP: &r, ECE: c.peerECE, PrivateData: append([]byte(nil), rep.PrivateData[:]...)})
}

func (m *Manager) recvRTU(src GID, rtu *RTU) {
	c := m.lookup(src, rtu.RemoteCommID, rtu.LocalCommID)
	if c == nil {
		m.stats.Unmatched++
		return
	}
	if c.state != StateREPSent && c.state != StateMRAREPRcvd {
		m.dup(AttrRTU)
		return
	}
	m.cancelOut(c)
	c.state = StateEstablished
	m.hoUpdate(c)
	m.emit(c, Event{Type: EventEstablished, PrivateData: append([]byte(nil), rtu.PrivateData[:]...)})
}

func (m *Manager) recvDREQ(src GID, h *Header, dreq *DREQ) {
	c := m.lookup(src, dreq.RemoteCommID, dreq.LocalCommID)
	if c == nil {
		// Already forgotten: answer so that the peer stops repeating
		// (Linux cm_issue_drep). A DREQ that names a live connection
		// but is not from its peer gets the same answer and changes
		// nothing: the answer does not tell which IDs are live.
		if m.conns[dreq.RemoteCommID] != nil {
			m.stats.Unmatched++
		} else {
			m.dup(AttrDREQ)
		}
		m.send(src, h.TID, &DREP{LocalCommID: dreq.RemoteCommID, RemoteCommID: dreq.LocalCommID})
		return
	}
	if c.localQPN != dreq.RemoteQPN {
		m.stats.Unmatched++
		return
	}
	switch c.state {
	case StateREPSent, StateDREQSent, StateEstablished, StateMRAREPRcvd:
		m.cancelOut(c)
	case StateTimeWait:
		// The DREP was lost: send it again.
		m.dup(AttrDREQ)
		c.tid = h.TID
		m.sendDREP(c)
		return
	case StateDREQRcvd:
		m.dup(AttrDREQ)
		return
	default:
		m.stats.Unmatched++
		return
	}
	c.state = StateDREQRcvd
	c.tid = h.TID
	m.hoUpdate(c)
	m.emit(c, Event{Type: EventDisconnectRequest, PrivateData: append([]byte(nil), dreq.PrivateData[:]...)})
}

func (m *Manager) recvDREP(src GID, drep *DREP) {
	c := m.lookup(src, drep.RemoteCommID, drep.LocalCommID)
	if c == nil {
		m.stats.Unmatched++
		return
	}
	if c.state != StateDREQSent && c.state != StateDREQRcvd {
		m.dup(AttrDREP)
		return
	}
	m.enterTimeWait(c)
	m.emit(c, Event{Type: EventDisconnected, PrivateData: append([]byte(nil), drep.PrivateData[:]...)})
}

func (m *Manager) recvSIDRReq(src GID, h *Header, req *SIDRReq) {
	key := sidrKey{req.RequestID, src}
	if m.sidr[key] != nil {
		m.dup(AttrSIDRREQ)
		return
	}
	ln := m.listenerFor(req.ServiceID)
	if ln == nil {
		m.send(src, h.TID, &SIDRRep{RequestID: req.RequestID, Status: SIDRUnsupported, ServiceID: req.ServiceID})
		return
	}
	m.admit(ln)
	c := &conn{id: m.allocID(), remoteID: req.RequestID, state: StateSIDRREQRcvd, peer: src,
		serviceID: req.ServiceID, pkey: req.PKey, tid: h.TID, inSIDR: true, sidrKey: key,
		ln: ln, arrived: m.clock.Now()}
	m.conns[c.id] = c
	m.sidr[key] = c
	m.hoUpdate(c)
	r := *req
	m.emit(c, Event{Type: EventSIDRRequest, SIDRReq: &r, PrivateData: append([]byte(nil), req.PrivateData[:]...)})
}

func (m *Manager) recvSIDRRep(src GID, rep *SIDRRep) {
	c := m.conns[rep.RequestID]
	if c == nil || c.state != StateSIDRREQSent || c.peer != src {
		m.stats.Unmatched++
		return
	}
	r := *rep
	m.emit(c, Event{Type: EventSIDRReply, SIDRRep: &r, PrivateData: append([]byte(nil), rep.PrivateData[:]...)})
	m.toIdle(c)
}
