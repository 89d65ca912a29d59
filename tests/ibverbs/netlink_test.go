package ibverbs_test

// What a program run by vrnic-run sees of the interface it gives a device
// on a loopback address, through sysfs (the RDMA device's parent and its
// net/ entry, /sys/class/net) and through rtnetlink (iproute2's ip, and a
// program of its own: testdata/rtnl_probe.c), against getifaddrs and the
// GID's ndevs: one interface, one name, index, MAC, MTU and address
// everywhere, the real interfaces still listed.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// sysfsNetScript prints, for device b: the GID's ndevs, the entries of
// device/net, where /sys/class/net/NDEV leads, what device/net/NDEV and
// /sys/class/net/NDEV hold, the ibdev behind the interface's device link,
// and lo's index (the real class).
const sysfsNetScript = `
set -e
ib=/sys/class/infiniband/b
nd=$(cat $ib/ports/1/gid_attrs/ndevs/0)
echo "ndevs $nd"
echo "devnet $(ls $ib/device/net | tr '\n' ' ')"
echo "classnet $(readlink -f /sys/class/net/$nd)"
echo "devattrs $(cat $ib/device/net/$nd/ifindex) $(cat $ib/device/net/$nd/address) $(cat $ib/device/net/$nd/mtu) $(cat $ib/device/net/$nd/operstate) $(cat $ib/device/net/$nd/type)"
echo "classattrs $(cat /sys/class/net/$nd/ifindex) $(cat /sys/class/net/$nd/address) $(cat /sys/class/net/$nd/mtu) $(cat /sys/class/net/$nd/operstate) $(cat /sys/class/net/$nd/type)"
echo "backlink $(ls /sys/class/net/$nd/device/infiniband)"
echo "uverbs $(ls /sys/class/infiniband_verbs/uverbs0/device/net)"
echo "lo $(cat /sys/class/net/lo/ifindex)"
`

// ipLink is what ip -j link/addr says of an interface.
type ipLink struct {
	Index    int      `json:"ifindex"`
	Name     string   `json:"ifname"`
	Flags    []string `json:"flags"`
	MTU      int      `json:"mtu"`
	Address  string   `json:"address"`
	AddrInfo []struct {
		Family string `json:"family"`
		Local  string `json:"local"`
		Prefix int    `json:"prefixlen"`
	} `json:"addr_info"`
}

