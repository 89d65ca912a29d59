package doorbell

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// raceRig is one context with one QP record: a client goroutine posts
// through the client mapping, a poller consumes through the daemon one.
type raceRig struct {
	daemon, client *Page
	d, c           QPRecord
	seen           uint32
	poller         *Poller
}

func newRaceRig(t *testing.T, spin int, skipRecheck bool) *raceRig {
	r := &raceRig{daemon: newPage(t)}
	r.client = clientMap(t, r.daemon)
	i, err := r.daemon.Alloc()
	require.NoError(t, err)
	r.d, _ = r.daemon.QP(i)
	r.c, _ = r.client.QP(i)
	r.poller, err = NewPoller(PollerConfig{SpinBudget: spin, Poll: func() bool {
		pi := r.d.SQPI.Load()
		if pi == r.seen {
			return false
		}
		r.seen = pi
		r.d.SQCI.Store(pi)
		return true
	}})
	require.NoError(t, err)
	r.poller.skipRecheck = skipRecheck
	require.NoError(t, r.poller.Add(r.daemon))
	return r
}

// run posts n times, one at a time. Odd posts are made by the poller's
// hook at the worst moment: after its last empty pass and before it stores
// kick_needed, so the post sees kick_needed == 0 and does not kick (the
// interleaving that loses a wake-up unless the poller re-checks). Even
// posts come from the client goroutine after a random short delay, so they
// land anywhere in the poller's cycle. It returns the first post that was
// not consumed within the grace period (a lost wake-up), or 0.
func (r *raceRig) run(t *testing.T, n uint32, grace time.Duration) (lost uint32, kicks, hooked int) {
	var forced atomic.Uint32 // value the hook must post, 0: none
	var forcedKicks atomic.Int64
	r.poller.hookBeforeArm = func() {
		if v := forced.Swap(0); v != 0 {
			kicked, err := r.client.Ring(r.c.SQPI, v)
			if err != nil || kicked {
				forcedKicks.Add(1)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, r.poller.Run(ctx))
	}()
	defer func() {
		cancel()
		wg.Wait()
		r.poller.Close()
	}()
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	var sink atomic.Uint64
	for i := uint32(1); i <= n; i++ {
		post := true
		if i%2 == 1 && r.poller.cfg.SpinBudget == 0 {
			// Hand the post to the hook; wake the poller (without posting)
			// in case it is already asleep, so it passes the hook again.
			forced.Store(i)
			require.NoError(t, r.poller.Wake())
			post = false
			hooked++
		}
		if post {
			for k := delay(rng); k > 0; k-- {
				sink.Add(1)
			}
			kicked, err := r.client.Ring(r.c.SQPI, i)
			require.NoError(t, err)
			if kicked {
				kicks++
			}
		}
		deadline := time.Now().Add(grace)
		for spins := 0; r.c.SQCI.Load() != i; spins++ {
			if spins%64 == 0 && time.Now().After(deadline) {
				return i, kicks, hooked
			}
			if spins > 1000 {
				time.Sleep(time.Microsecond)
			}
		}
	}
	assert.Zero(t, forcedKicks.Load(), "posts made before kick_needed is stored do not kick")
	return 0, kicks, hooked
}

// TestPollerNoLostWakeup races many posts against the poller going to
// sleep (spin budget 0: it tries to sleep after every empty pass), half of
// them forced into the window between its last empty pass and its
// kick_needed store. Every post must be consumed; without the re-check the
// first forced post is lost (see TestPollerWithoutRecheckLosesWakeups).
func TestPollerNoLostWakeup(t *testing.T) {
	n := uint32(20000)
	if testing.Short() {
		n = 5000
	}
	r := newRaceRig(t, 0, false)
	lost, kicks, hooked := r.run(t, n, 5*time.Second)
	assert.Zero(t, lost, "post %d was never consumed: lost wake-up", lost)
	st := r.poller.Stats()
	t.Logf("posts %d (%d in the arm window), client kicks %d, poller sleeps %d, re-checks that found work %d",
		n, hooked, kicks, st.Sleeps, st.Rechecks)
	assert.Positive(t, st.Sleeps, "the poller did sleep")
	assert.Greater(t, hooked, int(n/10), "many posts landed in the window")
	assert.GreaterOrEqual(t, st.Rechecks, uint64(hooked), "every post in the window was found by the re-check")
}

// TestPollerWithoutRecheckLosesWakeups runs the same race with the re-check
// disabled and requires a lost wake-up: proof that the test above detects
// a poller that forgets to re-check.
func TestPollerWithoutRecheckLosesWakeups(t *testing.T) {
	r := newRaceRig(t, 0, true)
	lost, _, _ := r.run(t, 1000, 200*time.Millisecond)
	assert.NotZero(t, lost, "expected a lost wake-up without the re-check")
	t.Logf("without the re-check, post %d was lost", lost)
}

func TestPollerBusyPollsWithoutKicks(t *testing.T) {
	r := newRaceRig(t, 1<<30, false) // never sleeps
	lost, kicks, _ := r.run(t, 2000, 5*time.Second)
	assert.Zero(t, lost)
	assert.Zero(t, kicks, "a busy-polling daemon never asks for a kick")
	assert.Zero(t, r.poller.Stats().Sleeps)
}

func TestPollerAddRemove(t *testing.T) {
	pages := []*Page{newPage(t), newPage(t), newPage(t)}
	var recs []QPRecord
	for _, p := range pages {
		i, err := p.Alloc()
		require.NoError(t, err)
		rec, _ := p.QP(i)
		recs = append(recs, rec)
	}
	var mu sync.Mutex
	active := map[int]bool{}
	seen := make([]uint32, len(pages))
	poller, err := NewPoller(PollerConfig{Poll: func() bool {
		mu.Lock()
		defer mu.Unlock()
		work := false
		for i := range pages {
			if !active[i] {
				continue
			}
			if pi := recs[i].SQPI.Load(); pi != seen[i] {
				seen[i] = pi
				recs[i].SQCI.Store(pi)
				work = true
			}
		}
		return work
	}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- poller.Run(ctx) }()
	for i, p := range pages {
		mu.Lock()
		active[i] = true
		mu.Unlock()
		require.NoError(t, poller.Add(p))
	}
	waitCI := func(rec QPRecord, v uint32) bool {
		deadline := time.Now().Add(5 * time.Second)
		for rec.SQCI.Load() != v {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(50 * time.Microsecond)
		}
		return true
	}
	for round := uint32(1); round <= 50; round++ {
		for i, p := range pages {
			_, err := p.Ring(recs[i].SQPI, round)
			require.NoError(t, err)
			require.True(t, waitCI(recs[i], round), "page %d round %d", i, round)
		}
	}
	require.NoError(t, poller.Remove(pages[1]))
	assert.Zero(t, pages[1].KickNeeded().Load())
	require.NoError(t, pages[1].Close()) // safe: the poller no longer touches it
	mu.Lock()
	active[1] = false
	mu.Unlock()
	for _, i := range []int{0, 2} {
		_, err := pages[i].Ring(recs[i].SQPI, 100)
		require.NoError(t, err)
		require.True(t, waitCI(recs[i], 100))
	}
	cancel()
	require.NoError(t, <-done)
	assert.Zero(t, pages[0].KickNeeded().Load(), "kick_needed cleared when the poller stops")
	require.NoError(t, poller.Close())
}

// delay picks how long the client works before its next post, in atomic
// increments: mostly a few hundred nanoseconds, so posts land around the
// moment the poller, having consumed the previous one, goes to sleep.
func delay(rng *rand.Rand) int {
	if rng.IntN(4) == 0 {
		return rng.IntN(3000)
	}
	return rng.IntN(50)
}
