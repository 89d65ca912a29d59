package routed

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
)

// nHosts is the number of host namespaces.
const nHosts = 4

// topo is the routed network of the package doc: host namespaces
// <p>h0..<p>h3, router namespaces <p>r1 and <p>r2.
type topo struct {
	pfx     string
	hosts   [nHosts]string // namespace names
	routers [2]string
	dir     string // runtime directory of the daemons
}

// Addresses. Host i's segment is 10.142.(i+1).0/24 and
// fd42:142:(i+1)::/64: the router's port .1/::1, the host kernel's
// address (on br0) .2/::2, the TAP NIC's .3/::3. The routers' transit
// link is 10.142.100.0/30 and fd42:142:100::/64.
func subnet(i int) int { return i + 1 }

// hostAddr is host i's kernel address (the UDP link's, and what mpirun's
// runtime uses).
func hostAddr(i int) string { return fmt.Sprintf("10.142.%d.2", subnet(i)) }

func hostAddr6(i int) string { return fmt.Sprintf("fd42:142:%d::2", subnet(i)) }

// transit4 and transit6 are router k's (0: r1, 1: r2) transit address.
func transit4(k int) string { return fmt.Sprintf("10.142.100.%d", k+1) }
func transit6(k int) string { return fmt.Sprintf("fd42:142:100::%d", k+1) }

// nicAddr4 and nicAddr6 are host i's TAP NIC's addresses.
func nicAddr4(i int) string { return fmt.Sprintf("10.142.%d.3", subnet(i)) }
func nicAddr6(i int) string { return fmt.Sprintf("fd42:142:%d::3", subnet(i)) }

// gw4 and gw6 are host i's router port.
func gw4(i int) string { return fmt.Sprintf("10.142.%d.1", subnet(i)) }
func gw6(i int) string { return fmt.Sprintf("fd42:142:%d::1", subnet(i)) }

// routerOf is the router (0: r1, 1: r2) host i hangs off.
func routerOf(i int) int { return i / 2 }

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// newTopo builds the namespaces, links, addresses and routes; t.Cleanup
// deletes the namespaces (which removes the veths and bridges in them)
// and then checks that none is left.
func newTopo(t *testing.T) *topo {
	t.Helper()
	requireRoot(t)
	p := fmt.Sprintf("vrtr%d", os.Getpid()%100000)
	tp := &topo{pfx: p, dir: t.TempDir()}
	for i := range tp.hosts {
		tp.hosts[i] = fmt.Sprintf("%sh%d", p, i)
	}
	tp.routers = [2]string{p + "r1", p + "r2"}
	all := append(tp.hosts[:], tp.routers[:]...)
	t.Cleanup(func() { // registered first: runs last
		out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		for _, ns := range all {
			for _, l := range strings.Split(string(out), "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == ns {
					t.Errorf("namespace %s left behind", ns)
				}
			}
		}
	})
	for _, ns := range all {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		// No duplicate address detection on the interfaces to come:
		// their link-local addresses are usable at once.
		sysctl(t, ns, "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	for _, r := range tp.routers {
		sysctl(t, r, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	}
	// Host i: bridge br0 (its Ethernet segment) with the uplink veth up0,
	// whose peer dI is router port .1 in r1 (hosts 0, 1) or r2 (2, 3);
	// the transit link r1 t1 ── t2 r2. Every link is up before it gets
	// addresses (IPv6 addresses then join their multicast groups with
	// the carrier present).
	for i, h := range tp.hosts {
		// The bridge's MAC is fixed: it would otherwise follow its ports'
		// (and change when a TAP NIC joins).
		ipCmd(t, "-n", h, "link", "add", "br0", "address", fmt.Sprintf("02:42:01:42:00:%02x", i), "type", "bridge", "mcast_snooping", "0")
		ipCmd(t, "-n", h, "link", "add", "up0", "type", "veth", "peer", "name", fmt.Sprintf("d%d", i), "netns", tp.routers[routerOf(i)])
		ipCmd(t, "-n", h, "link", "set", "up0", "master", "br0")
		ipCmd(t, "-n", h, "link", "set", "up0", "up")
		ipCmd(t, "-n", h, "link", "set", "br0", "up")
		ipCmd(t, "-n", tp.routers[routerOf(i)], "link", "set", fmt.Sprintf("d%d", i), "up")
	}
	ipCmd(t, "-n", tp.routers[0], "link", "add", "t1", "type", "veth", "peer", "name", "t2", "netns", tp.routers[1])
	ipCmd(t, "-n", tp.routers[0], "link", "set", "t1", "up")
	ipCmd(t, "-n", tp.routers[1], "link", "set", "t2", "up")
	for i, h := range tp.hosts {
		r, port := tp.routers[routerOf(i)], fmt.Sprintf("d%d", i)
		ipCmd(t, "-n", h, "addr", "add", hostAddr(i)+"/24", "dev", "br0")
		ipCmd(t, "-n", h, "addr", "add", hostAddr6(i)+"/64", "dev", "br0", "nodad")
		ipCmd(t, "-n", r, "addr", "add", gw4(i)+"/24", "dev", port)
		ipCmd(t, "-n", r, "addr", "add", gw6(i)+"/64", "dev", port, "nodad")
		ipCmd(t, "-n", h, "route", "add", "default", "via", gw4(i))
		ipCmd(t, "-n", h, "-6", "route", "add", "default", "via", gw6(i))
	}
	for k, r := range tp.routers {
		ipCmd(t, "-n", r, "addr", "add", transit4(k)+"/30", "dev", fmt.Sprintf("t%d", k+1))
		ipCmd(t, "-n", r, "addr", "add", transit6(k)+"/64", "dev", fmt.Sprintf("t%d", k+1), "nodad")
	}
	// Each router's routes to the other's hosts.
	for k, r := range tp.routers {
		for i := range nHosts {
			if routerOf(i) != k {
				ipCmd(t, "-n", r, "route", "add", fmt.Sprintf("10.142.%d.0/24", subnet(i)), "via", transit4(1-k))
				ipCmd(t, "-n", r, "-6", "route", "add", fmt.Sprintf("fd42:142:%d::/64", subnet(i)), "via", transit6(1-k))
			}
		}
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ns := range all {
			var b strings.Builder
			for _, c := range [][]string{{"ip", "neigh"}, {"ip", "-6", "route"}, {"ip", "-s", "-br", "link"}, {"nstat", "-a"}} {
				out, _ := exec.Command("ip", append([]string{"netns", "exec", ns}, c...)...).CombinedOutput()
				fmt.Fprintf(&b, "$ %s\n%s\n", strings.Join(c, " "), out)
			}
			t.Logf("namespace %s:\n%s", ns, b.String())
		}
	})
	return tp
}

