package hostile

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/verbs"
)

// opsPerUIDLimit reads limits.per_uid.<what> from the daemon's Info (0 when
// it has none).
func opsPerUIDLimit(t *testing.T, d *opsDaemon, what string) int {
	t.Helper()
	lim, _ := d.infoJSON(t)["limits"].(map[string]any)
	per, _ := lim["per_uid"].(map[string]any)
	v, _ := per[what].(float64)
	return int(v)
}

// TestOpsContextHog: one process (root's) opens contexts until the daemon
// refuses. With the default limits it must stop at its uid's share
// (EAGAIN), well below the device's contexts, so that a client of another
// uid (nobody) still opens a context and runs a command. Closing the hog
// gives everything back.
func TestOpsContextHog(t *testing.T) {
	e := opsSetup(t)
	d := e.opsStartDaemon(t, "hog0")
	info, err := d.adm.Info()
	require.NoError(t, err)
	devMax := info.Limits.PerDevice.Contexts
	require.Positive(t, devMax)

	var hog []*verbs.Context
	t.Cleanup(func() {
		for _, c := range hog {
			c.Close()
		}
	})
	var refusal error
	for len(hog) <= devMax {
		c, err := verbs.Open(d.socket, verbs.WithClientName("hog"))
		if err != nil {
			refusal = err
			break
		}
		hog = append(hog, c)
	}
	require.Error(t, refusal, "opened %d contexts", len(hog))
	assert.Less(t, len(hog), devMax, "one uid took all %d contexts of the device", devMax)
	assert.ErrorIs(t, refusal, syscall.EAGAIN, "refused by its uid's limit, not the device's: %v", refusal)
	assert.Contains(t, refusal.Error(), fmt.Sprintf("uid 0 holds %d contexts", len(hog)))
	assert.Equal(t, opsPerUIDLimit(t, d, "contexts"), len(hog), "the hog has exactly its uid's share")

	lines := e.opsRun(t, opsAsNobody, "open", d.socket)
	assert.Equal(t, []string{"open ok"}, lines, "another uid is not starved of contexts")

	for _, c := range hog {
		require.NoError(t, c.Close())
	}
	hog = nil
	d.opsCheckHealthy(t)
}

// TestOpsConnectionFlood: one uid (root's) opens connections; past its
// limit each one's first command is answered with EAGAIN and the
// connection is closed, while the ones admitted are served and a client of
// another uid (nobody) is served too. Closing the flood gives every
// descriptor back.
func TestOpsConnectionFlood(t *testing.T) {
	e := opsSetup(t)
	d := e.opsStartDaemon(t, "flood0")
	limit := opsPerUIDLimit(t, d, "connections")
	assert.Positive(t, limit, "the daemon reports no per-uid connection limit")
	n := max(limit+50, 200)

	var flood []*admin.Client
	t.Cleanup(func() {
		for _, c := range flood {
			c.Close()
		}
	})
	served, refused := 0, 0
	for range n {
		c, err := admin.Dial(d.socket)
		require.NoError(t, err)
		flood = append(flood, c)
		_, err = c.Info()
		switch {
		case err == nil:
			served++
		case errors.Is(err, syscall.EAGAIN):
			refused++
			assert.Contains(t, err.Error(), "control connections, its limit")
			_, err = c.Info()
			assert.Error(t, err, "a refused connection is closed")
		default:
			t.Fatalf("connection %d: %v", served+refused, err)
		}
	}
	require.Positive(t, refused, "uid 0 opened %d connections, none was refused", n)
	assert.Equal(t, limit-1, served, "admitted up to the limit (the operator's own connection is one)")
	assert.Equal(t, n-(limit-1), refused)
	info, err := d.adm.Info()
	require.NoError(t, err)
	assert.LessOrEqual(t, info.Connections, int64(limit))
	assert.GreaterOrEqual(t, d.counter(t, "connections_refused"), int64(refused))

	lines := e.opsRun(t, opsAsNobody, "open", d.socket)
	assert.Equal(t, []string{"open ok"}, lines, "another uid is served during the flood")

	for _, c := range flood {
		c.Close()
	}
	flood = nil
	d.opsCheckHealthy(t)
}
