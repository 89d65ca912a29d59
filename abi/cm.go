package abi

import "strconv"

// Communication manager (ABI 1.2): the commands and the CM event of
// vrnic_abi.h's "Communication manager" section.

// CM commands.
const (
	CmdCMCreateID   Cmd = 24
	CmdCMDestroyID  Cmd = 25
	CmdCMListen     Cmd = 26
	CmdCMConnect    Cmd = 27
	CmdCMAccept     Cmd = 28
	CmdCMReject     Cmd = 29
	CmdCMEstablish  Cmd = 30
	CmdCMDisconnect Cmd = 31
	CmdCMInitQPAttr Cmd = 32
)

// Private data sizes.
const (
	CMMaxPrivateData        = 224
	CMREQPrivateData        = 92
	CMREPPrivateData        = 196
	CMREJPrivateData        = 148
	CMDREQPrivateData       = 220
	CMSIDRREQPrivateData    = 216
	CMSIDRREPPrivateData    = 136
	SizeofCMEvent           = 352
	CMDefaultBacklog        = 128
	CMDefaultResponseTimout = 20
	CMDefaultMaxRetries     = 15
)

// CMEventType is enum vrnic_cm_event_type: VRNIC_CM_EVENT_BASE + enum
// rdma_cm_event_type.
type CMEventType uint32

// CM events.
const (
	CMEventBase            CMEventType = 0x100
	CMEventConnectRequest  CMEventType = 0x104
	CMEventConnectResponse CMEventType = 0x105
	CMEventUnreachable     CMEventType = 0x107
	CMEventRejected        CMEventType = 0x108
	CMEventEstablished     CMEventType = 0x109
	CMEventDisconnected    CMEventType = 0x10a
	CMEventTimeWaitExit    CMEventType = 0x10f
)

// DISCONNECTED statuses.
const (
	CMDisconnectRequest  = 0 // the peer's DREQ: answer with CM_DISCONNECT
	CMDisconnectReply    = 1 // the DREP answering ours
	CMDisconnectTimedOut = 2 // our DREQ got no answer
)

var cmEventNames = map[CMEventType]string{
	CMEventConnectRequest: "CONNECT_REQUEST", CMEventConnectResponse: "CONNECT_RESPONSE",
	CMEventUnreachable: "UNREACHABLE", CMEventRejected: "REJECTED", CMEventEstablished: "ESTABLISHED",
	CMEventDisconnected: "DISCONNECTED", CMEventTimeWaitExit: "TIMEWAIT_EXIT",
}

// String returns the event's name without the VRNIC_CM_EVENT_ prefix.
func (e CMEventType) String() string {
	if n, ok := cmEventNames[e]; ok {
		return n
	}
	return "CM_EVENT_" + strconv.FormatUint(uint64(e), 10)
}

// CmdCMCreateIDReq is struct vrnic_cmd_cm_create_id.
type CmdCMCreateIDReq struct {
	QPType QPType `c:"qp_type"`
	Flags  uint32 `c:"flags"` // ABI 1.5: CMIDFlag*
}

// CMIDFlagECE is VRNIC_CM_ID_F_ECE (ABI 1.5): the CM ID, and a listener's
// connection requests, negotiate ECE; their events are CMEventECE.
const CMIDFlagECE = 1 << 0

// RespCMID is struct vrnic_resp_cm_id.
type RespCMID struct {
	CMID     uint32 `c:"cm_id"`
	Reserved uint32 `c:"reserved"`
}

// CmdCMListenReq is struct vrnic_cmd_cm_listen.
type CmdCMListenReq struct {
	CMID      uint32 `c:"cm_id"`
	Backlog   uint32 `c:"backlog"`
	ServiceID uint64 `c:"service_id"`
}

// CmdCMConnectReq is struct vrnic_cmd_cm_connect.
type CmdCMConnectReq struct {
	CMID               uint32                 `c:"cm_id"`
	QPN                uint32                 `c:"qpn"`
	StartingPSN        uint32                 `c:"starting_psn"`
	FlowLabel          uint32                 `c:"flow_label"`
	ServiceID          uint64                 `c:"service_id"`
	DGID               [16]byte               `c:"dgid"`
	SGIDIndex          uint8                  `c:"sgid_index"`
	HopLimit           uint8                  `c:"hop_limit"`
	TrafficClass       uint8                  `c:"traffic_class"`
	PathMTU            uint8                  `c:"path_mtu"`
	ResponderResources uint8                  `c:"responder_resources"`
	InitiatorDepth     uint8                  `c:"initiator_depth"`
	RetryCount         uint8                  `c:"retry_count"`
	RNRRetryCount      uint8                  `c:"rnr_retry_count"`
	SRQ                uint8                  `c:"srq"`
	CMResponseTimeout  uint8                  `c:"cm_response_timeout"`
	MaxCMRetries       uint8                  `c:"max_cm_retries"`
	PrivateDataLen     uint8                  `c:"private_data_len"`
	PrivateData        [CMMaxPrivateData]byte `c:"private_data"`
	ECEOptions         uint32                 `c:"ece_options"` // ABI 1.5, CMIDFlagECE: offered in the REQ
}

