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

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/mwprogs"
	"github.com/vrnic/vrnic/internal/testenv"
)

// fiInfoEntry is one fi_info entry: provider, domain and endpoint type.
type fiInfoEntry struct{ prov, domain, typ string }

// parseFiInfo reads fi_info's default output (provider:, then indented
// fabric:, domain:, version:, type:, protocol: lines).
func parseFiInfo(out string) []fiInfoEntry {
	var es []fiInfoEntry
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		switch k {
		case "provider":
			es = append(es, fiInfoEntry{prov: v})
		case "domain":
			if len(es) > 0 {
				es[len(es)-1].domain = v
			}
		case "type":
			if len(es) > 0 {
				es[len(es)-1].typ = v
			}
		}
	}
	return es
}

func hasEntry(es []fiInfoEntry, prov, domain, typ string) bool {
	for _, e := range es {
		if e.prov == prov && e.domain == domain && e.typ == typ {
			return true
		}
	}
	return false
}

// TestFabricInfo: fi_info -p verbs, run on each device, lists a MSG
// endpoint (verbs, RC), a DGRAM endpoint (verbs, UD, domain DEV-dgram) and
// RDM endpoints (verbs;ofi_rxm over MSG, verbs;ofi_rxd over DGRAM) for
// it. Run on both devices at once it lists the RDM endpoints over UD of
// both.
func TestFabricInfo(t *testing.T) {
	testenv.NeedTool(t, "fi_info")
	p := startPair(t)
	for _, dev := range []string{"a", "b"} {
		out, err := p.run(t, 60*time.Second, "-d", dev, "fi_info", "-p", "verbs")
		require.NoError(t, err, "%s", out)
		es := parseFiInfo(out)
		assert.True(t, hasEntry(es, "verbs", dev, "FI_EP_MSG"), "device %s: no MSG endpoint:\n%s", dev, out)
		assert.True(t, hasEntry(es, "verbs", dev+"-dgram", "FI_EP_DGRAM"), "device %s: no DGRAM endpoint:\n%s", dev, out)
		assert.True(t, hasEntry(es, "verbs;ofi_rxm", dev, "FI_EP_RDM"), "device %s: no RDM endpoint over MSG:\n%s", dev, out)
		assert.True(t, hasEntry(es, "verbs;ofi_rxd", dev+"-dgram", "FI_EP_RDM"), "device %s: no RDM endpoint over DGRAM:\n%s", dev, out)
		for _, e := range es {
			assert.True(t, e.domain == dev || e.domain == dev+"-dgram", "device %s: entry of another domain: %+v", dev, e)
		}
	}
	out, err := p.run(t, 60*time.Second, "fi_info", "-p", "verbs")
	require.NoError(t, err, "%s", out)
	es := parseFiInfo(out)
	for _, dev := range []string{"a", "b"} {
		assert.True(t, hasEntry(es, "verbs;ofi_rxd", dev+"-dgram", "FI_EP_RDM"), "both devices: no RDM endpoint of %s:\n%s", dev, out)
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
		"ioctl SIOCETHTOOL EOPNOTSUPP", "sysfs ENOENT",
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

// fiRow is one line of fi_pingpong's table.
type fiRow struct {
	bytes, sent, ack int
	mbps, usec       float64
}

var fiRowRE = regexp.MustCompile(`(?m)^(\d+)([kmg]?)\s+(\d+)\s+=(\d+)\s+\S+\s+\S+s\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+\s*$`)

// parseFiPingpong reads fi_pingpong's table: bytes, #sent, #ack, total,
// time, MB/sec, usec/xfer, Mxfers/sec. Sizes of 1024 bytes and more
// carry a binary suffix (1k, 64k, 1m).
func parseFiPingpong(out string) []fiRow {
	var rows []fiRow
	for _, m := range fiRowRE.FindAllStringSubmatch(out, -1) {
		var r fiRow
		r.bytes, _ = strconv.Atoi(m[1])
		r.bytes <<= map[string]int{"": 0, "k": 10, "m": 20, "g": 30}[m[2]]
		r.sent, _ = strconv.Atoi(m[3])
		r.ack, _ = strconv.Atoi(m[4])
		r.mbps, _ = strconv.ParseFloat(m[5], 64)
		r.usec, _ = strconv.ParseFloat(m[6], 64)
		rows = append(rows, r)
	}
	return rows
}

func TestParseFiPingpong(t *testing.T) {
	out := "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n" +
		"64      100     =100     12k         0.01s      1.16      55.06       0.02\n" +
		"64k     10      =10      1.2m        0.02s     66.12     991.20       0.00\n"
	rows := parseFiPingpong(out)
	require.Len(t, rows, 2)
	assert.Equal(t, fiRow{bytes: 64, sent: 100, ack: 100, mbps: 1.16, usec: 55.06}, rows[0])
	assert.Equal(t, fiRow{bytes: 65536, sent: 10, ack: 10, mbps: 66.12, usec: 991.20}, rows[1])
	assert.Empty(t, parseFiPingpong("64x     10      =10      1.2m        0.02s     66.12     991.20       0.00\n"))
}

// daemonPackets returns data_path.packets_sent of each daemon.
func daemonPackets(t *testing.T, p *pair) [2]uint64 {
	t.Helper()
	return [2]uint64{mwprogs.ReadCounters(t, admin.SocketPath(p.dir, "a")).Sent, mwprogs.ReadCounters(t, admin.SocketPath(p.dir, "b")).Sent}
}

// fiPingpong runs fi_pingpong once: the server on device b, the client on
// device a connecting to b's address; both must exit 0 within the timeout
// and the client's table must show iters messages of each size, acked.
func fiPingpong(t *testing.T, p *pair, prov, ep string, check bool, iters int, sizes ...int) []fiRow {
	t.Helper()
	port := freeTCPPort(t)
	args := []string{"fi_pingpong", "-p", prov, "-e", ep, "-I", strconv.Itoa(iters)}
	if check {
		args = append(args, "-c")
	}
	var rows []fiRow
	for _, size := range sizes {
		sargs := append(append([]string{"-d", "b"}, args...), "-S", strconv.Itoa(size), "-B", strconv.Itoa(port))
		srv, sout := p.start(t, "fi_pingpong server", sargs...)
		deadline := time.Now().Add(60 * time.Second)
		for !listening(port) {
			if !srv.Running() || time.Now().After(deadline) {
				t.Fatalf("fi_pingpong server did not listen on %d:\n%s", port, sout.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cargs := append(append([]string{"-d", "a"}, args...), "-S", strconv.Itoa(size), "-P", strconv.Itoa(port), p.addr[1].String())
		cout, err := p.run(t, 30*time.Second, cargs...)
		require.NoError(t, err, "client (%s %s -S %d):\n%s\nserver:\n%s", prov, ep, size, cout, sout.String())
		require.True(t, srv.Wait(30*time.Second), "server did not exit:\n%s", sout.String())
		require.NoError(t, srv.Err(), "server:\n%s", sout.String())
		got := parseFiPingpong(cout)
		require.Len(t, got, 1, "client table:\n%s", cout)
		r := got[0]
		assert.Equal(t, size, r.bytes)
		assert.Equal(t, iters, r.sent)
		assert.Equal(t, iters, r.ack)
		assert.Greater(t, r.usec, 0.0)
		assert.Less(t, r.usec, 1e6, "a second per transfer")
		rows = append(rows, r)
		port = freeTCPPort(t)
	}
	return rows
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
	cases := []struct {
		name, prov, ep string
		sizes          []int
	}{
		{"msg", "verbs", "msg", []int{64, 65536}},
		{"rdm", "verbs", "rdm", []int{64, 65536}},
		{"dgram", "verbs", "dgram", []int{64, 1024}},
		{"rdm-rxd", "verbs;ofi_rxd", "rdm", []int{64, 4096}},
	}
	const iters = 10
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := daemonPackets(t, p)
			for i := range runs {
				// One size a run, alternating, so that 20 runs stay
				// within a few seconds each.
				fiPingpong(t, p, c.prov, c.ep, i%2 == 1, iters, c.sizes[i%len(c.sizes)])
				if t.Failed() {
					t.Fatalf("run %d of %d failed\n%s", i+1, runs, p.daemonLogs())
				}
			}
			after := daemonPackets(t, p)
			for i := range after {
				assert.GreaterOrEqual(t, after[i]-before[i], uint64(runs*iters),
					"daemon %d sent fewer packets than ping-pong messages", i)
			}
		})
	}
}
