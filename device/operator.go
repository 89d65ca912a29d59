package device

import (
	"os"

	"golang.org/x/sys/unix"

	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// adminTable maps each operator command to the function listing its items
// (nil for admin.InfoCmd). Called with Device.mu held.
var adminTable = map[abi.Cmd]func(d *Device) []any{
	admin.InfoCmd:     nil,
	admin.ContextsCmd: (*Device).listContexts,
	admin.PDsCmd:      (*Device).listPDs,
	admin.MRsCmd:      (*Device).listMRs,
	admin.CQsCmd:      (*Device).listCQs,
	admin.QPsCmd:      (*Device).listQPs,
	admin.SRQsCmd:     (*Device).listSRQs,
	admin.AHsCmd:      (*Device).listAHs,
	admin.HostMemCmd:  (*Device).listHostMem,
	admin.AccountsCmd: (*Device).listAccounts,
	admin.CaptureCmd:  nil, // served by capture
	admin.CMCmd:       nil, // served by cmInfo
	admin.FaultCmd:    nil, // served by faults
}

// adminReplyBudget keeps a list reply inside one datagram.
const adminReplyBudget = abi.MaxMsgSize - abi.SizeofMsgHdr - 1024

// admin serves an operator command to an operator (conn.operator); any
// other peer gets EPERM, and its connection continues.
// page encodes items from start on, as many as fit one reply after
// overhead bytes of the rest of it; next is the start of the rest (0: none
// left).
func page[T any](items []T, start, overhead int) (out []json.RawMessage, next int, err error) {
	out = []json.RawMessage{}
	size := overhead
	for i := start; i < len(items); i++ {
		b, err := json.Marshal(items[i])
		if err != nil {
			return nil, 0, err
		}
		if size+len(b)+1 > adminReplyBudget && len(out) > 0 {
			return out, i, nil
		}
		size += len(b) + 1
		out = append(out, b)
	}
	return out, 0, nil
}

// operatorOnly refuses an operator command to a peer that is not one.
func (cn *conn) operatorOnly(op abi.Cmd) error {
	if cn.operator {
		return nil
	}
	cn.d.counters.OperatorDenied.Add(1)
	return cn.d.operatorDenied(cn, op)
}

// adminRequest decodes the JSON payload of an operator list command.
func adminRequest(payload []byte) (admin.Request, error) {
	var req admin.Request
	if len(payload) > 0 {
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return req, errorf(errInval, "operator request: %v", err)
		}
		if dec.More() {
			return req, errorf(errInval, "operator request: trailing data")
		}
		if req.Start < 0 {
			return req, errorf(errInval, "operator request: negative start")
		}
	}
	return req, nil
}

