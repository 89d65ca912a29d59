// Package launch starts and stops the processes vrnic's commands and
// integration tests run beside themselves: vrnicd daemons and the client
// roles of vrnic-demo and vrnic-perf.
//
// Every child is started with Pdeathsig SIGKILL (the kernel kills it if
// its parent dies without stopping it). The kernel ties that signal to
// the OS thread that forked, not to the process: Start must not be
// called from a goroutine locked to a thread that may end (one that
// switched network namespace, for instance). A child is stopped by its
// PID:
// optionally a wait for it to exit by itself, then SIGTERM, then SIGKILL
// after a grace period. One goroutine per child waits for it and closes
// Done; Err is the exit status after that.
//
// A child's output goes either to files in a directory (Dir/Name.log for
// stderr, and stdout too unless SplitStdout sends it to Dir/Name.out) or
// to writers the caller gives. Group keeps the children of one run in one
// private directory.
//
// The package also finds or builds vrnicd (FindVrnicd, GoBuild), waits
// until a daemon answers on its control socket (WaitReady) and picks
// loopback addresses whose RoCE v2 UDP port is free for the UDP link
// (UDPFree, FreeLoopback, LoopbackPair).
package launch

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Spec describes a process to start.
type Spec struct {
	// Name names the process in errors and its output files.
	Name string
	// Bin is the executable, Args its arguments (without argv[0]).
	Bin  string
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Dir, if set, holds the output files: stderr goes to Dir/Name.log,
	// stdout to the same file, or to Dir/Name.out with SplitStdout.
	Dir         string
	SplitStdout bool
	// Stdout and Stderr receive the output when Dir is empty (nil:
	// discarded).
	Stdout, Stderr io.Writer
}

// Proc is a started child process.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	// Log is the file of its stderr (and stdout without SplitStdout),
	// Out the file of its stdout with SplitStdout; empty without Dir.
	Log, Out string

	done   chan struct{}
	err    error
	killed bool
}

// Start starts the process described by s.
func Start(s Spec) (*Proc, error) {
	p := &Proc{Name: s.Name, done: make(chan struct{})}
	p.Cmd = exec.Command(s.Bin, s.Args...)
	p.Cmd.Stdout, p.Cmd.Stderr = s.Stdout, s.Stderr
	if s.Dir != "" {
		p.Log = filepath.Join(s.Dir, s.Name+".log")
		logF, err := os.Create(p.Log)
		if err != nil {
			return nil, err
		}
		defer logF.Close()
		p.Cmd.Stdout, p.Cmd.Stderr = logF, logF
		if s.SplitStdout {
			p.Out = filepath.Join(s.Dir, s.Name+".out")
			outF, err := os.Create(p.Out)
			if err != nil {
				return nil, err
			}
			defer outF.Close()
			p.Cmd.Stdout = outF
		}
	}
	if s.Env != nil {
		p.Cmd.Env = append(os.Environ(), s.Env...)
	}
	// The kernel kills the child if this process dies without stopping it.
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	go func() { p.err = p.Cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid is the process's PID.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit status as exec.Cmd.Wait returns it; valid
// once Done is closed.
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Wait waits up to d for the process to exit by itself and reports
// whether it did.
func (p *Proc) Wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// Stop ends the process by its PID: it waits up to wait for the process
// to exit by itself, then sends SIGTERM, then SIGKILL after grace. It
// returns the exit status (Err). Stopping an exited process only returns
// its status.
func (p *Proc) Stop(wait, grace time.Duration) error {
	if p.Wait(wait) {
		return p.err
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	if !p.Wait(grace) {
		p.killed = true
		p.Cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// Killed reports whether Stop had to send SIGKILL (the process did not
// exit within the grace period after SIGTERM).
func (p *Proc) Killed() bool { return p.killed }

// Tail returns the last n lines of the process's log file ("" without
// one).
func (p *Proc) Tail(n int) string {
	if p.Log == "" {
		return ""
	}
	return Tail(p.Log, n)
}

// Tail returns the last n lines of the file at path, or "" if it cannot
// be read.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Group is the processes of one run, with their output files in one
// private directory.
type Group struct {
	Dir   string
	Procs []*Proc // in the order started
}

// Start starts s with its output files in g.Dir and adds it to g.
func (g *Group) Start(s Spec) (*Proc, error) {
	s.Dir = g.Dir
	p, err := Start(s)
	if err != nil {
		return nil, err
	}
	g.Procs = append(g.Procs, p)
	return p, nil
}

// StopAll stops every process still running, the last started first
// (SIGTERM, then SIGKILL after grace).
func (g *Group) StopAll(grace time.Duration) {
	for i := len(g.Procs) - 1; i >= 0; i-- {
		g.Procs[i].Stop(0, grace)
	}
}
