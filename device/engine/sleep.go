package engine

import (
	"errors"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// How an idle worker waits, and how its timers fire on time.
//
// The Go runtime alone cannot wake a goroutine within microseconds of a
// deadline: with nothing to run, the scheduler waits in epoll_wait, whose
// timeout is in milliseconds (a sleep under 1 ms lasts at least 1 ms, plus
// the thread's 50 µs timer slack), so ACK timeouts and RNR waits under a
// millisecond fired 8 to 11 times late. A worker therefore sleeps with two
// alarms for the same instant, whichever comes first:
//
//   - a timerfd (CLOCK_MONOTONIC, TFD_TIMER_ABSTIME: an hrtimer without
//     slack) read by a small goroutine on the Go poller, which signals the
//     worker when it expires: the runtime's epoll_wait returns at that
//     instant, whatever timeout it slept with;
//   - the runtime's own timer (time.Timer), which the scheduler checks
//     whenever it switches goroutines: on time when the worker's P runs
//     other goroutines and the poller is only looked at now and then.
//
// Both are set wakeLead before the deadline; the worker polls through the
// remaining stretch (its loop, yielding to other goroutines between
// passes) and fires the timer in the first pass at or after its deadline.
// Nothing due, no alarm: an idle worker with no timers sleeps until a
// kick, a frame or a control message, off the CPU.

// wakeLead is how long before a timer's deadline a sleeping worker wakes:
// more than a wake-up takes on a loaded machine (the vCPU woken from idle,
// the alarm's goroutine and then the worker scheduled), so that the worker
// is already polling when the deadline comes. Measured on the 2-core
// development VM (BENCHMARKS.md, timers): with 25 µs the ACK timeout of
// code 8 fired 22-35 µs late at p50, with 100 µs 1-2 µs early (the probe
// times frames at the link, a pass after the timer's own instants).
const wakeLead = 100 * time.Microsecond

// alarm is a worker's timerfd and the goroutine that reads it. set and
// c are the worker's; run is the goroutine's.
type alarm struct {
	f    *os.File
	fd   int
	c    chan struct{} // signalled when the timerfd expires (capacity 1)
	done chan struct{} // closed when run returns
	at   int64         // the deadline set (engine clock), -1 none
	base int64         // CLOCK_MONOTONIC at the engine clock's zero
}

// newAlarm creates the timerfd of a worker whose clock is clk; nil when
// the kernel has none (the runtime's timer alone then wakes the worker).
func newAlarm(clk clock) *alarm {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	// base = CLOCK_MONOTONIC - engine clock, read with the engine clock
	// taken before the system clock: the engine clock at the system
	// clock's instant is no earlier, so base is no smaller than the true
	// offset and an alarm never fires before its deadline (at worst by
	// the gap between the reads late; the closest of a few tries).
	var base int64
	gap := int64(-1)
	for range 4 {
		var ts unix.Timespec
		before := clk.now()
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
			unix.Close(fd)
			return nil
		}
		after := clk.now()
		if gap < 0 || after-before < gap {
			base, gap = ts.Nano()-before, after-before
		}
	}
	return &alarm{
		f: os.NewFile(uintptr(fd), "timerfd"), fd: fd,
		c: make(chan struct{}, 1), done: make(chan struct{}), at: -1,
		base: base,
	}
}

// set arms the alarm for when (engine clock), replacing what was set (no
// system call when it is armed for when already). A stale expiry already
// read is discarded from c first: discarding it after arming could take
// the new deadline's own expiry (a deadline already past fires at once)
// and leave the waiter without it.
func (a *alarm) set(when int64) {
	select {
	case <-a.c:
	default:
	}
	if when != a.at {
		its := unix.ItimerSpec{Value: unix.NsecToTimespec(a.base + when)}
		if unix.TimerfdSettime(a.fd, unix.TFD_TIMER_ABSTIME, &its, nil) != nil {
			return
		}
		a.at = when
	}
}

// expired is told that the alarm has fired: the next set arms it again
// even for the same deadline.
func (a *alarm) expired() { a.at = -1 }

// run reads the timerfd until it is closed and signals c at each expiry.
func (a *alarm) run() {
	defer close(a.done)
	var buf [8]byte
	for {
		if _, err := a.f.Read(buf[:]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
		}
		select {
		case a.c <- struct{}{}:
		default:
		}
	}
}

// close closes the timerfd and waits for run to return.
func (a *alarm) close() {
	a.f.Close()
	<-a.done
}

// sleep is an idle worker's wait: until the next timer is nearly due (see
// wakeLead), or, with frames the link did not take, txPoll; until a kick,
// a frame, a control message or stop otherwise. Within wakeLead of the
// next deadline it does not sleep but yields (to the goroutines of its P
// and to the threads of its CPU, osYield) and returns, so the loop polls
// through the last stretch. It returns false on stop.
func (w *worker) sleep(stop <-chan struct{}) bool {
	now := w.clk.now()
	at := int64(-1) // no deadline
	if when, ok := w.timers.next(); ok {
		if at = when - int64(wakeLead); at <= now {
			runtime.Gosched()
			osYield()
			return true
		}
	}
	if len(w.parked) > 0 && (at < 0 || w.parkedDue < at) {
		// Parked send rings to give back: wake for the sweep (at
		// most every ringLinger/sweepSpacing; with none left, no
		// deadline).
		at = max(w.parkedDue, now)
	}
	if w.txN > 0 && (at < 0 || at-now > int64(txPoll)) {
		// Frames the link did not take: offer them again soon,
		// whatever the next timer. (Sleeping until the timer left a
		// requester's burst queued for a whole ACK timeout, which then
		// counted against retry_cnt for frames never sent.)
		at = now + int64(txPoll)
	}
	var tc <-chan time.Time
	var ac <-chan struct{}
	d := time.Duration(-1)
	if at >= 0 {
		d = time.Duration(at - now)
		w.sleepTimer.Reset(d)
		tc = w.sleepTimer.C
		if w.alarm != nil {
			w.alarm.set(at)
			ac = w.alarm.c
		}
	}
	w.Counters.Sleeps.Add(1)
	if w.arm != nil {
		w.arm()
	}
	if w.sleepHook != nil {
		w.sleepHook(d)
	}
	ok := true
	select {
	case <-stop:
		ok = false
	case <-w.ctlWake:
		w.drainCtl()
	case <-w.kick:
	case <-w.link.Ready():
	case <-tc:
	case <-ac:
		w.alarm.expired()
	}
	w.Counters.Wakes.Add(1)
	w.sleepTimer.Stop()
	return ok
}