func (cn *conn) admin(r *request) (reply, error) {
	d := cn.d
	if err := cn.operatorOnly(r.hdr.Opcode); err != nil {
		return reply{}, err
	}
	if r.hdr.Opcode == admin.CaptureCmd {
		return cn.capture(r)
	}
	if r.hdr.Opcode == admin.FaultCmd {
		return d.faults(r.payload)
	}
	req, err := adminRequest(r.payload)
	if err != nil {
		return reply{}, err
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
	out := admin.ListReply{Total: len(items)}
	if out.Items, out.Next, err = page(items, req.Start, 64); err != nil {
		return reply{}, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return reply{}, err
	}
	return reply{raw: b}, nil
}

func (d *Device) infoLocked() admin.Info {
	c := &d.counters
	lastErr, lastErrAt := d.dp.LastLinkError()
	var ccMode, ccParams string
	if m, ok := d.dp.(ccModer); ok {
		ccMode, ccParams = m.CongestionControl()
	}
	return admin.Info{
		CongestionControl: ccMode,
		CCParams:          ccParams,
		ECE:               abi.ECEString(d.ECEOptions()),
		LastLinkError:     lastErr,
		LastLinkErrorAt:   lastErrAt,
		RejectedWQEs:      d.dp.RejectedWQEs(),
		Doorbells:         d.dp.Doorbells(),
		Device:            d.cfg.Name,
		ABIVersion:        fmt.Sprintf("%d.%d", abi.VersionMajor, abi.VersionMinor),
		LinkType:          linkTypeName(d.cfg.Link.Type),
		Workers:           d.cfg.NumWorkers,
		UptimeSec:         time.Since(d.start).Seconds(),
		Resources:         d.totals,
		Limits:            d.cfg.Limits,
		Counters: map[string]int64{
			"commands":             int64(c.Commands.Load()),
			"command_errors":       int64(c.CommandErrors.Load()),
			"bad_messages":         int64(c.BadMessages.Load()),
			"fds_closed":           int64(c.FdsClosed.Load()),
			"contexts_opened":      int64(c.ContextsOpened.Load()),
			"contexts_closed":      int64(c.ContextsClosed.Load()),
			"connections_refused":  int64(c.ConnectionsRefused.Load()),
			"operator_denied":      int64(c.OperatorDenied.Load()),
			"accept_errors":        int64(c.AcceptErrors.Load()),
			"async_events":         int64(c.AsyncEvents.Load()),
			"async_events_dropped": int64(c.AsyncEventsDropped.Load()),
		},
		Connections: c.ConnectionsOpen.Load(),
		DataPath:    d.dataPathTotalsLocked(),
		Wire:        d.dp.WireCounters(),
		Held:        d.heldLocked(),
	}
}

// heldLocked sums what the daemon holds for the clients (the resources
// listAccounts reports per uid). Called with d.mu held.
func (d *Device) heldLocked() admin.HeldResources {
	var h admin.HeldResources
	for _, a := range d.accounts {
		h.FDs += uint64(a.conns)
	}
	for _, cx := range d.contexts {
		h.FDs += uint64(cx.fds())
		for _, m := range cx.hostMem {
			h.HostMemBytes += m.length
		}
		for _, m := range cx.mrs {
			h.MRPages += uint64(m.npages)
		}
	}
	h.PinnedBytes, h.LockedBytes, h.LockFailures = d.cfg.Space.LockStats()
	return h
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
		out = append(out, admin.ContextInfo{Ctx: cx.handle, Client: cx.name, PID: cx.pid, UID: cx.uid,
			OpenedSec: time.Since(cx.opened).Seconds(), Resources: cx.counts})
	}
	return out
}

func (d *Device) listPDs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.pds) {
			out = append(out, admin.PDInfo{Ctx: cx.handle, Handle: h, Users: cx.pds[h].users})
		}
	}
	return out
}

func (d *Device) listMRs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.mrs) {
			m := cx.mrs[h]
			out = append(out, admin.MRInfo{Ctx: cx.handle, Handle: h, PD: m.pd.handle, IOVA: m.iova, Length: m.length,
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
			out = append(out, admin.CQInfo{Ctx: cx.handle, Handle: h, CQEs: q.cqeCount, RingPA: q.ringPA,
				DBIndex: q.dbIndex, Channel: q.eventfd >= 0, Users: q.users})
		}
	}
	return out
}

// ccRater and ccModer are what a data plane with congestion control adds
// to DataPlane (package device/dataplane): a QP's current rate, the mode.
type (
	ccRater interface{ CCRate(q *QP) uint64 }
	ccModer interface {
		CongestionControl() (mode, params string)
	}
)

