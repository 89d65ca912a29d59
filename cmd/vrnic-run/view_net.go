package main

// The device's parent and its network interfaces in the sysfs view
// (kernel-notes/vrnic-run-view.md, "The device and its interface"):
//
//	/sys/class/infiniband/DEV/device/            the parent device (a virtual one)
//	    net/NDEV/                                 the interface: address, mtu, ifindex, ...
//	    infiniband/DEV -> ../..                   back to the RDMA device
//	    infiniband_verbs/uverbsN -> .../uverbsN
//	/sys/class/infiniband_verbs/uverbsN/device -> ../../infiniband/DEV/device
//	/sys/class/net/NDEV -> ../infiniband/DEV/device/net/NDEV
//
// as the kernel has it for a Soft-RoCE device: the RDMA device's parent is
// its net device's parent, so device/net/ names the net device. A GID held
// by a real interface names that interface there (a link to its sysfs
// directory) and /sys/class/net is left as it is for it.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// netDevFiles are the attribute files of a synthetic interface's sysfs
// directory, as the kernel writes them for an up Ethernet interface
// (net/core/net-sysfs.c).
func netDevFiles(nd netDev) map[string]string {
	flags := 0x1003 // IFF_UP|IFF_BROADCAST|IFF_MULTICAST (dev->flags: RUNNING is operstate's)
	return map[string]string{
		"address":          nd.MAC.String(),
		"addr_assign_type": "0",
		"addr_len":         "6",
		"broadcast":        "ff:ff:ff:ff:ff:ff",
		"carrier":          "1",
		"carrier_changes":  "0",
		"dev_id":           "0x0",
		"dev_port":         "0",
		"dormant":          "0",
		"flags":            fmt.Sprintf("%#x", flags),
		"ifalias":          "",
		"ifindex":          fmt.Sprint(nd.Index),
		"iflink":           fmt.Sprint(nd.Index),
		"link_mode":        "0",
		"mtu":              fmt.Sprint(nd.MTU),
		"netdev_group":     "0",
		"operstate":        "up",
		"proto_down":       "0",
		"tx_queue_len":     "1000",
		"type":             "1", // ARPHRD_ETHER
		"uevent":           fmt.Sprintf("INTERFACE=%s\nIFINDEX=%d", nd.Name, nd.Index),
	}
}

// deviceNetDevs returns the interfaces the GIDs of d name, in GID order,
// each once.
func deviceNetDevs(d viewDevice) []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range d.GIDs {
		if g.Valid && g.NetDev != "" && !seen[g.NetDev] {
			seen[g.NetDev] = true
			out = append(out, g.NetDev)
		}
	}
	return out
}

// writeDeviceSysfs writes each device's parent directory under class
// (the staging /sys/class) and returns the directory holding the links
// to add to /sys/class/net (under stage), or "" if there are none.
func writeDeviceSysfs(class, stage string, devs []viewDevice, nds []netDev) (string, error) {
	synth := map[string]netDev{}
	for _, nd := range nds {
		synth[nd.Name] = nd
	}
	netAdd := ""
	for _, d := range devs {
		dev := filepath.Join(class, "infiniband", d.Name, "device")
		if err := os.MkdirAll(filepath.Join(dev, "infiniband"), 0o755); err != nil {
			return "", err
		}
		if err := os.MkdirAll(filepath.Join(dev, "infiniband_verbs"), 0o755); err != nil {
			return "", err
		}
		uv := fmt.Sprintf("uverbs%d", d.Index)
		links := map[string]string{
			filepath.Join(dev, "infiniband", d.Name):               "../..",
			filepath.Join(dev, "infiniband_verbs", uv):             "../../../../infiniband_verbs/" + uv,
			filepath.Join(class, "infiniband_verbs", uv, "device"): "../../infiniband/" + d.Name + "/device",
		}
		if err := os.WriteFile(filepath.Join(dev, "uevent"), nil, 0o444); err != nil {
			return "", err
		}
		ndevs := deviceNetDevs(d)
		if len(ndevs) > 0 {
			if err := os.MkdirAll(filepath.Join(dev, "net"), 0o755); err != nil {
				return "", err
			}
		}
		for _, name := range ndevs {
			nd, ok := synth[name]
			if !ok {
				// A real interface: its own sysfs directory.
				if real, err := filepath.EvalSymlinks(filepath.Join("/sys/class/net", name)); err == nil {
					links[filepath.Join(dev, "net", name)] = real
				}
				continue
			}
			dir := filepath.Join(dev, "net", name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", err
			}
			for f, v := range netDevFiles(nd) {
				if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o444); err != nil {
					return "", err
				}
			}
			links[filepath.Join(dir, "device")] = "../.."
			links[filepath.Join(dir, "subsystem")] = "../../../../../net"
			if !bindable(nd) {
				// The device's address is not this namespace's (a TAP
				// daemon of another netns): its net device lives
				// elsewhere, as a kernel RDMA device's does, so the
				// namespace's net class does not list it (programs that
				// scan it, UCX's tcp transport, would bind the address).
				continue
			}
			if netAdd == "" {
				netAdd = filepath.Join(stage, "net-add")
				if err := os.Mkdir(netAdd, 0o755); err != nil {
					return "", err
				}
			}
			links[filepath.Join(netAdd, name)] = "../infiniband/" + d.Name + "/device/net/" + name
		}
		for p, target := range links {
			if err := os.Symlink(target, p); err != nil {
				return "", err
			}
		}
	}
	return netAdd, nil
}

// mountNetClass makes class/net the real /sys/class/net with the entries
// of netAdd added: an overlay whose lower layers are netAdd and the real
// class (it stays live: interfaces created later appear, removed ones
// go). Without overlayfs the real class is bound alone, as before.
func mountNetClass(class, netAdd string) error {
	dst := filepath.Join(class, "net")
	if netAdd != "" {
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		opts := "lowerdir=" + escapeOverlay(netAdd) + ":" + escapeOverlay("/sys/class/net")
		if err := unix.Mount("overlay", dst, "overlay", unix.MS_RDONLY, opts); err == nil {
			return nil
		}
		if err := os.Remove(dst); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	return unix.Mount("/sys/class/net", dst, "", unix.MS_BIND|unix.MS_REC, "")
}

// escapeOverlay escapes the characters overlayfs's option parser splits
// on.
func escapeOverlay(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `:`, `\:`, `,`, `\,`)
	return r.Replace(p)
}

// bindable reports whether every address of nd can be bound here (a
// UDP socket on it, port 0): the address belongs to this network
// namespace.
func bindable(nd netDev) bool {
	for _, p := range nd.Addrs {
		c, err := net.ListenPacket("udp", net.JoinHostPort(p.Addr().String(), "0"))
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}
