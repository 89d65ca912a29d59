package devview

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNetDevName(t *testing.T) {
	for _, c := range []struct {
		dev  string
		idx  int
		want string
	}{
		{"a", 0, "vrnic-a"},
		{"rxe0", 3, "vrnic-rxe0"},
		{"a-much-too-long-name", 2, "vrnic2"}, // over 15 bytes
		{"x:y", 1, "vrnic1"},                  // not a valid interface name
		{"x/y", 1, "vrnic1"},
	} {
		if got := NetDevName(c.dev, c.idx); got != c.want {
			t.Errorf("NetDevName(%q, %d) = %q, want %q", c.dev, c.idx, got, c.want)
		}
	}
}

func TestMACOf(t *testing.T) {
	// EUI-64 from 02:42:ac:11:00:02: 00:42:ac:ff:fe:11:00:02.
	if got := MACOf(0x0042acfffe110002).String(); got != "02:42:ac:11:00:02" {
		t.Errorf("EUI-64: got %s", got)
	}
	if got := MACOf(0x1122334455667788).String(); got != "02:44:55:66:77:88" {
		t.Errorf("other GUID: got %s", got)
	}
}

// A device whose address no interface holds (TEST-NET-3 here) gets an
// interface holding it, as a host address; sysfs's ndevs names it.
func TestSyntheticNetDevs(t *testing.T) {
	g := [16]byte{10: 0xff, 11: 0xff, 12: 203, 13: 0, 14: 113, 15: 77}
	devs := []Device{{Name: "a", Index: 0, GIDs: []GID{{GID: g, Valid: true, V2: true}, {}}}}
	nds := SyntheticNetDevs(devs, Local)
	if len(nds) != 1 || nds[0].Name != "vrnic-a" || len(nds[0].Addrs) != 1 ||
		nds[0].Addrs[0] != netip.MustParsePrefix("203.0.113.77/32") || nds[0].Index < 1000 {
		t.Fatalf("got %+v", nds)
	}
	if devs[0].GIDs[0].NetDev != "vrnic-a" || devs[0].GIDs[1].NetDev != "" {
		t.Errorf("ndevs: %+v", devs[0].GIDs)
	}
}

// TestWriteDeviceSysfs: each device gets a parent directory whose net/
// holds its interface (attributes as the kernel writes them), links back
// to the RDMA and uverbs devices, and a /sys/class/net link to add; a GID
// on a real interface links to that interface's own directory.
func TestWriteDeviceSysfs(t *testing.T) {
	class, stage := t.TempDir(), t.TempDir()
	nd := NetDev{Name: "vrnic-a", Index: 1000, MTU: 1500, MAC: net.HardwareAddr{2, 1, 2, 3, 4, 5},
		Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.1.1/8")}}
	devs := []Device{
		{Name: "a", Index: 0, GIDs: []GID{{Valid: true, NetDev: "vrnic-a"}, {Valid: true, NetDev: "vrnic-a"}, {}}},
		{Name: "b", Index: 1, GIDs: []GID{{Valid: true, NetDev: "lo"}}},
	}
	for _, d := range []string{"infiniband/a", "infiniband/b", "infiniband_verbs/uverbs0", "infiniband_verbs/uverbs1"} {
		if err := os.MkdirAll(filepath.Join(class, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	netAdd, err := WriteDeviceSysfs(class, stage, devs, []NetDev{nd}, func(NetDev) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(class, p))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	ents, _ := os.ReadDir(filepath.Join(class, "infiniband/a/device/net"))
	if len(ents) != 1 || ents[0].Name() != "vrnic-a" {
		t.Fatalf("device/net of a: %v", ents)
	}
	for f, want := range map[string]string{"address": "02:01:02:03:04:05", "ifindex": "1000", "iflink": "1000", "mtu": "1500",
		"operstate": "up", "type": "1", "flags": "0x1003", "carrier": "1", "uevent": "INTERFACE=vrnic-a\nIFINDEX=1000"} {
		if got := read("infiniband/a/device/net/vrnic-a/" + f); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	for link, want := range map[string]string{
		filepath.Join(class, "infiniband/a/device/infiniband/a"):             "../..",
		filepath.Join(class, "infiniband/a/device/net/vrnic-a/device"):       "../..",
		filepath.Join(class, "infiniband/a/device/net/vrnic-a/subsystem"):    "../../../../../net",
		filepath.Join(class, "infiniband_verbs/uverbs1/device"):              "../../infiniband/b/device",
		filepath.Join(class, "infiniband/a/device/infiniband_verbs/uverbs0"): "../../../../infiniband_verbs/uverbs0",
		filepath.Join(netAdd, "vrnic-a"):                                     "../infiniband/a/device/net/vrnic-a",
	} {
		if got, err := os.Readlink(link); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, want)
		}
	}
	// b's GID is on a real interface: its own sysfs directory, nothing
	// added to /sys/class/net.
	if real, err := filepath.EvalSymlinks("/sys/class/net/lo"); err == nil {
		if got, _ := os.Readlink(filepath.Join(class, "infiniband/b/device/net/lo")); got != real {
			t.Errorf("b's device/net/lo -> %q, want %q", got, real)
		}
	}
	if ents, _ := os.ReadDir(netAdd); len(ents) != 1 {
		t.Errorf("net additions: %v", ents)
	}
}
