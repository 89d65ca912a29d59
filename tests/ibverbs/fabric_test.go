package ibverbs_test

// libfabric's verbs provider (Debian's libfabric1 and libfabric-bin) on
// vrnic through vrnic-run: fi_info lists the endpoints of each device,
// fi_pingpong runs over MSG (RC), RDM (ofi_rxm over RC, and ofi_rxd over
// UD) and DGRAM (UD) endpoints many times in a row, and what a program
// sees of the network interfaces agrees with sysfs.

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/mwprogs"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestFabricInfo: fi_info -p verbs, run on each device, lists a MSG
// endpoint (verbs, RC), a DGRAM endpoint (verbs, UD, domain DEV-dgram) and
// RDM endpoints (verbs;ofi_rxm over MSG, verbs;ofi_rxd over DGRAM) for
// it. Run on both devices at once it lists the RDM endpoints over UD of
// both.
func TestFabricInfo(t *testing.T) {
	testenv.NeedTool(t, "fi_info")
	p := startPair(t)
	for _, dev := range []string{"a", "b"} {
		mwprogs.FIInfo(t, mwEnv(p), dev)
	}
	out, err := p.run(t, 60*time.Second, "fi_info", "-p", "verbs")
	require.NoError(t, err, "%s", out)
	es := mwprogs.ParseFIInfo(out)
	for _, dev := range []string{"a", "b"} {
		assert.True(t, mwprogs.HasFIEntry(es, "verbs;ofi_rxd", dev+"-dgram", "FI_EP_RDM"), "both devices: no RDM endpoint of %s:\n%s", dev, out)
	}
	// Without the view (no interface for the devices) the verbs provider
	// finds no address for MSG endpoints: what the view fixes.
	out, err = p.run(t, 60*time.Second, "-view=false", "-d", "a", "fi_info", "-p", "verbs", "-t", "FI_EP_MSG")
	assert.Error(t, err, "fi_info found MSG endpoints without vrnic-run's interfaces:\n%s", out)
}

// TestFabricNetDev checks what a program run by vrnic-run sees of the
// interface it gives device b (on a loopback address): getifaddrs lists
// it up, running, not loopback, with b's address; its name and index
// agree everywhere and with sysfs's gid_attrs/ndevs; probes the kernel
// would refuse for it (ethtool) or for an unknown interface give the
// kernel's errors.
func TestFabricNetDev(t *testing.T) {
	prog := buildCLibs(t, "netdev_probe.c", nil)
	p := startPair(t)
	ndev, err := p.run(t, 30*time.Second, "-d", "b", "cat", "/sys/class/infiniband/b/ports/1/gid_attrs/ndevs/0")
	require.NoError(t, err, "%s", ndev)
	ndev = strings.TrimSpace(ndev)
	require.Equal(t, "vrnic-b", ndev, "sysfs names the interface")
	out, err := p.run(t, 30*time.Second, "-d", "b", prog, ndev)
	require.NoError(t, err, "%s", out)
	addr := p.addr[1].String()
	m := regexp.MustCompile(`(?m)^ifaddr vrnic-b inet ` + regexp.QuoteMeta(addr) + `/8 0x([0-9a-f]+)$`).FindStringSubmatch(out)
	require.NotNil(t, m, "no address entry for vrnic-b with %s:\n%s", addr, out)
	flags, _ := strconv.ParseUint(m[1], 16, 32)
	assert.Equal(t, uint64(0x1|0x40), flags&(0x1|0x40), "IFF_UP|IFF_RUNNING")
	assert.Zero(t, flags&0x8, "not IFF_LOOPBACK")
	idx := regexp.MustCompile(`(?m)^link vrnic-b (\d+)$`).FindStringSubmatch(out)
	require.NotNil(t, idx, "no link entry:\n%s", out)
	for _, want := range []string{
		"nametoindex " + idx[1], "indextoname vrnic-b", "nameindex vrnic-b " + idx[1],
		"ioctl SIOCGIFINDEX OK " + idx[1], "ioctl SIOCGIFADDR OK " + addr, "ioctl SIOCGIFNAME OK vrnic-b",
		"ioctl SIOCETHTOOL EOPNOTSUPP", "sysfs OK",
		"bogus nametoindex ENODEV", "bogus ioctl SIOCGIFFLAGS ENODEV", "bogus ioctl SIOCETHTOOL ENODEV",
	} {
		assert.Contains(t, out, want+"\n")
	}
	assert.NotContains(t, out, "ifaddr vrnic-a", "device a is not in -d b's view")
	// Without the view, no interface.
	out, err = p.run(t, 30*time.Second, "-view=false", "-d", "b", prog, ndev)
	require.NoError(t, err, "%s", out)
	assert.NotContains(t, out, "ifaddr vrnic-b")
	assert.Contains(t, out, "nametoindex ENODEV\n")
}

// TestFabricPingpong runs fi_pingpong 20 times in a row for each endpoint
// type (every other run with -c, the data check), each run bounded by a
// timeout: a hang fails it. RDM runs over both of libfabric's RDM
// layers, ofi_rxm over RC and ofi_rxd over UD: ofi_rxd's teardown once
// hung (a datagram posted just before the peer destroyed its QP was not
// sent). Afterwards the daemons' counters show the traffic went through
// them.
func TestFabricPingpong(t *testing.T) {
	testenv.NeedTool(t, "fi_pingpong")
	p := startPair(t)
	runs := 20
	if testing.Short() {
		runs = 4
	}
	mwprogs.FIPingpongSuite(t, mwEnv(p), runs)
}
