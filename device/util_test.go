package device_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

const (
	timeout = 10 * time.Second
	tick    = 5 * time.Millisecond
)

func adminList[T any](t *testing.T, path string, op abi.Cmd) []T {
	t.Helper()
	a, err := admin.Dial(path)
	require.NoError(t, err)
	defer a.Close()
	items, err := admin.ListAs[T](a, op)
	require.NoError(t, err)
	return items
}

// waitFor polls cond in the calling goroutine (unlike require.Eventually,
// it starts no goroutine, so it can wait for a goroutine count).
func waitFor(cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(tick)
	}
	return cond()
}
