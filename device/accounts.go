package device

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"golang.org/x/sys/unix"
)

// A client is its uid: what the kernel reports for the peer of a control
// connection (SO_PEERCRED, the credentials of the process that called
// connect(2)). Per uid, the device counts the connections and contexts
// (account) and bounds them (Limits.PerUID), so that one process or one
// user cannot take every context or connection of the device; the
// operator command admin.AccountsCmd shows, per uid, these counts and the
// resources of the uid's contexts summed.
//
// The same credentials decide who is an operator (isOperator): root, the
// daemon's own effective uid, or a member of Config.OperatorGroup.

// account is what the connections of one uid hold. Guarded by Device.mu;
// the entry goes when the uid's last connection closes.
type account struct {
	conns    int
	contexts int
	refused  uint64    // connections refused at the per-uid limit
	lastLog  time.Time // last refusal logged (at most one a second per uid)
	unlogged uint64    // refusals since then, not logged
	// turn is the uid's turn on the control path (a semaphore of one,
	// not guarded by Device.mu): see uidTurn.
	turn uidTurn
}

// uidTurn is a uid's turn on the control path. A connection holds its
// uid's turn while it handles a datagram (decoding it, running the command
// under the device lock, building the reply, closing the descriptors that
// came with it) and while its context is torn down; it writes the reply
// after giving the turn back. So the connections of one uid take turns,
// and what a uid makes the daemon do at one time is one command or one
// teardown, however many connections it opens and however fast it sends:
//
//   - the device lock has at most one waiter per uid: another uid's
//     command waits for at most one command (or teardown) of each busy
//     uid, not for a queue of them;
//   - the goroutines of a uid's connections that have a datagram to
//     handle wait for the turn asleep, instead of all competing for the
//     CPU with the engine's workers (with GOMAXPROCS as small as the
//     workers, a flood of commands on a hundred connections would
//     otherwise queue a hundred runnable goroutines before a worker each
//     time it yields).
//
// Nothing else is taken while the turn is held except the device lock,
// and the turn is never taken under the device lock.
type uidTurn chan struct{}

func (t uidTurn) take()    { t <- struct{}{} }
func (t uidTurn) release() { <-t }

// OperatorGroup is the group whose members may use the operator commands
// besides root and the daemon's own uid.
type OperatorGroup struct {
	Name string
	GID  uint32
}

// peer is the credentials of a control connection's peer.
type peer struct {
	pid      int32
	uid, gid uint32
}

// refuseWait bounds how long a refused connection is kept open waiting for
// its first command (which gets the EAGAIN reply); maxRefusing bounds how
// many are kept so at once; beyond it a refused connection is closed at
// once, without a reply.
const (
	refuseWait  = 200 * time.Millisecond
	maxRefusing = 32
)

// fillUIDLimits derives the zero per-uid limits from the device's.
func fillUIDLimits(l *Limits) {
	if l.PerUID.Contexts == 0 {
		l.PerUID.Contexts = max(1, l.PerDevice.Contexts/4)
	}
	if l.PerUID.Connections == 0 {
		l.PerUID.Connections = 2*l.PerUID.Contexts + 16
	}
	if l.PerUID.CMIDs == 0 {
		// The CM IDs of sixteen full contexts (cm.ServiceConfig's
		// default per context, 4096), about 100 MB of the daemon's
		// memory at most: a uid's connections and requests are bounded
		// even when it opens every context it may.
		l.PerUID.CMIDs = 16 * 4096
	}
	if l.PerUID.FDs == 0 {
		l.PerUID.FDs = max(1024, 16*l.PerUID.Contexts)
	}
}

// fdsPerContext are the descriptors a context holds in the daemon before
// it adds anything: its doorbell page's memfd and its kick eventfd.
const fdsPerContext = 2

