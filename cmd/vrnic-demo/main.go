// Command vrnic-demo is vrnic's main job for a new user, with no
// privileges: it starts two vrnicd daemons on 127.0.0.1 and 127.0.0.2
// (UDP link) and two client processes, connects an RC QP pair between the
// clients, runs SEND, RDMA WRITE, RDMA READ and atomic traffic for a few
// seconds with every byte and every atomic result verified, shows
// progress, and prints a summary (operations, bytes, bandwidth, latency
// percentiles, retransmissions from the QP counters).
//
//	go run ./cmd/vrnic-demo [-duration 5s] [-size 16384] [-link udp|mem]
//
// With -link mem one daemon with its in-memory link serves both clients
// (the QPs are connected through that daemon's loopback). With the
// default addresses taken (UDP port 4791 in use), the demo picks free
// 127.0.0.0/8 addresses instead.
//
// Processes: the daemons are vrnicd (the -vrnicd binary, a vrnicd beside
// this executable, or one built with the go tool into the demo's
// directory); the clients are this executable again, in the client role
// (environment VRNIC_DEMO_ROLE=client). The clients exchange their QP
// numbers, GIDs, PSNs and rkeys through the demo over a unix socket (see
// proto.go). Everything lives in a private temporary directory (sockets,
// logs, the built daemon), removed at exit; every process the demo starts
// is stopped by its PID (and gets SIGKILL if the demo dies). The exit
// status is 1 on any verification failure or error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
)

const roleEnv = "VRNIC_DEMO_ROLE"

// defaultLink is the link the demo uses without -link.
const defaultLink = "udp"

