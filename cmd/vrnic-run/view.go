package main

// The system's view of the vrnic devices (kernel-notes/vrnic-run-view.md):
// vrnic-run starts itself again in a new mount namespace (and, when not
// root, a new user namespace mapping its uid and gid to themselves); that
// stage mounts /dev and /sys/class copies holding /dev/infiniband/uverbsN
// and the infiniband and infiniband_verbs classes, then executes the
// program.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// stageEnv names the environment variable that makes vrnic-run the stage
// inside the namespaces; its value is the JSON of a viewSpec.
const stageEnv = "VRNIC_RUN_VIEW_STAGE"

// viewSpec is what the stage needs: the program and the devices.
type viewSpec struct {
	Prog    string       `json:"prog"`
	Args    []string     `json:"args"`
	Verbose bool         `json:"verbose"`
	Devices []viewDevice `json:"devices"`
	NetDevs []netDev     `json:"netdevs"` // the synthetic interfaces (netdev.go)
}

// viewDevice is one daemon's device as libibverbs users see it in sysfs.
type viewDevice struct {
	Name     string    `json:"name"`
	Index    int       `json:"index"` // uverbsN
	NodeGUID uint64    `json:"node_guid"`
	SysGUID  uint64    `json:"sys_image_guid"`
	FWVer    string    `json:"fw_ver"`
	GIDs     []viewGID `json:"gids"` // the whole table, invalid entries zero
}

type viewGID struct {
	GID    [16]byte `json:"gid"`
	Valid  bool     `json:"valid"`
	V2     bool     `json:"v2"`
	NetDev string   `json:"netdev,omitempty"`
}

// daemonSockets lists the devices the C library lists, in the order that
// numbers them (uverbsN): with want (VRNIC_DEVICE) only that one, else
// every NAME.sock in dir, by name. Whether each answers is checked later.
func daemonSockets(dir, want string) (names, paths []string) {
	if want != "" {
		if strings.Contains(want, "/") {
			return []string{strings.TrimSuffix(filepath.Base(want), ".sock")}, []string{want}
		}
		return []string{want}, []string{filepath.Join(dir, want+".sock")}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil
	}
	for _, e := range ents {
		n := e.Name()
		if len(n) > len(".sock") && strings.HasSuffix(n, ".sock") {
			names = append(names, strings.TrimSuffix(n, ".sock"))
		}
	}
	sort.Strings(names)
	for _, n := range names {
		paths = append(paths, filepath.Join(dir, n+".sock"))
	}
	return names, paths
}

// queryDevices asks each daemon for its device, port and GID table. A
// socket that accepts no connection is left out, as the C library does.
func queryDevices(dir, want string) []viewDevice {
	names, paths := daemonSockets(dir, want)
	var out []viewDevice
	for i, p := range paths {
		c, err := net.Dial("unixpacket", p)
		if err != nil {
			continue
		}
		c.Close()
		d := viewDevice{Name: names[i], Index: len(out), FWVer: "1.0"}
		if ctx, err := verbs.Open(p, verbs.WithClientName("vrnic-run")); err == nil {
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
				vg := viewGID{GID: g.GID, Valid: g.Valid != 0, V2: g.GIDType == 2}
				if vg.Valid {
					vg.NetDev = netDevOf(netip.AddrFrom16(g.GID).Unmap())
				}
				d.GIDs = append(d.GIDs, vg)
			}
			ctx.Close()
		}
		out = append(out, d)
	}
	return out
}

// netDevOf returns the network interface holding addr, else the one whose
// network contains it (127.0.0.2 on lo), else "".
func netDevOf(addr netip.Addr) string {
	name, _, _, _ := addrHome(addr)
	return name
}

// runInView starts the stage in new namespaces and waits for it, passing
// signals on and exiting as it does. It returns an error only when the
// namespaces cannot be created (the caller then runs the program without
// the view).
func runInView(spec viewSpec, env []string) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// Pdeathsig is tied to the thread that starts the child: keep it.
	runtime.LockOSThread()
	cmd := exec.Command(self)
	cmd.Args = []string{"vrnic-run"}
	cmd.Env = append(env, stageEnv+"="+string(b))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = inheritedFiles()
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if uid, gid := os.Getuid(), os.Getgid(); uid != 0 {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		attr.GidMappingsEnableSetgroups = false
		// Not root in the namespace: exec would drop the capabilities
		// the stage needs to mount, unless ambient. The stage clears
		// them before it executes the program.
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	cmd.SysProcAttr = attr
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGALRM, syscall.SIGCONT)
	if err := cmd.Start(); err != nil {
		signal.Stop(sigs)
		return err
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	cmd.Wait()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		sig := ws.Signal()
		// The default action, set past the Go runtime (which would
		// otherwise catch and drop e.g. SIGUSR1), then the signal.
		signal.Reset(sig)
		var dfl [4]uint64 // struct sigaction: SIG_DFL, no flags, no mask
		syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
		syscall.Kill(os.Getpid(), sig)
		// Delivered to some thread soon; exit as a shell would if not.
		time.Sleep(time.Second)
		os.Exit(128 + int(sig))
	}
	os.Exit(ws.ExitStatus())
	return nil
}

