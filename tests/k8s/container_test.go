package k8s

// A container runtime reduced to what the test needs: it starts a process
// the way a runtime starts a pod's container with a device plugin's
// ContainerAllocateResponse, and with nothing else of the host.
//
// The test binary starts itself with CLONE_NEWNS (a fresh mount
// namespace); TestMain sees containerEnv and runs runContainerStage
// instead of the tests. The stage makes every mount private, mounts a
// tmpfs as the new root and builds in it:
//
//   - the image: the host's /usr, read-only, and Debian's merged-/usr
//     links /bin, /lib, /lib64 and /sbin (→ usr/...). Nothing else of the
//     host: no /etc, no /home, no /run, no /var.
//   - what a runtime adds to any container: /proc (a proc mount), /dev (a
//     tmpfs with null, zero, full, random, urandom and tty bound from the
//     host's, as runc creates them, and a tmpfs /dev/shm), /tmp (tmpfs),
//     and /sys: a read-only tmpfs here, not sysfs (a real runtime mounts
//     sysfs, which has class/infiniband{,_verbs} only where the RDMA core
//     is loaded: Config.SysfsView).
//   - the allocation: every Mount of the response bound at its
//     container path (read-only if asked), in the order of their depth as
//     containerd sorts them, and every DeviceSpec's host node bound at its
//     container path.
//
// It then pivots into the root, detaches the old one, takes the uid, gid
// and supplementary groups it was given and executes the program with
// exactly the environment given (the response's Envs plus the image's
// PATH).

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const containerEnv = "VK8S_CONTAINER_SPEC"

type bindSpec struct {
	Container, Host string
	ReadOnly        bool
}

type containerSpec struct {
	Root   string     // an empty directory: the root's mount point
	Binds  []bindSpec // the response's mounts and devices
	Env    []string
	Args   []string
	UID    int
	GID    int
	Groups []int
}

// containerCmd returns the command that runs spec in a fresh mount
// namespace.
func containerCmd(spec containerSpec) (*exec.Cmd, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = []string{containerEnv + "=" + string(b)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

func runContainerStage(specJSON string) {
	var spec containerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fail("spec: %v", err)
	}
	if err := buildRoot(spec); err != nil {
		fail("%v", err)
	}
	if err := syscall.Setgroups(spec.Groups); err != nil {
		fail("setgroups: %v", err)
	}
	if err := syscall.Setgid(spec.GID); err != nil {
		fail("setgid: %v", err)
	}
	if err := syscall.Setuid(spec.UID); err != nil {
		fail("setuid: %v", err)
	}
	path := "/usr/bin:/bin"
	for _, e := range spec.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	prog := spec.Args[0]
	if !strings.Contains(prog, "/") {
		for _, d := range filepath.SplitList(path) {
			if fi, err := os.Stat(filepath.Join(d, prog)); err == nil && fi.Mode().IsRegular() {
				prog = filepath.Join(d, prog)
				break
			}
		}
	}
	err := syscall.Exec(prog, spec.Args, spec.Env)
	fail("exec %s: %v", prog, err)
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "container: "+format+"\n", a...)
	os.Exit(125)
}

func buildRoot(spec containerSpec) error {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := spec.Root
	if err := unix.Mount("rootfs", root, "tmpfs", 0, "mode=755"); err != nil {
		return fmt.Errorf("root tmpfs: %w", err)
	}
	in := func(p string) string { return filepath.Join(root, p) }
	// The image.
	if err := bind("/usr", in("/usr"), true); err != nil {
		return err
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if err := os.Symlink("usr/"+l, in(l)); err != nil {
			return err
		}
	}
	// What a runtime gives every container.
	for _, d := range []string{"proc", "dev", "tmp", "sys", "run"} {
		if err := os.Mkdir(in(d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("proc", in("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	if err := unix.Mount("tmpfs", in("/dev"), "tmpfs", unix.MS_NOSUID, "mode=755"); err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bind("/dev/"+n, in("/dev/"+n), false); err != nil {
			return err
		}
	}
	if err := os.Mkdir(in("/dev/shm"), 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("shm", in("/dev/shm"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("dev/shm: %w", err)
	}
	if err := unix.Mount("tmpfs", in("/tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("tmp: %w", err)
	}
	if err := unix.Mount("sysfs-stand-in", in("/sys"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755"); err != nil {
		return fmt.Errorf("sys: %w", err)
	}
	// The allocation, shallowest first.
	binds := spec.Binds
	sort.SliceStable(binds, func(i, j int) bool {
		return strings.Count(filepath.Clean(binds[i].Container), "/") < strings.Count(filepath.Clean(binds[j].Container), "/")
	})
	for _, b := range binds {
		if err := bind(b.Host, in(b.Container), b.ReadOnly); err != nil {
			return err
		}
	}
	if err := unix.Mount("", in("/sys"), "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("sys read-only: %w", err)
	}
	// Into the root; the old one detached.
	old := in("/.old-root")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old-root", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the old root: %w", err)
	}
	return os.Remove("/.old-root")
}

// bind creates the mount point dst (a directory or a file, as src is)
// and binds src there, read-only if ro.
func bind(src, dst string, ro bool) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	if ro {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("%s read-only: %w", dst, err)
		}
	}
	return nil
}
