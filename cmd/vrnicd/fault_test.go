package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

// daemon is a vrnicd run in the test.
type daemon struct {
	sock  string
	local netip.AddrPort // its address (GID 0), and UDP port on the UDP link
	logs  *syncWriter    // over a strings.Builder
	stop  func()
}

// startDaemon runs a daemon named name over the UDP link on local with
// extra flags; stop (also at cleanup) ends it and waits for it.
func startDaemon(t *testing.T, name string, local netip.AddrPort, extra ...string) *daemon {
	t.Helper()
	return startDaemonArgs(t, name, local, append([]string{"-link", "udp", "-local", local.String()}, extra...))
}

// startDaemonArgs runs a daemon with the link flags of args; local is
// its GID 0.
func startDaemonArgs(t *testing.T, name string, local netip.AddrPort, args []string) *daemon {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncWriter{w: &strings.Builder{}}
	done := make(chan error, 1)
	args = append([]string{"-name", name, "-runtime-dir", dir, "-workers", "2"}, args...)
	go func() { done <- run(ctx, args, logs) }()
	stopped := false
	d := &daemon{sock: admin.SocketPath(dir, name), local: local, logs: logs}
	d.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(d.stop)
	require.Eventually(t, func() bool {
		_, err := admin.Serving(d.sock)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "%s", logs)
	return d
}

// faultCall sends a FaultCmd request to the daemon.
func faultCall(t *testing.T, sock string, req admin.FaultRequest) (admin.FaultReply, error) {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Call(admin.FaultCmd, req)
	if err != nil {
		return admin.FaultReply{}, err
	}
	var r admin.FaultReply
	require.NoError(t, json.Unmarshal(b, &r))
	return r, nil
}

// startCapture starts an unbounded capture on the daemon; the result
// delivers the pcapng once the capture ends (the daemon stopping).
func startCapture(t *testing.T, sock string) <-chan []byte {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	src, err := a.Capture(admin.CaptureRequest{})
	require.NoError(t, err)
	out := make(chan []byte, 1)
	go func() {
		defer src.Close()
		b, _ := io.ReadAll(src)
		out <- b
	}()
	return out
}

// connectPair connects an RC QP on each daemon to the other's, both
// sending from PSN 100, path MTU 1024, ACK timeout code timeout.
func connectPair(t *testing.T, a, b *daemon, timeout uint8) (*rcEnd, *rcEnd) {
	t.Helper()
	ea, eb := openRCEnd(t, a.sock), openRCEnd(t, b.sock)
	for _, p := range [][2]struct {
		e *rcEnd
		d *daemon
	}{{{ea, a}, {eb, b}}, {{eb, b}, {ea, a}}} {
		l, r := p[0], p[1]
		require.NoError(t, l.e.qp.ToInit(abi.AccessAll, 0))
		require.NoError(t, l.e.qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: r.d.local.Addr().As16(), PortNum: 1, HopLimit: 64},
			PathMTU: abi.MTU1024, DestQPN: r.e.qp.QPN, RQPSN: 100, MaxDestRdAtomic: 1, MinRNRTimer: 1}))
		require.NoError(t, l.e.qp.ToRTS(verbs.RTSAttr{SQPSN: 100, Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}))
	}
	return ea, eb
}

// sentRequests returns the requests of a capture that left local (PSN
// and comment each, in capture order), parsed with their ICRC checked.
func sentRequests(t *testing.T, frames []capture.Frame, local netip.AddrPort) (psn []uint32, notes []string) {
	t.Helper()
	for _, f := range frames {
		var p roce.Packet
		require.NoError(t, roce.Parse(f.Data, &p), "every captured frame is valid RoCE v2 (the capture shows what the engine sent)")
		if p.Src() != local.Addr() || p.Info.Flags&roce.OpRequest == 0 {
			continue
		}
		psn = append(psn, p.BTH.PSN())
		notes = append(notes, f.Comment)
	}
	return psn, notes
}

// TestFaultDropNthPacketOfMthWrite: on two daemons over the UDP link, a
// rule "drop the 3rd packet of the 2nd RDMA WRITE on the QP, first
// transmission only", added over the control socket, drops exactly that
// frame: the requester's capture shows it with the rule's comment, then
// the go-back-N retransmission from its PSN; both WRITEs complete, the
// data arrives intact, and the rule's counters say one match, one drop.
func TestFaultDropNthPacketOfMthWrite(t *testing.T) {
	a := startDaemon(t, "fa", freeLoopback(t))
	b := startDaemon(t, "fb", freeLoopback(t))
	dropNthWrite(t, a, b)
}