// inheritedFiles returns the descriptors above 2 that vrnic-run inherited
// without close-on-exec, at their numbers (nil entries are closed), so
// that the program gets them as it would without the view.
func inheritedFiles() []*os.File {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || fl&unix.FD_CLOEXEC != 0 {
			continue
		}
		for len(files) < fd-2 {
			files = append(files, nil)
		}
		files[fd-3] = os.NewFile(uintptr(fd), e.Name())
	}
	return files
}

// stage runs inside the namespaces: it builds the view and executes the
// program. A view that cannot be built is reported (with -v) and the
// program runs without it.
func stage(specJSON string) {
	// The mounts and the final exec happen on this thread, whose ambient
	// capabilities are cleared before the exec.
	runtime.LockOSThread()
	var spec viewSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "vrnic-run: bad %s: %v\n", stageEnv, err)
		os.Exit(126)
	}
	if err := buildView(spec.Devices, spec.NetDevs); err != nil && spec.Verbose {
		fmt.Fprintf(os.Stderr, "vrnic-run: running without the system view of the devices: %v\n", err)
	}
	env := setEnv(os.Environ(), stageEnv, "")
	env = env[:len(env)-1] // setEnv appends it last
	if os.Getuid() != 0 {
		// Drop every capability (in the user namespace) of this thread,
		// ambient ones with the inheritable set: the program runs with
		// none, as it would without the view.
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			fmt.Fprintf(os.Stderr, "vrnic-run: drop capabilities: %v\n", err)
			os.Exit(126)
		}
	}
	err := syscall.Exec(spec.Prog, spec.Args, env)
	fmt.Fprintf(os.Stderr, "vrnic-run: exec %s: %v\n", spec.Prog, err)
	os.Exit(126)
}

// buildView makes /dev and /sys/class of this mount namespace copies of
// the real ones plus the vrnic devices. Everything is built in a staging
// tmpfs first and bound into place at the end, so a failure leaves both
// as they were.
func buildView(devs []viewDevice, nds []netDev) error {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	tmp, err := os.MkdirTemp("", "vrnic-run-view-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := unix.Mount("vrnic-view", tmp, "tmpfs", unix.MS_NOSUID, "mode=755"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	defer unix.Unmount(tmp, unix.MNT_DETACH)
	devDir, classDir := filepath.Join(tmp, "dev"), filepath.Join(tmp, "class")
	if err := copyDir("/dev", devDir, nil); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(devDir, "infiniband"), 0o755); err != nil {
		return err
	}
	var nullRdev uint64
	var st unix.Stat_t
	if err := unix.Stat("/dev/null", &st); err != nil {
		return err
	}
	nullRdev = st.Rdev
	for _, d := range devs {
		p := filepath.Join(devDir, "infiniband", fmt.Sprintf("uverbs%d", d.Index))
		if err := bindFile("/dev/null", p); err != nil {
			return err
		}
	}
	_, serr := os.Stat("/sys/class/net")
	hasNet := serr == nil
	if err := copyDir("/sys/class", classDir, map[string]bool{"infiniband": true, "infiniband_verbs": true, "net": hasNet}); err != nil {
		return err
	}
	if err := writeSysfs(classDir, devs, unix.Major(nullRdev), unix.Minor(nullRdev)); err != nil {
		return err
	}
	netAdd, err := writeDeviceSysfs(classDir, tmp, devs, nds)
	if err != nil {
		return err
	}
	if hasNet {
		if err := mountNetClass(classDir, netAdd); err != nil {
			return fmt.Errorf("/sys/class/net: %w", err)
		}
	}
	if err := unix.Mount(classDir, "/sys/class", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount /sys/class: %w", err)
	}
	if err := unix.Mount(devDir, "/dev", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		unix.Unmount("/sys/class", unix.MNT_DETACH)
		return fmt.Errorf("mount /dev: %w", err)
	}
	// Read-only as sysfs is to users; the bound real classes keep their own flags.
	unix.Mount("", "/sys/class", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
	return nil
}

// copyDir creates dst holding src's entries: symlinks copied, everything
// else (directories, device nodes, files) bind-mounted from src, with its
// mounts below. Entries named in skip are left out.
func copyDir(src, dst string, skip map[string]bool) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if skip[e.Name()] {
			continue
		}
		s, d := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			t, err := os.Readlink(s)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, d); err != nil {
				return err
			}
		case e.IsDir():
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			if err := unix.Mount(s, d, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return fmt.Errorf("bind %s: %w", s, err)
			}
		default:
			if err := bindFile(s, d); err != nil {
				return err
			}
		}
	}
	return nil
}

// bindFile creates the file dst and bind-mounts src (a file or device
// node) onto it.
func bindFile(src, dst string) error {
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return nil
}

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

// writeSysfs writes the infiniband and infiniband_verbs classes under
// class; the char devices are major:minor (the node bound at
// /dev/infiniband/uverbsN).
func writeSysfs(class string, devs []viewDevice, major, minor uint32) error {
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
