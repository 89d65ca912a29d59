package cm

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// commands are the CM_* commands of the ABI, each run on the Service's
// goroutine with the client's payload.
var commands = map[abi.Cmd]func(s *Service, c Client, payload []byte) (any, error){
	abi.CmdCMCreateID:   (*Service).cmdCreateID,
	abi.CmdCMDestroyID:  (*Service).cmdDestroyID,
	abi.CmdCMListen:     (*Service).cmdListen,
	abi.CmdCMConnect:    (*Service).cmdConnect,
	abi.CmdCMAccept:     (*Service).cmdAccept,
	abi.CmdCMReject:     (*Service).cmdReject,
	abi.CmdCMEstablish:  (*Service).cmdEstablish,
	abi.CmdCMDisconnect: (*Service).cmdDisconnect,
	abi.CmdCMInitQPAttr: (*Service).cmdInitQPAttr,
}

// decode reads a command's fixed-size body.
func decode(op abi.Cmd, payload []byte, v any) error {
	if len(payload) != abi.Sizeof(v) {
		return errnoErr(unix.EMSGSIZE, "%v: payload is %d bytes, want %d", op, len(payload), abi.Sizeof(v))
	}
	if _, err := abi.Unmarshal(payload, v); err != nil {
		return errnoErr(unix.EMSGSIZE, "%v: %w", op, err)
	}
	return nil
}

// lookup returns the CM ID handle of client c.
func (s *Service) lookup(c Client, handle uint32) (*cmID, error) {
	if cl := s.clients[c]; cl != nil {
		if id := cl.ids[handle]; id != nil {
			return id, nil
		}
	}
	return nil, errnoErr(unix.ENOENT, "no CM ID %d", handle)
}

// privateData is the first n bytes of a command's private data field, or
// EINVAL when n is past the field.
func privateData(pd *[abi.CMMaxPrivateData]byte, n uint8) ([]byte, error) {
	if int(n) > len(pd) {
		return nil, errnoErr(unix.EINVAL, "private data of %d bytes", n)
	}
	return pd[:n], nil
}

func (s *Service) cmdCreateID(c Client, payload []byte) (any, error) {
	var r abi.CmdCMCreateIDReq
	if err := decode(abi.CmdCMCreateID, payload, &r); err != nil {
		return nil, err
	}
	switch r.QPType {
	case abi.QPTRC, abi.QPTUC, abi.QPTUD:
	default:
		return nil, errnoErr(unix.EINVAL, "CM ID for QP type %d", r.QPType)
	}
	if r.Flags&^abi.CMIDFlagECE != 0 {
		return nil, errnoErr(unix.EINVAL, "CM ID flags %#x: unknown bits %#x", r.Flags, r.Flags&^abi.CMIDFlagECE)
	}
	id, err := s.newID(s.client(c), r.QPType)
	if err != nil {
		return nil, err
	}
	id.ece = r.Flags&abi.CMIDFlagECE != 0
	return &abi.RespCMID{CMID: id.handle}, nil
}

func (s *Service) cmdDestroyID(c Client, payload []byte) (any, error) {
	var r abi.CmdHandleReq
	if err := decode(abi.CmdCMDestroyID, payload, &r); err != nil {
		return nil, err
	}
	id, err := s.lookup(c, r.Handle)
	if err != nil {
		return nil, err
	}
	s.destroy(id)
	return nil, nil
}

// privilegedPort reports whether an rdma_cm service ID names a port below
// 1024 (Linux cma_check_port: PROT_SOCK).
func privilegedPort(serviceID uint64) bool {
	_, port, ok := ParseServiceID(serviceID)
	return ok && port != 0 && port < 1024
}

func (s *Service) cmdListen(c Client, payload []byte) (any, error) {
	var r abi.CmdCMListenReq
	if err := decode(abi.CmdCMListen, payload, &r); err != nil {
		return nil, err
	}
	id, err := s.lookup(c, r.CMID)
	if err != nil {
		return nil, err
	}
	if !c.CMEventsOpen() {
		return nil, errnoErr(unix.EINVAL, "CM_LISTEN needs the context's event socket (OPEN_EVENTS)")
	}
	if id.listening || id.conn != 0 || id.active {
		return nil, errnoErr(unix.EINVAL, "CM ID %d is in use", id.handle)
	}
	if privilegedPort(r.ServiceID) && !c.CMMayBindPrivileged() {
		_, port, _ := ParseServiceID(r.ServiceID)
		return nil, errnoErr(unix.EACCES, "port %d is below 1024: listening there needs CAP_NET_BIND_SERVICE", port)
	}
	if s.listeners[r.ServiceID] != nil {
		return nil, errnoErr(unix.EADDRINUSE, "service ID %#x has a listener", r.ServiceID)
	}
	backlog := int(r.Backlog)
	if backlog <= 0 {
		backlog = abi.CMDefaultBacklog
	}
	if err := s.mgr.ListenBacklog(r.ServiceID, 0, backlog); err != nil {
		return nil, err
	}
	id.listening, id.serviceID, id.backlog = true, r.ServiceID, backlog
	id.last = "LISTEN"
	s.listeners[r.ServiceID] = id
	return nil, nil
}