// fds returns the descriptors the daemon holds for uid (UIDLimits.FDs).
func (d *Device) fds(uid uint32) int {
	n := 0
	if a := d.accounts[uid]; a != nil {
		n = a.conns
	}
	for _, cx := range d.contexts {
		if cx.uid == uid {
			n += cx.fds()
		}
	}
	return n
}

// fds returns the descriptors the daemon holds for cx: fdsPerContext, a
// memfd per host memory region, an eventfd per CQ with a completion
// channel, the event socket's end once opened.
func (cx *Context) fds() int {
	n := fdsPerContext + cx.counts.HostMem + cx.eventfds
	if cx.events.Load() != nil {
		n++
	}
	if cx.odp != nil {
		n++ // the pidfd
	}
	return n
}

// fdLimit fails with EMFILE when cx's uid holds its limit of descriptors
// in the daemon, before the device keeps one more for cx (what says why).
func (d *Device) fdLimit(cx *Context, what string) error {
	if n, lim := d.fds(cx.uid), d.cfg.Limits.PerUID.FDs; n >= lim {
		return errorf(unix.EMFILE, "%s: uid %d holds %d descriptors in the daemon, its limit (limits.per_uid.fds)", what, cx.uid, n)
	}
	return nil
}

// admitLocked counts a new connection of p.uid and returns the uid's turn
// on the control path, or returns an error (the uid holds its limit of
// connections).
func (d *Device) admitLocked(p peer) (uidTurn, error) {
	a := d.accounts[p.uid]
	if a == nil {
		a = &account{turn: make(uidTurn, 1)}
		d.accounts[p.uid] = a
	}
	if lim := d.cfg.Limits.PerUID.Connections; a.conns >= lim {
		a.refused++
		d.counters.ConnectionsRefused.Add(1)
		if now := time.Now(); now.Sub(a.lastLog) >= time.Second {
			d.log.Warn("connection refused: uid at its connection limit", "uid", p.uid, "pid", p.pid,
				"limit", lim, "refused_since_last_log", a.unlogged+1)
			a.lastLog, a.unlogged = now, 0
		} else {
			a.unlogged++
		}
		return nil, errorf(errAgain, "uid %d holds %d control connections, its limit (limits.per_uid.connections); connection refused", p.uid, a.conns)
	}
	a.conns++
	return a.turn, nil
}

// leaveLocked uncounts a connection of uid admitted by admitLocked.
func (d *Device) leaveLocked(uid uint32) {
	a := d.accounts[uid]
	if a == nil {
		return
	}
	a.conns--
	if a.conns <= 0 && a.contexts <= 0 {
		delete(d.accounts, uid)
	}
}

// refuse answers the first command on c with err and closes c. It waits
// for that command at most refuseWait, and not at all when maxRefusing
// refusals are already waiting: a connection the device refuses must not
// hold a descriptor for long.
func (d *Device) refuse(c *net.UnixConn, err error) {
	defer c.Close()
	if d.refusing.Add(1) > maxRefusing {
		d.refusing.Add(-1)
		return
	}
	defer d.refusing.Add(-1)
	c.SetDeadline(time.Now().Add(refuseWait))
	// Only the header is needed; a longer datagram is truncated, and
	// descriptors that do not fit the control buffer are discarded by the
	// kernel. readMsg closes the ones that arrive.
	buf := make([]byte, abi.SizeofMsgHdr)
	oob := make([]byte, unix.CmsgSpace(maxOOBFds*4))
	m, rerr := readMsg(c, buf, oob)
	m.closeFds()
	if rerr != nil && len(m.data) < abi.SizeofMsgHdr {
		return
	}
	var h abi.MsgHdr
	if h.Decode(m.data) != nil {
		return
	}
	rbuf := make([]byte, abi.SizeofMsgHdr+abi.MaxErrMsg)
	n, perr := abi.PutErrorReply(rbuf, &h, errnoOf(err), err.Error())
	if perr == nil {
		c.WriteMsgUnix(rbuf[:n], nil, nil)
	}
}

