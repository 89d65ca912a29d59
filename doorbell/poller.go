package doorbell

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/fdwait"
)

// PollerConfig configures a Poller.
type PollerConfig struct {
	// Poll makes one pass over every record of every page the poller
	// serves, consumes what it finds and reports whether it found any work.
	// It runs on the poller's goroutine only.
	Poll func() bool
	// Recheck, if set, is the pass made after kick_needed was stored,
	// before the poller sleeps; it must read every record a post may
	// have changed since the last pass (Poll may read only some of them
	// per pass). Default: Poll.
	Recheck func() bool
	// SpinBudget is the number of consecutive empty passes before the
	// poller goes to sleep; 0 sleeps after the first empty pass.
	SpinBudget int
	// SpinFor, if set, also keeps the poller polling until this long has
	// passed since the last pass that found work: a client that posts
	// once per round trip (a queue kept full, a ping-pong) then finds the
	// poller awake, and posting costs it no system call, as long as its
	// round trip is shorter.
	SpinFor time.Duration
}

// PollerStats counts what a poller did.
type PollerStats struct {
	Passes   uint64 // calls to Poll
	Sleeps   uint64 // times the poller went to sleep (the re-check found nothing)
	Rechecks uint64 // re-checks after kick_needed that found work (sleep avoided)
	Kicks    uint64 // kick eventfd reads that returned a non-zero count
}

type served struct {
	kickNeeded *atomic.Uint32
	kick       *EventFD
}

// pageSet is an immutable list of served pages; Add and Remove replace it.
type pageSet struct {
	gen  uint64
	list []served
}

// Poller is a daemon polling loop over the doorbell pages of several
// contexts: it busy-polls while work arrives, then advertises kick_needed,
// re-checks, and sleeps until a kick eventfd (in its epoll set) is
// readable. Add and Remove may be
// called from any goroutine; Run from one.
type Poller struct {
	cfg  PollerConfig
	epfd int
	wake *EventFD // ends a sleep (Add, Remove, Run's context, Wake)

	// The epoll fd as a file on the Go poller (an epoll fd is itself
	// pollable): Run sleeps there, not in a blocking epoll_wait (see
	// sleep).
	file  *os.File
	ready *fdwait.Waiter

	mu      sync.Mutex // serialises Add/Remove
	set     atomic.Pointer[pageSet]
	seen    atomic.Uint64 // generation of the set Run last loaded
	running atomic.Bool

	passes, sleeps, rechecks, kicks atomic.Uint64

	// Test hooks: skipRecheck disables the re-check (tests prove they
	// catch its absence); hookBeforeArm runs after the last empty pass,
	// before kick_needed is stored (tests post exactly there).
	skipRecheck   bool
	hookBeforeArm func()
}

// NewPoller creates a poller; Close releases its epoll and wake fds.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.Poll == nil {
		return nil, errors.New("doorbell: poller needs a Poll function")
	}
	if cfg.Recheck == nil {
		cfg.Recheck = cfg.Poll
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("doorbell: epoll_create1: %w", err)
	}
	wake, err := NewEventFD()
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		wake.Close()
		return nil, fmt.Errorf("doorbell: epoll fd: %w", err)
	}
	file := os.NewFile(uintptr(epfd), "doorbell-epoll")
	rc, err := file.SyscallConn()
	if err != nil {
		file.Close()
		wake.Close()
		return nil, fmt.Errorf("doorbell: epoll fd: %w", err)
	}
	p := &Poller{cfg: cfg, epfd: epfd, wake: wake, file: file, ready: fdwait.New(rc)}
	if err := p.ctl(unix.EPOLL_CTL_ADD, wake.Fd()); err != nil {
		p.Close()
		return nil, err
	}
	p.set.Store(&pageSet{})
	return p, nil
}

func (p *Poller) ctl(op, fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(p.epfd, op, fd, &ev); err != nil {
		return fmt.Errorf("doorbell: epoll_ctl(%d, fd %d): %w", op, fd, err)
	}
	return nil
}

// Add starts serving page: its kick eventfd joins the epoll set and its
// kick_needed word is managed by the poller. The caller's Poll function
// must cover the page's records from the next pass on.
func (p *Poller) Add(page *Page) error {
	return p.add(page.KickNeeded(), page.Kick())
}

func (p *Poller) add(kickNeeded *atomic.Uint32, kick *EventFD) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ctl(unix.EPOLL_CTL_ADD, kick.Fd()); err != nil {
		return err
	}
	old := p.set.Load()
	next := make([]served, len(old.list), len(old.list)+1)
	copy(next, old.list)
	next = append(next, served{kickNeeded: kickNeeded, kick: kick})
	p.set.Store(&pageSet{gen: old.gen + 1, list: next})
	return p.wake.Signal()
}

