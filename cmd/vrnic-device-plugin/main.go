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
//	    [-lib-dir DIR] [-shares N] [-sysfs-view auto|true|false] [-metrics-addr HOST:PORT]
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
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vrnic/vrnic/deviceplugin"
	"github.com/vrnic/vrnic/ibverbs"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// options are the command line's settings.
type options struct {
	cfg         deviceplugin.Config
	sysfs       string // auto, true or false
	logLevel    slog.Level
	metricsAddr string
}

// parseFlags parses the command line (without the program name).
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fl := flag.NewFlagSet("vrnic-device-plugin", flag.ContinueOnError)
	fl.SetOutput(stderr)
	o := &options{}
	c := &o.cfg
	fl.StringVar(&c.ResourceName, "resource", deviceplugin.DefaultResourceName, "extended resource name the devices are advertised as")
	fl.StringVar(&c.PluginDir, "plugin-dir", pb.DevicePluginPath, "the kubelet's device plugin directory (its kubelet.sock; the plugin's socket goes there)")
	fl.StringVar(&c.Endpoint, "endpoint", deviceplugin.DefaultEndpoint, "the plugin's socket file name in -plugin-dir")
	fl.StringVar(&c.RuntimeDir, "runtime-dir", deviceplugin.DefaultRuntimeDir, "directory of the daemons' control sockets (the node's path)")
	fl.StringVar(&c.StateDir, "state-dir", deviceplugin.DefaultStateDir, "the plugin's directory for the libraries and the containers' views (the node's path)")
	fl.StringVar(&c.LibDir, "lib-dir", "", "directory holding a built libibverbs.so.1, librdmacm.so.1 and libvrnic-netdev.so (default: build them into -state-dir)")
	fl.IntVar(&c.Shares, "shares", 1, "containers that may use one daemon at once: each daemon is advertised as this many devices")
	fl.StringVar(&o.sysfs, "sysfs-view", "auto", "mount /sys/class/infiniband{,_verbs} views into containers: true, false, or auto (when the node's sysfs has those classes)")
	fl.DurationVar(&c.PollInterval, "poll", 200*time.Millisecond, "how often to scan for new sockets, retry down daemons and check the kubelet's socket")
	fl.DurationVar(&c.HealthInterval, "health-interval", time.Second, "how often to ask a healthy daemon for INFO (its exit is seen at once)")
	fl.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics over HTTP on this host:port (path /metrics); default: none")
	level := fl.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fl.Parse(args); err != nil {
		return nil, err
	}
	if fl.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	if err := o.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	switch o.sysfs {
	case "auto", "true", "false":
	default:
		return nil, fmt.Errorf("-sysfs-view %q: want auto, true or false", o.sysfs)
	}
	if err := deviceplugin.CheckResourceName(c.ResourceName); err != nil {
		return nil, err
	}
	return o, nil
}

func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintf(stderr, "vrnic-device-plugin: %v\n", err)
		return 2
	}
	cfg := o.cfg
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.logLevel}))
	cfg.Log = log
	cfg.SysfsView = o.sysfs == "true" || o.sysfs == "auto" && deviceplugin.SysfsClassesPresent()
	if cfg.LibDir == "" {
		dir, err := ibverbs.Build(ibverbs.Options{CacheDir: filepath.Join(cfg.StateDir, "build"), Log: io.Discard})
		if err != nil {
			log.Error("building the drop-in libraries (or pass -lib-dir)", "err", err)
			return 1
		}
		cfg.LibDir = dir
	}
	p, err := deviceplugin.New(cfg)
	if err != nil {
		log.Error("starting", "err", err)
		return 1
	}
	log.Info("vrnic device plugin", "resource", cfg.ResourceName, "runtime_dir", cfg.RuntimeDir, "libraries", p.LibDir(),
		"shares", cfg.Shares, "sysfs_view", cfg.SysfsView)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.metricsAddr != "" {
		ms, err := serveMetrics(o.metricsAddr, p)
		if err != nil {
			log.Error("metrics", "err", err)
			return 1
		}
		defer ms.Close()
		log.Info("metrics", "addr", ms.Addr().String())
	}
	if err := p.Run(ctx); err != nil {
		log.Error("stopped", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// metricsServer serves /metrics: the plugin's collector and the process
// and Go runtime collectors.
type metricsServer struct {
	srv *http.Server
	ln  net.Listener
}

func serveMetrics(addr string, p *deviceplugin.Plugin) (*metricsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	s := &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln: ln}
	go s.srv.Serve(ln)
	return s, nil
}

func (s *metricsServer) Addr() net.Addr { return s.ln.Addr() }

func (s *metricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
