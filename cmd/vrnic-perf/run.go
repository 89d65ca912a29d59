package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vrnic/vrnic/device"
)

// runConfig is the command line of run.
type runConfig struct {
	link         string
	devA, devB   string
	vrnicd       string
	workers      int
	addrA, addrB string
	ctrl         string
	verbose      bool
	autoAddr     bool
	clientArgs   []string
	opt          options
}

// runOnly are run's own flags; every other flag is a test option passed
// to the client.
var runOnly = map[string]bool{"link": true, "dev-a": true, "dev-b": true, "vrnicd": true, "workers": true,
	"addr-a": true, "addr-b": true, "ctrl": true, "v": true}

func parseRun(args []string, stderr io.Writer) (*runConfig, error) {
	fs := flag.NewFlagSet("vrnic-perf run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &runConfig{}
	fs.StringVar(&c.link, "link", "udp", "daemons to start: udp (two vrnicd over the UDP link on loopback) or mem (one vrnicd, in-memory link)")
	fs.StringVar(&c.devA, "dev-a", "", "client's device socket (with -dev-b: use running daemons, start none)")
	fs.StringVar(&c.devB, "dev-b", "", "server's device socket")
	fs.StringVar(&c.vrnicd, "vrnicd", "", "vrnicd binary (default: beside this program, or built with the go tool)")
	fs.IntVar(&c.workers, "workers", 1, "engine workers per daemon started")
	fs.StringVar(&c.addrA, "addr-a", "127.0.0.1", "udp: the client daemon's address (port 4791)")
	fs.StringVar(&c.addrB, "addr-b", "127.0.0.2", "udp: the server daemon's address (port 4791)")
	fs.StringVar(&c.ctrl, "ctrl", "unix", "control connection between the roles: unix or tcp (loopback)")
	fs.BoolVar(&c.verbose, "v", false, "print the logs of every process at the end")
	c.opt.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if !runOnly[f.Name] {
			c.clientArgs = append(c.clientArgs, "-"+f.Name+"="+f.Value.String())
		}
	})
	c.autoAddr = !set["addr-a"] && !set["addr-b"]
	bad := func(format string, a ...any) error { return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...)) }
	switch {
	case fs.NArg() > 0:
		return nil, bad("unexpected arguments %q", fs.Args())
	case c.link != "mem" && c.link != "udp":
		return nil, bad("link %q: want mem or udp", c.link)
	case (c.devA == "") != (c.devB == ""):
		return nil, bad("give both -dev-a and -dev-b, or neither")
	case c.workers < 1 || c.workers > 64:
		return nil, bad("workers %d out of range", c.workers)
	case c.ctrl != "unix" && c.ctrl != "tcp":
		return nil, bad("ctrl %q: want unix or tcp", c.ctrl)
	}
	for _, a := range []string{c.addrA, c.addrB} {
		if _, err := netip.ParseAddr(a); err != nil {
			return nil, bad("address %q: %v", a, err)
		}
	}
	if err := c.opt.finish(); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return c, nil
}

// child is a process run started.
type child struct {
	name string
	cmd  *exec.Cmd
	out  string // stdout file
	log  string // stderr file
	done chan struct{}
	err  error
}

func (p *child) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// wait waits up to d for the process to exit by itself.
func (p *child) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// stop ends the process by its PID: SIGTERM, then SIGKILL after grace.
func (p *child) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if !p.wait(grace) {
		p.cmd.Process.Kill()
		<-p.done
	}
}

// launcher starts and stops run's processes, all in one private
// directory.
type launcher struct {
	dir   string
	procs []*child
}

func (l *launcher) start(name, bin string, args []string) (*child, error) {
	p := &child{name: name, out: filepath.Join(l.dir, name+".out"), log: filepath.Join(l.dir, name+".log"), done: make(chan struct{})}
	outF, err := os.Create(p.out)
	if err != nil {
		return nil, err
	}
	defer outF.Close()
	logF, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	defer logF.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = outF, logF
	p.cmd.Env = append(os.Environ(), mainEnv+"=1")
	// If run dies without stopping it, the kernel kills the child.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	l.procs = append(l.procs, p)
	return p, nil
}

// stopAll stops every process still running, the last started first.
func (l *launcher) stopAll() {
	for i := len(l.procs) - 1; i >= 0; i-- {
		l.procs[i].stop(5 * time.Second)
	}
}

