package devview

// The sysfs classes (kernel-notes/vrnic-run-view.md, "Values" and "The
// device and its interface"):
//
//	infiniband/DEV/...                        node_guid, ports/1/gids/N, ...
//	infiniband/DEV/device/                    the parent device (a virtual one)
//	    net/NDEV/                             the interface: address, mtu, ifindex, ...
//	    infiniband/DEV -> ../..               back to the RDMA device
//	    infiniband_verbs/uverbsN -> .../uverbsN
//	infiniband_verbs/abi_version
//	infiniband_verbs/uverbsN/{ibdev,abi_version,dev}
//	infiniband_verbs/uverbsN/device -> ../../infiniband/DEV/device
//	net/NDEV -> ../infiniband/DEV/device/net/NDEV   (vrnic-run only)
//
// as the kernel has it for a Soft-RoCE device: the RDMA device's parent is
// its net device's parent, so device/net/ names the net device. A GID held
// by a real interface names that interface there (a link to its sysfs
// directory). Every link between the view's own entries is relative, so
// the two classes work wherever they are mounted side by side.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// kernelGID formats a GID as the kernel's sysfs does: 8 groups of 4 hex
// digits.
func kernelGID(g [16]byte) string {
	var b strings.Builder
	for i := 0; i < 16; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02x%02x", g[i], g[i+1])
	}
	return b.String()
}

func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

// WriteSysfs writes the infiniband and infiniband_verbs classes under
// class; the char devices are major:minor (the node bound at
// /dev/infiniband/uverbsN).
func WriteSysfs(class string, devs []Device, major, minor uint32) error {
	files := map[string]string{"infiniband_verbs/abi_version": "6"}
	dirs := []string{"infiniband", "infiniband_verbs"}
	for _, d := range devs {
		ib := "infiniband/" + d.Name + "/"
		uv := fmt.Sprintf("infiniband_verbs/uverbs%d/", d.Index)
		dirs = append(dirs, ib+"ports/1/gids", ib+"ports/1/gid_attrs/types", ib+"ports/1/gid_attrs/ndevs",
			ib+"ports/1/pkeys", uv)
		for k, v := range map[string]string{
			"node_guid": guidString(d.NodeGUID), "sys_image_guid": guidString(d.SysGUID),
			"node_type": "1: CA", "fw_ver": d.FWVer, "node_desc": "vrnic " + d.Name,
			"board_id": "VRNIC0001", "hca_type": "vrnic", "hw_rev": "0",
			"ports/1/state": "4: ACTIVE", "ports/1/phys_state": "5: LinkUp",
			"ports/1/link_layer": "Ethernet", "ports/1/lid": "0x0", "ports/1/sm_lid": "0x0",
			"ports/1/lid_mask_count": "0", "ports/1/pkeys/0": "0xffff",
		} {
			files[ib+k] = v
		}
		for i, g := range d.GIDs {
			n := strconv.Itoa(i)
			files[ib+"ports/1/gids/"+n] = kernelGID(g.GID)
			if !g.Valid {
				continue
			}
			if g.V2 {
				files[ib+"ports/1/gid_attrs/types/"+n] = "RoCE v2"
			} else {
				files[ib+"ports/1/gid_attrs/types/"+n] = "IB/RoCE v1"
			}
			if g.NetDev != "" {
				files[ib+"ports/1/gid_attrs/ndevs/"+n] = g.NetDev
			}
		}
		files[uv+"ibdev"] = d.Name
		files[uv+"abi_version"] = "1"
		files[uv+"dev"] = fmt.Sprintf("%d:%d", major, minor)
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(filepath.Join(class, dir), 0o755); err != nil {
			return err
		}
	}
	for p, v := range files {
		if err := os.WriteFile(filepath.Join(class, p), []byte(v+"\n"), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// netDevFiles are the attribute files of a synthetic interface's sysfs
// directory, as the kernel writes them for an up Ethernet interface
// (net/core/net-sysfs.c).
func netDevFiles(nd NetDev) map[string]string {
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
func deviceNetDevs(d Device) []string {
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

// WriteDeviceSysfs writes each device's parent directory under class
// (after WriteSysfs). For each synthetic interface for which
// addToNetClass returns true (nil: none), it adds a link to a directory
// net-add under stage and returns that directory, to be laid over
// /sys/class/net by the caller; "" if there are none.
func WriteDeviceSysfs(class, stage string, devs []Device, nds []NetDev, addToNetClass func(NetDev) bool) (string, error) {
	synth := map[string]NetDev{}
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
			if addToNetClass == nil || !addToNetClass(nd) {
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