func (s *Service) cmdConnect(c Client, payload []byte) (any, error) {
	var r abi.CmdCMConnectReq
	if err := decode(abi.CmdCMConnect, payload, &r); err != nil {
		return nil, err
	}
	id, err := s.lookup(c, r.CMID)
	if err != nil {
		return nil, err
	}
	if !c.CMEventsOpen() {
		return nil, errnoErr(unix.EINVAL, "CM_CONNECT needs the context's event socket (OPEN_EVENTS)")
	}
	if id.listening || id.conn != 0 {
		return nil, errnoErr(unix.EINVAL, "CM ID %d is in use", id.handle)
	}
	if int(r.SGIDIndex) >= len(s.cfg.GIDs) {
		return nil, errnoErr(unix.EINVAL, "GID index %d (the port has %d)", r.SGIDIndex, len(s.cfg.GIDs))
	}
	pd, err := privateData(&r.PrivateData, r.PrivateDataLen)
	if err != nil {
		return nil, err
	}
	if err := s.checkECE(id, r.ECEOptions); err != nil {
		return nil, err
	}
	timeout, retries := r.CMResponseTimeout, r.MaxCMRetries
	if timeout == 0 {
		timeout = CMAResponseTimeout
	}
	if retries == 0 {
		retries = CMAMaxCMRetries
	}
	var conn ConnID
	if id.qpType == abi.QPTUD {
		conn, err = s.mgr.SIDRRequest(SIDRParams{Peer: GID(r.DGID), ServiceID: r.ServiceID, PKey: DefaultPKey,
			Timeout: IBADuration(timeout), MaxRetries: retries, PrivateData: pd})
	} else {
		mtu := roce.MTU(r.PathMTU)
		if mtu == 0 || mtu > s.cfg.MaxMTU {
			mtu = s.cfg.MaxMTU
		}
		hop := r.HopLimit
		if hop == 0 {
			hop = 64
		}
		tt := TransportRC
		if id.qpType == abi.QPTUC {
			tt = TransportUC
		}
		conn, err = s.mgr.Connect(ConnectParams{
			Path: PathParams{SGID: GID(s.cfg.GIDs[r.SGIDIndex]), DGID: GID(r.DGID),
				FlowLabel: r.FlowLabel & 0xfffff, TrafficClass: r.TrafficClass, HopLimit: hop,
				PKey: DefaultPKey, MTU: mtu, Rate: 0, PacketLifeTime: CMAIBoEPacketLifeTime},
			ServiceID: r.ServiceID, QPN: r.QPN, QPType: tt, StartingPSN: r.StartingPSN & 0xffffff,
			ResponderResources: r.ResponderResources, InitiatorDepth: r.InitiatorDepth,
			RetryCount: r.RetryCount & 7, RNRRetryCount: r.RNRRetryCount & 7,
			RemoteCMResponseTimeout: timeout, LocalCMResponseTimeout: timeout, MaxCMRetries: retries,
			SRQ: r.SRQ != 0, PrivateData: pd, ECE: r.ECEOptions,
		})
	}
	if err != nil {
		return nil, err
	}
	id.conn, id.active, id.serviceID, id.peer = conn, true, r.ServiceID, r.DGID
	id.last = "CONNECT"
	s.byConn[conn] = id
	if id.qpType != abi.QPTUD {
		var init abi.CMQPAttr
		s.qpAttr(id, &init, conn, QPStateInit)
	}
	return nil, nil
}

func (s *Service) cmdAccept(c Client, payload []byte) (any, error) {
	var r abi.CmdCMAcceptReq
	if len(payload) == abi.OffCMAcceptECE {
		// A client of ABI 1.4: the command without ece_options.
		payload = append(payload[:len(payload):len(payload)], make([]byte, abi.Sizeof(&r)-abi.OffCMAcceptECE)...)
	}
	if err := decode(abi.CmdCMAccept, payload, &r); err != nil {
		return nil, err
	}
	if r.Reserved2 != 0 {
		return nil, errnoErr(unix.EINVAL, "CM_ACCEPT: reserved2 must be 0")
	}
	id, err := s.lookup(c, r.CMID)
	if err != nil {
		return nil, err
	}
	if id.conn == 0 || id.active {
		return nil, errnoErr(unix.EINVAL, "CM ID %d has no connection request", id.handle)
	}
	pd, err := privateData(&r.PrivateData, r.PrivateDataLen)
	if err != nil {
		return nil, err
	}
	if err := s.checkECE(id, r.ECEOptions); err != nil {
		return nil, err
	}
	if id.qpType == abi.QPTUD {
		err = s.mgr.SIDRReply(id.conn, SIDRReplyParams{Status: SIDRSuccess, QPN: r.QPN, QKey: r.QKey, PrivateData: pd})
		if err == nil {
			s.forget(id)
		}
	} else {
		err = s.mgr.Accept(id.conn, AcceptParams{QPN: r.QPN, StartingPSN: r.StartingPSN & 0xffffff,
			ResponderResources: r.ResponderResources, InitiatorDepth: r.InitiatorDepth,
			RNRRetryCount: r.RNRRetryCount & 7, SRQ: r.SRQ != 0, PrivateData: pd, ECE: r.ECEOptions})
	}
	if err != nil {
		return nil, err
	}
	if id.parent != nil {
		id.parent.pending--
		id.parent = nil
	}
	id.last = "ACCEPT"
	return nil, nil
}