// sysctl sets kernel parameters (name=value) in namespace ns.
func sysctl(t *testing.T, ns string, kvs ...string) {
	t.Helper()
	for _, kv := range kvs {
		out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-q", "-w", kv).CombinedOutput()
		require.NoError(t, err, "sysctl %s in %s: %s", kv, ns, out)
	}
}

// hops returns the path from host from's namespace to dst: the routers'
// addresses, then dst. It pings dst with TTL 1, 2, ... and reads who
// answered "Time to live exceeded" (IPv6: "Time exceeded: Hop limit"),
// until dst answers.
func (tp *topo) hops(t *testing.T, from int, dst string) []string {
	t.Helper()
	var hops []string
	for ttl := 1; ttl <= 4; ttl++ {
		out, _ := exec.Command("ip", "netns", "exec", tp.hosts[from], "ping", "-n", "-c", "1", "-W", "5", "-t", fmt.Sprint(ttl), dst).CombinedOutput()
		// ping's -t is the IPv6 hop limit too.
		s := string(out)
		switch {
		case strings.Contains(s, "Time to live exceeded"), strings.Contains(s, "Time exceeded: Hop limit"):
			f := strings.Fields(s[strings.Index(s, "From "):])
			hops = append(hops, f[1])
		case strings.Contains(s, " 0% packet loss"):
			return append(hops, dst)
		default:
			require.Failf(t, "ping", "from %s to %s with TTL %d:\n%s", tp.hosts[from], dst, ttl, s)
		}
	}
	require.Failf(t, "ping", "%s not reached from %s in 4 hops: %v", dst, tp.hosts[from], hops)
	return nil
}

// link is the daemons' link: "udp" or "tap".
type linkKind string

// daemon is a vrnicd in a host namespace.
type daemon struct {
	host  int
	name  string
	sock  string
	args  []string // ip netns exec ... vrnicd ...
	proc  *launch.Proc
	log   *launch.Buffer
	tp    *topo
	gone  bool // killed on purpose
	epoch int  // starts so far
}

// startDaemon starts host i's vrnicd with the given link, inside the
// host's namespace: UDP on the host's kernel address, or TAP (interface
// vnic0 in the host's namespace, a port of br0) with the NIC's own
// addresses and the router port as gateway.
func (tp *topo) startDaemon(t *testing.T, i int, kind linkKind) *daemon {
	t.Helper()
	name := fmt.Sprintf("h%d", i)
	args := []string{"netns", "exec", tp.hosts[i], filepath.Join(bin, "vrnicd"), "-name", name, "-runtime-dir", tp.dir, "-workers", "1"}
	switch kind {
	case "udp":
		args = append(args, "-link", "udp", "-local", hostAddr(i)+":4791")
	case "tap":
		args = append(args, "-link", "tap", "-tap-name", "vnic0", "-tap-mtu", "1500",
			"-tap-addr", nicAddr4(i)+"/24", "-tap-addr", nicAddr6(i)+"/64",
			"-tap-gateway", gw4(i), "-tap-gateway", gw6(i))
	}
	d := &daemon{host: i, name: name, sock: admin.SocketPath(tp.dir, name), args: args, tp: tp}
	t.Cleanup(func() {
		if d.proc == nil {
			return
		}
		if err := d.proc.Stop(0, 10*time.Second); !d.gone && (err != nil || d.proc.Killed()) {
			t.Errorf("vrnicd %s: stop: %v (killed %v); log:\n%s", name, err, d.proc.Killed(), d.log.String())
		}
	})
	d.start(t, kind)
	return d
}