// TestFaultDropNthPacketOfMthWriteTAP is TestFaultDropNthPacketOfMthWrite
// over the TAP link: two daemons whose TAPs are ports of a bridge in a
// network namespace (root only).
func TestFaultDropNthPacketOfMthWriteTAP(t *testing.T) {
	a, b, _ := tapPair(t, "vrflt")
	dropNthWrite(t, a, b)
}

// tapPair starts two daemons on the TAP link, vfa (10.79.0.1) and vfb
// (10.79.0.2), whose TAPs are ports of a bridge in a network namespace
// named after prefix (removed at cleanup), and returns them and the
// namespace's name. Root only.
func tapPair(t *testing.T, prefix string) (a, b *daemon, ns string) {
	testenv.NeedRoot(t, "the TAP link needs root (CAP_NET_ADMIN, CAP_BPF)")
	testenv.NeedTool(t, "ip")
	ns = fmt.Sprintf("%s%d", prefix, os.Getpid())
	ip := func(args ...string) {
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "add", "br0", "type", "bridge")
	ip("-n", ns, "link", "set", "br0", "up")
	tapDaemon := func(name, addr string) *daemon {
		d := startDaemonArgs(t, name, netip.AddrPortFrom(netip.MustParseAddr(addr), 4791),
			[]string{"-link", "tap", "-tap-netns", ns, "-tap-addr", addr + "/24"})
		// The daemon created the interface in ns before it answered; if
		// ip(8) cannot see it there, say where it is.
		if out, err := exec.Command("ip", "-n", ns, "link", "show", name).CombinedOutput(); err != nil {
			inNS, _ := exec.Command("ip", "-n", ns, "-br", "link").CombinedOutput()
			inRoot, _ := exec.Command("ip", "-br", "link").CombinedOutput()
			nss, _ := exec.Command("ip", "netns", "list").CombinedOutput()
			t.Fatalf("%s not in netns %s: %v: %s\nlinks there:\n%s\nlinks in this namespace:\n%s\nnamespaces:\n%s\ndaemon log:\n%s",
				name, ns, err, out, inNS, inRoot, nss, d.logs)
		}
		ip("-n", ns, "link", "set", name, "master", "br0")
		ip("-n", ns, "link", "set", name, "up")
		return d
	}
	return tapDaemon("vfa", "10.79.0.1"), tapDaemon("vfb", "10.79.0.2"), ns
}