func lastLines(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseRun(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "vrnic-perf-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l := &launcher{dir: dir}
	err = l.run(ctx, c, stdout, stderr)
	l.stopAll()
	if err != nil || c.verbose {
		for _, p := range l.procs {
			fmt.Fprintf(stderr, "--- %s (pid %d, %v):\n", p.name, p.cmd.Process.Pid, p.cmd.ProcessState)
			if t := lastLines(p.log, 20); t != "" {
				fmt.Fprintln(stderr, t)
			}
		}
	}
	return err
}

func (l *launcher) run(ctx context.Context, c *runConfig, stdout, stderr io.Writer) error {
	devA, devB := c.devA, c.devB
	if devA == "" {
		var err error
		if devA, devB, err = l.startDaemons(ctx, c, stderr); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	listen := "unix:" + filepath.Join(l.dir, "ctrl.sock")
	if c.ctrl == "tcp" {
		listen = "127.0.0.1:0"
	}
	srv, err := l.start("server", self, []string{"server", "-dev", devB, "-listen", listen})
	if err != nil {
		return err
	}
	addr, err := listenAddr(ctx, srv)
	if err != nil {
		return err
	}
	cli, err := l.start("client", self, append([]string{"client", "-dev", devA, "-server", addr}, c.clientArgs...))
	if err != nil {
		return err
	}
	select {
	case <-cli.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	out, _ := os.ReadFile(cli.out)
	stdout.Write(out)
	if cli.err != nil {
		return fmt.Errorf("client (pid %d): %w: %s", cli.cmd.Process.Pid, cli.err, lastLines(cli.log, 3))
	}
	if !srv.wait(10 * time.Second) {
		return fmt.Errorf("server (pid %d) did not exit after the client", srv.cmd.Process.Pid)
	}
	if srv.err != nil {
		return fmt.Errorf("server (pid %d): %w: %s", srv.cmd.Process.Pid, srv.err, lastLines(srv.log, 3))
	}
	return nil
}

// listenAddr waits for the server's "listening on NETWORK:ADDR" line.
func listenAddr(ctx context.Context, srv *child) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if f, err := os.Open(srv.out); err == nil {
			line, _ := bufio.NewReader(f).ReadString('\n')
			f.Close()
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on "); ok && strings.HasSuffix(line, "\n") {
				if u, ok := strings.CutPrefix(a, "unix:"); ok {
					return "unix:" + u, nil
				}
				return strings.TrimPrefix(a, "tcp:"), nil
			}
		}
		if !srv.running() {
			return "", fmt.Errorf("server exited during start-up: %s", lastLines(srv.log, 5))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", errors.New("server: no control address")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startDaemons starts one vrnicd (mem link: both roles on it) or two (UDP
// link on two loopback addresses) and returns the client's and the
// server's device sockets.
func (l *launcher) startDaemons(ctx context.Context, c *runConfig, stderr io.Writer) (string, string, error) {
	bin, err := l.vrnicd(c, stderr)
	if err != nil {
		return "", "", err
	}
	addrs := []string{c.addrA, c.addrB}
	if c.link == "udp" && c.autoAddr && (!udpPortFree(c.addrA) || !udpPortFree(c.addrB)) {
		addrs = []string{randomLoopback(), randomLoopback()}
		if addrs[0] == "" || addrs[1] == "" || addrs[0] == addrs[1] {
			return "", "", errors.New("no free loopback addresses with UDP port 4791")
		}
	}
	n := 2
	if c.link == "mem" {
		n = 1
	}
	var socks []string
	for i := range n {
		name := fmt.Sprintf("perf-%c", 'a'+i)
		args := []string{"-name", name, "-runtime-dir", l.dir, "-link", c.link, "-workers", strconv.Itoa(c.workers)}
		if c.link == "udp" {
			args = append(args, "-local", net.JoinHostPort(addrs[i], "4791"))
		}
		p, err := l.start("vrnicd-"+name, bin, args)
		if err != nil {
			return "", "", err
		}
		sock := device.SocketPath(l.dir, name)
		if err := daemonReady(ctx, p, sock); err != nil {
			return "", "", err
		}
		socks = append(socks, sock)
	}
	if n == 1 {
		return socks[0], socks[0], nil
	}
	return socks[0], socks[1], nil
}

// vrnicd finds the daemon binary: -vrnicd, beside this executable, or
// built into the private directory.
func (l *launcher) vrnicd(c *runConfig, stderr io.Writer) (string, error) {
	if c.vrnicd != "" {
		return c.vrnicd, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "vrnicd")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	bin := filepath.Join(l.dir, "vrnicd")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/vrnic/vrnic/cmd/vrnicd")
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build vrnicd (run from the repository, or give -vrnicd): %w", err)
	}
	return bin, nil
}

// daemonReady waits until the daemon answers on its control socket.
func daemonReady(ctx context.Context, p *child, sock string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		if a, err := device.DialAdmin(sock); err == nil {
			_, err = a.Info()
			a.Close()
			if err == nil {
				return nil
			}
		}
		if !p.running() {
			return fmt.Errorf("%s exited during start-up: %s", p.name, lastLines(p.log, 10))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: no control socket at %s", p.name, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func udpPortFree(addr string) bool {
	c, err := net.ListenPacket("udp", net.JoinHostPort(addr, "4791"))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// randomLoopback returns a 127.0.0.0/8 address whose UDP port 4791 is
// free, or "".
func randomLoopback() string {
	for range 64 {
		a := netip.AddrFrom4([4]byte{127, byte(rand.IntN(256)), byte(rand.IntN(256)), byte(2 + rand.IntN(250))}).String()
		if udpPortFree(a) {
			return a
		}
	}
	return ""
}
