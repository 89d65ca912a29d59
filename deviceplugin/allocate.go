package deviceplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/devview"
)

// What a container gets for devices D1..Dn (sorted by name; Di is
// uverbs(i-1) to it, as the C library numbers them):
//
//	mounts (read-only)
//	  /opt/vrnic/lib                  ← STATE/lib/HASH      the drop-in libraries
//	  /run/vrnic                      ← STATE/alloc/KEY/run  Di.sock -> node/Di.sock
//	  /run/vrnic/node                 ← RUNTIME_DIR          the node's daemons' sockets
//	  /sys/class/infiniband           ← STATE/alloc/KEY/sys/infiniband        (SysfsView)
//	  /sys/class/infiniband_verbs     ← STATE/alloc/KEY/sys/infiniband_verbs  (SysfsView)
//	devices
//	  /dev/infiniband/uverbs(i-1)     ← /dev/null, rw
//	environment
//	  LD_LIBRARY_PATH=/opt/vrnic/lib  VRNIC_RUNTIME_DIR=/run/vrnic
//	  LD_PRELOAD=/opt/vrnic/lib/libvrnic-netdev.so  VRNIC_NETDEVS=...
//
// The node's runtime directory is mounted whole, not socket by socket: a
// daemon that restarts makes a new socket file, which a mount of the old
// one would not show. Through it the container can reach the other
// daemons of the node too, as any local process can; the libraries list
// only the container's devices (the symlinks), and each daemon applies its
// per-uid limits and operator rules to the container's processes as to
// any client.
//
// KEY is a hash of the view's content, so identical allocations share one
// directory and a running container's view never changes under it. The
// kubelet never tells a plugin that a container is gone, so the views
// stay; there is one per distinct set of devices and attributes.

// allocateContainer builds the response for one container.
func (p *Plugin) allocateContainer(ids []string) (*pb.ContainerAllocateResponse, error) {
	if len(ids) == 0 {
		return nil, errors.New("no device requested")
	}
	if len(sortedUnique(ids)) != len(ids) {
		return nil, fmt.Errorf("device listed twice in %q", ids)
	}
	// Shares of one daemon are one device to the container.
	var names []string
	for _, id := range ids {
		n, ok := p.daemonOf(id)
		if !ok {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		names = append(names, n)
	}
	names = sortedUnique(names)
	var paths []string
	for _, n := range names {
		paths = append(paths, admin.SocketPath(p.cfg.RuntimeDir, n))
	}
	devs := devview.Query(names, paths, devview.Foreign, "vrnic-device-plugin")
	if len(devs) != len(names) {
		var missing []string
		for _, n := range names {
			if !slices.ContainsFunc(devs, func(d devview.Device) bool { return d.Name == n }) {
				missing = append(missing, n)
			}
		}
		return nil, fmt.Errorf("device %s: its daemon does not answer", strings.Join(missing, ", "))
	}
	nds := devview.SyntheticNetDevs(devs, devview.Foreign)
	view, err := p.writeView(devs, nds)
	if err != nil {
		return nil, fmt.Errorf("writing the devices' view: %w", err)
	}
	r := &pb.ContainerAllocateResponse{Envs: map[string]string{
		"LD_LIBRARY_PATH":   ContainerLibDir,
		"VRNIC_RUNTIME_DIR": ContainerRuntimeDir,
	}}
	if len(nds) > 0 {
		r.Envs["LD_PRELOAD"] = filepath.Join(ContainerLibDir, "libvrnic-netdev.so")
		r.Envs[devview.NetDevsEnvVar] = devview.NetDevsEnv(nds)
	}
	r.Mounts = []*pb.Mount{
		{ContainerPath: ContainerLibDir, HostPath: p.libDir, ReadOnly: true},
		{ContainerPath: ContainerRuntimeDir, HostPath: filepath.Join(view, "run"), ReadOnly: true},
		{ContainerPath: filepath.Join(ContainerRuntimeDir, nodeSubdir), HostPath: p.cfg.RuntimeDir, ReadOnly: true},
	}
	if p.cfg.SysfsView {
		for _, c := range []string{"infiniband", "infiniband_verbs"} {
			r.Mounts = append(r.Mounts, &pb.Mount{ContainerPath: "/sys/class/" + c, HostPath: filepath.Join(view, "sys", c), ReadOnly: true})
		}
	}
	for _, d := range devs {
		r.Devices = append(r.Devices, &pb.DeviceSpec{
			ContainerPath: fmt.Sprintf("/dev/infiniband/uverbs%d", d.Index),
			HostPath:      "/dev/null",
			Permissions:   "rw",
		})
	}
	return r, nil
}

// writeView returns the directory of the view of devs, writing it if no
// allocation wrote the same before.
func (p *Plugin) writeView(devs []devview.Device, nds []devview.NetDev) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/dev/null", &st); err != nil {
		return "", err
	}
	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	key, err := json.Marshal(struct {
		Devs         []devview.Device
		NetDevs      []devview.NetDev
		Major, Minor uint32
		Node         string
	}{devs, nds, major, minor, p.cfg.RuntimeDir})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(key)
	root := filepath.Join(p.cfg.StateDir, "alloc")
	dir := filepath.Join(root, hex.EncodeToString(sum[:])[:16])
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(root, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	run := filepath.Join(tmp, "run")
	if err := os.MkdirAll(filepath.Join(run, nodeSubdir), 0o755); err != nil {
		return "", err
	}
	for _, d := range devs {
		s := d.Name + admin.SocketSuffix
		if err := os.Symlink(nodeSubdir+"/"+s, filepath.Join(run, s)); err != nil {
			return "", err
		}
	}
	sys := filepath.Join(tmp, "sys")
	if err := devview.WriteSysfs(sys, devs, major, minor); err != nil {
		return "", err
	}
	if _, err := devview.WriteDeviceSysfs(sys, "", devs, nds, nil); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			return dir, nil
		}
		return "", err
	}
	return dir, nil
}
