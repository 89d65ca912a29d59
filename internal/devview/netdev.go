package devview

// Network interfaces for the devices (kernel-notes/vrnic-run-view.md,
// "Network interfaces"): a device whose addresses no real, non-loopback
// interface of the program's namespace holds (a daemon on 127.0.0.x, or
// any daemon seen from a pod) gets an interface of its own, named
// vrnic-DEVICE, which ibverbs' libvrnic-netdev.so (preloaded) adds to
// getifaddrs, if_nametoindex and the SIOCGIF* ioctls, described to it by
// VRNIC_NETDEVS (NetDevsEnv). The GIDs' ndevs in sysfs name the same
// interface.

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// NetDevsEnvVar is the environment variable that describes the synthetic
// interfaces to the preloaded shim.
const NetDevsEnvVar = "VRNIC_NETDEVS"

// NetDev is one synthetic interface.
type NetDev struct {
	Name  string
	Index int
	MTU   int
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
}

// NetDevName is the interface name for device dev: vrnic-DEV when it is a
// valid interface name (at most 15 bytes, no '/', ':' or space), else
// vrnicN (N the device's uverbs number).
func NetDevName(dev string, index int) string {
	n := "vrnic-" + dev
	if len(n) <= 15 && !strings.ContainsAny(n, "/: \t\n%") {
		return n
	}
	return fmt.Sprintf("vrnic%d", index)
}

// freeIndex returns the first interface index from want up that no
// interface of ns and no index in taken uses.
func freeIndex(ns Namespace, want int, taken map[int]bool) int {
	for ; ; want++ {
		if !taken[want] && !ns.IndexInUse(want) {
			return want
		}
	}
}

// SyntheticNetDevs decides the interfaces for devs in ns and sets the
// GIDs' NetDev: the real interface holding an address, unless that is a
// loopback interface or none; then the device's synthetic interface,
// holding every such address of the device.
func SyntheticNetDevs(devs []Device, ns Namespace) []NetDev {
	var out []NetDev
	taken := map[int]bool{}
	for i := range devs {
		d := &devs[i]
		var nd *NetDev
		for j := range d.GIDs {
			g := &d.GIDs[j]
			if !g.Valid {
				continue
			}
			addr := netip.AddrFrom16(g.GID).Unmap()
			if addr.Is6() && addr.IsLinkLocalUnicast() {
				// fe80:: GIDs (RoCE v1 default) follow the device's
				// interface, whichever it is.
				continue
			}
			name, loop, held, bits := ns.AddrHome(addr)
			if held && !loop {
				g.NetDev = name
				continue
			}
			if nd == nil {
				idx := freeIndex(ns, 1000+d.Index, taken)
				taken[idx] = true
				out = append(out, NetDev{Name: NetDevName(d.Name, d.Index), Index: idx, MTU: 1500, MAC: MACOf(d.NodeGUID)})
				nd = &out[len(out)-1]
			}
			if bits < 0 || name == "" {
				bits = addr.BitLen()
			}
			nd.Addrs = append(nd.Addrs, netip.PrefixFrom(addr, bits))
			g.NetDev = nd.Name
		}
		if nd != nil {
			for j := range d.GIDs {
				g := &d.GIDs[j]
				if g.Valid && g.NetDev == "" {
					g.NetDev = nd.Name
				}
			}
		}
	}
	return out
}

// MACOf derives a MAC address from a node GUID built from one (EUI-64:
// the 0xfffe in the middle, the universal/local bit flipped), else a
// locally administered address from its low bytes.
func MACOf(guid uint64) net.HardwareAddr {
	b := [8]byte{byte(guid >> 56), byte(guid >> 48), byte(guid >> 40), byte(guid >> 32), byte(guid >> 24), byte(guid >> 16), byte(guid >> 8), byte(guid)}
	if b[3] == 0xff && b[4] == 0xfe {
		return net.HardwareAddr{b[0] ^ 2, b[1], b[2], b[5], b[6], b[7]}
	}
	return net.HardwareAddr{0x02, b[3], b[4], b[5], b[6], b[7]}
}

// NetDevsEnv is the value of NetDevsEnvVar for nds.
func NetDevsEnv(nds []NetDev) string {
	var parts []string
	for _, nd := range nds {
		f := []string{nd.Name, fmt.Sprint(nd.Index), fmt.Sprint(nd.MTU), nd.MAC.String()}
		for _, a := range nd.Addrs {
			f = append(f, a.String())
		}
		parts = append(parts, strings.Join(f, ","))
	}
	return strings.Join(parts, ";")
}