func main() {
	if os.Getenv(roleEnv) == "client" {
		os.Exit(clientMain(os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func clientMain(args []string) int {
	fs := flag.NewFlagSet("vrnic-demo client", flag.ContinueOnError)
	var c clientConfig
	var mtu int
	fs.StringVar(&c.role, "role", "", "a (requester) or b (responder)")
	fs.StringVar(&c.socket, "socket", "", "daemon control socket")
	fs.StringVar(&c.ctrl, "ctrl", "", "demo message socket")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "traffic duration")
	fs.IntVar(&c.size, "size", 16384, "message size")
	fs.IntVar(&mtu, "mtu", 4096, "path MTU")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	c.mtu = rcpair.MTU(mtu)
	if err := runClient(c); err != nil {
		fmt.Fprintf(os.Stderr, "vrnic-demo client %s: %v\n", c.role, err)
		return 1
	}
	return 0
}

// config is the demo's command line.
type config struct {
	duration time.Duration
	size     int
	link     string
	workers  int
	vrnicd   string
	addrA    string
	addrB    string
	mtu      int
	verbose  bool
	autoAddr bool // addresses not given: another free pair may be used
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("vrnic-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "how long the traffic runs")
	fs.IntVar(&c.size, "size", 16384, "bytes per SEND, WRITE and READ (1..1048576)")
	fs.StringVar(&c.link, "link", defaultLink, "udp: two daemons over UDP on loopback; mem: one daemon, in-memory link")
	fs.IntVar(&c.workers, "workers", 1, "engine workers per daemon")
	fs.StringVar(&c.vrnicd, "vrnicd", "", "vrnicd binary (default: beside this program, or built with the go tool)")
	fs.StringVar(&c.addrA, "addr-a", "127.0.0.1", "UDP link: first daemon's address (port 4791)")
	fs.StringVar(&c.addrB, "addr-b", "127.0.0.2", "UDP link: second daemon's address (port 4791)")
	fs.IntVar(&c.mtu, "mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096")
	fs.BoolVar(&c.verbose, "v", false, "show the daemons' logs at the end")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.autoAddr = !set["addr-a"] && !set["addr-b"]
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	case c.duration <= 0 || c.duration > time.Hour:
		return nil, fmt.Errorf("duration %v out of range", c.duration)
	case c.size < 1 || c.size > 1<<20:
		return nil, fmt.Errorf("size %d out of range (1..1048576)", c.size)
	case c.link != "udp" && c.link != "mem":
		return nil, fmt.Errorf("link %q: want udp or mem", c.link)
	case c.workers < 1 || c.workers > 64:
		return nil, fmt.Errorf("workers %d out of range", c.workers)
	case rcpair.MTU(c.mtu) == 0:
		return nil, fmt.Errorf("mtu %d: want 256, 512, 1024, 2048 or 4096", c.mtu)
	}
	for _, a := range []string{c.addrA, c.addrB} {
		if _, err := netip.ParseAddr(a); err != nil {
			return nil, fmt.Errorf("address %q: %w", a, err)
		}
	}
	return c, nil
}

// run is the demo; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "vrnic-demo:", err)
		}
		return 2
	}
	dir, err := os.MkdirTemp("", "vrnic-demo-")
	if err != nil {
		fmt.Fprintln(stderr, "vrnic-demo:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	d := &demo{cfg: c, dir: dir, out: stdout, procs: launch.Group{Dir: dir}}
	err = d.run(ctx)
	procs := d.procs.Procs
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		wait := time.Duration(0)
		if !strings.HasPrefix(p.Name, "vrnicd") && err == nil {
			wait = 10 * time.Second // a client exits by itself after its result
		}
		if perr := p.Stop(wait, 5*time.Second); perr != nil && err == nil && !strings.HasPrefix(p.Name, "vrnicd") {
			err = fmt.Errorf("%s: %w", p.Name, perr)
		}
	}
	if c.verbose || err != nil {
		for _, p := range procs {
			if t := p.Tail(15); t != "" {
				fmt.Fprintf(stderr, "--- %s (pid %d) log:\n%s\n", p.Name, p.Pid(), t)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "vrnic-demo: FAIL:", err)
		return 1
	}
	fmt.Fprintln(stdout, "PASS")
	return 0
}

type demo struct {
	cfg   *config
	dir   string
	out   io.Writer
	procs launch.Group // daemons and clients, in d.dir
}

func (d *demo) run(ctx context.Context) error {
	c := d.cfg
	bin, err := launch.FindVrnicd(c.vrnicd, d.dir, d.out)
	if err != nil {
		return err
	}
	if c.link == "udp" && c.autoAddr {
		a, b, err := launch.LoopbackPair(netip.MustParseAddr(c.addrA), netip.MustParseAddr(c.addrB))
		if err != nil {
			return err
		}
		if a.String() != c.addrA || b.String() != c.addrB {
			fmt.Fprintf(d.out, "UDP port 4791 of %s or %s is in use: using %v and %v\n", c.addrA, c.addrB, a, b)
			c.addrA, c.addrB = a.String(), b.String()
		}
	}
	type daemonSpec struct{ name, local string }
	specs := []daemonSpec{{"demo-a", c.addrA}, {"demo-b", c.addrB}}
	if c.link == "mem" {
		specs = specs[:1]
	}
	var socks []string
	for _, s := range specs {
		args := []string{"-name", s.name, "-runtime-dir", d.dir, "-link", c.link, "-workers", strconv.Itoa(c.workers), "-log-level", "info"}
		if c.link == "udp" {
			args = append(args, "-local", netip.AddrPortFrom(netip.MustParseAddr(s.local), 4791).String())
		}
		p, err := d.procs.Start(launch.Spec{Name: "vrnicd-" + s.name, Bin: bin, Args: args})
		if err != nil {
			return err
		}
		sock := admin.SocketPath(d.dir, s.name)
		if err := launch.WaitReady(ctx, p, sock, 15*time.Second); err != nil {
			return err
		}
		socks = append(socks, sock)
		fmt.Fprintf(d.out, "started vrnicd %s (pid %d, %s link%s)\n", s.name, p.Pid(), c.link, map[bool]string{true: " " + s.local + ":4791", false: ""}[c.link == "udp"])
	}
	if len(socks) == 1 {
		socks = append(socks, socks[0])
	}

	ctrlPath := filepath.Join(d.dir, "demo.sock")
	ln, err := net.Listen("unix", ctrlPath)
	if err != nil {
		return err
	}
	defer ln.Close()
	stopWatch := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopWatch()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	for i, role := range []string{"a", "b"} {
		args := []string{"-role", role, "-socket", socks[i], "-ctrl", ctrlPath, "-duration", c.duration.String(),
			"-size", strconv.Itoa(c.size), "-mtu", strconv.Itoa(c.mtu)}
		p, err := d.procs.Start(launch.Spec{Name: "client-" + role, Bin: self, Args: args, Env: []string{roleEnv + "=client"}})
		if err != nil {
			return err
		}
		fmt.Fprintf(d.out, "started client %s (pid %d) on %s\n", role, p.Pid(), filepath.Base(socks[i]))
	}
	peers, err := d.accept(ctx, ln)
	if err != nil {
		return err
	}
	for _, p := range peers {
		defer p.c.Close()
		context.AfterFunc(ctx, func() { p.c.Close() })
	}
	a, b := peers["a"], peers["b"]
	return d.session(a, b)
}

// accept takes the two clients' connections and their hello messages.
func (d *demo) accept(ctx context.Context, ln net.Listener) (map[string]*peerConn, error) {
	peers := map[string]*peerConn{}
	hellos := map[string]*rcpair.Info{}
	ln.(*net.UnixListener).SetDeadline(time.Now().Add(30 * time.Second))
	for len(peers) < 2 {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Cause(ctx)
			}
			return nil, fmt.Errorf("waiting for the clients: %w", err)
		}
		p := newPeerConn(nc)
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		m, err := p.recv("hello")
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("client hello: %w", err)
		}
		if (m.Role != "a" && m.Role != "b") || peers[m.Role] != nil || m.QP == nil {
			nc.Close()
			return nil, fmt.Errorf("unexpected hello %+v", m)
		}
		peers[m.Role], hellos[m.Role] = p, m.QP
	}
	for role, other := range map[string]string{"a": "b", "b": "a"} {
		if err := peers[role].send(message{Kind: "peer", QP: hellos[other]}); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(d.out, "QPs: a %#x (PSN %#x) <-> b %#x (PSN %#x), exchanged through the demo\n",
		hellos["a"].QPN, hellos["a"].PSN, hellos["b"].QPN, hellos["b"].PSN)
	return peers, nil
}

