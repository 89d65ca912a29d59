// Command vrnic-run runs an unmodified libibverbs or rdma_cm program on
// vrnic:
//
//	vrnic-run [-d DEVICE] [-runtime-dir DIR] PROGRAM ARGS...
//	vrnic-run -build-only
//
// It builds vrnic's libibverbs.so.1 and librdmacm.so.1 (package ibverbs)
// if its cache does not hold them yet, puts their directory first on
// LD_LIBRARY_PATH, names the
// daemons' runtime directory (VRNIC_RUNTIME_DIR) and, with -d, the one
// device to list (VRNIC_DEVICE: a daemon name or a control socket path),
// then executes PROGRAM in its own place, so that signals and the exit
// status are the program's. -build-only prints the library's directory.
//
// Unless -view=false, the program runs in a mount namespace of its own
// (and a user namespace mapping the caller's uid and gid to themselves
// when not root) where /dev/infiniband/uverbsN and the sysfs classes
// infiniband and infiniband_verbs describe the devices (view.go): vrnic-run
// then starts itself there as a child, waits for it and exits as it does,
// passing signals on. Without namespaces the program runs without the
// view. Devices on addresses no real interface shows (a daemon on
// 127.0.0.x: lo, which interface scans skip) get an interface each,
// vrnic-DEVICE, through a preloaded shim (netdev.go).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/ibverbs"
	"github.com/vrnic/vrnic/internal/devview"
)

func main() {
	if spec := os.Getenv(stageEnv); spec != "" {
		stage(spec)
	}
	fl := flag.NewFlagSet("vrnic-run", flag.ContinueOnError)
	device := fl.String("d", "", "only this device: a daemon name or a control socket path (default: every daemon in the runtime directory)")
	runtimeDir := fl.String("runtime-dir", "", "directory of the daemons' control sockets (default: the daemons' default)")
	buildOnly := fl.Bool("build-only", false, "build the library if needed, print its directory and exit")
	cacheDir := fl.String("cache-dir", "", "library cache directory (default $XDG_CACHE_HOME/vrnic or ~/.cache/vrnic)")
	sanitize := fl.String("sanitize", "", "build the library with -fsanitize=VALUE (e.g. address,undefined; a separate cache entry)")
	verbose := fl.Bool("v", false, "say what is built, and why the program runs without the system view")
	view := fl.Bool("view", true, "give the program /dev/infiniband and /sys/class/infiniband{,_verbs} entries for the devices (in its own mount namespace)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "usage: vrnic-run [flags] PROGRAM [ARGS...]\n       vrnic-run -build-only\n\n")
		fl.PrintDefaults()
	}
	if err := fl.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if !*buildOnly && fl.NArg() == 0 {
		fl.Usage()
		os.Exit(2)
	}
	o := ibverbs.Options{CacheDir: *cacheDir}
	if *sanitize != "" {
		o.ExtraCFlags = []string{"-fsanitize=" + *sanitize, "-fno-omit-frame-pointer", "-g"}
	}
	if *verbose {
		o.Log = os.Stderr
	} else {
		o.Log = io.Discard
	}
	dir, err := ibverbs.Build(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vrnic-run: %v\n", err)
		os.Exit(1)
	}
	if *buildOnly {
		fmt.Println(dir)
		return
	}
	prog, err := exec.LookPath(fl.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "vrnic-run: %v\n", err)
		os.Exit(127)
	}
	env := setEnv(os.Environ(), "LD_LIBRARY_PATH", prepend(dir, os.Getenv("LD_LIBRARY_PATH")))
	rd := *runtimeDir
	if rd == "" {
		rd = os.Getenv("VRNIC_RUNTIME_DIR")
	}
	if rd == "" {
		rd = admin.RuntimeDir()
	}
	env = setEnv(env, "VRNIC_RUNTIME_DIR", rd)
	if *device != "" {
		env = setEnv(env, "VRNIC_DEVICE", *device)
	}
	args := append([]string{fl.Arg(0)}, fl.Args()[1:]...)
	if *view {
		want := *device
		if want == "" {
			want = os.Getenv("VRNIC_DEVICE")
		}
		names, paths := devview.Sockets(rd, want)
		devs := devview.Query(names, paths, devview.Local, "vrnic-run")
		nds := devview.SyntheticNetDevs(devs, devview.Local)
		env = withNetDevs(env, dir, prog, nds)
		spec := viewSpec{Prog: prog, Args: args, Verbose: *verbose, Devices: devs, NetDevs: nds}
		err := runInView(spec, env)
		if *verbose {
			fmt.Fprintf(os.Stderr, "vrnic-run: running without the system view of the devices: %v\n", err)
		}
	}
	err = syscall.Exec(prog, args, env)
	fmt.Fprintf(os.Stderr, "vrnic-run: exec %s: %v\n", prog, err)
	os.Exit(126)
}

func prepend(dir, path string) string {
	if path == "" {
		return dir
	}
	return dir + ":" + path
}

func setEnv(env []string, k, v string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, k+"=") {
			out = append(out, e)
		}
	}
	return append(out, k+"="+v)
}