// TestNetDevSysfsAndRtnl: for device b (on a loopback address) the sysfs
// device/net entry, /sys/class/net, ip -j addr show, ip -j link and a
// program's own getifaddrs and NETLINK_ROUTE dumps and gets all name the
// interface of the GID's ndevs, with one index, MAC, MTU and address;
// lo is still there, and without the view ip knows no such interface.
func TestNetDevSysfsAndRtnl(t *testing.T) {
	testenv.NeedTool(t, "ip")
	prog := buildCLibs(t, "rtnl_probe.c", nil)
	p := startPair(t)
	addr := p.addr[1].String()

	out, err := p.run(t, 30*time.Second, "-d", "b", "sh", "-c", sysfsNetScript)
	require.NoError(t, err, "%s", out)
	field := func(key string) []string {
		m := regexp.MustCompile(`(?m)^` + key + ` (.*)$`).FindStringSubmatch(out)
		require.NotNil(t, m, "no %s line:\n%s", key, out)
		return strings.Fields(m[1])
	}
	nd := field("ndevs")[0]
	require.Equal(t, "vrnic-b", nd)
	assert.Equal(t, []string{nd}, field("devnet"), "device/net names the GID's ndev")
	assert.Equal(t, []string{"/sys/class/infiniband/b/device/net/" + nd}, field("classnet"))
	sys := field("devattrs")
	require.Len(t, sys, 5, out)
	assert.Equal(t, sys, field("classattrs"))
	assert.Equal(t, "up", sys[3])
	assert.Equal(t, "1", sys[4], "ARPHRD_ETHER")
	assert.Equal(t, []string{"b"}, field("backlink"))
	assert.Equal(t, []string{nd}, field("uverbs"))
	assert.Equal(t, []string{"1"}, field("lo"), "the real /sys/class/net")
	index, mac, mtu := sys[0], sys[1], sys[2]

	// iproute2: the pyverbs probe (ip -j addr show NAME), then every link.
	out, err = p.run(t, 30*time.Second, "-d", "b", "ip", "-j", "addr", "show", nd)
	require.NoError(t, err, "%s", out)
	var links []ipLink
	require.NoError(t, json.Unmarshal([]byte(out), &links), out)
	require.Len(t, links, 1, out)
	l := links[0]
	assert.Equal(t, index, fmt.Sprint(l.Index))
	assert.Equal(t, nd, l.Name)
	assert.Equal(t, mac, l.Address)
	assert.Equal(t, mtu, fmt.Sprint(l.MTU))
	assert.Subset(t, l.Flags, []string{"UP", "LOWER_UP", "BROADCAST", "MULTICAST"})
	assert.NotContains(t, l.Flags, "LOOPBACK")
	require.Len(t, l.AddrInfo, 1, out)
	assert.Equal(t, "inet", l.AddrInfo[0].Family)
	assert.Equal(t, addr, l.AddrInfo[0].Local)
	assert.Equal(t, 8, l.AddrInfo[0].Prefix, "the prefix of lo's network")

	out, err = p.run(t, 30*time.Second, "-d", "b", "ip", "-j", "link")
	require.NoError(t, err, "%s", out)
	links = nil
	require.NoError(t, json.Unmarshal([]byte(out), &links), out)
	byName := map[string]ipLink{}
	for _, l := range links {
		byName[l.Name] = l
	}
	require.Contains(t, byName, "lo", out)
	assert.Equal(t, 1, byName["lo"].Index)
	assert.Contains(t, byName["lo"].Flags, "LOOPBACK")
	require.Contains(t, byName, nd, out)
	assert.Equal(t, index, fmt.Sprint(byName[nd].Index))
	assert.Equal(t, mac, byName[nd].Address)
	assert.NotContains(t, byName, "vrnic-a", "-d b: a is not in the view")

	// A program's own getifaddrs and rtnetlink requests.
	out, err = p.run(t, 30*time.Second, "-d", "b", prog, nd)
	require.NoError(t, err, "%s", out)
	out = "\n" + out
	for _, want := range []string{
		fmt.Sprintf("ifl %s %s %s", nd, index, mac),
		fmt.Sprintf("ifa %s %s/8 0x11043", nd, addr), // UP|BROADCAST|RUNNING|MULTICAST|LOWER_UP
		fmt.Sprintf("link %s %s %s %s 0x11043", index, nd, mtu, mac),
		"linkdone",
		fmt.Sprintf("addr %s %s/8 %s 254", index, addr, nd), // RT_SCOPE_HOST, as 127/8 on lo
		"addrdone 0",
		fmt.Sprintf("get %s %s %s %s 0x11043", index, nd, mtu, mac),
		"getack 0 1 1", // the ack names the request as it was sent
		fmt.Sprintf("getidx %s %s", index, nd),
		"bogus ENODEV", // the kernel's answer for an unknown name
		"trunc 16 16 1 0",
		fmt.Sprintf("filtered %s %s/8", index, addr),
		"filtereddone 0",
		"ifl lo 1 00:00:00:00:00:00",
		"link 1 lo 65536 00:00:00:00:00:00 0x10049",
		"addr 1 127.0.0.1/8 lo 254",
	} {
		assert.Contains(t, out, "\n"+want+"\n", "probe output")
	}
	// Each interface once, in the dump as in getifaddrs.
	assert.Equal(t, 1, strings.Count(out, "\nlink "+index+" "), out)
	assert.Equal(t, 1, strings.Count(out, "\nifl "+nd+" "), out)
	assert.NotRegexp(t, `(?m)^filtered 1 `, out, "lo's addresses replaced, not added")

	// The kernel's own answers to the same probe, for lo: what the shim
	// mimics (sequence numbers, ack, truncation).
	kout, err := p.run(t, 30*time.Second, "-view=false", prog, "lo")
	require.NoError(t, err, "%s", kout)
	for _, want := range []string{"getack 0 1 1", "getidx 1 lo", "bogus ENODEV", "trunc 16 16 1 0", "filtereddone 0"} {
		assert.Contains(t, kout, "\n"+want+"\n", "the kernel, for lo")
	}

	// Without the view, no such interface.
	out, err = p.run(t, 30*time.Second, "-view=false", "-d", "b", "ip", "-j", "addr", "show", nd)
	assert.Error(t, err, "%s", out)
	assert.Contains(t, out, "does not exist")
}
