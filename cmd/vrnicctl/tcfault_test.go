package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/ebpf"
	"github.com/vrnic/vrnic/internal/nettest"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestTCFaultCLI: "vrnicctl tcfault" attaches the injector to a veth in
// a namespace, where it stays between commands; its rules fault the
// RoCE v2 frames crossing it exactly as written (PSNs 0-9 dropped, the
// rest CE-marked); list shows the counters; clear and detach undo it all.
func TestTCFaultCLI(t *testing.T) {
	p := nettest.NewVethPair(t, "vrctl")
	root := t.TempDir()
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	tc := func(args ...string) (int, string, string) {
		return ctl(append([]string{"-bpffs", root, "tcfault"}, args...)...)
	}
	at := []string{"dev=" + p.IfA, "hook=egress", "netns=" + p.NameA}
	rc, out, errs := tc(append([]string{"attach"}, at...)...)
	require.Equal(t, 0, rc, "%s%s", out, errs)
	assert.Contains(t, out, "attached to tfa egress (netns "+p.NameA+") (tcx")
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(root, &st))
	assert.Equal(t, uint32(bpffsMagic), uint32(st.Type), "attach mounted a bpffs on -bpffs")

	rc, out, errs = tc(append([]string{"add", "action=drop", "qpn=0x123", "psn=0-9", "op=RC_SEND_ONLY"}, at...)...)
	require.Equal(t, 0, rc, "%s%s", out, errs)
	assert.Contains(t, out, "added rule 0 on tfa egress")
	assert.Contains(t, out, "action=drop qpn=0x123 op=RC_SEND_ONLY psn=0-9")
	rc, out, errs = tc(append([]string{"add", "action=ecn", "op=rc"}, at...)...)
	require.Equal(t, 0, rc, "%s%s", out, errs)
	assert.Contains(t, out, "added rule 1 on tfa egress (netns "+p.NameA+"): action=ecn op=rc")

	fl := p.NewFlow(t, 0x123)
	fl.Send(t, 50)
	got := fl.Recv(t, 40)
	assert.Equal(t, nettest.Seq(50)[10:], nettest.PSNs(got, nil))
	assert.Len(t, nettest.PSNs(got, func(r nettest.Received) bool { return r.ECN == 3 && r.Valid }), 40)

	rc, out, errs = ctl("-bpffs", root, "-json", "tcfault", "list")
	require.Equal(t, 0, rc, "%s%s", out, errs)
	var l []tcListing
	require.NoError(t, json.Unmarshal([]byte(out), &l), out)
	require.Len(t, l, 1)
	assert.Equal(t, tcListing{Dev: p.IfA, Hook: "egress", Netns: p.NameA, Mode: "tcx", Rules: []tcRuleState{
		{"action=drop qpn=0x123 op=RC_SEND_ONLY psn=0-9", ebpf.TCFaultCount{Matched: 10, Taken: 10, Applied: 10}},
		{"action=ecn op=rc", ebpf.TCFaultCount{Matched: 40, Taken: 40, Applied: 40}},
	}}, l[0])
	rc, out, _ = tc("list")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `0\s+10\s+10\s+10\s+0\s+action=drop`, out)

	rc, _, _ = tc(append([]string{"clear"}, at...)...)
	require.Equal(t, 0, rc)
	fl.Send(t, 20)
	assert.Len(t, nettest.PSNs(fl.Recv(t, 20), func(r nettest.Received) bool { return r.ECN == 0 }), 20, "cleared")

	for _, bad := range []struct {
		args []string
		want string
	}{
		{append([]string{"attach"}, at...), "pinned there already"},
		{[]string{"add", "action=drop", "dev=nope", "hook=egress"}, "no injector attached to nope egress"},
		{append([]string{"add", "action=drop", "colour=red"}, at...), `unknown key "colour"`},
		{append([]string{"add"}, at...), "action= is required"},
		{append([]string{"add", "action=drop", "prob=2"}, at...), "probability 2"},
		{append([]string{"add", "action=drop", "psn=9-3"}, at...), `psn range "9-3" is empty`},
		{append([]string{"add", "action=drop", "offset=3"}, at...), "offset and xor are for action=corrupt"},
		{[]string{"attach", "dev=" + p.IfA, "hook=sideways"}, "hook=ingress|egress are required"},
		{[]string{"attach", "dev=nosuch", "hook=egress"}, "nosuch"},
		{[]string{"fly"}, `unknown tcfault operation "fly"`},
	} {
		rc, out, errs := tc(bad.args...)
		assert.Equal(t, 1, rc, "%v: %s", bad.args, out)
		assert.Contains(t, errs, bad.want, "%v", bad.args)
	}

	rc, out, errs = tc(append([]string{"detach"}, at...)...)
	require.Equal(t, 0, rc, "%s%s", out, errs)
	rc, out, _ = tc("list")
	require.Equal(t, 0, rc)
	assert.Contains(t, out, "no tc fault injector attached")
	ents, err := os.ReadDir(filepath.Join(root, tcfaultDirName))
	require.NoError(t, err)
	assert.Empty(t, ents, "no pins left")
	fl.Send(t, 20)
	assert.Equal(t, nettest.Seq(20), nettest.PSNs(fl.Recv(t, 20), nil), "detached")
}