func (d *Device) listQPs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		qs := cx.qps.list()
		slices.SortFunc(qs, func(a, b *QP) int { return cmp.Compare(a.qpn, b.qpn) })
		for _, q := range qs {
			n := q.qpn
			qi := admin.QPInfo{Ctx: cx.handle, QPN: n, Type: q.typ.String(), State: q.state.Load().String(),
				PD: q.pd.handle, SendCQ: q.sendCQ.handle, RecvCQ: q.recvCQ.handle,
				SQPSN: q.attr.SQPSN, RQPSN: q.attr.RQPSN, DestQPN: q.attr.DestQPNum,
				PathMTU: q.attr.PathMTU.Bytes(), SendWR: q.attr.Cap.MaxSendWR, RecvWR: q.attr.Cap.MaxRecvWR,
				Counters: d.dp.Counters(q)}
			if c, ok := d.dp.(ccRater); ok {
				qi.CCRate = c.CCRate(q)
			}
			if q.ece != 0 {
				qi.ECE = abi.ECEString(q.ece)
			}
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
			out = append(out, admin.SRQInfo{Ctx: cx.handle, Handle: h, PD: s.pd.handle, MaxWR: s.maxWR,
				MaxSGE: s.maxSGE, Limit: s.armed.Load(), Users: s.users})
		}
	}
	return out
}

func (d *Device) listAHs() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.ahs) {
			a := cx.ahs[h]
			out = append(out, admin.AHInfo{Ctx: cx.handle, Handle: h, PD: a.pd.handle, DGID: fmt.Sprintf("%x", a.attr.DGID)})
		}
	}
	return out
}

func (d *Device) listHostMem() []any {
	var out []any
	for _, cx := range d.sortedContexts() {
		for _, h := range sortedKeys(cx.hostMem) {
			m := cx.hostMem[h]
			out = append(out, admin.HostMemInfo{Ctx: cx.handle, Handle: h, PABase: m.pa, Length: m.length, Locked: m.locked})
		}
	}
	return out
}

// capture is admin.CaptureCmd: a stream socket pair, the daemon's end
// handed to Config.Capture, the operator's end in the reply.
func (cn *conn) capture(r *request) (reply, error) {
	d := cn.d
	if d.cfg.Capture == nil {
		return reply{}, errorf(errNotSup, "this device has no packet capture (no data plane)")
	}
	var req admin.CaptureRequest
	if len(r.payload) > 0 {
		dec := json.NewDecoder(bytes.NewReader(r.payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return reply{}, errorf(errInval, "capture request: %v", err)
		}
	}
	if req.Count < 0 || req.Seconds < 0 || req.Snaplen < 0 {
		return reply{}, errorf(errInval, "capture request: count, seconds and snaplen must not be negative")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return reply{}, errorf(errNoMem, "capture socket: %v", err)
	}
	unix.Shutdown(fds[0], unix.SHUT_RD)
	unix.Shutdown(fds[1], unix.SHUT_WR)
	// Non-blocking, so that the writer's deadlines work: an operator who
	// stops reading ends the capture, and nothing waits on it for ever.
	unix.SetNonblock(fds[0], true)
	w := os.NewFile(uintptr(fds[0]), "capture")
	if err := d.cfg.Capture(w, req); err != nil {
		w.Close()
		unix.Close(fds[1])
		return reply{}, errorf(errBusy, "capture: %v", err)
	}
	return reply{fds: []int{fds[1]}, handOff: true}, nil
}

// faults is admin.FaultCmd: the request, decoded strictly, goes to
// Config.Faults, which validates every rule; what is wrong with one comes
// back as the error's message (EINVAL).
func (d *Device) faults(payload []byte) (reply, error) {
	if d.cfg.Faults == nil {
		return reply{}, errorf(errNotSup, "this device has no fault layer (no data plane)")
	}
	var req admin.FaultRequest
	if err := admin.StrictJSON(payload, &req); err != nil {
		return reply{}, errorf(errInval, "fault request: %v", err)
	}
	out, err := d.cfg.Faults(req)
	if err != nil {
		return reply{}, errorf(errInval, "%v", err)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return reply{}, err
	}
	if len(b) > adminReplyBudget {
		return reply{}, errorf(errInval, "fault reply of %d bytes does not fit a message: list with start", len(b))
	}
	return reply{raw: b}, nil
}