// Remove stops serving page and waits until a running Run no longer
// touches it, so the page may be closed once Remove returns (its
// kick_needed is left 0).
func (p *Poller) Remove(page *Page) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.set.Load()
	next := make([]served, 0, len(old.list))
	for _, s := range old.list {
		if s.kick != page.Kick() {
			next = append(next, s)
		}
	}
	gen := old.gen + 1
	p.set.Store(&pageSet{gen: gen, list: next})
	err := p.ctl(unix.EPOLL_CTL_DEL, page.KickFd())
	for p.running.Load() && p.seen.Load() < gen {
		p.wake.Signal()
		time.Sleep(20 * time.Microsecond)
	}
	page.KickNeeded().Store(0)
	return err
}

// Stats returns the poller's counters.
func (p *Poller) Stats() PollerStats {
	return PollerStats{Passes: p.passes.Load(), Sleeps: p.sleeps.Load(), Rechecks: p.rechecks.Load(), Kicks: p.kicks.Load()}
}

// Run polls until ctx is done. It should run on a goroutine of its own;
// it sleeps on the Go poller, so that goroutine need not be locked to an OS
// thread (vrnicd's is not).
func (p *Poller) Run(ctx context.Context) error {
	var stop atomic.Bool
	fired := make(chan struct{})
	release := context.AfterFunc(ctx, func() {
		stop.Store(true)
		p.wake.Signal()
		close(fired)
	})
	defer func() {
		if !release() {
			<-fired // the wake-up write finished: Close may follow
		}
	}()
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("doorbell: poller already running")
	}
	defer p.running.Store(false)
	var events [16]unix.EpollEvent
	idle := 0
	var gen uint32 // the kick_needed generation last advertised
	lastWork := time.Now()
	var seen uint64
	for !stop.Load() {
		set := p.set.Load()
		if set.gen != seen {
			seen = set.gen
			p.seen.Store(seen)
		}
		p.passes.Add(1)
		if p.cfg.Poll() {
			idle = 0
			if p.cfg.SpinFor > 0 {
				lastWork = time.Now()
			}
			continue
		}
		if idle < p.cfg.SpinBudget {
			idle++
			continue
		}
		if p.cfg.SpinFor > 0 && time.Since(lastWork) < p.cfg.SpinFor {
			continue
		}
		idle = 0
		if p.hookBeforeArm != nil {
			p.hookBeforeArm()
		}
		pages := set.list
		// A new generation each time (abi.DBDaemonKickGen): a client
		// kicks once per value, never 0.
		if gen++; gen == 0 {
			gen = 1
		}
		for _, s := range pages {
			s.kickNeeded.Store(gen)
		}
		// Re-check every record after advertising kick_needed: a post that
		// raced with the stores above is seen here, or its client saw
		// kick_needed and kicked.
		if !p.skipRecheck {
			p.passes.Add(1)
			if p.cfg.Recheck() {
				p.rechecks.Add(1)
				for _, s := range pages {
					s.kickNeeded.Store(0)
				}
				continue
			}
		}
		if stop.Load() {
			break
		}
		p.sleeps.Add(1)
		n, err := p.sleep(events[:])
		for _, s := range pages {
			s.kickNeeded.Store(0)
		}
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("doorbell: sleep: %w", err)
		}
		for i := range n {
			fd := int(events[i].Fd)
			if fd == p.wake.Fd() {
				p.wake.Drain()
				continue
			}
			for _, s := range pages {
				if s.kick.Fd() == fd {
					if c, _ := s.kick.Drain(); c != 0 {
						p.kicks.Add(1)
					}
				}
			}
		}
	}
	for _, s := range p.set.Load().list {
		s.kickNeeded.Store(0)
	}
	return nil
}

// sleep blocks until the epoll set has events and returns them. It parks
// the goroutine on the Go poller, which watches the epoll fd (package
// fdwait: no wake-up is lost), instead of blocking the thread in
// epoll_wait: a goroutine in a blocking system call keeps its P until the
// runtime's monitor takes it back (up to 10 ms when the monitor is idle),
// and with GOMAXPROCS sized to the workers (vrnicd) that stalled the
// worker behind a sleeping poller.
func (p *Poller) sleep(events []unix.EpollEvent) (int, error) {
	for {
		if err := p.ready.Wait(); err != nil {
			return 0, err
		}
		n, err := unix.EpollWait(p.epfd, events, 0)
		if err == unix.EINTR || err == nil && n == 0 {
			continue // events taken meanwhile: wait again
		}
		return n, err
	}
}

// Wake interrupts a sleeping Run (for example after Add, so the new page's
// records are polled at once).
func (p *Poller) Wake() error { return p.wake.Signal() }

// Close releases the poller's descriptors; Run must have returned.
func (p *Poller) Close() error {
	err := p.file.Close()
	p.wake.Close()
	return err
}
