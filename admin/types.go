package admin

import (
	"encoding/json"
	"reflect"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// The operator commands. JSON instead of C structs: this is the operator
// path, not a hot one, it changes with the features, and keeping it out of
// vrnic_abi.h leaves the client ABI small. A connection needs no
// OPEN_CONTEXT to use them.
//
// Request payload: empty, or a JSON Request. Reply payload: a JSON Info
// (InfoCmd) or a ListReply whose Items are of the listed kind. Lists are
// paged so a reply always fits one datagram: a reply with Next != 0 is
// continued by a request with Start = Next.
//
// Only operators may use them: root, the daemon's own uid, or a member of
// the daemon's operator group (vrnicd -operator-group), as the kernel
// reports the peer with SO_PEERCRED. Anyone else gets EPERM for each of
// them and the connection stays usable for the client commands.
const (
	InfoCmd     = abi.CmdAdminBase + 0 // Info
	ContextsCmd = abi.CmdAdminBase + 1 // []ContextInfo
	PDsCmd      = abi.CmdAdminBase + 2 // []PDInfo
	MRsCmd      = abi.CmdAdminBase + 3 // []MRInfo
	CQsCmd      = abi.CmdAdminBase + 4 // []CQInfo
	QPsCmd      = abi.CmdAdminBase + 5 // []QPInfo
	SRQsCmd     = abi.CmdAdminBase + 6 // []SRQInfo
	AHsCmd      = abi.CmdAdminBase + 7 // []AHInfo
	HostMemCmd  = abi.CmdAdminBase + 8 // []HostMemInfo
	AccountsCmd = abi.CmdAdminBase + 9 // []AccountInfo
	// CaptureCmd starts a packet capture (CaptureRequest): the reply
	// carries a stream socket on which the daemon writes pcapng until
	// the capture ends (its count or duration reached, or the reader
	// closes it).
	CaptureCmd = abi.CmdAdminBase + 10
	// CMCmd lists the communication manager's CM IDs and its QP1 and
	// MAD counters (Request: Start pages through the IDs; reply CMInfo).
	CMCmd = abi.CmdAdminBase + 11
)

// Request is the JSON payload of an operator list command.
type Request struct {
	Start int `json:"start,omitempty"`
}

// CaptureRequest is the JSON request of CaptureCmd.
type CaptureRequest struct {
	Count   int     `json:"count,omitempty"`   // frames; 0: no bound
	Seconds float64 `json:"seconds,omitempty"` // 0: no bound
	Snaplen int     `json:"snaplen,omitempty"` // bytes kept per frame; 0: all
}

// ListReply is the JSON reply of an operator list command.
type ListReply struct {
	Total int               `json:"total"`
	Next  int               `json:"next,omitempty"`
	Items []json.RawMessage `json:"items"`
}

// Info is the JSON reply of InfoCmd.
type Info struct {
	Device     string `json:"device"`
	ABIVersion string `json:"abi_version"`
	LinkType   string `json:"link_type"`
	// CongestionControl is "dcqcn" or "off" (vrnicd -cc), with the
	// DCQCN parameters when on (name=value, rates in Mb/s, times in µs).
	CongestionControl string           `json:"congestion_control,omitempty"`
	CCParams          string           `json:"cc_params,omitempty"`
	Workers           int              `json:"workers"`
	UptimeSec         float64          `json:"uptime_sec"`
	Resources         ResourceCounts   `json:"resources"`
	Limits            Limits           `json:"limits"`
	Counters          map[string]int64 `json:"counters"`
	Connections       int64            `json:"connections"`
	// DataPath sums the engine's per-QP counters over every QP, live or
	// destroyed, since the device started.
	DataPath QPCounters `json:"data_path"`
	// Wire sums the engine workers' frame counters: what reached no QP.
	Wire WireCounters `json:"wire"`
	// LastLinkError is the newest failed link call of any worker
	// ("send: TEXT" or "receive: TEXT"), with its time; empty: none.
	LastLinkError string `json:"last_link_error,omitempty"`
	// ECE names the ECE options the device supports ("sr,rto"), "none"
	// when the operator switched them off (vrnicd -ece=false).
	ECE string `json:"ece,omitempty"`
	// RejectedWQEs counts the work requests the device rejected
	// (malformed WQEs, broken rings) by cause: unknown_opcode,
	// too_many_sge, ring_index, ...
	RejectedWQEs map[string]uint64 `json:"rejected_wqes,omitempty"`
	// Doorbells counts what the doorbell poller did: a client's post
	// makes a system call (a kick) only after the poller went to sleep.
	Doorbells       DoorbellCounters `json:"doorbells"`
	LastLinkErrorAt time.Time        `json:"last_link_error_at,omitzero"`
	// Held is what the daemon holds for the device's clients now.
	Held HeldResources `json:"held"`
}

// HeldResources is what the daemon holds for a device's clients: the
// memory they registered and what of it is pinned, the page tables of
// their MRs and the file descriptors kept for them (what the per-uid
// limits bound, summed over every uid).
type HeldResources struct {
	HostMemBytes uint64 `json:"host_mem_bytes"` // bytes of the host memory regions
	PinnedBytes  uint64 `json:"pinned_bytes"`   // bytes pinned by MRs and rings (charged in 2 MiB chunks)
	LockedBytes  uint64 `json:"locked_bytes"`   // of them, locked in RAM now (mlock)
	LockFailures uint64 `json:"lock_failures"`  // locks that failed (RLIMIT_MEMLOCK): the memory stays pageable
	MRPages      uint64 `json:"mr_pages"`       // page-table entries of the MRs
	FDs          uint64 `json:"fds"`            // descriptors: connections, doorbell pages, kick and completion eventfds, memfds
}

// WireCounters are the engine's per-device frame counters, summed over
// its workers since the device started: frames in and out, and the
// received frames dropped before any QP saw them, by reason.
type WireCounters struct {
	RxFrames    uint64 `json:"rx_frames"`
	TxFrames    uint64 `json:"tx_frames"`
	ParseErrors uint64 `json:"parse_errors"` // malformed frames
	ICRCErrors  uint64 `json:"icrc_errors"`  // ICRC mismatches
	UnknownQP   uint64 `json:"unknown_qp"`   // no such destination QP
	BadPeer     uint64 `json:"bad_peer"`     // not from the QP's peer, wrong P_Key or service
	CQOverflows uint64 `json:"cq_overflows"`
	BuildErrors uint64 `json:"build_errors"` // frames the engine could not build
	// Failed calls of the link (a failed batch counts once), by
	// direction; Info.LastLinkError says what the newest was.
	LinkSendErrors uint64 `json:"link_send_errors"`
	LinkRecvErrors uint64 `json:"link_recv_errors"`
	// Congestion Notification Packets the device sent and received;
	// CNPsIgnored were received with congestion control off or for a
	// QP that does not send (also in CNPsReceived).
	CNPsSent     uint64 `json:"cnps_sent"`
	CNPsReceived uint64 `json:"cnps_received"`
	CNPsIgnored  uint64 `json:"cnps_ignored"`
	// HeldPackets are the request packets the device's responders keep
	// out of order now, waiting for a gap to be filled (selective repeat;
	// a level, not a count).
	HeldPackets uint64 `json:"held_packets"`
}

// ContextInfo describes one client context.
type ContextInfo struct {
	Ctx       uint32         `json:"ctx"`
	Client    string         `json:"client"`
	PID       int32          `json:"pid"`
	UID       uint32         `json:"uid"`
	OpenedSec float64        `json:"opened_sec_ago"`
	Resources ResourceCounts `json:"resources"`
}

// PDInfo describes a PD.
type PDInfo struct {
	Ctx    uint32 `json:"ctx"`
	Handle uint32 `json:"handle"`
	Users  int    `json:"users"`
}

// MRInfo describes an MR.
type MRInfo struct {
	Ctx       uint32 `json:"ctx"`
	Handle    uint32 `json:"handle"`
	PD        uint32 `json:"pd"`
	IOVA      uint64 `json:"iova"`
	Length    uint64 `json:"length"`
	Access    uint32 `json:"access"`
	LKey      uint32 `json:"lkey"`
	RKey      uint32 `json:"rkey"`
	Pages     uint32 `json:"pages"`
	PageShift uint32 `json:"page_shift"`
}

// CQInfo describes a CQ.
type CQInfo struct {
	Ctx     uint32 `json:"ctx"`
	Handle  uint32 `json:"handle"`
	CQEs    uint32 `json:"cqes"`
	RingPA  uint64 `json:"ring_pa"`
	DBIndex uint32 `json:"db_index"`
	Channel bool   `json:"channel"`
	Users   int    `json:"users"`
}

// QPInfo describes a QP.
type QPInfo struct {
	Ctx      uint32     `json:"ctx"`
	QPN      uint32     `json:"qpn"`
	Type     string     `json:"type"`
	State    string     `json:"state"`
	PD       uint32     `json:"pd"`
	SendCQ   uint32     `json:"send_cq"`
	RecvCQ   uint32     `json:"recv_cq"`
	SRQ      *uint32    `json:"srq,omitempty"`
	SQPSN    uint32     `json:"sq_psn"`
	RQPSN    uint32     `json:"rq_psn"`
	DestQPN  uint32     `json:"dest_qpn"`
	PathMTU  int        `json:"path_mtu"`
	SendWR   uint32     `json:"max_send_wr"`
	RecvWR   uint32     `json:"max_recv_wr"`
	Counters QPCounters `json:"counters"`
	// CCRate is the QP's current send rate in b/s while congestion
	// control limits it (after a CNP, until it recovers to the line
	// rate); 0: not limited. A column of vrnicctl qps.
	CCRate uint64 `json:"cc_rate_bps"`
	// ECE names the ECE options in force on the QP ("sr,rto", "sr",
	// ...; abi.ECEString), "" for none: what the CM or the program
	// agreed with the peer (vrnic_abi.h "Enhanced Connection
	// Establishment"). A column of vrnicctl qps.
	ECE string `json:"ece"`
}

// SRQInfo describes an SRQ.
type SRQInfo struct {
	Ctx    uint32 `json:"ctx"`
	Handle uint32 `json:"handle"`
	PD     uint32 `json:"pd"`
	MaxWR  uint32 `json:"max_wr"`
	MaxSGE uint32 `json:"max_sge"`
	Limit  uint32 `json:"limit"`
	Users  int    `json:"users"`
}

// AHInfo describes an AH.
type AHInfo struct {
	Ctx    uint32 `json:"ctx"`
	Handle uint32 `json:"handle"`
	PD     uint32 `json:"pd"`
	DGID   string `json:"dgid"`
}

// HostMemInfo describes a host memory region.
type HostMemInfo struct {
	Ctx    uint32 `json:"ctx"`
	Handle uint32 `json:"handle"`
	PABase uint64 `json:"pa_base"`
	Length uint64 `json:"length"`
	Locked bool   `json:"locked"`
}

// AccountInfo is what the clients of one uid hold together: a client is
// its uid (as SO_PEERCRED reports it), whatever its processes and
// connections. Resources sums the per-context counts over the uid's
// contexts (Resources.Contexts is the number of contexts).
type AccountInfo struct {
	UID          uint32         `json:"uid"`
	Connections  int            `json:"connections"`
	Resources    ResourceCounts `json:"resources"`
	HostMemBytes uint64         `json:"host_mem_bytes"`
	FDs          int            `json:"fds"`      // descriptors the daemon holds for the uid (UIDLimits.FDs)
	MRPages      uint64         `json:"mr_pages"` // page-table entries of the uid's MRs
	CMIDs        int            `json:"cm_ids"`   // CM IDs of the uid's contexts (UIDLimits.CMIDs)
	// Refused counts the connections of this uid refused at the per-uid
	// connection limit while the account was live (it ends when the
	// uid's last connection closes).
	Refused uint64 `json:"connections_refused"`
}

// ResourceCounts counts the objects of one kind each; used for limits and
// for the operator's resource report.
type ResourceCounts struct {
	Contexts int `json:"contexts"`
	HostMem  int `json:"host_mem"`
	PD       int `json:"pd"`
	MR       int `json:"mr"`
	CQ       int `json:"cq"`
	QP       int `json:"qp"`
	SRQ      int `json:"srq"`
	AH       int `json:"ah"`
	MW       int `json:"mw"` // memory windows
}

// Limits bound what clients may create. PerClient limits (per context)
// and PerUID limits failing give EAGAIN, PerDevice limits ENOMEM.
// PerClient.Contexts is not used (a context is the client of
// PerClient).
type Limits struct {
	PerClient ResourceCounts `json:"per_client"`
	PerDevice ResourceCounts `json:"per_device"`
	// PerUID bounds what the processes of one uid hold together, so that
	// one user cannot take every context or connection of the device.
	PerUID UIDLimits `json:"per_uid"`
	// MaxMRPages bounds the page list of one REG_MR (the daemon copies
	// it): a larger registration fails with EINVAL, as any MR beyond the
	// device's attributes does.
	MaxMRPages uint32 `json:"max_mr_pages"`
	// MRTableBytesPerUID bounds the memory the daemon spends on the MR
	// page tables of all contexts of one uid together (8 bytes a page,
	// or 16 a run of contiguous pages); beyond it REG_MR fails with
	// ENOMEM.
	MRTableBytesPerUID uint64 `json:"mr_table_bytes_per_uid"`
	// PinnedBytesPerUID bounds the host memory that the MRs and rings of
	// all contexts of one uid pin (lock), counted in the 2 MiB chunks the
	// daemon locks; beyond it REG_MR and ring creation fail with ENOMEM.
	PinnedBytesPerUID uint64 `json:"pinned_bytes_per_uid"`
}

// UIDLimits bound the contexts and control connections of one uid. Zero
// fields take defaults: Contexts a quarter of the device's contexts (at
// least 1), Connections twice the per-uid contexts plus 16 (room for
// operator tools beside the clients).
type UIDLimits struct {
	// Contexts: OPEN_CONTEXT past it fails with EAGAIN.
	Contexts int `json:"contexts"`
	// Connections: the first command on a connection past it is
	// answered with EAGAIN, then the connection is closed.
	Connections int `json:"connections"`
	// FDs bounds the descriptors the daemon holds for the uid: its
	// connections, two per context (doorbell page, kick eventfd), one per
	// host memory region (the memfd) and one per CQ with a completion
	// channel (its eventfd). ADD_HOST_MEM or CREATE_CQ past it fails with
	// EMFILE. Default: 16 per context of PerUID.Contexts, at least 1024.
	FDs int `json:"fds"`
	// CMIDs bounds the CM IDs of the uid's contexts (rdma_cm IDs: each
	// listener, connection and connect request received for its
	// listeners). CM_CREATE_ID past it fails with EAGAIN, and a connect
	// request is rejected (no resources). Default 65536.
	CMIDs int `json:"cm_ids"`
}

// QPCounters are one QP's data-path counters as the operator sees them
// (the engine keeps them as atomics of the same names, in the same order:
// package device/dataplane copies one into the other and a test checks
// the two agree); Info.DataPath holds their device-wide sums. QUERY_QP
// carries the first four it declares (abi.RespQueryQP).
type QPCounters struct {
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
	Retransmits     uint64 `json:"retransmits"`       // go-back-N restarts
	RNRNAKsReceived uint64 `json:"rnr_naks_received"` // in QUERY_QP
	Timeouts        uint64 `json:"timeouts"`          // local ACK timeouts
	RNRNAKsSent     uint64 `json:"rnr_naks_sent"`
	SeqNAKsReceived uint64 `json:"seq_naks_received"`
	SeqNAKsSent     uint64 `json:"seq_naks_sent"`
	Duplicates      uint64 `json:"duplicates"` // duplicate requests received
	Dropped         uint64 `json:"dropped"`    // packets dropped by a check
	SendCQEs        uint64 `json:"send_cqes"`
	RecvCQEs        uint64 `json:"recv_cqes"`
	QKeyViolations  uint64 `json:"qkey_violations"` // UD: bad Q_Key (also in dropped)
	NoRecvWQE       uint64 `json:"no_recv_wqe"`     // UD, UC: no receive WQE posted (also in dropped)
	// Fatal NAKs by code (IBTA 9.7.5.2.3-9.7.5.2.5): the responder's class
	// C and D errors, which also count in dropped where the responder
	// sent them and fail the WQE where the requester received them.
	InvalidReqNAKsSent     uint64 `json:"invalid_request_naks_sent"`
	RemAccessNAKsSent      uint64 `json:"remote_access_naks_sent"`
	RemOpNAKsSent          uint64 `json:"remote_operational_naks_sent"`
	InvalidReqNAKsReceived uint64 `json:"invalid_request_naks_received"`
	RemAccessNAKsReceived  uint64 `json:"remote_access_naks_received"`
	RemOpNAKsReceived      uint64 `json:"remote_operational_naks_received"`
	// Congestion control (RoCE v2 annex A17.9, DCQCN): data packets
	// received marked Congestion Experienced, and the Congestion
	// Notification Packets (opcode 0x81) sent for them and received.
	CEReceived   uint64 `json:"ce_received"`
	CNPsSent     uint64 `json:"cnps_sent"`
	CNPsReceived uint64 `json:"cnps_received"`
}

// Add adds every counter of o to c.
func (c *QPCounters) Add(o QPCounters) {
	dst, src := reflect.ValueOf(c).Elem(), reflect.ValueOf(o)
	for i := range dst.NumField() {
		f := dst.Field(i)
		f.SetUint(f.Uint() + src.Field(i).Uint())
	}
}

// CMInfo is the JSON reply of CMCmd: the device's communication manager.
// IDs holds the CM IDs from Request.Start on (as many as fit one reply);
// Next, when not 0, is the Start of the rest.
type CMInfo struct {
	Enabled         bool     `json:"enabled"` // the device has QP1 and a CM
	QP1             QP1Stats `json:"qp1"`
	MADsSent        uint64   `json:"mads_sent"`       // CM MADs sent, first transmissions and answers
	Retransmissions uint64   `json:"retransmissions"` // CM MADs sent again after a timeout
	MADsReceived    uint64   `json:"mads_received"`   // CM MADs decoded
	Duplicates      uint64   `json:"duplicates"`      // received and recognised as repeats
	Invalid         uint64   `json:"invalid"`         // malformed or unsupported CM MADs
	Unmatched       uint64   `json:"unmatched"`       // CM MADs for no known connection, or not from its peer
	HalfOpen        int      `json:"half_open"`       // connect requests received, not yet established
	Shed            uint64   `json:"shed"`            // half-open connections dropped to admit a newer request
	Expired         uint64   `json:"expired"`         // connect requests dropped unanswered after the peer's wait
	// REJs sent and received by reason, as Linux words it ("consumer
	// defined", "stale conn", ...; "other": a reason the IBTA does not
	// define).
	RejectsSent     map[string]uint64 `json:"rejects_sent,omitempty"`
	RejectsReceived map[string]uint64 `json:"rejects_received,omitempty"`
	Connections     int               `json:"connections"` // connections the CM IDs hold
	Total           int               `json:"total"`       // CM IDs
	Next            int               `json:"next,omitempty"`
	IDs             []CMIDInfo        `json:"ids"`
}

// QP1Stats are the counters of the device's QP1.
type QP1Stats struct {
	Sent        uint64 `json:"sent"`         // MADs handed to the transport
	SendErrors  uint64 `json:"send_errors"`  // MADs whose send failed
	SendDropped uint64 `json:"send_dropped"` // MADs refused: send queue full, no route
	Overflow    uint64 `json:"overflow"`     // answers (REJ, MRA, RTU, DREP, SIDR_REP) queued past the send backlog's bound
	Received    uint64 `json:"received"`     // MADs received and given to an agent
	Dropped     uint64 `json:"dropped"`      // MADs received and dropped: no agent for the class, malformed
	RecvErrors  uint64 `json:"recv_errors"`  // receive completions with an error
	NoRecvSlot  uint64 `json:"no_recv_slot"` // MADs the transport dropped: every receive slot held a MAD the CM had not taken yet
}

// CMIDInfo is one CM ID in CMInfo.
type CMIDInfo struct {
	Ctx       uint32 `json:"ctx"`
	ID        uint32 `json:"id"`
	QPType    string `json:"qp_type"`
	Role      string `json:"role"` // listen, active, passive, idle
	ServiceID uint64 `json:"service_id"`
	Backlog   int    `json:"backlog,omitempty"`
	Pending   int    `json:"pending,omitempty"` // requests not yet answered (listen)
	Conn      uint32 `json:"conn,omitempty"`    // local communication ID
	State     string `json:"state,omitempty"`   // the connection's CM state
	Peer      string `json:"peer,omitempty"`
	LastEvent string `json:"last_event,omitempty"`
	// ECE names the ECE options agreed on the connection ("sr,rto";
	// empty: none).
	ECE string `json:"ece,omitempty"`
}

// DoorbellCounters count the doorbell poller's work since the device
// started.
type DoorbellCounters struct {
	Passes   uint64 `json:"passes"`   // passes over the served pages
	Sleeps   uint64 `json:"sleeps"`   // times it went to sleep (clients must kick)
	Rechecks uint64 `json:"rechecks"` // re-checks before sleeping that found a post
	Kicks    uint64 `json:"kicks"`    // kicks that woke it
}
