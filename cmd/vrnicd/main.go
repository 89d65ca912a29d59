// Command vrnicd is the vrnic daemon: one emulated RDMA NIC (device) per
// VM or host, serving clients on a SOCK_SEQPACKET control socket.
//
// Files it creates, all removed on SIGINT/SIGTERM:
//
//	<runtime-dir>/<name>.sock   the control socket (mode 0660)
//	<runtime-dir>/<name>.lock   lock file holding the daemon's pid (flock)
//
// The runtime dir itself (and any parent) is removed at exit too when this
// daemon created it and it is empty by then; a directory that existed
// before, or that still holds another daemon's files, stays.
//
// The runtime dir is /run/vrnic as root, $XDG_RUNTIME_DIR/vrnic for other
// users, or $TMPDIR/vrnic-<uid> (mode 0700, owner checked) when
// XDG_RUNTIME_DIR is unset; -runtime-dir or -socket choose another place.
// Several daemons run side by side with distinct names. A second daemon
// with the same name is refused while the first lives (lock held, socket
// answering); a socket left by a crashed daemon (connect gives
// ECONNREFUSED) is replaced.
//
// Operator commands (vrnicctl) are served to root, the daemon's own uid
// and the members of -operator-group (config key "operator_group"; the
// group is resolved at start, an unknown one is an error); any other peer
// of the control socket gets EPERM for them and sees only what it created.
// Per uid, limits.per_uid bounds the contexts (default: a quarter of
// limits.per_device.contexts), the control connections (default: twice
// that plus 16) and the descriptors the daemon holds for it (fds: its
// connections, memfds and completion eventfds; default 16 per context, at
// least 1024); vrnicctl accounts shows what each uid holds.
//
// At start the daemon raises its soft limit of open files to the hard
// limit and logs it; if it runs out of descriptors even so (a flood of
// connections), the control server pauses and retries its accepts
// instead of exiting.
//
// The daemon wires the control plane (package device: the control socket,
// the resources, the QP state machine) to the data plane (package
// device/dataplane) through device.DataPlane.
//
// Data path: the RC transport engine (package device/engine) runs -workers
// workers over the link: -link mem is an in-memory link private to the
// daemon (QPs of its clients connected to its own GID talk to each other);
// -link udp carries RoCE v2 over UDP sockets bound to -local (port 4791),
// to the peers the QPs' destination GIDs name; -link tap (root) creates a
// multi-queue TAP interface (-tap-name, in -tap-netns) with one queue per
// worker and eBPF steering by destination QP, the NIC answering ARP/ND for
// its -tap-addr addresses (its GIDs) and resolving its peers' MACs. UD and
// UC QPs get the data path too. QP1 (a UD QP the daemon owns) carries the
// communication manager's MADs (package cm) for the clients' CM IDs (vrnicctl
// cm lists them). A control command never waits for an engine worker: CREATE_QP, MODIFY_QP and DESTROY_QP queue their change for the
// QP's worker, which applies it before anything that follows the reply.
//
// With -link tap the daemon also serves its link counters (per-queue
// steering and link counters, filter verdicts, ARP/ND) as one JSON
// document per connection on the stream socket <runtime-dir>/<name>.stats
// (vrnicctl link).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/cm"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/metrics"
	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "vrnicd:", err)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// run starts the daemon and serves until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		if strings.Contains(err.Error(), "flag") {
			return errUsage
		}
		return err
	}
	level, _ := parseLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	opGroup, err := cfg.operatorGroup()
	if err != nil {
		return err
	}
	raiseFdLimit(log)
	if cfg.Nice != 0 {
		if err := setNice(cfg.Nice); err != nil {
			return err
		}
		log.Info("scheduling priority set", "nice", cfg.Nice)
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}

	if cfg.Trace != "" {
		f, err := os.Create(cfg.Trace)
		if err != nil {
			return err
		}
		if err := trace.Start(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			trace.Stop()
			f.Close()
		}()
	}

	dir := cfg.RuntimeDir
	if dir == "" {
		dir = admin.RuntimeDir()
	}
	sock := cfg.Socket
	if sock == "" {
		sock = admin.SocketPath(dir, cfg.Name)
	}
	lockPath := strings.TrimSuffix(sock, admin.SocketSuffix) + ".lock"
	var created []string // directories this daemon made, removed at exit if empty
	defer func() {
		if removed := admin.RemoveCreatedDirs(created); len(removed) > 0 {
			log.Debug("runtime dir removed", "dirs", removed)
		}
	}()
	var unlock func()
	for attempt := 1; ; attempt++ {
		made, err := admin.CreateRuntimeDir(filepath.Dir(sock))
		created = append(created, made...)
		if err != nil {
			return err
		}
		if unlock, err = lockFile(lockPath); err == nil {
			break
		}
		// ENOENT: a daemon that made the directory removed it (empty)
		// between our check and our lock file; make it again.
		if !errors.Is(err, fs.ErrNotExist) || attempt == 3 {
			return err
		}
	}
	defer unlock()

	workers := cfg.Workers
	if workers == 0 {
		workers = runtime.NumCPU()
	}
	setProcs(workers, log)
	setGCPercent(log)
	li, err := linkInfo(cfg)
	if err != nil {
		return err
	}
	// The key table holds the device's MRs and no more (index 0 is never
	// used): a smaller table reuses indices sooner, which is safe, since
	// a reused index never takes a variant its last MR had.
	mrs := cfg.Limits.PerDevice.MR
	if mrs == 0 {
		mrs = device.DefaultLimits.PerDevice.MR
	}
	// Memory windows take key indices of the same table.
	if mws := cfg.Limits.PerDevice.MW; mws > 0 {
		mrs += mws
	} else {
		mrs += device.DefaultLimits.PerDevice.MW
	}
	space, err := dma.NewSpace(dma.Config{Logger: log, MaxRegionsPerOwner: maxInt(cfg.Limits.PerClient.HostMem, device.DefaultLimits.PerClient.HostMem),
		MaxMRs: min(mrs, 1<<24-1) + 1})
	if err != nil {
		return err
	}
	defer space.Close()
	// The control socket first: a name clash is reported before the link
	// is touched.
	l, err := admin.Listen(sock)
	if err != nil {
		return err
	}
	plane, err := newDataPlane(cfg, li, space, workers, log)
	if err != nil {
		l.Close()
		return err
	}
	defer func() {
		if err := plane.stop(); err != nil {
			log.Warn("data plane stop", "err", err)
		}
	}()
	// QP1, the device's GSI QP, carries the communication manager's MADs.
	qp1, err := plane.dp.StartQP1(netip.AddrFrom16(li.GIDs[0]))
	if err != nil {
		l.Close()
		return err
	}
	defer qp1.Close()
	rdAtomic := uint8(cfg.MaxRdAtomic)
	if rdAtomic == 0 {
		rdAtomic = abi.MaxRdAtomic
	}
	// The communication manager: one goroutine owns it; QP1 hands it the
	// CM MADs, the device routes it the CM commands.
	cmSvc, err := cm.NewService(cm.ServiceConfig{
		// The port and device the CM speaks for: it clamps what a peer
		// offers to them.
		CM: cm.Config{CAGUID: device.NodeGUID(cfg.Name), AckDelay: cm.RXEAckDelay,
			MaxRdAtomic: rdAtomic, MaxInitRdAtomic: rdAtomic, ECE: cfg.eceOptions()},
		GSI:    qp1,
		GIDs:   li.GIDs,
		MaxMTU: roce.MTU(li.MaxMTU),
		Logger: log.With("device", cfg.Name),
	})
	if err != nil {
		l.Close()
		return err
	}
	defer cmSvc.Close()
	qp1.RegisterAgent(cm.MgmtClassCM, cmSvc.HandleMAD)
	dev, err := device.New(device.Config{
		Name:       cfg.Name,
		NumWorkers: workers,
		Link:       li,
		Limits:     cfg.Limits,
		Space:      space,
		DataPlane:  plane.dp,
		Logger:     log,

		OperatorGroup: opGroup,
		Capture:       plane.capture(log),
		Faults:        plane.faults.Serve,
		CM:            cmSvc,
		MaxRdAtomic:   rdAtomic,
		NoECE:         cfg.eceOptions() == 0,
	})
	if err != nil {
		l.Close()
		return err
	}
	plane.faults.AttachPort(dev.SetPort) // port_flap
	plane.dp.Start()
	if plane.stats != nil {
		statsPath := strings.TrimSuffix(sock, admin.SocketSuffix) + admin.StatsSuffix
		stopStats, err := serveStats(statsPath, func() (any, error) { return plane.stats() }, log)
		if err != nil {
			dev.Close()
			l.Close()
			return err
		}
		defer stopStats()
	}
	if opGroup != nil {
		log.Info("operator group", "group", opGroup.Name, "gid", opGroup.GID)
	}
	if cfg.MetricsAddr != "" {
		ms, err := metrics.Listen(cfg.MetricsAddr, func() metrics.Snapshot {
			info, qps := dev.Snapshot()
			s := metrics.Snapshot{Info: info}
			for _, q := range qps {
				s.QPs = append(s.QPs, metrics.QPCount{Type: q.Type, State: q.State, N: q.N})
			}
			cm := cmSvc.Info()
			s.CM = &cm
			if lat, err := plane.dp.Engine().CompletionLatency(); err == nil {
				s.Latency = &lat
			}
			s.Faults = plane.faults.List()
			if plane.stats != nil {
				if st, err := plane.stats(); err == nil {
					s.Link = &st
				} else {
					log.Warn("metrics: link counters", "err", err)
				}
			}
			return s
		})
		if err != nil {
			dev.Close()
			l.Close()
			return fmt.Errorf("metrics: %w", err)
		}
		log.Info("metrics served", "addr", ms.Addr().String(), "path", "/metrics")
		defer func() {
			if err := ms.Close(); err != nil {
				log.Warn("metrics server close", "err", err)
			}
		}()
	}
	where := []any{"local", cfg.Link.Local, "peers", cfg.Link.Peers}
	switch cfg.Link.Type {
	case "tap":
		where = []any{"tap_addrs", cfg.Link.TAP.Addrs}
	case "mem":
		where = nil
	}
	log.Info("vrnicd started", append(append([]any{"device", cfg.Name, "socket", sock, "link", cfg.Link.Type}, where...),
		"workers", workers, "mtu", li.MaxMTU.Bytes(), "max_rd_atomic", dev.MaxRdAtomic(), "data_path", true, "pid", os.Getpid(),
		"abi", fmt.Sprintf("%d.%d", abi.VersionMajor, abi.VersionMinor))...)
	done := make(chan error, 1)
	go func() {
		if serveHook != nil {
			serveHook()
		}
		done <- dev.Serve(l)
	}()
	readyCtx, readyDone := context.WithCancel(ctx)
	readyExited := make(chan struct{})
	go func() {
		defer close(readyExited)
		notifyReady(readyCtx, sock, cfg.Name, log)
	}()
	defer func() {
		readyDone()
		<-readyExited
	}()
	select {
	case <-ctx.Done():
		log.Info("vrnicd stopping", "device", cfg.Name, "reason", context.Cause(ctx))
		if _, err := sdNotify("STOPPING=1"); err != nil {
			log.Warn("stop notification", "err", err)
		}
		dev.Close()
		<-done
	case err = <-done:
		dev.Close()
		if errors.Is(err, device.ErrClosed) {
			err = nil
		}
	}
	// Listener.Close removed the socket; make sure even if it was replaced.
	if fi, serr := os.Lstat(sock); serr == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(sock)
	}
	log.Info("vrnicd stopped", "device", cfg.Name)
	return err
}

