package device

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// Operator commands (vrnicctl).
//
// They use the opcode range VRNIC_CMD_ADMIN_BASE (0x100..0x1ff) and, unlike
// the client commands, carry JSON after the message header instead of a C
// struct: this is the operator path, not a hot one, it changes with the
// features, and keeping it out of vrnic_abi.h leaves the client ABI small.
// A connection needs no OPEN_CONTEXT to use them.
//
// Request payload: empty, or a JSON AdminRequest. Reply payload: a JSON
// AdminInfo (AdminInfoCmd) or an AdminList whose Items are of the listed
// kind. Lists are paged so a reply always fits one datagram: a reply with
// Next != 0 is continued by a request with Start = Next.
const (
	AdminInfoCmd     = abi.CmdAdminBase + 0 // AdminInfo
	AdminContextsCmd = abi.CmdAdminBase + 1 // []ContextInfo
	AdminPDsCmd      = abi.CmdAdminBase + 2 // []PDInfo
	AdminMRsCmd      = abi.CmdAdminBase + 3 // []MRInfoJSON
	AdminCQsCmd      = abi.CmdAdminBase + 4 // []CQInfo
	AdminQPsCmd      = abi.CmdAdminBase + 5 // []QPInfo
	AdminSRQsCmd     = abi.CmdAdminBase + 6 // []SRQInfo
	AdminAHsCmd      = abi.CmdAdminBase + 7 // []AHInfo
	AdminHostMemCmd  = abi.CmdAdminBase + 8 // []HostMemInfo
)

// AdminRequest is the JSON payload of an operator list command.
type AdminRequest struct {
	Start int `json:"start,omitempty"`
}

// AdminList is the JSON reply of an operator list command.
type AdminList struct {
	Total int               `json:"total"`
	Next  int               `json:"next,omitempty"`
	Items []json.RawMessage `json:"items"`
}

// AdminInfo is the JSON reply of AdminInfoCmd.
type AdminInfo struct {
	Device      string           `json:"device"`
	ABIVersion  string           `json:"abi_version"`
	LinkType    string           `json:"link_type"`
	Workers     int              `json:"workers"`
	UptimeSec   float64          `json:"uptime_sec"`
	Resources   ResourceCounts   `json:"resources"`
	Limits      Limits           `json:"limits"`
	Counters    map[string]int64 `json:"counters"`
	Connections int64            `json:"connections"`
	// DataPath sums the engine's per-QP counters over every QP, live or
	// destroyed, since the device started.
	DataPath QPCounters `json:"data_path"`
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

// MRInfoJSON describes an MR.
type MRInfoJSON struct {
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

// adminTable maps each operator command to the function listing its items
// (nil for AdminInfoCmd). Called with Device.mu held.
var adminTable = map[abi.Cmd]func(d *Device) []any{
	AdminInfoCmd:     nil,
	AdminContextsCmd: (*Device).listContexts,
	AdminPDsCmd:      (*Device).listPDs,
	AdminMRsCmd:      (*Device).listMRs,
	AdminCQsCmd:      (*Device).listCQs,
	AdminQPsCmd:      (*Device).listQPs,
	AdminSRQsCmd:     (*Device).listSRQs,
	AdminAHsCmd:      (*Device).listAHs,
	AdminHostMemCmd:  (*Device).listHostMem,
}

// adminReplyBudget keeps a list reply inside one datagram.
const adminReplyBudget = abi.MaxMsgSize - abi.SizeofMsgHdr - 1024

func (cn *conn) admin(r *request) (reply, error) {
	d := cn.d
	var req AdminRequest
	if len(r.payload) > 0 {
		dec := json.NewDecoder(bytes.NewReader(r.payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return reply{}, errorf(errInval, "operator request: %v", err)
		}
		if dec.More() {
			return reply{}, errorf(errInval, "operator request: trailing data")
		}
		if req.Start < 0 {
			return reply{}, errorf(errInval, "operator request: negative start")
		}
	}
	list := adminTable[r.hdr.Opcode]
	if list == nil {
		b, err := json.Marshal(d.infoLocked())
		if err != nil {
			return reply{}, err
		}
		return reply{raw: b}, nil
	}
	items := list(d)
	out := AdminList{Total: len(items), Items: []json.RawMessage{}}
	size := 64
	for i := req.Start; i < len(items); i++ {
		b, err := json.Marshal(items[i])
		if err != nil {
			return reply{}, err
		}
		if size+len(b)+1 > adminReplyBudget && len(out.Items) > 0 {
			out.Next = i
			break
		}
		size += len(b) + 1
		out.Items = append(out.Items, b)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return reply{}, err
	}
	return reply{raw: b}, nil
}

func (d *Device) infoLocked() AdminInfo {
	c := &d.counters
	return AdminInfo{
		Device:     d.cfg.Name,
		ABIVersion: fmt.Sprintf("%d.%d", abi.VersionMajor, abi.VersionMinor),
		LinkType:   linkTypeName(d.cfg.Link.Type),
		Workers:    d.cfg.NumWorkers,
		UptimeSec:  time.Since(d.start).Seconds(),
		Resources:  d.totals,
		Limits:     d.cfg.Limits,
		Counters: map[string]int64{
			"commands":        int64(c.Commands.Load()),
			"command_errors":  int64(c.CommandErrors.Load()),
			"bad_messages":    int64(c.BadMessages.Load()),
			"fds_closed":      int64(c.FdsClosed.Load()),
			"contexts_opened": int64(c.ContextsOpened.Load()),
			"contexts_closed": int64(c.ContextsClosed.Load()),
		},
		Connections: c.ConnectionsOpen.Load(),
		DataPath:    d.dataPathTotalsLocked(),
	}
}

func linkTypeName(t abi.LinkType) string {
	switch t {
	case abi.LinkMem:
		return "mem"
	case abi.LinkUDP:
		return "udp"
	case abi.LinkTAP:
		return "tap"
	}
	return fmt.Sprintf("link%d", t)
}

// sortedContexts returns the contexts by handle.
func (d *Device) sortedContexts() []*Context {
	out := make([]*Context, 0, len(d.contexts))
	for _, cx := range d.contexts {
		out = append(out, cx)
	}
	slices.SortFunc(out, func(a, b *Context) int { return int(a.handle) - int(b.handle) })
	return out
}

func sortedKeys[V any](m map[uint32]V) []uint32 {
	k := make([]uint32, 0, len(m))
	for h := range m {
		k = append(k, h)
	}
	slices.Sort(k)
	return k
}

func (d *Device) listContexts() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		out = append(out, ContextInfo{Ctx: cx.handle, Client: cx.name, PID: cx.pid, UID: cx.uid,
			OpenedSec: time.Since(cx.opened).Seconds(), Resources: cx.counts})
	}
	return out
}

func (d *Device) listPDs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.pds) {
			out = append(out, PDInfo{Ctx: cx.handle, Handle: h, Users: cx.pds[h].users})
		}
	}
	return out
}