// start starts (or restarts) the daemon and waits until it serves; a TAP
// daemon's interface is then made a port of br0.
func (d *daemon) start(t *testing.T, kind linkKind) {
	t.Helper()
	d.log = &launch.Buffer{}
	d.epoch++
	p, err := launch.Start(launch.Spec{Name: fmt.Sprintf("vrnicd %s#%d", d.name, d.epoch), Bin: "ip", Args: d.args, Stdout: d.log, Stderr: d.log})
	require.NoError(t, err)
	d.proc, d.gone = p, false
	require.NoError(t, launch.WaitReady(context.Background(), p, d.sock, 30*time.Second), "%s", d.log.String())
	if kind == "tap" {
		// The stats socket is the last thing the daemon creates (the
		// link comes after the control socket).
		stats := strings.TrimSuffix(d.sock, admin.SocketSuffix) + admin.StatsSuffix
		require.Eventually(t, func() bool {
			c, err := net.Dial("unix", stats)
			if err == nil {
				c.Close()
			}
			return err == nil || !p.Running()
		}, 30*time.Second, 10*time.Millisecond)
		require.True(t, p.Running(), "vrnicd %s exited:\n%s", d.name, d.log.String())
		ipCmd(t, "-n", d.tp.hosts[d.host], "link", "set", "vnic0", "master", "br0")
	}
}

// kill kills the daemon with SIGKILL by its PID and waits until it is gone.
func (d *daemon) kill(t *testing.T) {
	t.Helper()
	d.gone = true
	require.NoError(t, d.proc.Cmd.Process.Signal(syscall.SIGKILL))
	require.True(t, d.proc.Wait(10*time.Second), "vrnicd %s still running after SIGKILL", d.name)
}

// linkPackets returns the packets interface ifname of namespace ns
// received and sent.
func linkPackets(t *testing.T, ns, ifname string) (rx, tx uint64) {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "-s", "-j", "link", "show", "dev", ifname).CombinedOutput()
	require.NoError(t, err, "%s", out)
	var links []struct {
		Stats64 struct {
			RX struct {
				Packets uint64 `json:"packets"`
			} `json:"rx"`
			TX struct {
				Packets uint64 `json:"packets"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	require.NoError(t, json.Unmarshal(out, &links), "%s", out)
	require.Len(t, links, 1)
	return links[0].Stats64.RX.Packets, links[0].Stats64.TX.Packets
}

// neighbors returns a TAP daemon's ARP/ND counters (its stats socket).
func (d *daemon) neighbors(t *testing.T) map[string]uint64 {
	t.Helper()
	c, err := net.Dial("unix", strings.TrimSuffix(d.sock, admin.SocketSuffix)+admin.StatsSuffix)
	require.NoError(t, err)
	defer c.Close()
	var st admin.LinkStats
	require.NoError(t, json.NewDecoder(c).Decode(&st))
	return st.Neighbors
}

// checkPaths checks the routes, IPv4 and IPv6, between the hosts' kernel
// addresses: h0 to h1 through r1, h0 to h3 through r1 and r2, h3 to h1
// through r2 and r1. (The pings also leave the routers' neighbour
// entries of each other resolved.)
func (tp *topo) checkPaths(t *testing.T) {
	t.Helper()
	require.Equal(t, []string{gw4(0), hostAddr(1)}, tp.hops(t, 0, hostAddr(1)), "path h0 → h1")
	require.Equal(t, []string{gw4(0), transit4(1), hostAddr(3)}, tp.hops(t, 0, hostAddr(3)), "path h0 → h3")
	require.Equal(t, []string{gw4(3), transit4(0), hostAddr(1)}, tp.hops(t, 3, hostAddr(1)), "path h3 → h1")
	require.Equal(t, []string{gw6(0), hostAddr6(1)}, tp.hops(t, 0, hostAddr6(1)), "IPv6 path h0 → h1")
	require.Equal(t, []string{gw6(0), transit6(1), hostAddr6(3)}, tp.hops(t, 0, hostAddr6(3)), "IPv6 path h0 → h3")
	require.Equal(t, []string{gw6(3), transit6(0), hostAddr6(1)}, tp.hops(t, 3, hostAddr6(1)), "IPv6 path h3 → h1")
}

// TestTopology builds the routed network and checks its IPv4 and IPv6
// paths (checkPaths), then that everything is gone at cleanup.
func TestTopology(t *testing.T) {
	newTopo(t).checkPaths(t)
}