// isOperator reports whether p may use the operator commands: root, the
// daemon's effective uid, or a member of the operator group, by primary
// gid (SO_PEERCRED carries it) or by supplementary group.
//
// SO_PEERCRED has no supplementary groups; they are read from
// /proc/<pid>/status (Groups:) when the connection is accepted, after
// checking that the process there still has the uid and gid the socket
// reported (a pid reused by another process fails that check unless it
// has the same credentials). Limits: the groups are those of the process
// when the daemon looks, not when it connected (a process that called
// setgroups(2) in between is judged by its new groups); a peer in another
// pid namespace is found only if the kernel could translate its pid into
// the daemon's (pid 0 otherwise: not an operator by group); a descriptor
// passed to another process keeps the rights of the process that
// connected; and membership is decided once per connection.
func (d *Device) isOperator(p peer) bool {
	if p.uid == 0 || p.uid == d.euid {
		return true
	}
	g := d.cfg.OperatorGroup
	if g == nil {
		return false
	}
	if p.gid == g.GID {
		return true
	}
	if p.pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
	if err != nil {
		return false
	}
	groups, ok := procGroups(b, p.uid, p.gid)
	return ok && slices.Contains(groups, g.GID)
}

// procGroups parses a /proc/<pid>/status: it returns the supplementary
// groups (Groups:) and true if the effective uid and gid (second field of
// Uid: and Gid:) are uid and gid.
func procGroups(status []byte, uid, gid uint32) ([]uint32, bool) {
	var groups []uint32
	uidOK, gidOK := false, false
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		switch key {
		case "Uid", "Gid":
			if len(f) < 2 {
				return nil, false
			}
			v, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				return nil, false
			}
			if key == "Uid" {
				uidOK = uint32(v) == uid
			} else {
				gidOK = uint32(v) == gid
			}
		case "Groups":
			for _, s := range f {
				v, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return nil, false
				}
				groups = append(groups, uint32(v))
			}
		}
	}
	return groups, uidOK && gidOK
}

// operatorDenied is the error a non-operator gets for an operator command.
func (d *Device) operatorDenied(cn *conn, op abi.Cmd) error {
	who := fmt.Sprintf("root or uid %d (the daemon's)", d.euid)
	if g := d.cfg.OperatorGroup; g != nil {
		who += fmt.Sprintf(" or a member of group %s (gid %d)", g.Name, g.GID)
	}
	return errorf(errPerm, "operator command %#x refused: the peer (uid %d, gid %d, pid %d) is not an operator; operators are %s",
		uint16(op), cn.uid, cn.gid, cn.pid, who)
}

// listAccounts lists the accounts by uid, with the resources of each
// uid's contexts summed.
func (d *Device) listAccounts() []any {
	byUID := map[uint32]*admin.AccountInfo{}
	for uid, a := range d.accounts {
		byUID[uid] = &admin.AccountInfo{UID: uid, Connections: a.conns, FDs: a.conns, Refused: a.refused,
			CMIDs: d.cmIDsOf(uid)}
	}
	for _, cx := range d.contexts {
		ai := byUID[cx.uid]
		if ai == nil { // not reached: a context lives on a counted connection
			ai = &admin.AccountInfo{UID: cx.uid}
			byUID[cx.uid] = ai
		}
		r := &ai.Resources
		r.Contexts++
		r.HostMem += cx.counts.HostMem
		r.PD += cx.counts.PD
		r.MR += cx.counts.MR
		r.CQ += cx.counts.CQ
		r.QP += cx.counts.QP
		r.SRQ += cx.counts.SRQ
		r.AH += cx.counts.AH
		r.MW += cx.counts.MW
		ai.FDs += cx.fds()
		for _, m := range cx.hostMem {
			ai.HostMemBytes += m.length
		}
		for _, m := range cx.mrs {
			ai.MRPages += uint64(m.npages)
		}
	}
	out := make([]any, 0, len(byUID))
	for _, uid := range sortedKeys(byUID) {
		out = append(out, *byUID[uid])
	}
	return out
}