// session runs the traffic and checks the results.
func (d *demo) session(a, b *peerConn) error {
	c := d.cfg
	for role, p := range map[string]*peerConn{"a": a, "b": b} {
		if _, err := p.recv("ready"); err != nil {
			return fmt.Errorf("client %s: %w", role, err)
		}
	}
	for _, p := range []*peerConn{a, b} {
		p.c.SetDeadline(time.Time{})
		if err := p.send(message{Kind: "go"}); err != nil {
			return err
		}
	}
	fmt.Fprintf(d.out, "RC QPs in RTS; running SEND / RDMA WRITE / RDMA READ / FETCH_AND_ADD / CMP_AND_SWP for %v, %d-byte messages\n", c.duration, c.size)
	a.c.SetReadDeadline(time.Now().Add(c.duration + 60*time.Second))
	var ra *result
	for ra == nil {
		m, err := a.recv("")
		if err != nil {
			return fmt.Errorf("client a: %w", err)
		}
		switch m.Kind {
		case "progress":
			p := m.Progress
			fmt.Fprintf(d.out, "  [%4.1fs] %9d ops %12d bytes %9.1f MB/s\n", p.Elapsed.Seconds(), p.Ops, p.Bytes,
				float64(p.Bytes)/p.Elapsed.Seconds()/1e6)
		case "result":
			ra = m.Result
		default:
			return fmt.Errorf("client a: unexpected message %q", m.Kind)
		}
	}
	if err := b.send(message{Kind: "stop"}); err != nil {
		return err
	}
	b.c.SetReadDeadline(time.Now().Add(60 * time.Second))
	m, err := b.recv("result")
	if err != nil {
		return fmt.Errorf("client b: %w", err)
	}
	rb := m.Result
	d.summary(ra, rb)
	return verify(ra, rb)
}

// verify compares what the requester did with what the responder's memory
// and receive queue show.
func verify(ra, rb *result) error {
	var errs []error
	for _, f := range append(append([]string(nil), ra.Failures...), rb.Failures...) {
		errs = append(errs, errors.New(f))
	}
	check := func(what string, got, want uint64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s: responder has %d, requester did %d", what, got, want))
		}
	}
	check("SENDs received and verified", rb.RecvVerified, ra.Sends)
	check("SEND bytes", rb.RecvBytes, ra.SendBytes)
	check("FETCH_AND_ADD word", rb.AddWord, ra.FetchAdds)
	check("CMP_AND_SWP word", rb.SwapWord, ra.CmpSwaps)
	if ra.All.Ops == 0 {
		errs = append(errs, errors.New("no operation completed"))
	}
	return errors.Join(errs...)
}

func (d *demo) summary(ra, rb *result) {
	w := d.out
	secs := ra.Elapsed.Seconds()
	fmt.Fprintf(w, "\nsummary (%.1f s, one operation in flight, latency = post to completion):\n", secs)
	fmt.Fprintf(w, "  %-14s %9s %13s %10s %10s %10s %10s\n", "operation", "ops", "bytes", "MB/s", "p50", "p99", "p99.9")
	row := func(s opStats) {
		fmt.Fprintf(w, "  %-14s %9d %13d %10.1f %10v %10v %10v\n", s.Name, s.Ops, s.Bytes, float64(s.Bytes)/secs/1e6,
			s.P50.Round(100*time.Nanosecond), s.P99.Round(100*time.Nanosecond), s.P999.Round(100*time.Nanosecond))
	}
	for _, s := range ra.Ops {
		row(s)
	}
	row(ra.All)
	fmt.Fprintf(w, "  QP a: %d packets sent, %d received, %d retransmissions, %d RNR NAKs\n", ra.PacketsSent, ra.PacketsReceived, ra.Retransmits, ra.RNRNAKs)
	fmt.Fprintf(w, "  QP b: %d packets sent, %d received, %d retransmissions, %d RNR NAKs\n", rb.PacketsSent, rb.PacketsReceived, rb.Retransmits, rb.RNRNAKs)
	fmt.Fprintf(w, "  verified: %d SENDs (%d bytes) checked by b, every READ equal to the WRITE before it, FETCH_AND_ADD word %d (want %d), CMP_AND_SWP word %d (want %d)\n",
		rb.RecvVerified, rb.RecvBytes, rb.AddWord, ra.FetchAdds, rb.SwapWord, ra.CmpSwaps)
}
