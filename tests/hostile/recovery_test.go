package hostile

// What the load probes (flood, SIGKILL, fairness) measure before the
// hostile clients come and check after they are gone: a well-behaved
// victim (memVictim) works on the daemon throughout; once the hostile
// clients are gone the daemon holds what it held with the victim alone.

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
)

// Bounds on what the daemon may keep of the hostile clients once they are
// gone: its RSS (the Go heap is returned to the kernel lazily) and its
// locked memory, above the baseline.
const (
	loadRSSSlack = 64 << 20
	loadLckSlack = 4 << 20
)

// loadBase is the daemon with the victim working and no hostile client.
type loadBase struct {
	fds  int
	mem  memStatus
	info admin.Info
}

// loadBaseline starts the victim's steps and, once it has done a few,
// takes the baseline.
func loadBaseline(t testing.TB, d *opsDaemon, v *memVictim) loadBase {
	t.Helper()
	v.start()
	loadWaitSteps(t, v, 20, 20*time.Second)
	var b loadBase
	var err error
	b.info, err = d.adm.Info()
	require.NoError(t, err)
	b.fds = opsFdCount(t, d.proc.Pid())
	b.mem = memHelperStatus(t, d.proc.Pid())
	return b
}

// loadWaitSteps waits until the victim has done n more steps, and fails t
// if it fails or does not get there within timeout.
func loadWaitSteps(t testing.TB, v *memVictim, n int, timeout time.Duration) {
	t.Helper()
	from, _ := v.progress()
	var ops int
	var st memVictimStats
	require.Eventually(t, func() bool {
		ops, st = v.progress()
		return ops >= from+n || st.err != nil
	}, timeout, 5*time.Millisecond, "the victim did %d steps in %v, want %d", ops-from, timeout, n)
	require.NoError(t, st.err, "the victim failed")
}

// counterDelta returns how much the daemon's counter name grew since the
// baseline; a counter the daemon does not have fails t.
func (b loadBase) counterDelta(t testing.TB, now admin.Info, name string) int64 {
	t.Helper()
	v, ok := now.Counters[name]
	if !ok {
		t.Errorf("the daemon has no %q counter", name)
	}
	return v - b.info.Counters[name]
}

// loadCheckRecovered checks, once every hostile client is gone, that the
// victim goes on with its memory intact, that the daemon holds only the
// victim's contexts and resources, its connections and descriptors of the
// baseline and about its memory, and that it logged no panic.
func loadCheckRecovered(t testing.TB, d *opsDaemon, v *memVictim, b loadBase) {
	t.Helper()
	d.requireRunning(t)
	loadWaitSteps(t, v, 10, 20*time.Second)

	d.waitHolding(t, b.info.Connections, b.info.Resources, 20*time.Second) // the victim's alone
	ctxs, err := admin.ListAs[admin.ContextInfo](d.adm, admin.ContextsCmd)
	require.NoError(t, err)
	for _, c := range ctxs {
		assert.Equal(t, "victim", c.Client, "a context besides the victim's: %+v", c)
	}

	var fds int
	assert.Eventually(t, func() bool {
		fds = opsFdCount(t, d.proc.Pid())
		return fds <= b.fds
	}, 10*time.Second, 10*time.Millisecond, "daemon fds: %d, with the victim alone %d", fds, b.fds)
	var m memStatus
	assert.Eventually(t, func() bool {
		m = memHelperStatus(t, d.proc.Pid())
		return m.rss <= b.mem.rss+loadRSSSlack && m.lck <= b.mem.lck+loadLckSlack
	}, 20*time.Second, 50*time.Millisecond, "daemon memory: %v, with the victim alone %v", m, b.mem)
	t.Logf("after the hostile clients: %d fds (%d with the victim alone), %v (%v)", fds, b.fds, m, b.mem)

	loadWaitSteps(t, v, 10, 20*time.Second)
	d.requireRunning(t)
	loadNoPanic(t, d)
}

// loadNoPanic fails t if the daemon's log shows a panic or a fatal
// runtime error.
func loadNoPanic(t testing.TB, d *opsDaemon) {
	t.Helper()
	logs := d.log.String()
	for _, bad := range []string{"panic:", "fatal error:", "goroutine "} {
		assert.NotContains(t, logs, bad, "the daemon's log")
	}
	if t.Failed() && !strings.Contains(logs, "vrnicd started") {
		t.Logf("daemon log:\n%s", logs)
	}
}
