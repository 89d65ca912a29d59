package hostile

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestOpsAcceptEMFILE floods a daemon whose limit of open files is low
// (64) with more connections than it has descriptors: accept(2) fails with
// EMFILE. The daemon must not exit: it keeps serving the connections it
// has, pauses and retries its accepts, counts the failures, logs the burst
// (not every failure), and once the flood is gone serves a new client and
// holds no more descriptors than before.
func TestOpsAcceptEMFILE(t *testing.T) {
	e := opsSetup(t)
	d := e.opsStartDaemon(t, "emfile0")
	const limit = 64
	require.Less(t, d.baseline, limit-20, "the daemon needs too many descriptors for this probe")
	// Lowered once the daemon runs (it raises its soft limit to the hard
	// one at start); the hard limit too, so nothing raises it again.
	require.NoError(t, unix.Prlimit(d.proc.Pid(), unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil))

	var flood []*net.UnixConn
	t.Cleanup(func() {
		for _, c := range flood {
			c.Close()
		}
	})
	for range 3 * limit {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: d.socket, Net: "unixpacket"})
		if err != nil {
			break // the listen backlog is full
		}
		flood = append(flood, c)
	}
	require.Greater(t, len(flood), limit, "the flood must outnumber the daemon's descriptors")
	require.Eventually(t, func() bool {
		if !d.proc.Running() {
			return true
		}
		i, err := d.adm.Info()
		return err == nil && i.Counters["accept_errors"] > 0
	}, 10*time.Second, 10*time.Millisecond, "accept never failed (or the failures are not counted)")
	d.requireRunning(t)
	// Out of descriptors, the daemon still serves the connections it has.
	time.Sleep(300 * time.Millisecond)
	d.requireRunning(t)
	_, err := d.adm.Info()
	require.NoError(t, err, "the operator connection is served during the flood")

	for _, c := range flood {
		c.Close()
	}
	flood = nil
	d.opsCheckHealthy(t)
	errs := d.counter(t, "accept_errors")
	assert.Positive(t, errs)
	logs := d.log.String()
	bursts := strings.Count(logs, "accept failed")
	assert.Positive(t, bursts, "%s", logs)
	assert.Less(t, int64(bursts), errs, "logged per burst, not per failed accept")
	assert.Contains(t, logs, "too many open files")
	assert.Contains(t, logs, "accept works again")
	t.Logf("%d failed accepts in %d bursts", errs, bursts)
}