// TestParseTCRule: the keys of "tcfault add" make the rule they say; a
// probability without a seed gets a chosen one.
func TestParseTCRule(t *testing.T) {
	r, seeded, err := parseTCRule(map[string]string{"action": "corrupt", "op": "0x06/0xfe", "offset": "-1", "xor": "0x10", "skip": "2", "limit": "5"})
	require.NoError(t, err)
	assert.False(t, seeded)
	assert.Equal(t, ebpf.TCFaultRule{Action: ebpf.TCCorrupt, Opcode: 6, OpcodeMask: 0xfe, CorruptOffset: -1, CorruptXOR: 0x10, Skip: 2, Limit: 5}, r)
	assert.Equal(t, "action=corrupt op=0x06/0xfe skip=2 limit=5 offset=-1 xor=0x10", describeTCRule(r))

	r, seeded, err = parseTCRule(map[string]string{"action": "drop", "prob": "0.5", "psn": "7"})
	require.NoError(t, err)
	assert.True(t, seeded)
	assert.Equal(t, &[2]uint32{7, 7}, r.PSN)
	r2, seeded2, err := parseTCRule(map[string]string{"action": "drop", "prob": "0.5", "psn": "7"})
	require.NoError(t, err)
	assert.True(t, seeded2)
	assert.NotEqual(t, r.Seed, r2.Seed, "chosen seeds differ")

	r, _, err = parseTCRule(map[string]string{"action": "duplicate", "op": "UD", "copies": "3", "qpn": "0xffffff"})
	require.NoError(t, err)
	assert.Equal(t, "action=duplicate qpn=0xffffff op=ud copies=3", describeTCRule(r))
	for _, bad := range []map[string]string{
		{"action": "drop", "qpn": "0x1000000"},
		{"action": "drop", "psn": "a-b"},
		{"action": "drop", "op": "0x100"},
		{"action": "drop", "seed": "1"},
		{"action": "drop", "copies": "2"},
		{"action": "corrupt", "xor": "0"},
		{"action": "teleport"},
	} {
		_, _, err := parseTCRule(bad)
		assert.Error(t, err, "%v", bad)
	}
}

// TestTCFaultCLINetnsGone: an injector whose namespace was deleted is
// still listed (its pins hold it), and detach removes its pins.
func TestTCFaultCLINetnsGone(t *testing.T) {
	testenv.NeedRoot(t, "needs root (network namespaces, tc programs, bpffs)")
	testenv.NeedTool(t, "ip")
	ns := fmt.Sprintf("vrgone%d", os.Getpid())
	for _, args := range [][]string{{"netns", "add", ns}, {"-n", ns, "link", "add", "gone0", "type", "veth", "peer", "name", "gone1"}} {
		b, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, b)
		if args[0] == "netns" {
			t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		}
	}
	root := t.TempDir()
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	for _, mode := range []string{"tcx", "cls_bpf"} {
		at := []string{"dev=gone0", "hook=" + map[string]string{"tcx": "ingress", "cls_bpf": "egress"}[mode], "netns=" + ns}
		rc, out, errs := ctl(append([]string{"-bpffs", root, "tcfault", "attach", "mode=" + mode}, at...)...)
		require.Equal(t, 0, rc, "%s%s", out, errs)
		rc, out, errs = ctl(append([]string{"-bpffs", root, "tcfault", "add", "action=drop"}, at...)...)
		require.Equal(t, 0, rc, "%s%s", out, errs)
	}
	b, err := exec.Command("ip", "netns", "del", ns).CombinedOutput()
	require.NoError(t, err, "%s", b)
	rc, out, errs := ctl("-bpffs", root, "tcfault", "list")
	require.Equal(t, 0, rc, "%s%s", out, errs)
	assert.Contains(t, out, "gone0 ingress (netns "+ns+") (tcx): 1 rules")
	assert.Contains(t, out, "gone0 egress (netns "+ns+") (cls_bpf): 1 rules")
	for _, hook := range []string{"ingress", "egress"} {
		rc, out, errs = ctl("-bpffs", root, "tcfault", "detach", "dev=gone0", "hook="+hook, "netns="+ns)
		require.Equal(t, 0, rc, "%s%s", out, errs)
		assert.Contains(t, out, "is gone: removed the pins")
	}
	ents, err := os.ReadDir(filepath.Join(root, tcfaultDirName))
	require.NoError(t, err)
	assert.Empty(t, ents)
}