// dropNthWrite is the body of TestFaultDropNthPacketOfMthWrite on a and b.
func dropNthWrite(t *testing.T, a, b *daemon) {
	ea, eb := connectPair(t, a, b, 14)
	rule := admin.FaultRule{Name: "nth", Dir: "tx", QPN: &eb.qp.QPN,
		Message: &admin.FaultMessage{Kind: "write", Index: 2, Packet: 3}, Round: "first", Action: admin.FaultAction{Type: "drop"}}
	added, err := faultCall(t, a.sock, admin.FaultRequest{Op: admin.FaultAdd, Rules: []admin.FaultRule{rule}})
	require.NoError(t, err)
	require.Len(t, added.Rules, 1)
	id := added.Rules[0].ID
	capDone := startCapture(t, a.sock)

	for i := range ea.buf.Bytes {
		ea.buf.Bytes[i] = byte(i*7 + i>>8)
	}
	// Two 4 KiB WRITEs of four 1 KiB packets each: PSNs 100-103, 104-107.
	for w := range 2 {
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(w + 1), Opcode: abi.WRRDMAWrite,
			SGL: []abi.SGE{ea.mr.SGE(uint32(4096*w), 4096)}, RemoteAddr: eb.mr.Addr + uint64(4096*w), RKey: eb.mr.RKey}))
	}
	for w := range 2 {
		c := pollOne(t, ea.cq)
		assert.Equal(t, abi.WCSuccess, c.Status)
		assert.Equal(t, uint64(w+1), c.WrID)
	}
	assert.Equal(t, ea.buf.Bytes, eb.buf.Bytes, "the data arrived intact")

	list, err := faultCall(t, a.sock, admin.FaultRequest{Op: admin.FaultList})
	require.NoError(t, err)
	require.Len(t, list.Rules, 1)
	assert.Equal(t, uint64(1), list.Rules[0].Matched)
	assert.Equal(t, uint64(1), list.Rules[0].Applied)
	t.Logf("rule %d: matched %d, applied %d", id, list.Rules[0].Matched, list.Rules[0].Applied)
	q, err := ea.qp.Query()
	require.NoError(t, err)
	assert.NotZero(t, q.Retransmits, "the requester went back")

	a.stop()
	frames, err := capture.ReadFrames(<-capDone)
	require.NoError(t, err)
	psns, notes := sentRequests(t, frames, a.local)
	require.GreaterOrEqual(t, len(psns), 10, "%v", psns)
	assert.Equal(t, []uint32{100, 101, 102, 103, 104, 105, 106, 107}, psns[:8], "first transmissions")
	for i, n := range notes {
		if i == 6 {
			assert.Equal(t, "fault rule "+itoa(id)+": drop", n)
		} else {
			assert.Empty(t, n, "frame %d (PSN %d)", i, psns[i])
		}
	}
	assert.Equal(t, []uint32{106, 107}, psns[8:10], "go-back-N from the dropped PSN")
	for _, p := range psns[8:] {
		assert.GreaterOrEqual(t, p, uint32(106), "nothing before the dropped PSN is sent again: %v", psns)
	}
	assert.Contains(t, a.logs.String(), "fault injected")
	assert.Contains(t, a.logs.String(), "psn=106")
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// scenarioRun runs the seeded scenario of TestFaultScenarioReplays once:
// two daemons on the given addresses, the scenario loaded from a YAML
// file at start, 24 one-packet WRITEs one at a time. It returns the
// requester's capture and the rules' counters.
func scenarioRun(t *testing.T, la, lb netip.AddrPort, seed uint64) ([]capture.Frame, []admin.FaultRuleInfo) {
	t.Helper()
	yaml := `seed: ` + strconv.FormatUint(seed, 10) + `
rules:
  - {id: 1, name: lose, dir: tx, op: [write], probability: 0.25, action: {type: drop}}
  - {id: 2, name: flip, dir: tx, op: [write], probability: 0.3, action: {type: corrupt, field: payload, fix_icrc: true}}
  - {id: 3, name: echo, dir: rx, op: [ack], probability: 0.4, action: {type: duplicate}}
  - {id: 4, name: mark, dir: tx, op: [write], round: retransmit, action: {type: ecn}}
`
	path := filepath.Join(t.TempDir(), "scenario.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o644))
	a := startDaemon(t, "sa", la, "-faults", path)
	b := startDaemon(t, "sb", lb)
	ea, eb := connectPair(t, a, b, 15)
	capDone := startCapture(t, a.sock)
	for i := range 24 {
		copy(ea.buf.Bytes[i*64:], strings.Repeat(string(rune('a'+i%26)), 64))
		require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite,
			SGL: []abi.SGE{ea.mr.SGE(uint32(i*64), 64)}, RemoteAddr: eb.mr.Addr + uint64(i*64), RKey: eb.mr.RKey}))
		c := pollOne(t, ea.cq)
		require.Equal(t, abi.WCSuccess, c.Status, "WRITE %d", i)
	}
	list, err := faultCall(t, a.sock, admin.FaultRequest{Op: admin.FaultList})
	require.NoError(t, err)
	assert.Equal(t, seed, list.Seed)
	a.stop()
	b.stop()
	frames, err := capture.ReadFrames(<-capDone)
	require.NoError(t, err)
	return frames, list.Rules
}

// masked returns the frame with the fields drawn at random for every run
// zeroed: the QPN and the rkey (the daemon draws them, so that they are
// not guessable), the client buffer's address in the RETH (where the
// client's memory was mapped), and the ICRC over them.
func masked(t *testing.T, f []byte) []byte {
	out := append([]byte(nil), f...)
	var p roce.Packet
	require.NoError(t, roce.Parse(out, &p))
	p.BTH.SetDestQP(0)
	if p.RETH != nil {
		p.RETH.SetRKey(0)
		p.RETH.SetVA(0)
	}
	clear(out[len(out)-roce.ICRCLen:])
	return out
}

