package hostile

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/verbs"
	"golang.org/x/sys/unix"
)

// opsAdminOps are the operator opcodes probed: 0x100 (info) to 0x10a
// (capture).
const opsAdminFirst, opsAdminLast = abi.CmdAdminBase, abi.CmdAdminBase + 10

// TestOpsHelperProcess is the client of another uid: the probes re-execute
// this test binary under that uid with VRNIC_OPS_HELPER set to a mode.
// It prints its findings as "OPS ..." lines.
func TestOpsHelperProcess(t *testing.T) {
	mode, sock := os.Getenv("VRNIC_OPS_HELPER"), os.Getenv("VRNIC_OPS_SOCKET")
	if mode == "" {
		t.Skip("helper process of the ops probes")
	}
	say := func(format string, a ...any) { fmt.Printf("OPS "+format+"\n", a...) }
	errnoOf := func(err error) int {
		var en syscall.Errno
		if errors.As(err, &en) {
			return int(en)
		}
		return -1
	}
	switch mode {
	case "ops":
		opsHelperOperatorOpcodes(say, sock)
	case "open":
		c, err := verbs.Open(sock, verbs.WithClientName("other-uid"))
		if err != nil {
			say("open errno=%d err=%v", errnoOf(err), err)
			return
		}
		defer c.Close()
		if _, err := c.AllocPD(); err != nil {
			say("open errno=%d err=%v", errnoOf(err), err)
			return
		}
		if _, err := c.QueryDevice(); err != nil {
			say("open errno=%d err=%v", errnoOf(err), err)
			return
		}
		say("open ok")
	case "operator":
		a, err := admin.Dial(sock)
		if err != nil {
			say("operator dial err=%v", err)
			return
		}
		defer a.Close()
		if _, err := a.Info(); err != nil {
			say("operator errno=%d err=%v", errnoOf(err), err)
			return
		}
		items, err := a.List(admin.ContextsCmd)
		if err != nil {
			say("operator errno=%d err=%v", errnoOf(err), err)
			return
		}
		say("operator ok contexts=%d", len(items))
	case "flood":
		floodHelper(say, sock)
	case "killed":
		killedHelper(say, sock)
	default:
		say("unknown mode %q", mode)
	}
}

// opsHelperOperatorOpcodes sends every operator opcode on one raw
// connection, then OPEN_CONTEXT and QUERY_DEVICE on the same connection,
// and reports each reply: "op=0x100 errno=1 msg=..." (the reply body too
// when a command succeeds), "open errno=0", "query errno=0".
func opsHelperOperatorOpcodes(say func(string, ...any), sock string) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		say("dial err=%v", err)
		return
	}
	defer c.Close()
	seq := uint32(0)
	buf := make([]byte, abi.MaxMsgSize+1)
	oob := make([]byte, unix.CmsgSpace(16*4))
	call := func(op abi.Cmd, payload []byte) (status uint32, body []byte, err error) {
		seq++
		msg := make([]byte, abi.SizeofMsgHdr+len(payload))
		h := abi.MsgHdr{Opcode: op, Length: uint32(len(msg)), Seq: seq}
		h.Put(msg)
		copy(msg[abi.SizeofMsgHdr:], payload)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			return 0, nil, err
		}
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil {
			return 0, nil, err
		}
		closeRights(oob[:oobn])
		var rh abi.MsgHdr
		if err := rh.Decode(buf[:n]); err != nil {
			return 0, nil, err
		}
		if rh.Opcode != op || rh.Seq != seq {
			return 0, nil, fmt.Errorf("reply opcode %#x seq %d to %#x seq %d", uint16(rh.Opcode), rh.Seq, uint16(op), seq)
		}
		return rh.Status, buf[abi.SizeofMsgHdr:n], nil
	}
	for op := opsAdminFirst; op <= opsAdminLast; op++ {
		status, body, err := call(op, nil)
		switch {
		case err != nil:
			say("op=%#x err=%v", uint16(op), err)
		case status != 0:
			say("op=%#x errno=%d msg=%q", uint16(op), status, strings.TrimRight(string(body), "\x00"))
		default:
			say("op=%#x errno=0 body=%s", uint16(op), body)
		}
	}
	req := abi.CmdOpenContextReq{ABIVersion: abi.Version}
	copy(req.ClientName[:], "other-uid-raw")
	p := make([]byte, abi.Sizeof(&req))
	if _, err := abi.Marshal(p, &req); err != nil {
		say("open err=%v", err)
		return
	}
	status, body, err := call(abi.CmdOpenContext, p)
	if err != nil {
		say("open err=%v", err)
		return
	}
	if status != 0 {
		say("open errno=%d msg=%q", status, strings.TrimRight(string(body), "\x00"))
		return
	}
	say("open errno=0")
	status, body, err = call(abi.CmdQueryDevice, nil)
	if err != nil {
		say("query err=%v", err)
		return
	}
	say("query errno=%d", status)
	_ = body
}

// opsVictim is a client of root holding a QP, an MR and the rest.
type opsVictim struct {
	c   *verbs.Context
	qpn uint32
	mr  *verbs.MR
}

