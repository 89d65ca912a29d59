package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
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

// launcher starts and stops run's processes, all in one private
// directory.
type launcher struct {
	launch.Group
}

// start starts a process; stdout and stderr go to separate files.
func (l *launcher) start(name, bin string, args []string) (*launch.Proc, error) {
	return l.Start(launch.Spec{Name: name, Bin: bin, Args: args, Env: []string{mainEnv + "=1"}, SplitStdout: true})
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
	l := &launcher{launch.Group{Dir: dir}}
	err = l.run(ctx, c, stdout, stderr)
	l.StopAll(5 * time.Second)
	if err != nil || c.verbose {
		for _, p := range l.Procs {
			fmt.Fprintf(stderr, "--- %s (pid %d, %v):\n", p.Name, p.Pid(), p.Cmd.ProcessState)
			if t := p.Tail(20); t != "" {
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
	listen := "unix:" + filepath.Join(l.Dir, "ctrl.sock")
	if c.ctrl == "tcp" {
		listen = "127.0.0.1:0"
	}
	srvArgs := []string{"server", "-dev", devB, "-listen", listen}
	if c.opt.ECE != 0 {
		// The server asks for the ECE options the client offers.
		srvArgs = append(srvArgs, "-ece", abi.ECEString(c.opt.ECE))
	}
	srv, err := l.start("server", self, srvArgs)
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
	case <-cli.Done():
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	out, _ := os.ReadFile(cli.Out)
	stdout.Write(out)
	if err := cli.Err(); err != nil {
		return fmt.Errorf("client (pid %d): %w: %s", cli.Pid(), err, cli.Tail(3))
	}
	if !srv.Wait(10 * time.Second) {
		return fmt.Errorf("server (pid %d) did not exit after the client", srv.Pid())
	}
	if err := srv.Err(); err != nil {
		return fmt.Errorf("server (pid %d): %w: %s", srv.Pid(), err, srv.Tail(3))
	}
	return nil
}

// listenAddr waits for the server's "listening on NETWORK:ADDR" line.
func listenAddr(ctx context.Context, srv *launch.Proc) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if f, err := os.Open(srv.Out); err == nil {
			line, _ := bufio.NewReader(f).ReadString('\n')
			f.Close()
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on "); ok && strings.HasSuffix(line, "\n") {
				if u, ok := strings.CutPrefix(a, "unix:"); ok {
					return "unix:" + u, nil
				}
				return strings.TrimPrefix(a, "tcp:"), nil
			}
		}
		if !srv.Running() {
			return "", fmt.Errorf("server exited during start-up: %s", srv.Tail(5))
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
	bin, err := launch.FindVrnicd(c.vrnicd, l.Dir, stderr)
	if err != nil {
		return "", "", err
	}
	addrs := []string{c.addrA, c.addrB}
	if c.link == "udp" && c.autoAddr {
		a, b, err := launch.LoopbackPair(netip.MustParseAddr(c.addrA), netip.MustParseAddr(c.addrB))
		if err != nil {
			return "", "", err
		}
		addrs = []string{a.String(), b.String()}
	}
	n := 2
	if c.link == "mem" {
		n = 1
	}
	var socks []string
	for i := range n {
		name := fmt.Sprintf("perf-%c", 'a'+i)
		args := []string{"-name", name, "-runtime-dir", l.Dir, "-link", c.link, "-workers", strconv.Itoa(c.workers)}
		if c.link == "udp" {
			args = append(args, "-local", net.JoinHostPort(addrs[i], "4791"))
		}
		p, err := l.start("vrnicd-"+name, bin, args)
		if err != nil {
			return "", "", err
		}
		sock := admin.SocketPath(l.Dir, name)
		if err := launch.WaitReady(ctx, p, sock, 20*time.Second); err != nil {
			return "", "", err
		}
		socks = append(socks, sock)
	}
	if n == 1 {
		return socks[0], socks[0], nil
	}
	return socks[0], socks[1], nil
}
