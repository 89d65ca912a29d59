package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/osyield"
	"github.com/vrnic/vrnic/roce"
)

// sleepingEngine starts an engine of one worker on a link that takes every
// frame and delivers none; every sleep of the worker is reported on the
// returned channel with its wait (-1: none).
func sleepingEngine(t *testing.T) (*Engine, <-chan time.Duration) {
	return sleepingEngineWith(t, nil)
}

// sleepingEngineWith is sleepingEngine with set (if not nil) applied to
// the worker before it starts.
func sleepingEngineWith(t *testing.T, set func(*worker)) (*Engine, <-chan time.Duration) {
	e, err := New(Config{Links: []Link{&nullLink{ready: make(chan struct{}, 1)}}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	if set != nil {
		set(e.workers[0])
	}
	sleeps := make(chan time.Duration, 1024)
	e.workers[0].sleepHook = func(d time.Duration) {
		select {
		case sleeps <- d:
		default:
		}
	}
	e.Start()
	t.Cleanup(func() { _ = e.Close() })
	return e, sleeps
}

// nextSleep returns the wait of the worker's next sleep.
func nextSleep(t *testing.T, sleeps <-chan time.Duration) time.Duration {
	select {
	case d := <-sleeps:
		return d
	case <-time.After(waitFor):
		t.Fatal("the worker never went to sleep")
		return 0
	}
}

// TestIdleWorkerSleeps: a worker with nothing due sleeps with no deadline
// (no alarm, no polling: off the CPU until a kick, a frame or a control
// message); with an ACK timer armed far ahead it sleeps until wakeLead
// before it, in one sleep, not in a series of short waits.
func TestIdleWorkerSleeps(t *testing.T) {
	e, sleeps := sleepingEngine(t)
	assert.Equal(t, time.Duration(-1), nextSleep(t, sleeps), "nothing due: a sleep without deadline")
	c := &e.workers[0].Counters
	assert.Equal(t, c.Wakes.Load()+1, c.Sleeps.Load(), "asleep")

	// An RC QP in RTS whose WRITE goes nowhere: its ACK timer (code 20,
	// 4.3 s) is the only thing due.
	o := defaultOpts()
	o.timeout = 20
	qp := rtsQP(t, e, o)
	src := qp.n.buffer(8, 0x1000, abi.AccessAll, 1)
	qp.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: 0x1000, RKey: 1}, src.sge(0, 8))

	// Sleeps until the WRITE is out and the timer armed may have any
	// wait; then the worker sleeps once, until wakeLead before the timer.
	timeout := time.Duration(ackTimeout(o.timeout))
	for {
		d := nextSleep(t, sleeps)
		if d < 0 {
			continue // woken by the control messages or the kick, before the WRITE went out
		}
		assert.Greater(t, d, timeout-time.Second, "one sleep until the timer is nearly due")
		assert.LessOrEqual(t, d, timeout-wakeLead)
		break
	}
	// A worker that polled (short waits, or none) would report more
	// sleeps now; a stale wake-up left by the set-up may cost one more,
	// as long.
	window := time.After(20 * time.Millisecond)
	for n := 0; ; n++ {
		select {
		case d := <-sleeps:
			require.Less(t, n, 2, "the worker keeps waking up long before its timer")
			require.Greater(t, d, timeout-time.Second, "a short wait while only a far timer is due")
			continue
		case <-window:
		}
		break
	}
}

// TestAlarmNeverEarly: the alarm converts the engine's clock to the
// kernel's CLOCK_MONOTONIC; it never fires before the instant it was set
// for (a wrong sign or base would make it fire at once).
func TestAlarmNeverEarly(t *testing.T) {
	clk := newClock()
	a := newAlarm(clk)
	if a == nil {
		t.Skip("no timerfd")
	}
	go a.run()
	defer a.close()
	for _, d := range []time.Duration{0, 50 * time.Microsecond, time.Millisecond, 5 * time.Millisecond} {
		at := clk.now() + int64(d)
		a.set(at)
		<-a.c
		a.expired()
		assert.GreaterOrEqual(t, clk.now(), at, "alarm for +%v", d)
	}
}

// TestNearDeadlineYields: a worker whose next timer is due within
// wakeLead does not sleep but polls, and gives its CPU away each time
// (sched_yield), so that a responder the kernel woke onto the same CPU
// can answer before the deadline; with a later timer it sleeps and does
// not yield first.
func TestNearDeadlineYields(t *testing.T) {
	w, _ := fuzzWorker(t, roce.ModeEthernet)
	yields := 0
	osYield = func() { yields++ }
	t.Cleanup(func() { osYield = osyield.Yield })
	stop := make(chan struct{})

	near := timer{idx: -1}
	w.timers.set(&near, w.clk.now()+int64(wakeLead/2))
	require.True(t, w.sleep(stop))
	assert.Equal(t, 1, yields, "polling toward a deadline within wakeLead yields the CPU")
	require.True(t, w.sleep(stop))
	assert.Equal(t, 2, yields, "every pass")

	w.timers.stop(&near)
	w.sleepTimer = time.NewTimer(time.Hour) // as run makes it
	far := timer{idx: -1}
	w.timers.set(&far, w.clk.now()+int64(wakeLead)+int64(2*time.Millisecond))
	start := time.Now()
	require.True(t, w.sleep(stop))
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Millisecond, "a later deadline: the worker slept")
	assert.Equal(t, 2, yields, "no yield before a sleep")
}
