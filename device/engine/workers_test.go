package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

// TestWorkers: each QP lives on the worker its QPN hashes to
// (roce.SteerQueue, the hash the UDP and TAP steering programs use, so
// a QP's frames arrive on its owner's queue); an idle worker polls a
// little, then sleeps (no timer armed: it stays asleep) and a kick for
// one of its QPs wakes it.
func TestWorkers(t *testing.T) {
	const n = 4
	links := make([]Link, n)
	for i := range links {
		links[i] = &nullLink{ready: make(chan struct{}, 1)}
	}
	e, err := New(Config{Links: links, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	e.Start()
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	for qpn := uint32(1); qpn <= 64; qpn++ {
		_, err := e.CreateQP(QPConfig{QPN: qpn * 0x1357, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16),
			RecvCQ: newFakeCQ(16), Mem: newFakeMem(), SQDepth: 16})
		require.NoError(t, err)
	}
	// Every worker asleep (Sleeps ahead of Wakes) with nothing left to
	// wake it: CreateQP does not wait for the workers, so first a query
	// of every QP (which does) takes the last control messages.
	for qpn := uint32(1); qpn <= 64; qpn++ {
		_, err := e.Counters(qpn * 0x1357)
		require.NoError(t, err)
	}
	asleep := func() bool {
		for i := range n {
			if c := e.WorkerCounters(i); c.Sleeps.Load() <= c.Wakes.Load() {
				return false
			}
		}
		return true
	}
	require.Eventually(t, asleep, 10*time.Second, time.Millisecond, "idle workers go to sleep")
	var before [n]uint64
	for i := range n {
		before[i] = e.WorkerCounters(i).Sleeps.Load()
	}
	time.Sleep(50 * time.Millisecond)
	for i := range n {
		assert.LessOrEqual(t, e.WorkerCounters(i).Sleeps.Load(), before[i]+1, "worker %d sleeps instead of polling", i)
		before[i] = e.WorkerCounters(i).Sleeps.Load()
	}
	// A kick wakes the owner of the QP: it polls again, then sleeps again.
	qpn := uint32(5 * 0x1357)
	owner := roce.SteerQueue(qpn, n)
	e.Kick(qpn)
	require.Eventually(t, func() bool { return e.WorkerCounters(owner).Sleeps.Load() > before[owner] }, 10*time.Second, time.Millisecond,
		"the kick woke worker %d", owner)

	require.NoError(t, e.Close())
	closed = true
	perWorker := make([]int, n)
	for i, w := range e.workers {
		for q := range w.qps {
			assert.Equal(t, roce.SteerQueue(q, n), i, "QP %#x on worker %d", q, i)
			assert.Same(t, w, w.qps[q].w, "QP %#x: its timers are its worker's", q)
			perWorker[i]++
		}
	}
	for i, k := range perWorker {
		assert.NotZero(t, k, "64 QPs spread over every worker (%d)", i)
	}
}