// serveHook, when set (tests), runs before the control socket is served:
// a test holds it to see that readiness waits for the daemon to answer.
var serveHook func()

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// linkInfo derives the port description from the link configuration.
func linkInfo(cfg *Config) (device.LinkInfo, error) {
	code, _ := mtuCode(cfg.Link.MTU)
	li := device.LinkInfo{MaxMTU: abi.MTU(activeMTU(cfg, code)), SpeedMbps: 10000}
	switch cfg.Link.Type {
	case "udp":
		li.Type = abi.LinkUDP
		ap, err := netip.ParseAddrPort(cfg.Link.Local)
		if err != nil {
			return li, err
		}
		li.GIDs = [][16]byte{ap.Addr().As16()} // IPv4 becomes ::ffff:a.b.c.d
	case "mem":
		li.Type = abi.LinkMem
		li.GIDs = [][16]byte{netip.MustParseAddr("::ffff:127.0.0.1").As16()}
	case "tap":
		li.Type = abi.LinkTAP
		prefixes, err := cfg.Link.TAP.prefixes()
		if err != nil {
			return li, err
		}
		for _, p := range prefixes {
			li.GIDs = append(li.GIDs, p.Addr().As16()) // IPv4 becomes ::ffff:a.b.c.d
		}
	}
	// A locally administered MAC derived from the name.
	h := uint64(14695981039346656037)
	for i := 0; i < len(cfg.Name); i++ {
		h = (h ^ uint64(cfg.Name[i])) * 1099511628211
	}
	li.MAC = [6]byte{0x02, byte(h >> 32), byte(h >> 24), byte(h >> 16), byte(h >> 8), byte(h)}
	if cfg.Link.Type == "tap" && cfg.Link.TAP.MAC != "" {
		mac, err := cfg.Link.TAP.mac()
		if err != nil {
			return li, err
		}
		li.MAC = mac
	}
	return li, nil
}