// CmdCMAcceptReq is struct vrnic_cmd_cm_accept.
type CmdCMAcceptReq struct {
	CMID               uint32                 `c:"cm_id"`
	QPN                uint32                 `c:"qpn"`
	StartingPSN        uint32                 `c:"starting_psn"`
	QKey               uint32                 `c:"qkey"`
	ResponderResources uint8                  `c:"responder_resources"`
	InitiatorDepth     uint8                  `c:"initiator_depth"`
	RNRRetryCount      uint8                  `c:"rnr_retry_count"`
	SRQ                uint8                  `c:"srq"`
	Reserved           [3]byte                `c:"reserved"`
	PrivateDataLen     uint8                  `c:"private_data_len"`
	PrivateData        [CMMaxPrivateData]byte `c:"private_data"`
	// ABI 1.5 (a 1.4 client sends the first OffCMAcceptECE bytes):
	// CMIDFlagECE, RC: the ECE options the QP took at RTR.
	ECEOptions uint32 `c:"ece_options"`
	Reserved2  uint32 `c:"reserved2"`
}

// OffCMAcceptECE is where ABI 1.5 extended CM_ACCEPT: the length of the
// command of a 1.4 client, which the daemon still takes.
const OffCMAcceptECE = 248

// CmdCMPrivateReq is struct vrnic_cmd_cm_private (CM_REJECT,
// CM_DISCONNECT).
type CmdCMPrivateReq struct {
	CMID           uint32                 `c:"cm_id"`
	Reserved       [3]byte                `c:"reserved"`
	PrivateDataLen uint8                  `c:"private_data_len"`
	PrivateData    [CMMaxPrivateData]byte `c:"private_data"`
}

// CmdCMInitQPAttrReq is struct vrnic_cmd_cm_init_qp_attr.
type CmdCMInitQPAttrReq struct {
	CMID    uint32  `c:"cm_id"`
	QPState QPState `c:"qp_state"`
}

// CMQPAttr is struct vrnic_cm_qp_attr.
type CMQPAttr struct {
	AttrMask        uint32   `c:"attr_mask"`
	QPState         QPState  `c:"qp_state"`
	QPAccessFlags   uint32   `c:"qp_access_flags"`
	PathMTU         MTU      `c:"path_mtu"`
	DestQPNum       uint32   `c:"dest_qp_num"`
	RQPSN           uint32   `c:"rq_psn"`
	SQPSN           uint32   `c:"sq_psn"`
	FlowLabel       uint32   `c:"flow_label"`
	DGID            [16]byte `c:"dgid"`
	SGIDIndex       uint8    `c:"sgid_index"`
	HopLimit        uint8    `c:"hop_limit"`
	TrafficClass    uint8    `c:"traffic_class"`
	SL              uint8    `c:"sl"`
	MaxDestRdAtomic uint8    `c:"max_dest_rd_atomic"`
	MinRNRTimer     uint8    `c:"min_rnr_timer"`
	Timeout         uint8    `c:"timeout"`
	RetryCnt        uint8    `c:"retry_cnt"`
	RNRRetry        uint8    `c:"rnr_retry"`
	MaxRdAtomic     uint8    `c:"max_rd_atomic"`
	PortNum         uint8    `c:"port_num"`
	Reserved        uint8    `c:"reserved"`
	PKeyIndex       uint16   `c:"pkey_index"`
	ECEOptions      uint16   `c:"ece_options"` // ABI 1.5, RTR with QPAttrECE: the agreed ECE options
}

// CMEvent is struct vrnic_cm_event: one datagram on a context's event
// socket.
type CMEvent struct {
	Type               CMEventType            `c:"event_type"`
	CMID               uint32                 `c:"cm_id"`
	ListenID           uint32                 `c:"listen_id"`
	Status             uint32                 `c:"status"`
	ServiceID          uint64                 `c:"service_id"`
	PeerGID            [16]byte               `c:"peer_gid"`
	PeerQPN            uint32                 `c:"peer_qpn"`
	PeerPSN            uint32                 `c:"peer_psn"`
	PeerQKey           uint32                 `c:"peer_qkey"`
	ResponderResources uint8                  `c:"responder_resources"`
	InitiatorDepth     uint8                  `c:"initiator_depth"`
	RetryCount         uint8                  `c:"retry_count"`
	RNRRetryCount      uint8                  `c:"rnr_retry_count"`
	SRQ                uint8                  `c:"srq"`
	QPType             uint8                  `c:"qp_type"`
	PrivateDataLen     uint8                  `c:"private_data_len"`
	Reserved           uint8                  `c:"reserved"`
	QPAttr             CMQPAttr               `c:"qp_attr"`
	PrivateData        [CMMaxPrivateData]byte `c:"private_data"`
	Reserved2          [4]byte                `c:"reserved2"`
}

// CMECE is struct vrnic_cm_ece: the ECE a REQ or REP carried.
type CMECE struct {
	VendorID uint32 `c:"vendor_id"` // 24 bits; 0: none
	Options  uint32 `c:"options"`   // the MAD's attribute modifier
}

// CMEventECE is struct vrnic_cm_event_ece (ABI 1.5): the events of a CM
// ID created with CMIDFlagECE.
type CMEventECE struct {
	Ev      CMEvent `c:"ev"`
	PeerECE CMECE   `c:"peer_ece"`
}

// SizeofCMEventECE is sizeof(struct vrnic_cm_event_ece).
const SizeofCMEventECE = 360

// Private returns the event's private data.
func (e *CMEvent) Private() []byte {
	return e.PrivateData[:min(int(e.PrivateDataLen), CMMaxPrivateData)]
}
