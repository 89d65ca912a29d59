package cm

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of a Manager: the daemon passes SystemClock,
// tests a FakeClock they advance by hand.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f once, in a goroutine of the clock's choosing,
	// when d has passed, unless the returned Timer is stopped first.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether
	// it did.
	Stop() bool
}

// SystemClock is the real clock (time.Now, time.AfterFunc).
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var _ Clock = SystemClock{}

// FakeClock is a Clock that only moves when Advance is called. Timers due
// by the new time run in Advance's goroutine, in order of their due time
// (then of their creation), with no lock of the clock held, so they may
// create and stop timers. It is safe for concurrent use.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*fakeTimer
}

type fakeTimer struct {
	c    *FakeClock
	when time.Time
	seq  uint64
	f    func()
	done bool
}

// NewFakeClock returns a FakeClock reading start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, when: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	return true
}

// Advance moves the clock forward by d, running every timer that falls
// due on the way at its own due time.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		live := c.timers[:0]
		for _, t := range c.timers {
			if !t.done {
				live = append(live, t)
			}
		}
		c.timers = live
		sort.Slice(c.timers, func(i, j int) bool {
			a, b := c.timers[i], c.timers[j]
			if !a.when.Equal(b.when) {
				return a.when.Before(b.when)
			}
			return a.seq < b.seq
		})
		if len(c.timers) == 0 || c.timers[0].when.After(end) {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		t.done = true
		if t.when.After(c.now) {
			c.now = t.when
		}
		c.mu.Unlock()
		t.f()
	}
}

// Pending returns how many timers have not fired or been stopped.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.done {
			n++
		}
	}
	return n
}

// NextDue returns how long until the next pending timer, and false when
// there is none.
func (c *FakeClock) NextDue() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var best *fakeTimer
	for _, t := range c.timers {
		if !t.done && (best == nil || t.when.Before(best.when)) {
			best = t
		}
	}
	if best == nil {
		return 0, false
	}
	return best.when.Sub(c.now), true
}
