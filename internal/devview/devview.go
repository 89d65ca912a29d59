// Package devview describes vrnic's devices the way the kernel describes
// RDMA devices to programs: the sysfs classes infiniband and
// infiniband_verbs (with each device's parent and its network interface),
// the /dev/infiniband/uverbsN node numbering, and the synthetic network
// interfaces of devices whose addresses no real interface shows
// (kernel-notes/vrnic-run-view.md).
//
// It is one implementation with two users: vrnic-run, which writes the
// view into a tmpfs of its program's own mount namespace, and the
// Kubernetes device plugin (package deviceplugin), which writes it into a
// directory on the node that the container runtime mounts into a pod.
// Neither writes anything here but plain files, directories and symlinks
// under a directory the caller gives; the mounts are the caller's.
//
// What a view says depends on the network namespace the program runs in
// (which interface holds a device's address, which interface indices are
// free): the Namespace interface answers that. Local is this process's
// namespace (vrnic-run runs its program in its own); Foreign is one that
// holds none of the devices' addresses (a pod's, from the node's point of
// view).
package devview

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// SocketSuffix ends a daemon's control socket name (admin.SocketSuffix).
const socketSuffix = ".sock"

// Device is one daemon's device as libibverbs users see it in sysfs.
type Device struct {
	Name     string `json:"name"`
	Index    int    `json:"index"` // uverbsN
	NodeGUID uint64 `json:"node_guid"`
	SysGUID  uint64 `json:"sys_image_guid"`
	FWVer    string `json:"fw_ver"`
	GIDs     []GID  `json:"gids"` // the whole table, invalid entries zero
}

// GID is one GID table entry and the interface sysfs names for it.
type GID struct {
	GID    [16]byte `json:"gid"`
	Valid  bool     `json:"valid"`
	V2     bool     `json:"v2"`
	NetDev string   `json:"netdev,omitempty"`
}

// Sockets lists the devices the C library lists, in the order that
// numbers them (uverbsN): with want (VRNIC_DEVICE) only that one, else
// every NAME.sock in dir, by name. Whether each answers is checked later.
func Sockets(dir, want string) (names, paths []string) {
	if want != "" {
		if strings.Contains(want, "/") {
			return []string{strings.TrimSuffix(filepath.Base(want), socketSuffix)}, []string{want}
		}
		return []string{want}, []string{filepath.Join(dir, want+socketSuffix)}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	for _, e := range ents {
		n := e.Name()
		if len(n) > len(socketSuffix) && strings.HasSuffix(n, socketSuffix) {
			names = append(names, strings.TrimSuffix(n, socketSuffix))
		}
	}
	sort.Strings(names)
	for _, n := range names {
		paths = append(paths, filepath.Join(dir, n+socketSuffix))
	}
	return names, paths
}

// Query asks each daemon (names[i] at the control socket paths[i], in
// uverbs order) for its device, port and GID table, opening a context
// under the client name client. A socket that accepts no connection is
// left out, as the C library does; the others are numbered in order. The
// GIDs' interfaces are those of ns; SyntheticNetDevs then replaces the
// ones a program there cannot see.
func Query(names, paths []string, ns Namespace, client string) []Device {
	var out []Device
	for i, p := range paths {
		c, err := net.Dial("unixpacket", p)
		if err != nil {
			continue
		}
		c.Close()
		d := Device{Name: names[i], Index: len(out), FWVer: "1.0"}
		if ctx, err := verbs.Open(p, verbs.WithClientName(client)); err == nil {
			if a, err := ctx.QueryDevice(); err == nil {
				d.NodeGUID, d.SysGUID = a.NodeGUID, a.SysImageGUID
				if fw := strings.TrimRight(string(a.FWVer[:]), "\x00"); fw != "" {
					d.FWVer = fw
				}
			}
			n := uint32(abi.GIDTableLen)
			if pa, err := ctx.QueryPort(1); err == nil && pa.GIDTblLen > 0 {
				n = pa.GIDTblLen
			}
			for j := uint32(0); j < n; j++ {
				g, err := ctx.QueryGID(1, j)
				if err != nil {
					break
				}
				vg := GID{GID: g.GID, Valid: g.Valid != 0, V2: g.GIDType == 2}
				if vg.Valid {
					vg.NetDev, _, _, _ = ns.AddrHome(netip.AddrFrom16(g.GID).Unmap())
				}
				d.GIDs = append(d.GIDs, vg)
			}
			ctx.Close()
		}
		out = append(out, d)
	}
	return out
}
