// Command vrnic-device-plugin is the Kubernetes device plugin of a node's
// vrnic devices (package deviceplugin): it advertises each vrnicd control
// socket in the runtime directory as a device of an extended resource
// (default vrnic.io/rdma), healthy while its daemon answers, and gives the
// containers that ask for the resource their devices' sockets, vrnic's
// drop-in libibverbs and librdmacm, the environment vrnic-run sets and the
// devices' /dev and sysfs view.
//
//	vrnic-device-plugin [-resource vrnic.io/rdma] [-runtime-dir /run/vrnic]
//	    [-plugin-dir /var/lib/kubelet/device-plugins] [-state-dir /var/lib/vrnic/device-plugin]
//	    [-lib-dir DIR] [-shares N] [-sysfs-view auto|true|false]
//
// Without -lib-dir it builds the libraries as vrnic-run does (package
// ibverbs: the system's C compiler, libibverbs and librdmacm headers and
// libraries) into the state directory. It runs until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vrnic/vrnic/deviceplugin"
	"github.com/vrnic/vrnic/ibverbs"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fl := flag.NewFlagSet("vrnic-device-plugin", flag.ContinueOnError)
	fl.SetOutput(stderr)
	resource := fl.String("resource", deviceplugin.DefaultResourceName, "extended resource name the devices are advertised as")
	pluginDir := fl.String("plugin-dir", pb.DevicePluginPath, "the kubelet's device plugin directory (its kubelet.sock; the plugin's socket goes there)")
	endpoint := fl.String("endpoint", deviceplugin.DefaultEndpoint, "the plugin's socket file name in -plugin-dir")
	runtimeDir := fl.String("runtime-dir", deviceplugin.DefaultRuntimeDir, "directory of the daemons' control sockets (the node's path)")
	stateDir := fl.String("state-dir", deviceplugin.DefaultStateDir, "the plugin's directory for the libraries and the containers' views (the node's path)")
	libDir := fl.String("lib-dir", "", "directory holding a built libibverbs.so.1, librdmacm.so.1 and libvrnic-netdev.so (default: build them into -state-dir)")
	shares := fl.Int("shares", 1, "containers that may use one daemon at once: each daemon is advertised as this many devices")
	sysfs := fl.String("sysfs-view", "auto", "mount /sys/class/infiniband{,_verbs} views into containers: true, false, or auto (when the node's sysfs has those classes)")
	poll := fl.Duration("poll", 200*time.Millisecond, "how often to scan for new sockets, retry down daemons and check the kubelet's socket")
	health := fl.Duration("health-interval", time.Second, "how often to ask a healthy daemon for INFO (its exit is seen at once)")
	level := fl.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fl.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "vrnic-device-plugin: unexpected arguments %q\n", fl.Args())
		return 2
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "vrnic-device-plugin: -log-level: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	var view bool
	switch *sysfs {
	case "auto":
		view = deviceplugin.SysfsClassesPresent()
	case "true":
		view = true
	case "false":
	default:
		fmt.Fprintf(stderr, "vrnic-device-plugin: -sysfs-view %q: want auto, true or false\n", *sysfs)
		return 2
	}
	if *libDir == "" {
		dir, err := ibverbs.Build(ibverbs.Options{CacheDir: filepath.Join(*stateDir, "build"), Log: io.Discard})
		if err != nil {
			log.Error("building the drop-in libraries (or pass -lib-dir)", "err", err)
			return 1
		}
		*libDir = dir
	}
	p, err := deviceplugin.New(deviceplugin.Config{
		ResourceName: *resource, PluginDir: *pluginDir, Endpoint: *endpoint,
		RuntimeDir: *runtimeDir, StateDir: *stateDir, LibDir: *libDir, Shares: *shares, SysfsView: view,
		PollInterval: *poll, HealthInterval: *health, Log: log,
	})
	if err != nil {
		log.Error("starting", "err", err)
		return 1
	}
	log.Info("vrnic device plugin", "resource", *resource, "runtime_dir", *runtimeDir, "libraries", p.LibDir(), "sysfs_view", view)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := p.Run(ctx); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}
