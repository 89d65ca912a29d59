// Package suite is a fault-injection test harness on top of vrnicd's
// control socket: it starts real daemons (internal/launch), installs
// fault rules (admin.FaultCmd), runs a verbs workload between RC QPs of
// two daemons, and returns what a suite checks: every completion, the
// QPs' counters, the rules' counters and each daemon's packet capture.
// The checks a fault suite needs come with it: every work request
// completed exactly once with the status expected (CheckCompletions), no
// data changed without an ICRC error the receiver saw (CheckData), and a
// requester's retransmissions consistent with go-back-N (CheckGoBackN).
//
// A suite is a plain Go test:
//
//	a, b, err := suite.StartPair(suite.Options{Dir: t.TempDir()})
//	defer a.Stop(); defer b.Stop()
//	qa, qb, err := suite.Connect(a, b, suite.ConnOpts{})
//	a.AddRules(admin.FaultRule{Dir: "tx", Op: []string{"write"}, Probability: &p, Action: admin.FaultAction{Type: "drop"}})
//	res, err := suite.Workload{Ops: ops}.Run(qa, qb, time.Minute)
//	err = res.CheckCompletions(suite.AllSucceed)
//
// examples/faultmatrix runs a workload under a matrix of faults this way.
package suite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/internal/launch"
)

// Options configure the daemons a suite starts.
type Options struct {
	// Dir holds the daemons' runtime directories (required; a test's
	// t.TempDir()).
	Dir string
	// Vrnicd is the daemon binary; "" finds one beside the test binary
	// or builds it into Dir (launch.FindVrnicd).
	Vrnicd string
	// Seed is the daemons' fault seed (-fault-seed); 0: 1, so that runs
	// replay.
	Seed uint64
	// Workers per daemon (default 1: one worker replays exactly).
	Workers int
	// Log gets the build's output (default: discarded).
	Log io.Writer
}

// Daemon is a vrnicd process over the UDP link on a loopback address.
type Daemon struct {
	Name   string
	Socket string
	Addr   netip.Addr // its GID 0 and UDP link address

	proc *launch.Proc
	logs *launch.Buffer

	capMu  sync.Mutex
	capOut chan []byte
	frames []capture.Frame
	capErr error
	done   bool
}

var buildOnce struct {
	sync.Mutex
	bin, dir string
}

// RemoveBuilt removes the daemon binary Start built for this process, if
// it built one (call it from TestMain after m.Run).
func RemoveBuilt() {
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	buildOnce.bin, buildOnce.dir = "", ""
}

func (o *Options) binary() (string, error) {
	if o.Vrnicd != "" {
		return o.Vrnicd, nil
	}
	buildOnce.Lock()
	defer buildOnce.Unlock()
	if buildOnce.bin != "" {
		if _, err := os.Stat(buildOnce.bin); err == nil {
			return buildOnce.bin, nil
		}
	}
	out := o.Log
	if out == nil {
		out = io.Discard
	}
	// Built once per process, into a directory of its own (a test's
	// Dir goes away with the test).
	dir, err := os.MkdirTemp("", "faultsuite-bin-")
	if err != nil {
		return "", err
	}
	bin, err := launch.FindVrnicd("", dir, out)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if buildOnce.dir != "" {
		os.RemoveAll(buildOnce.dir)
	}
	buildOnce.bin, buildOnce.dir = bin, dir
	return bin, nil
}