// lockFile takes an exclusive flock on path and writes the pid into it.
// It fails if another live daemon holds it. The returned function removes
// the file and releases the lock.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("device already running (lock %s held by pid %s): %w", path, strings.TrimSpace(string(b)), admin.ErrSocketInUse)
	}
	f.Truncate(0)
	f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	return func() {
		os.Remove(path)
		f.Close()
	}, nil
}

// raiseFdLimit raises the soft limit of open files to the hard limit: every
// client connection, host memory region and completion eventfd is a
// descriptor of the daemon. (The Go runtime does the same at start;
// this makes it explicit and logs the limit the daemon runs with.) When
// the daemon runs out even so, the control server pauses and retries
// (device.Serve); it does not exit.
func raiseFdLimit(log *slog.Logger) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		log.Warn("open files limit", "err", err)
		return
	}
	if rl.Cur < rl.Max {
		raised := syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			log.Warn("raise open files limit", "soft", rl.Cur, "hard", rl.Max, "err", err)
			return
		}
		rl = raised
	}
	log.Info("open files limit", "soft", rl.Cur, "hard", rl.Max)
}

// setProcs sizes the Go scheduler to the data plane: GOMAXPROCS =
// min(workers, CPUs), unless the GOMAXPROCS environment variable says
// otherwise. The data plane's busy goroutines are its workers; more Ps
// than workers only spread the doorbell poller, the link waiters and the
// control server over more threads, and on a small machine shared with
// the clients (and a second daemon) every extra thread is a hand-off and
// a thread waiting for a core (BENCHMARKS.md has what this changed in the
// TAP and UDP figures).
func setProcs(workers int, log *slog.Logger) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	n := min(workers, runtime.NumCPU())
	if n < runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
		log.Info("scheduler sized to the workers", "gomaxprocs", n, "workers", workers)
	}
}

// gcPercent is the daemon's GOGC unless the environment sets one. The
// heap is mostly long-lived state (QPs, MRs, page tables: memory that
// grows with the connections, BENCHMARKS.md "Idle QPs"), and only the
// control path allocates (the data path allocates nothing: a daemon
// carrying traffic and no control requests runs no collection at all).
// The default of 100 lets the heap reach twice what is live before a
// collection, which for an idle host of 100,000 QPs is as much memory
// again; at 50 it is half as much, for twice the marking per byte the
// control path allocates (a collection marks the live heap L and comes
// after GOGC % of L was allocated: 100/GOGC bytes marked per byte
// allocated, whatever L). No memory limit is set: the right one depends
// on the host; GOMEMLIMIT sets one.
const gcPercent = 50

// setGCPercent applies gcPercent unless GOGC is set.
func setGCPercent(log *slog.Logger) {
	if os.Getenv("GOGC") != "" {
		return
	}
	debug.SetGCPercent(gcPercent)
	log.Debug("garbage collector target", "gogc", gcPercent)
}
