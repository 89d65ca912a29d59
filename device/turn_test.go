package device_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
)

// TestUIDTurn: the connections of one uid take turns on the control path.
// While the uid's turn is held, a command on another of its connections
// is not handled (nor is a connection's teardown done); once it is given
// back, both are.
func TestUIDTurn(t *testing.T) {
	s := startServer(t, device.Limits{})
	a, err := admin.Dial(s.SocketPath)
	require.NoError(t, err)
	defer a.Close()
	_, err = a.Info()
	require.NoError(t, err)
	c := open(t, s)
	counts := s.Device.Counters()

	release, ok := s.Device.TakeTurn(uint32(os.Geteuid()))
	require.True(t, ok)
	before := counts.Commands.Load()
	done := make(chan error, 1)
	go func() {
		_, err := a.Info()
		done <- err
	}()
	require.NoError(t, c.Close())
	assert.Never(t, func() bool { return counts.Commands.Load() != before || len(done) > 0 },
		100*time.Millisecond, 5*time.Millisecond, "a command handled while its uid's turn was held")
	assert.Equal(t, 1, s.Device.Counts().Contexts, "a teardown done while its uid's turn was held")

	release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the command was not handled once the turn was given back")
	}
	require.Eventually(t, func() bool { return s.Device.Counts().Contexts == 0 }, timeout, tick, "the teardown once the turn was given back")
}
