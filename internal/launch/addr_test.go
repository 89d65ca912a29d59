package launch

import (
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hold binds UDP port 4791 of a until the test ends.
func hold(t *testing.T, a netip.Addr) {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, RoCEPort)))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
}

func TestFreeLoopback(t *testing.T) {
	a, err := FreeLoopback()
	require.NoError(t, err)
	assert.True(t, a.Is4() && a.IsLoopback(), "%v", a)
	assert.False(t, netip.MustParsePrefix("127.0.0.0/16").Contains(a), "%v: 127.0.0.1 and 127.0.0.2 are the defaults", a)
	assert.True(t, UDPFree(a))
	hold(t, a)
	assert.False(t, UDPFree(a), "port 4791 of %v is bound", a)
}

func TestLoopbackPair(t *testing.T) {
	a, err := FreeLoopback()
	require.NoError(t, err)
	b, err := FreeLoopback()
	require.NoError(t, err)
	require.NotEqual(t, a, b)

	t.Run("both free", func(t *testing.T) {
		x, y, err := LoopbackPair(a, b)
		require.NoError(t, err)
		assert.Equal(t, a, x)
		assert.Equal(t, b, y)
	})
	t.Run("one taken", func(t *testing.T) {
		hold(t, b)
		x, y, err := LoopbackPair(a, b)
		require.NoError(t, err)
		assert.NotEqual(t, x, y)
		for _, z := range []netip.Addr{x, y} {
			assert.NotEqual(t, b, z)
			assert.True(t, z.IsLoopback(), "%v", z)
			assert.True(t, UDPFree(z), "%v", z)
		}
	})
}

// TestLoopbackPairZero: zero addresses ask for any two free ones, never
// the zero Addr back (which once passed the free check by binding
// 0.0.0.0:4791 when nothing else held the port).
func TestLoopbackPairZero(t *testing.T) {
	assert.False(t, UDPFree(netip.Addr{}))
	a, b, err := LoopbackPair(netip.Addr{}, netip.Addr{})
	require.NoError(t, err)
	assert.True(t, a.IsValid() && a.Is4() && a.IsLoopback(), "%v", a)
	assert.True(t, b.IsValid() && b.Is4() && b.IsLoopback(), "%v", b)
	assert.NotEqual(t, a, b)
}
