package main

import (
	"context"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/link"
)

func writeFile(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "c.json")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestParseConfigFlags(t *testing.T) {
	c, err := parseConfig([]string{"-name", "vm1", "-udp-local", "10.0.0.1:4791", "-udp-peer", "10.0.0.2:4791", "-udp-peer", "10.0.0.3:4791", "-workers", "3", "-mtu", "1024"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "vm1", c.Name)
	assert.Equal(t, "udp", c.Link.Type)
	assert.Equal(t, []string{"10.0.0.2:4791", "10.0.0.3:4791"}, c.Link.Peers)
	assert.Equal(t, 3, c.Workers)
	li, err := linkInfo(c)
	require.NoError(t, err)
	assert.Equal(t, byte(10), li.GIDs[0][12])
	assert.Equal(t, byte(0xff), li.GIDs[0][10], "IPv4-mapped GID")
	assert.EqualValues(t, 3, li.MaxMTU)
}

func TestParseConfigFile(t *testing.T) {
	p := writeFile(t, `{"name":"fromfile","link":{"type":"mem","mtu":2048},"workers":2,"log_level":"debug",
		"limits":{"per_client":{"qp":7},"max_mr_pages":100}}`)
	c, err := parseConfig([]string{"-config", p}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "fromfile", c.Name)
	assert.Equal(t, "mem", c.Link.Type)
	assert.Equal(t, 2048, c.Link.MTU)
	assert.Equal(t, 7, c.Limits.PerClient.QP)
	assert.Equal(t, uint32(100), c.Limits.MaxMRPages)
	// Explicit flags win over the file; defaults do not.
	c, err = parseConfig([]string{"-config", p, "-name", "flag", "-workers", "5"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "flag", c.Name)
	assert.Equal(t, 5, c.Workers)
	c, err = parseConfig([]string{"-config", p, "-poll-spin", "3ms"}, io.Discard)
	require.NoError(t, err)
	d, err := c.pollSpin()
	require.NoError(t, err)
	assert.Equal(t, 3*time.Millisecond, d)
	assert.Equal(t, "mem", c.Link.Type)
	assert.Equal(t, "debug", c.LogLevel)
}

// TestSegmentIPv4Config: -udp-segment-ipv4 is auto (the link's loopback
// default) unless given; bare or =true is always, =false never; the flag
// wins over the file's segment_ipv4, an absent flag leaves the file's.
func TestSegmentIPv4Config(t *testing.T) {
	yes := writeFile(t, `{"name":"x","link":{"type":"udp","segment_ipv4":true}}`)
	no := writeFile(t, `{"name":"x","link":{"type":"udp","segment_ipv4":false}}`)
	for _, tc := range []struct {
		args []string
		want link.SegmentPolicy
	}{
		{nil, link.SegmentLoopback},
		{[]string{"-udp-segment-ipv4"}, link.SegmentAlways},
		{[]string{"-udp-segment-ipv4=true"}, link.SegmentAlways},
		{[]string{"-udp-segment-ipv4=false"}, link.SegmentNever},
		{[]string{"-udp-segment-ipv4=auto"}, link.SegmentLoopback},
		{[]string{"-config", yes}, link.SegmentAlways},
		{[]string{"-config", no}, link.SegmentNever},
		{[]string{"-config", no, "-udp-segment-ipv4"}, link.SegmentAlways},
		{[]string{"-config", yes, "-udp-segment-ipv4=auto"}, link.SegmentLoopback},
	} {
		c, err := parseConfig(tc.args, io.Discard)
		require.NoError(t, err, "%q", tc.args)
		assert.Equal(t, tc.want, segmentPolicy(c.Link.SegmentIPv4), "%q", tc.args)
	}
}

func TestParseConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		file string
		msg  string
	}{
		{"unknown field", nil, `{"name":"x","link":{"type":"udp"},"nope":1}`, `unknown field "nope"`},
		{"unknown nested field", nil, `{"name":"x","link":{"type":"udp","speed":1}}`, `unknown field "speed"`},
		{"trailing", nil, `{"name":"x","link":{"type":"udp"}} {}`, "trailing data"},
		{"bad json", nil, `{"name":`, "unexpected EOF"},
		{"tap-without-addr", []string{"-link", "tap"}, "", "at least one -tap-addr"},
		{"link", []string{"-link", "eth"}, "", "unknown link type"},
		{"local", []string{"-udp-local", "nothost"}, "", "udp-local"},
		{"peer", []string{"-udp-peer", "1.2.3.4"}, "", "udp-peer"},
		{"mtu", []string{"-mtu", "1500"}, "", "mtu 1500"},
		{"name", []string{"-name", "a/b"}, "", "invalid device name"},
		{"level", []string{"-log-level", "loud"}, "", "log level"},
		{"workers", []string{"-workers", "-1"}, "", "workers"},
		{"poll-spin", []string{"-poll-spin", "soon"}, "", "poll-spin"},
		{"poll-spin zero", []string{"-poll-spin", "0s"}, "", "poll-spin"},
		{"negative limit", nil, `{"name":"x","link":{"type":"udp"},"limits":{"per_device":{"qp":-1}}}`, "negative"},
		{"negative per-uid limit", nil, `{"name":"x","link":{"type":"udp"},"limits":{"per_uid":{"connections":-1}}}`, "negative"},
		{"args", []string{"extra"}, "", "unexpected arguments"},
		{"segment", []string{"-udp-segment-ipv4=sometimes"}, "", "true, false or auto"},
		{"max-rd-atomic", []string{"-max-rd-atomic", "256"}, "", "max_rd_atomic 256"},
		{"max_rd_atomic", nil, `{"name":"x","link":{"type":"udp"},"max_rd_atomic":-1}`, "max_rd_atomic -1"},
		{"tap-mtu", []string{"-link", "tap", "-tap-addr", "10.0.0.1/24", "-tap-mtu", "9000"}, "", "tap-mtu 9000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"-config", writeFile(t, tc.file)}, args...)
			}
			_, err := parseConfig(args, io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// TestOperatorGroupConfig: the operator group comes from the config file
// or the flag (which wins), is resolved to its gid, and an unknown group
// stops the daemon before it creates anything, naming the group.
func TestOperatorGroupConfig(t *testing.T) {
	p := writeFile(t, `{"name":"x","link":{"type":"mem"},"operator_group":"root","limits":{"per_uid":{"contexts":3,"connections":9,"fds":77}}}`)
	c, err := parseConfig([]string{"-config", p}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "root", c.OperatorGroup)
	assert.Equal(t, 3, c.Limits.PerUID.Contexts)
	assert.Equal(t, 9, c.Limits.PerUID.Connections)
	assert.Equal(t, 77, c.Limits.PerUID.FDs)
	g, err := c.operatorGroup()
	require.NoError(t, err)
	assert.Equal(t, &device.OperatorGroup{Name: "root", GID: 0}, g)

	c, err = parseConfig([]string{"-config", p, "-operator-group", "no-such-group-x"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "no-such-group-x", c.OperatorGroup)
	_, err = c.operatorGroup()
	require.Error(t, err)
	assert.Contains(t, err.Error(), `operator group "no-such-group-x"`)
	assert.Contains(t, err.Error(), "unknown group")

	c, err = parseConfig(nil, io.Discard)
	require.NoError(t, err)
	g, err = c.operatorGroup()
	assert.NoError(t, err)
	assert.Nil(t, g, "none by default")

	dir := t.TempDir()
	err = run(context.Background(), []string{"-name", "g0", "-runtime-dir", filepath.Join(dir, "rt"), "-link", "mem", "-operator-group", "no-such-group-x"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown group")
	assert.NoDirExists(t, filepath.Join(dir, "rt"), "refused before the runtime dir is made")
}

// TestRunLifecycle runs the daemon in-process: it creates socket and lock
// file, serves, and removes both when its context ends.
func TestRunLifecycle(t *testing.T) {
	dir, err := os.MkdirTemp("", "vrnicd-run-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	local := freeLoopback(t) // the default UDP link binds it; 127.0.0.1 may be taken
	go func() {
		done <- run(ctx, []string{"-name", "r0", "-runtime-dir", dir, "-local", local.String()}, &syncWriter{w: &logs})
	}()
	sock := admin.SocketPath(dir, "r0")
	require.Eventually(t, func() bool {
		info, err := admin.Serving(sock)
		return err == nil && info.Device == "r0"
	}, 5*time.Second, 10*time.Millisecond)
	assert.FileExists(t, filepath.Join(dir, "r0.lock"))
	cancel()
	require.NoError(t, <-done)
	assert.NoFileExists(t, sock)
	assert.NoFileExists(t, filepath.Join(dir, "r0.lock"))
	assert.DirExists(t, dir, "the runtime dir existed before the daemon: it stays")
}

// startRun runs the daemon in-process with the in-memory link until the
// returned function stops it (idempotent; it also runs at cleanup).
func startRun(t *testing.T, dir, name string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-name", name, "-runtime-dir", dir, "-link", "mem", "-workers", "1"}, &syncWriter{w: &logs})
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			assert.NoError(t, <-done, "%s", &logs)
		}
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool {
		info, err := admin.Serving(admin.SocketPath(dir, name))
		return err == nil && info.Device == name
	}, 5*time.Second, 10*time.Millisecond, "%s", &logs)
	return stop
}

// TestRunRemovesRuntimeDirItCreated: a daemon that created its runtime
// dir (and missing parents) removes them at exit when they are empty;
// while another daemon's socket and lock file are there the directory
// stays, and that other daemon, which did not create it, leaves it too.
func TestRunRemovesRuntimeDirItCreated(t *testing.T) {
	base := t.TempDir()
	parent := filepath.Join(base, "new")
	dir := filepath.Join(parent, "rt")

	stop1 := startRun(t, dir, "c1") // creates new/ and new/rt/
	stop2 := startRun(t, dir, "c2") // finds them
	stop1()
	assert.NoFileExists(t, admin.SocketPath(dir, "c1"))
	assert.FileExists(t, admin.SocketPath(dir, "c2"), "the other daemon's socket")
	assert.DirExists(t, dir, "holds another daemon's socket and lock file")
	a, err := admin.Dial(admin.SocketPath(dir, "c2"))
	require.NoError(t, err, "the other daemon still serves")
	a.Close()
	stop2()
	assert.DirExists(t, dir, "c2 did not create it")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, ents, "both daemons removed their files")

	// A daemon alone in the directories it made removes them all.
	require.NoError(t, os.RemoveAll(parent))
	stop3 := startRun(t, dir, "c3")
	assert.DirExists(t, dir)
	stop3()
	assert.NoDirExists(t, parent, "created by c3 and empty at its exit")
	assert.DirExists(t, base, "existed before")

	// A file left in it by someone else keeps it.
	stop4 := startRun(t, dir, "c4")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "note"), nil, 0o600))
	stop4()
	assert.FileExists(t, filepath.Join(dir, "note"))
}

// TestMaxRdAtomicConfig: max_rd_atomic comes from the config file or the
// flag (which wins); absent, it is 0 and the device takes its default.
func TestMaxRdAtomicConfig(t *testing.T) {
	c, err := parseConfig([]string{"-max-rd-atomic", "128"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 128, c.MaxRdAtomic)
	p := writeFile(t, `{"name":"x","link":{"type":"udp"},"max_rd_atomic":64}`)
	c, err = parseConfig([]string{"-config", p}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 64, c.MaxRdAtomic)
	c, err = parseConfig([]string{"-config", p, "-max-rd-atomic", "128"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 128, c.MaxRdAtomic)
	c, err = parseConfig(nil, io.Discard)
	require.NoError(t, err)
	assert.Zero(t, c.MaxRdAtomic)
}

// TestECEConfig: ECE is on unless the flag (-ece=false) or the config
// file ("ece": false) switches it off; the flag wins over the file.
func TestECEConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		file string
		want uint32
	}{
		{"default", nil, "", abi.ECEOptions},
		{"flag off", []string{"-ece=false"}, "", 0},
		{"flag on", []string{"-ece"}, "", abi.ECEOptions},
		{"file default", nil, `{"name":"x","link":{"type":"udp"}}`, abi.ECEOptions},
		{"file off", nil, `{"name":"x","link":{"type":"udp"},"ece":false}`, 0},
		{"file off, flag on", []string{"-ece=true"}, `{"name":"x","link":{"type":"udp"},"ece":false}`, abi.ECEOptions},
		{"file on, flag off", []string{"-ece=false"}, `{"name":"x","link":{"type":"udp"},"ece":true}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if c.file != "" {
				args = append([]string{"-config", writeFile(t, c.file)}, args...)
			}
			cfg, err := parseConfig(args, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, c.want, cfg.eceOptions())
		})
	}
}

// TestActiveMTU: the port's MTU follows the link as Soft-RoCE's follows
// its net device (1500 bytes: 1024), capped by -mtu.
func TestActiveMTU(t *testing.T) {
	for _, tc := range []struct {
		ifMTU int
		code  uint32
	}{{1500, 3}, {1280, 3}, {2128, 4}, {2127, 3}, {4176, 5}, {4200, 5}, {65536, 5}, {9000, 5}, {600, 2}, {336, 1}, {335, 0}} {
		assert.Equal(t, tc.code, ibMTUFor(tc.ifMTU), "interface MTU %d", tc.ifMTU)
	}
	lo, ok := localIfMTU(netip.MustParseAddr("127.0.0.2"))
	require.True(t, ok, "the loopback interface")
	assert.Positive(t, lo)
	_, ok = localIfMTU(netip.MustParseAddr("192.0.2.77"))
	assert.False(t, ok, "an address no interface holds")

	// UDP on loopback: what loopback carries (65536: 4096), at most -mtu.
	for _, tc := range []struct {
		args []string
		want abi.MTU
	}{
		{[]string{"-udp-local", "127.0.0.1:4791"}, abi.MTU(min(ibMTUFor(lo), 5))},
		{[]string{"-udp-local", "127.0.0.1:4791", "-mtu", "1024"}, abi.MTU1024},
		{[]string{"-udp-local", "192.0.2.77:4791", "-mtu", "2048"}, abi.MTU2048},
		// A TAP device of Ethernet's 1500 bytes: 1024, as rxe's active MTU.
		{[]string{"-link", "tap", "-tap-addr", "10.0.0.1/24", "-tap-mtu", "1500"}, abi.MTU1024},
		{[]string{"-link", "tap", "-tap-addr", "10.0.0.1/24"}, abi.MTU4096},
		{[]string{"-link", "tap", "-tap-addr", "10.0.0.1/24", "-mtu", "512"}, abi.MTU512},
	} {
		c, err := parseConfig(tc.args, io.Discard)
		require.NoError(t, err, "%v", tc.args)
		li, err := linkInfo(c)
		require.NoError(t, err)
		assert.Equal(t, tc.want, li.MaxMTU, "%v", tc.args)
	}
}

// TestCongestionControlConfig: -cc and -cc-param, the config file's
// "congestion_control", flags over the file, and the refusals.
func TestCongestionControlConfig(t *testing.T) {
	c, err := parseConfig(nil, io.Discard)
	require.NoError(t, err)
	p, err := c.CC.params()
	require.NoError(t, err)
	assert.Nil(t, p, "off by default")

	c, err = parseConfig([]string{"-cc", "dcqcn", "-cc-param", "rpg_time_reset=2000", "-cc-param", "line_rate=1000"}, io.Discard)
	require.NoError(t, err)
	p, err = c.CC.params()
	require.NoError(t, err)
	require.NotNil(t, p)
	assert.Equal(t, 2*time.Millisecond, p.TimeReset)
	assert.Equal(t, uint64(1_000_000_000), p.LineRate)
	assert.Equal(t, uint32(1019), p.AlphaG, "the rest are the defaults")

	f := writeFile(t, `{"name":"x","link":{"type":"udp"},"congestion_control":{"mode":"dcqcn","params":["rpg_ai_rate=1"]}}`)
	c, err = parseConfig([]string{"-config", f}, io.Discard)
	require.NoError(t, err)
	p, err = c.CC.params()
	require.NoError(t, err)
	assert.Equal(t, uint64(1_000_000), p.AIRate)
	c, err = parseConfig([]string{"-config", f, "-cc", "off", "-cc-param", "rpg_ai_rate=2"}, io.Discard)
	assert.Error(t, err, "parameters with congestion control off")
	c, err = parseConfig([]string{"-config", f, "-cc", "off"}, io.Discard)
	require.NoError(t, err, "the flag turns the file's off, and its parameters with it")
	p, err = c.CC.params()
	require.NoError(t, err)
	assert.Nil(t, p)

	for _, args := range [][]string{
		{"-cc", "timely"},
		{"-cc", "dcqcn", "-cc-param", "nope=1"},
		{"-cc", "dcqcn", "-cc-param", "rpg_gd=2"},
		{"-cc-param", "rpg_gd=11"},
	} {
		_, err := parseConfig(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}
}