// TestFaultScenarioReplays: a seeded scenario (drops, corruption with a
// fixed ICRC, duplicated ACKs, CE marks on retransmissions) run twice
// gives the same capture, frame for frame and comment for comment, and
// the same counters; another seed gives other faults.
func TestFaultScenarioReplays(t *testing.T) {
	la, lb := freeLoopback(t), freeLoopback(t)
	f1, c1 := scenarioRun(t, la, lb, 1234)
	f2, c2 := scenarioRun(t, la, lb, 1234)
	require.Equal(t, len(f1), len(f2), "frames in the two captures")
	faults := 0
	for i := range f1 {
		assert.Equal(t, masked(t, f1[i].Data), masked(t, f2[i].Data), "frame %d", i)
		assert.Equal(t, f1[i].Comment, f2[i].Comment, "comment of frame %d", i)
		if f1[i].Comment != "" {
			faults++
		}
	}
	assert.Equal(t, c1, c2, "counters")
	for _, r := range c1 {
		t.Logf("seed 1234: rule %d (%s): matched %d, applied %d", r.ID, r.Name, r.Matched, r.Applied)
	}
	t.Logf("seed 1234: %d frames captured, %d with a fault comment", len(f1), faults)
	assert.Greater(t, faults, 5, "the scenario injected faults")
	for _, r := range c1 {
		assert.NotZero(t, r.Applied, "rule %d (%s) applied", r.ID, r.Name)
	}
	f3, c3 := scenarioRun(t, la, lb, 4321)
	same := len(f3) == len(f1)
	for i := 0; same && i < len(f1); i++ {
		same = f1[i].Comment == f3[i].Comment
	}
	assert.False(t, same && assert.ObjectsAreEqual(c1, c3), "another seed, other faults")
}

// TestParseConfigFaults: the config file's "faults" holds the seed and
// the rules; -faults FILE replaces them, -fault-seed sets the seed; a bad
// rule in either stops the daemon before it starts, saying what is
// wrong.
func TestParseConfigFaults(t *testing.T) {
	c, err := parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"udp"},
		"faults":{"seed":5,"rules":[{"id":2,"dir":"rx","op":["nak"],"action":{"type":"drop"}}]}}`)}, io.Discard)
	require.NoError(t, err)
	require.NotNil(t, c.Faults)
	assert.Equal(t, uint64(5), c.Faults.Seed)
	require.Len(t, c.Faults.Rules, 1)
	assert.Equal(t, []string{"nak"}, c.Faults.Rules[0].Op)

	yaml := filepath.Join(t.TempDir(), "s.yml")
	require.NoError(t, os.WriteFile(yaml, []byte("seed: 8\nrules:\n  - action: {type: ecn}\n"), 0o644))
	c, err = parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"udp"},"faults":{"seed":5}}`),
		"-faults", yaml, "-fault-seed", "9"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), c.Faults.Seed, "the flag's seed")
	require.Len(t, c.Faults.Rules, 1, "the scenario's rules")
	assert.Equal(t, "ecn", c.Faults.Rules[0].Action.Type)

	_, err = parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"udp"},"faults":{"rules":[{"action":{"type":"drop","copies":2}}]}}`)}, io.Discard)
	assert.ErrorContains(t, err, "action drop does not take copies")
	_, err = parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"udp"},"faults":{"rules":[{"op":["RC_BOGUS"],"action":{"type":"drop"}}]}}`)}, io.Discard)
	assert.ErrorContains(t, err, `opcode "RC_BOGUS"`)
	require.NoError(t, os.WriteFile(yaml, []byte("rules:\n  - action: {type: drop}\n    colour: red\n"), 0o644))
	_, err = parseConfig([]string{"-faults", yaml}, io.Discard)
	assert.ErrorContains(t, err, `unknown field "colour"`)
}

// TestFaultMemLink: the rules work on the in-memory link too: a daemon
// with -link mem and a scenario file dropping the 2nd packet of the
// first WRITE once; two of its clients' QPs connected to each other
// complete the WRITE intact after a retransmission.
func TestFaultMemLink(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"seed":3,"rules":[{"id":5,"dir":"tx","message":{"kind":"write","index":1,"packet":2},"count":1,"action":{"type":"drop"}}]}`), 0o644))
	d := startDaemonArgs(t, "fm", netip.MustParseAddrPort("127.0.0.1:4791"), []string{"-link", "mem", "-faults", path})
	ea, eb := connectPair(t, d, d, 14)
	for i := range 4096 {
		ea.buf.Bytes[i] = byte(i * 3)
	}
	require.NoError(t, ea.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{ea.mr.SGE(0, 4096)},
		RemoteAddr: eb.mr.Addr, RKey: eb.mr.RKey}))
	assert.Equal(t, abi.WCSuccess, pollOne(t, ea.cq).Status)
	assert.Equal(t, ea.buf.Bytes[:4096], eb.buf.Bytes[:4096])
	list, err := faultCall(t, d.sock, admin.FaultRequest{Op: admin.FaultList})
	require.NoError(t, err)
	require.Len(t, list.Rules, 1)
	assert.Equal(t, uint64(3), list.Seed)
	assert.Equal(t, uint64(1), list.Rules[0].Applied)
	q, err := ea.qp.Query()
	require.NoError(t, err)
	assert.NotZero(t, q.Retransmits)
}