func opsStartVictim(t *testing.T, socket string) *opsVictim {
	t.Helper()
	c, err := verbs.Open(socket, verbs.WithClientName("victim"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	pd, err := c.AllocPD()
	require.NoError(t, err)
	buf, err := c.Alloc(64<<10, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	return &opsVictim{c: c, qpn: qp.QPN, mr: mr}
}

// TestOpsOperatorCommandsNeedOperator: a client of another uid (nobody)
// that can reach the control socket sends every operator opcode; each is
// refused with EPERM and a message saying why, nothing of root's client
// (its QPN, rkey, IOVA) reaches it, and the same connection then opens a
// context and runs a command. vrnicctl run by nobody is refused the same
// way; run by root it lists everything.
func TestOpsOperatorCommandsNeedOperator(t *testing.T) {
	e := opsSetup(t)
	d := e.opsStartDaemon(t, "ops0")
	v := opsStartVictim(t, d.socket)

	lines := e.opsRun(t, opsAsNobody, "ops", d.socket)
	all := strings.Join(lines, "\n")
	for op := opsAdminFirst; op <= opsAdminLast; op++ {
		prefix := fmt.Sprintf("op=%#x ", uint16(op))
		var line string
		for _, l := range lines {
			if strings.HasPrefix(l, prefix) {
				line = l
			}
		}
		require.NotEmpty(t, line, "no reply to %#x: %s", uint16(op), all)
		assert.Contains(t, line, fmt.Sprintf("errno=%d ", syscall.EPERM), "operator command %#x served to uid %d", uint16(op), opsNobody)
		assert.Contains(t, line, "not an operator")
		assert.Contains(t, line, fmt.Sprintf("uid %d", opsNobody))
	}
	assert.NotContains(t, all, fmt.Sprintf(`"qpn":%d`, v.qpn), "root's QPN reached uid %d", opsNobody)
	assert.NotContains(t, all, fmt.Sprintf(`"rkey":%d`, v.mr.RKey), "root's rkey reached uid %d", opsNobody)
	assert.NotContains(t, all, `"client":"victim"`)
	assert.Contains(t, lines, "open errno=0", "the connection goes on after the refusals")
	assert.Contains(t, lines, "query errno=0")
	assert.GreaterOrEqual(t, d.counter(t, "operator_denied"), int64(opsAdminLast-opsAdminFirst+1))

	// vrnicctl: refused to nobody, served to root (an operator).
	rc, out := e.opsCtl(t, &opsAsNobody, "-s", d.socket, "-json", "qps")
	assert.Equal(t, 1, rc, "%s", out)
	assert.Contains(t, out, "operation not permitted")
	assert.NotContains(t, out, `"qpn"`)
	rc, out = e.opsCtl(t, &opsAsNobody, "-s", d.socket, "mrs")
	assert.Equal(t, 1, rc, "%s", out)
	assert.Contains(t, out, "operation not permitted")
	assert.NotContains(t, out, "RKEY")
	rc, out = e.opsCtl(t, nil, "-s", d.socket, "-json", "qps")
	require.Equal(t, 0, rc, "%s", out)
	var qps []admin.QPInfo
	require.NoError(t, json.Unmarshal([]byte(out), &qps))
	require.Len(t, qps, 1)
	assert.Equal(t, v.qpn, qps[0].QPN)

	require.NoError(t, v.c.Close())
	d.opsCheckHealthy(t)
}

// opsPickGroup returns a group of the system database to make the operator
// group, other than root's and nobody's.
func opsPickGroup(t *testing.T) (string, uint32) {
	t.Helper()
	for _, name := range []string{"users", "daemon", "adm", "staff", "sys", "bin", "disk"} {
		g, err := user.LookupGroup(name)
		if err != nil {
			continue
		}
		gid, err := strconv.ParseUint(g.Gid, 10, 32)
		if err == nil && gid != 0 && gid != opsNobody {
			return g.Name, uint32(gid)
		}
	}
	t.Skip("no group to make the operator group (users, daemon, adm, staff, sys, bin, disk)")
	return "", 0
}

// TestOpsOperatorGroup: with -operator-group, a process of another uid is
// an operator when the group is its primary group or one of its
// supplementary groups (read from /proc), and not otherwise.
func TestOpsOperatorGroup(t *testing.T) {
	e := opsSetup(t)
	name, gid := opsPickGroup(t)
	d := e.opsStartDaemon(t, "grp0", "-operator-group", name)
	v := opsStartVictim(t, d.socket)

	for _, c := range []struct {
		what string
		as   opsAs
		ok   bool
	}{
		{"supplementary group", opsAs{uid: opsNobody, gid: opsNobody, groups: []uint32{gid}}, true},
		{"primary group", opsAs{uid: opsNobody, gid: gid}, true},
		{"not in the group", opsAsNobody, false},
	} {
		lines := e.opsRun(t, c.as, "operator", d.socket)
		if c.ok {
			assert.Equal(t, []string{"operator ok contexts=1"}, lines, "%s: gid %d, groups %v", c.what, c.as.gid, c.as.groups)
		} else {
			require.Len(t, lines, 1)
			assert.Contains(t, lines[0], fmt.Sprintf("errno=%d ", syscall.EPERM), c.what)
			assert.Contains(t, lines[0], fmt.Sprintf("group %s (gid %d)", name, gid), "the message names the operator group")
		}
	}
	rc, out := e.opsCtl(t, &opsAs{uid: opsNobody, gid: opsNobody, groups: []uint32{gid}}, "-s", d.socket, "contexts")
	assert.Equal(t, 0, rc, "%s", out)
	assert.Contains(t, out, "victim")
	rc, out = e.opsCtl(t, &opsAsNobody, "-runtime-dir", e.rundir, "devices")
	assert.Equal(t, 0, rc, "%s", out)
	assert.Regexp(t, `grp0\s+up \(not an operator\)`, out)

	require.NoError(t, v.c.Close())
	d.opsCheckHealthy(t)
}
