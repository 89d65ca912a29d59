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
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"github.com/vrnic/vrnic/internal/devview"
	"golang.org/x/sys/unix"
)

// stageEnv names the environment variable that makes vrnic-run the stage
// inside the namespaces; its value is the JSON of a viewSpec.
const stageEnv = "VRNIC_RUN_VIEW_STAGE"

// viewSpec is what the stage needs: the program and the devices.
type viewSpec struct {
	Prog    string           `json:"prog"`
	Args    []string         `json:"args"`
	Verbose bool             `json:"verbose"`
	Devices []devview.Device `json:"devices"`
	NetDevs []devview.NetDev `json:"netdevs"` // the synthetic interfaces (netdev.go)
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
func buildView(devs []devview.Device, nds []devview.NetDev) error {
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
	if err := devview.WriteSysfs(classDir, devs, unix.Major(nullRdev), unix.Minor(nullRdev)); err != nil {
		return err
	}
	netAdd, err := devview.WriteDeviceSysfs(classDir, tmp, devs, nds, bindable)
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