// Start starts one daemon named name on a free loopback address and
// waits until its control socket answers. Stop it with Stop (by PID).
func Start(o Options, name string, addr netip.Addr) (*Daemon, error) {
	if o.Dir == "" {
		return nil, errors.New("suite: Options.Dir is required")
	}
	bin, err := o.binary()
	if err != nil {
		return nil, err
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Workers == 0 {
		o.Workers = 1
	}
	dir := filepath.Join(o.Dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d := &Daemon{Name: name, Socket: admin.SocketPath(dir, name), Addr: addr, logs: &launch.Buffer{}}
	d.proc, err = launch.Start(launch.Spec{Name: "vrnicd " + name, Bin: bin, Stderr: d.logs,
		Args: []string{"-name", name, "-runtime-dir", dir, "-link", "udp", "-local", netip.AddrPortFrom(addr, 4791).String(),
			"-workers", strconv.Itoa(o.Workers), "-fault-seed", strconv.FormatUint(o.Seed, 10)}})
	if err != nil {
		return nil, err
	}
	if err := launch.WaitReady(context.Background(), d.proc, d.Socket, 15*time.Second); err != nil {
		d.proc.Stop(0, 5*time.Second)
		return nil, err
	}
	return d, nil
}

// StartPair starts two daemons, "a" and "b", on two free loopback
// addresses, each with a packet capture running (Frames, after Stop).
func StartPair(o Options) (*Daemon, *Daemon, error) {
	x, y, err := launch.LoopbackPair(netip.Addr{}, netip.Addr{})
	if err != nil {
		return nil, nil, err
	}
	a, err := Start(o, "a", x)
	if err != nil {
		return nil, nil, err
	}
	b, err := Start(o, "b", y)
	if err != nil {
		a.Stop()
		return nil, nil, err
	}
	for _, d := range []*Daemon{a, b} {
		if err := d.StartCapture(); err != nil {
			a.Stop()
			b.Stop()
			return nil, nil, err
		}
	}
	return a, b, nil
}

// Logs returns the daemon's log so far.
func (d *Daemon) Logs() string { return d.logs.String() }

// Stop stops the daemon (SIGTERM to its PID, then waits) and collects
// its capture. It may be called more than once.
func (d *Daemon) Stop() error {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	if d.done {
		return nil
	}
	d.done = true
	err := d.proc.Stop(0, 10*time.Second)
	if d.capOut != nil {
		b := <-d.capOut
		d.frames, d.capErr = capture.ReadFrames(b)
	}
	if err != nil {
		return fmt.Errorf("vrnicd %s: %w\n%s", d.Name, err, d.proc.Tail(20))
	}
	return nil
}

// StartCapture starts an unbounded capture of the daemon's links; the
// frames are read when the daemon stops (Frames).
func (d *Daemon) StartCapture() error {
	a, err := admin.Dial(d.Socket)
	if err != nil {
		return err
	}
	defer a.Close()
	src, err := a.Capture(admin.CaptureRequest{})
	if err != nil {
		return err
	}
	out := make(chan []byte, 1)
	go func() {
		defer src.Close()
		b, _ := io.ReadAll(src)
		out <- b
	}()
	d.capMu.Lock()
	d.capOut = out
	d.capMu.Unlock()
	return nil
}

// Frames returns the daemon's capture (after Stop): sent frames as its
// engine built them, received frames as its link delivered them, each
// with the comment of what the fault rules did.
func (d *Daemon) Frames() ([]capture.Frame, error) {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	if !d.done {
		return nil, errors.New("suite: the capture is read when the daemon stops")
	}
	return d.frames, d.capErr
}

// Faults sends one FaultCmd request.
func (d *Daemon) Faults(req admin.FaultRequest) (admin.FaultReply, error) {
	a, err := admin.Dial(d.Socket)
	if err != nil {
		return admin.FaultReply{}, err
	}
	defer a.Close()
	b, err := a.Call(admin.FaultCmd, req)
	if err != nil {
		return admin.FaultReply{}, err
	}
	var r admin.FaultReply
	return r, json.Unmarshal(b, &r)
}

// AddRules installs rules; the reply has their ids.
func (d *Daemon) AddRules(rules ...admin.FaultRule) ([]admin.FaultRuleInfo, error) {
	r, err := d.Faults(admin.FaultRequest{Op: admin.FaultAdd, Rules: rules})
	return r.Rules, err
}

// Rules lists the rules with their counters.
func (d *Daemon) Rules() ([]admin.FaultRuleInfo, error) {
	r, err := d.Faults(admin.FaultRequest{Op: admin.FaultList})
	return r.Rules, err
}

// ClearRules removes every rule.
func (d *Daemon) ClearRules() error {
	_, err := d.Faults(admin.FaultRequest{Op: admin.FaultClear})
	return err
}