func (d *Device) listMRs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.mrs) {
			m := cx.mrs[h]
			out = append(out, MRInfoJSON{Ctx: cx.handle, Handle: h, PD: m.pd.handle, IOVA: m.iova, Length: m.length,
				Access: m.access, LKey: m.lkey, RKey: m.rkey, Pages: m.npages, PageShift: m.shift})
		}
	}
	return out
}

func (d *Device) listCQs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.cqs) {
			q := cx.cqs[h]
			out = append(out, CQInfo{Ctx: cx.handle, Handle: h, CQEs: q.cqeCount, RingPA: q.ringPA,
				DBIndex: q.dbIndex, Channel: q.eventfd >= 0, Users: q.users})
		}
	}
	return out
}

func (d *Device) listQPs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, n := range sortedKeys(cx.qps) {
			q := cx.qps[n]
			qi := QPInfo{Ctx: cx.handle, QPN: n, Type: qpTypeName(q.typ), State: q.state.String(),
				PD: q.pd.handle, SendCQ: q.sendCQ.handle, RecvCQ: q.recvCQ.handle,
				SQPSN: q.attr.SQPSN, RQPSN: q.attr.RQPSN, DestQPN: q.attr.DestQPNum,
				PathMTU: q.attr.PathMTU.Bytes(), SendWR: q.cap.MaxSendWR, RecvWR: q.cap.MaxRecvWR,
				Counters: d.engine.Counters(q)}
			if q.srq != nil {
				h := q.srq.handle
				qi.SRQ = &h
			}
			out = append(out, qi)
		}
	}
	return out
}

func (d *Device) listSRQs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.srqs) {
			s := cx.srqs[h]
			out = append(out, SRQInfo{Ctx: cx.handle, Handle: h, PD: s.pd.handle, MaxWR: s.maxWR,
				MaxSGE: s.maxSGE, Limit: s.limit, Users: s.users})
		}
	}
	return out
}

func (d *Device) listAHs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.ahs) {
			a := cx.ahs[h]
			out = append(out, AHInfo{Ctx: cx.handle, Handle: h, PD: a.pd.handle, DGID: fmt.Sprintf("%x", a.attr.DGID)})
		}
	}
	return out
}

func (d *Device) listHostMem() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.hostMem) {
			m := cx.hostMem[h]
			out = append(out, HostMemInfo{Ctx: cx.handle, Handle: h, PABase: m.pa, Length: m.length, Locked: m.locked})
		}
	}
	return out
}