// connOf returns the connection of CM ID handle of client c.
func (s *Service) connOf(c Client, handle uint32) (*cmID, error) {
	id, err := s.lookup(c, handle)
	if err != nil {
		return nil, err
	}
	if id.conn == 0 {
		return nil, errnoErr(unix.EINVAL, "CM ID %d has no connection", id.handle)
	}
	return id, nil
}

// privateCmd decodes a CM_REJECT or CM_DISCONNECT: the connection of its
// CM ID and its private data.
func (s *Service) privateCmd(c Client, op abi.Cmd, payload []byte) (*cmID, []byte, error) {
	var r abi.CmdCMPrivateReq
	if err := decode(op, payload, &r); err != nil {
		return nil, nil, err
	}
	pd, err := privateData(&r.PrivateData, r.PrivateDataLen)
	if err != nil {
		return nil, nil, err
	}
	id, err := s.connOf(c, r.CMID)
	if err != nil {
		return nil, nil, err
	}
	return id, pd, nil
}

func (s *Service) cmdReject(c Client, payload []byte) (any, error) {
	id, pd, err := s.privateCmd(c, abi.CmdCMReject, payload)
	if err != nil {
		return nil, err
	}
	if id.qpType == abi.QPTUD {
		err = s.mgr.SIDRReply(id.conn, SIDRReplyParams{Status: SIDRReject, PrivateData: pd})
	} else {
		err = s.mgr.Reject(id.conn, RejectConsumerDefined, nil, pd)
	}
	if err != nil {
		return nil, err
	}
	if st, err := s.mgr.State(id.conn); err != nil || st == StateIdle {
		s.forget(id)
	}
	id.last = "REJECT"
	return nil, nil
}

func (s *Service) cmdEstablish(c Client, payload []byte) (any, error) {
	var r abi.CmdHandleReq
	if err := decode(abi.CmdCMEstablish, payload, &r); err != nil {
		return nil, err
	}
	id, err := s.connOf(c, r.Handle)
	if err != nil {
		return nil, err
	}
	if id.active {
		return nil, s.mgr.RTU(id.conn, nil)
	}
	return nil, s.mgr.NotifyEstablished(id.conn)
}

func (s *Service) cmdDisconnect(c Client, payload []byte) (any, error) {
	id, pd, err := s.privateCmd(c, abi.CmdCMDisconnect, payload)
	if err != nil {
		return nil, err
	}
	return nil, s.mgr.Disconnect(id.conn, pd)
}

func (s *Service) cmdInitQPAttr(c Client, payload []byte) (any, error) {
	var r abi.CmdCMInitQPAttrReq
	if err := decode(abi.CmdCMInitQPAttr, payload, &r); err != nil {
		return nil, err
	}
	id, err := s.lookup(c, r.CMID)
	if err != nil {
		return nil, err
	}
	var st QPState
	switch r.QPState {
	case abi.QPSInit:
		st = QPStateInit
	case abi.QPSRTR:
		st = QPStateRTR
	case abi.QPSRTS:
		st = QPStateRTS
	default:
		return nil, errnoErr(unix.EINVAL, "QP state %d", r.QPState)
	}
	out := &abi.CMQPAttr{}
	if id.conn == 0 {
		// The connection is gone (its peer gave up, or rejected): the
		// QP of the request may still be created, as its INIT
		// attributes do not depend on the peer; RTR and RTS fail.
		if st == QPStateInit && id.hasInit {
			*out = id.init
			return out, nil
		}
		return nil, errnoErr(unix.EINVAL, "CM ID %d has no connection", id.handle)
	}
	a, err := s.mgr.QPAttr(id.conn, st)
	if err != nil {
		if errors.Is(err, ErrUnknownConn) && st == QPStateInit && id.hasInit {
			*out = id.init
			return out, nil
		}
		return nil, err
	}
	mergeQPAttr(out, &a, id.takesECE())
	return out, nil
}

// checkECE checks the ECE options of a CM_CONNECT or CM_ACCEPT: only an
// ID created with abi.CMIDFlagECE has any, and only known ones. Options
// the device does not support are not refused: the Manager offers and
// takes at most Config.ECE.
func (s *Service) checkECE(id *cmID, opts uint32) error {
	if opts == 0 {
		return nil
	}
	if !id.ece {
		return errnoErr(unix.EINVAL, "ece_options %#x on CM ID %d, created without VRNIC_CM_ID_F_ECE", opts, id.handle)
	}
	if opts&^abi.ECEOptions != 0 {
		return errnoErr(unix.EINVAL, "ece_options %#x: unknown bits %#x", opts, opts&^abi.ECEOptions)
	}
	return nil
}
