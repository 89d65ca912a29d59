package main

// Network interfaces for the devices (kernel-notes/vrnic-run-view.md,
// "Network interfaces"): a device whose addresses no real, non-loopback
// interface holds (a daemon on 127.0.0.x) gets an interface of its own,
// named vrnic-DEVICE, which ibverbs' libvrnic-netdev.so (preloaded) adds
// to getifaddrs, if_nametoindex and the SIOCGIF* ioctls. The GIDs' ndevs
// in sysfs name the same interface.

import (
	"debug/elf"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/vrnic/vrnic/ibverbs"
)

// netDev is one synthetic interface.
type netDev struct {
	Name  string
	Index int
	MTU   int
	MAC   net.HardwareAddr
	Addrs []netip.Prefix
}

// addrHome finds the real interface holding addr: its name, whether it is
// a loopback interface, and the prefix length of its network; else the
// interface whose network contains addr (127.0.0.2 on lo, held = false).
func addrHome(addr netip.Addr) (name string, loopback, held bool, bits int) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", false, false, -1
	}
	bits = -1
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			pn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(pn.IP)
			if !ok {
				continue
			}
			ones, _ := pn.Mask.Size()
			if ip.Unmap() == addr {
				return ifc.Name, ifc.Flags&net.FlagLoopback != 0, true, ones
			}
			if pf, err := ip.Unmap().Prefix(ones); err == nil && pf.Contains(addr) && name == "" {
				name, loopback, bits = ifc.Name, ifc.Flags&net.FlagLoopback != 0, ones
			}
		}
	}
	return name, loopback, false, bits
}

// netDevName is the interface name for device dev: vrnic-DEV when it is a
// valid interface name (at most 15 bytes, no '/', ':' or space), else
// vrnicN (N the device's uverbs number).
func netDevName(dev string, index int) string {
	n := "vrnic-" + dev
	if len(n) <= 15 && !strings.ContainsAny(n, "/: \t\n%") {
		return n
	}
	return fmt.Sprintf("vrnic%d", index)
}

// freeIndex returns the first interface index from want up that no real
// interface and no index in taken uses.
func freeIndex(want int, taken map[int]bool) int {
	for ; ; want++ {
		if taken[want] {
			continue
		}
		if _, err := net.InterfaceByIndex(want); err != nil {
			return want
		}
	}
}

// syntheticNetDevs decides the interfaces for devs and sets the GIDs'
// NetDev: the real interface holding an address, unless that is a
// loopback interface or none; then the device's synthetic interface,
// holding every such address of the device.
func syntheticNetDevs(devs []viewDevice) []netDev {
	var out []netDev
	taken := map[int]bool{}
	for i := range devs {
		d := &devs[i]
		var nd *netDev
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
			name, loop, held, bits := addrHome(addr)
			if held && !loop {
				g.NetDev = name
				continue
			}
			if nd == nil {
				idx := freeIndex(1000+d.Index, taken)
				taken[idx] = true
				out = append(out, netDev{Name: netDevName(d.Name, d.Index), Index: idx, MTU: 1500, MAC: macOf(d.NodeGUID)})
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

// macOf derives a MAC address from a node GUID built from one (EUI-64:
// the 0xfffe in the middle, the universal/local bit flipped), else a
// locally administered address from its low bytes.
func macOf(guid uint64) net.HardwareAddr {
	b := [8]byte{byte(guid >> 56), byte(guid >> 48), byte(guid >> 40), byte(guid >> 32), byte(guid >> 24), byte(guid >> 16), byte(guid >> 8), byte(guid)}
	if b[3] == 0xff && b[4] == 0xfe {
		return net.HardwareAddr{b[0] ^ 2, b[1], b[2], b[5], b[6], b[7]}
	}
	return net.HardwareAddr{0x02, b[3], b[4], b[5], b[6], b[7]}
}

// netDevsEnv is VRNIC_NETDEVS for the shim.
func netDevsEnv(nds []netDev) string {
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

// withNetDevs adds the shim to LD_PRELOAD (after what is there: a
// sanitizer's runtime must come first) and describes nds to it. prog is
// the program: one linked with AddressSanitizer's runtime gets that
// runtime preloaded first, as ASan requires once anything is preloaded.
func withNetDevs(env []string, libDir, prog string, nds []netDev) []string {
	if len(nds) == 0 {
		return env
	}
	pre := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LD_PRELOAD="); ok {
			pre = v
		}
	}
	if asan := asanRuntime(prog); asan != "" && !strings.Contains(pre, "libasan") {
		if pre == "" {
			pre = asan
		} else {
			pre = asan + ":" + pre
		}
	}
	lib := filepath.Join(libDir, ibverbs.NetDevLibName)
	if pre != "" {
		lib = pre + ":" + lib
	}
	env = setEnv(env, "LD_PRELOAD", lib)
	return setEnv(env, "VRNIC_NETDEVS", netDevsEnv(nds))
}

// asanRuntime returns the AddressSanitizer runtime prog needs (its
// DT_NEEDED libasan.so.N), or "".
func asanRuntime(prog string) string {
	f, err := elf.Open(prog)
	if err != nil {
		return ""
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return ""
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libasan.so") {
			return l
		}
	}
	return ""
}
