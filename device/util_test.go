package device_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
)

const (
	timeout = 10 * time.Second
	tick    = 5 * time.Millisecond
)

func adminList[T any](t *testing.T, path string, op abi.Cmd) []T {
	t.Helper()
	a, err := device.DialAdmin(path)
	require.NoError(t, err)
	defer a.Close()
	items, err := device.ListAs[T](a, op)
	require.NoError(t, err)
	return items
}
