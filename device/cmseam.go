package device

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// CM is the communication manager as the device uses it (package cm's
// Service, which the daemon builds over its QP1 and hands in as
// Config.CM). The device only routes to it: the CM_* commands of a
// context (Command, without the device lock: the CM never takes it), the
// release of a context (Release) and the operator's view (Info). The CM
// owns the CM IDs, their connections and their events; it reaches the
// context through CMClient.
type CM interface {
	// Command serves one CM_* command of client c; the error wraps the
	// errno the client gets.
	Command(c CMClient, op abi.Cmd, payload []byte) (any, error)
	// Release ends every CM ID of c (its context is going).
	Release(c CMClient)
	// Info is the operator's view (vrnicctl cm).
	Info() admin.CMInfo
}

// CMClient is what the CM needs of a context. It is the same type as
// cm.Client (both are aliases of this unnamed interface type). Its methods
// never block and never take the device lock: the CM calls them from its
// own goroutine.
type CMClient = interface {
	CMContext() uint32
	CMEventsOpen() bool
	CMPostEvent(ev []byte)
	CMMayBindPrivileged() bool
	CMChargeID(delta int) error
}

var _ CMClient = (*Context)(nil)

// CMContext is the context's handle.
func (cx *Context) CMContext() uint32 { return cx.handle }

// CMEventsOpen reports whether the context opened its event socket.
func (cx *Context) CMEventsOpen() bool { return cx.events.Load() != nil }

// CMPostEvent queues a CM event on the context's event socket (if open).
func (cx *Context) CMPostEvent(ev []byte) {
	if s := cx.events.Load(); s != nil {
		s.postBytes(ev)
	}
}

// CMMayBindPrivileged reports whether the context's process may use a port
// below 1024: root, or CAP_NET_BIND_SERVICE in its effective set (read
// from /proc/<pid>/status, checked against the uid the socket reported, as
// isOperator reads the groups).
func (cx *Context) CMMayBindPrivileged() bool {
	if cx.uid == 0 {
		return true
	}
	if cx.pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cx.pid))
	if err != nil {
		return false
	}
	caps, ok := procCapEff(b, cx.uid)
	return ok && caps&(1<<capNetBindService) != 0
}

// capNetBindService is CAP_NET_BIND_SERVICE's bit (linux/capability.h).
const capNetBindService = 10

// procCapEff returns the effective capabilities (CapEff:) of a
// /proc/<pid>/status and true if its effective uid is uid.
func procCapEff(status []byte, uid uint32) (uint64, bool) {
	var caps uint64
	capsOK, uidOK := false, false
	for _, line := range strings.Split(string(status), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		switch key {
		case "Uid":
			if len(f) >= 2 {
				v, err := strconv.ParseUint(f[1], 10, 32)
				uidOK = err == nil && uint32(v) == uid
			}
		case "CapEff":
			if len(f) == 1 {
				v, err := strconv.ParseUint(f[0], 16, 64)
				caps, capsOK = v, err == nil
			}
		}
	}
	return caps, capsOK && uidOK
}

// CMChargeID adds delta CM IDs to the account of the context's uid
// (Limits.PerUID.CMIDs); a positive delta past the limit fails with
// EAGAIN.
func (cx *Context) CMChargeID(delta int) error {
	d := cx.dev
	d.cmIDs.mu.Lock()
	defer d.cmIDs.mu.Unlock()
	n := d.cmIDs.byUID[cx.uid]
	if delta > 0 && n+delta > d.cfg.Limits.PerUID.CMIDs {
		return errorf(errAgain, "uid %d holds %d CM IDs, its limit (limits.per_uid.cm_ids)", cx.uid, n)
	}
	if n += delta; n <= 0 {
		delete(d.cmIDs.byUID, cx.uid)
	} else {
		d.cmIDs.byUID[cx.uid] = n
	}
	return nil
}

// cmIDsOf returns the CM IDs uid holds.
func (d *Device) cmIDsOf(uid uint32) int {
	d.cmIDs.mu.Lock()
	defer d.cmIDs.mu.Unlock()
	return d.cmIDs.byUID[uid]
}

// cmCommand routes a CM_* command to the CM, without the device lock.
func (cn *conn) cmCommand(r *request) (reply, error) {
	cm := cn.d.cfg.CM
	if cm == nil {
		return reply{}, errorf(errNotSup, "this device has no communication manager (no QP1)")
	}
	if cn.ctx == nil {
		return reply{}, errorf(errInval, "%v before OPEN_CONTEXT", r.hdr.Opcode)
	}
	body, err := cm.Command(cn.ctx, r.hdr.Opcode, r.payload)
	if err != nil {
		return reply{}, err
	}
	return reply{body: body}, nil
}

// cmAdmin serves admin.CMCmd (without the device lock, as the CM
// commands): the CM IDs from the request's start on, as many as fit one
// reply.
func (cn *conn) cmAdmin(r *request) (reply, error) {
	if err := cn.operatorOnly(r.hdr.Opcode); err != nil {
		return reply{}, err
	}
	req, err := adminRequest(r.payload)
	if err != nil {
		return reply{}, err
	}
	var info admin.CMInfo
	if cm := cn.d.cfg.CM; cm != nil {
		info = cm.Info()
	}
	// The IDs of the page, already encoded, in the reply's "ids".
	ids, next, err := page(info.IDs, req.Start, 1024)
	if err != nil {
		return reply{}, err
	}
	info.Total, info.Next, info.IDs = len(info.IDs), next, nil
	b, err := json.Marshal(struct {
		admin.CMInfo
		IDs []json.RawMessage `json:"ids"`
	}{info, ids})
	if err != nil {
		return reply{}, err
	}
	return reply{raw: b}, nil
}
