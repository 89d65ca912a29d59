package main

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vrnic/vrnic/internal/devview"
)

func TestNetDevsEnv(t *testing.T) {
	nds := []devview.NetDev{
		{Name: "vrnic-a", Index: 1000, MTU: 1500, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
			Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/8"), netip.MustParsePrefix("fd00::2/64")}},
		{Name: "vrnic-b", Index: 1001, MTU: 1500, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
			Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.3/8")}},
	}
	want := "vrnic-a,1000,1500,02:00:00:00:00:01,127.0.0.2/8,fd00::2/64;vrnic-b,1001,1500,02:00:00:00:00:02,127.0.0.3/8"
	if got := devview.NetDevsEnv(nds); got != want {
		t.Errorf("got %q\nwant %q", got, want)
	}
	env := withNetDevs([]string{"LD_PRELOAD=/x/libasan.so.8", "A=b"}, "/lib/dir", "/nonexistent", nds)
	var pre string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LD_PRELOAD="); ok {
			pre = v
		}
	}
	if pre != "/x/libasan.so.8:/lib/dir/libvrnic-netdev.so" {
		t.Errorf("LD_PRELOAD = %q: the shim goes after what is there", pre)
	}
	if got := withNetDevs([]string{"A=b"}, "/lib/dir", "/nonexistent", nil); len(got) != 1 {
		t.Errorf("no interfaces: env changed: %q", got)
	}
}
