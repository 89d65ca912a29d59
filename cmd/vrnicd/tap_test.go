package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/verbs"
)

func TestParseConfigTAP(t *testing.T) {
	c, err := parseConfig([]string{"-name", "n1", "-link", "tap", "-tap-name", "vr0", "-tap-addr", "10.77.0.1/24",
		"-tap-addr", "fd00::1/64", "-tap-mac", "02:00:00:00:00:01", "-tap-netns", "ns1", "-tap-verify-steering", "-workers", "4"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, TAPConfig{Name: "vr0", Addrs: []string{"10.77.0.1/24", "fd00::1/64"}, MAC: "02:00:00:00:00:01", NetNS: "ns1", VerifySteering: true}, c.Link.TAP)
	li, err := linkInfo(c)
	require.NoError(t, err)
	assert.Equal(t, abi.LinkTAP, li.Type)
	require.Len(t, li.GIDs, 2)
	assert.Equal(t, netip.MustParseAddr("::ffff:10.77.0.1").As16(), li.GIDs[0], "GID 0: the first address, IPv4-mapped")
	assert.Equal(t, netip.MustParseAddr("fd00::1").As16(), li.GIDs[1])
	assert.Equal(t, [6]byte{2, 0, 0, 0, 0, 1}, li.MAC, "the TAP MAC is the device MAC")
	assert.Equal(t, "vr0", c.tapIfName())

	c, err = parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"tap","tap":{"addrs":["10.0.0.1/8"]}}}`), "-tap-addr", "10.9.0.1/16"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.9.0.1/16"}, c.Link.TAP.Addrs, "the flag overrides the file")
	assert.Equal(t, "f", c.tapIfName(), "the device name names the interface by default")
}

func TestParseConfigTAPErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"no-prefix", []string{"-tap-addr", "10.0.0.1"}, "want address/prefix"},
		{"multicast-addr", []string{"-tap-addr", "224.0.0.1/4"}, "unicast"},
		{"bad-mac", []string{"-tap-addr", "10.0.0.1/24", "-tap-mac", "xx"}, "tap-mac"},
		{"multicast-mac", []string{"-tap-addr", "10.0.0.1/24", "-tap-mac", "01:00:5e:00:00:01"}, "multicast"},
		{"long-name", []string{"-tap-addr", "10.0.0.1/24", "-tap-name", "a-very-long-interface-name"}, "interface name"},
		{"netns-path", []string{"-tap-addr", "10.0.0.1/24", "-tap-netns", "/run/netns/x"}, "namespace name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig(append([]string{"-link", "tap"}, tc.args...), io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// TestRunTAP starts the daemon with the TAP link in a private network
// namespace (root only): the interface exists there with one queue per
// worker, the GID table holds the addresses, the stats socket serves the
// steering and filter counters, and everything is gone after the stop.
func TestRunTAP(t *testing.T) {
	testenv.NeedRoot(t, "TAP link test needs root (CAP_NET_ADMIN, CAP_BPF)")
	testenv.NeedTool(t, "ip")
	ns := fmt.Sprintf("vrnicd-t%d", os.Getpid())
	require.NoError(t, exec.Command("ip", "netns", "add", ns).Run())
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })

	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-name", "tp0", "-runtime-dir", dir, "-link", "tap", "-workers", "3", "-tap-netns", ns,
			"-tap-addr", "10.77.0.1/24", "-tap-addr", "fd00:77::1/64", "-tap-verify-steering"}, &syncWriter{w: &logs})
	}()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			<-done
		}
	}()
	sock := admin.SocketPath(dir, "tp0")
	// The stats socket comes last (the control socket before the link).
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", strings.TrimSuffix(sock, admin.SocketSuffix)+admin.StatsSuffix)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}, 10*time.Second, 10*time.Millisecond, "daemon up; log:\n%s", &logs)

	out, err := exec.Command("ip", "-n", ns, "-d", "link", "show", "tp0").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "tap")
	assert.Contains(t, string(out), "multi_queue")
	assert.Contains(t, string(out), fmt.Sprintf("qlen %d", tapTxQueueLen))

	vc, err := verbs.Open(sock)
	require.NoError(t, err)
	g0, err := vc.QueryGID(1, 0)
	require.NoError(t, err)
	g1, err := vc.QueryGID(1, 1)
	require.NoError(t, err)
	assert.Equal(t, netip.MustParseAddr("::ffff:10.77.0.1").As16(), g0.GID)
	assert.Equal(t, netip.MustParseAddr("fd00:77::1").As16(), g1.GID)
	vc.Close()

	c, err := net.Dial("unix", strings.TrimSuffix(sock, admin.SocketSuffix)+admin.StatsSuffix)
	require.NoError(t, err)
	var st admin.LinkStats
	require.NoError(t, json.NewDecoder(c).Decode(&st))
	c.Close()
	assert.Equal(t, "tap", st.Link)
	assert.Equal(t, "tp0", st.Interface)
	require.Len(t, st.Queues, 3)
	for _, q := range st.Queues {
		assert.Zero(t, q.Steered, "verification runs are not counted as traffic")
	}
	assert.Contains(t, st.Filter, "drop_ethertype")

	cancel()
	require.NoError(t, <-done)
	stopped = true
	out, _ = exec.Command("ip", "-n", ns, "link", "show", "tp0").CombinedOutput()
	assert.Contains(t, string(out), "does not exist", "the interface goes with the daemon")
	_, err = os.Stat(strings.TrimSuffix(sock, admin.SocketSuffix) + admin.StatsSuffix)
	assert.ErrorIs(t, err, os.ErrNotExist, "stats socket removed")
}

// TestTAPRoutes: the TAP NIC's next hop is the peer on its prefixes and
// the gateway of the peer's family off them; the gateways' checks.
func TestTAPRoutes(t *testing.T) {
	c, err := parseConfig([]string{"-link", "tap", "-tap-addr", "10.142.1.3/24", "-tap-addr", "fd42:142:1::3/64",
		"-tap-gateway", "10.142.1.1", "-tap-gateway", "fd42:142:1::1"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.142.1.1", "fd42:142:1::1"}, c.Link.TAP.Gateways)
	r, err := c.Link.TAP.routes()
	require.NoError(t, err)
	for dst, want := range map[string]string{
		"10.142.1.7":        "10.142.1.7",
		"::ffff:10.142.1.7": "10.142.1.7", // a GID's IPv4-mapped form
		"10.142.3.2":        "10.142.1.1",
		"fd42:142:1::9":     "fd42:142:1::9",
		"fd42:142:4::2":     "fd42:142:1::1",
	} {
		hop, ok := r.nextHop(netip.MustParseAddr(dst))
		assert.True(t, ok, dst)
		assert.Equal(t, netip.MustParseAddr(want), hop, dst)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { r.nextHop(netip.MustParseAddr("10.142.3.2")) }), "nextHop allocates")

	c, err = parseConfig([]string{"-link", "tap", "-tap-addr", "10.142.1.3/24", "-tap-gateway", "10.142.1.1"}, io.Discard)
	require.NoError(t, err)
	r, err = c.Link.TAP.routes()
	require.NoError(t, err)
	_, ok := r.nextHop(netip.MustParseAddr("fd42:142:4::2"))
	assert.False(t, ok, "no IPv6 gateway: an off-link IPv6 peer has no next hop")
	c, err = parseConfig([]string{"-config", writeFile(t, `{"link":{"type":"tap","tap":{"addrs":["10.0.0.1/8"],"gateways":["10.0.0.254"]}}}`)}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, []string{"10.0.0.254"}, c.Link.TAP.Gateways, "from the file")

	for name, tc := range map[string]struct {
		args []string
		msg  string
	}{
		"not-an-address": {[]string{"-tap-gateway", "router"}, "want an IP address"},
		"off-link":       {[]string{"-tap-gateway", "10.9.0.1"}, "not on any -tap-addr prefix"},
		"two-ipv4":       {[]string{"-tap-gateway", "10.142.1.1", "-tap-gateway", "10.142.1.2"}, "a second gateway"},
		"own-address":    {[]string{"-tap-gateway", "10.142.1.3"}, "the NIC's own address"},
		"multicast":      {[]string{"-tap-gateway", "224.0.0.1"}, "unicast"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseConfig(append([]string{"-link", "tap", "-tap-addr", "10.142.1.3/24"}, tc.args...), io.Discard)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}
