package tap

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGIDTable(t *testing.T) {
	tbl, err := NewGIDTable([]netip.Addr{dev4, dev6, netip.MustParseAddr("::ffff:10.9.0.2"), netip.MustParseAddr("fe80::1%eth0")})
	require.NoError(t, err)
	require.Equal(t, 3, tbl.Len(), "the IPv4-mapped duplicate is dropped")

	cases := []struct {
		idx  int
		gid  string
		addr netip.Addr
		v4   bool
	}{
		{0, "::ffff:10.9.0.2", dev4, true},
		{1, "fd09::2", dev6, false},
		{2, "fe80::1", netip.MustParseAddr("fe80::1"), false},
	}
	for _, c := range cases {
		t.Run(c.gid, func(t *testing.T) {
			g, err := tbl.GID(c.idx)
			require.NoError(t, err)
			assert.Equal(t, c.gid, g.String())
			assert.Equal(t, c.addr, g.Addr())
			assert.Equal(t, c.v4, g.IsIPv4())
			i, ok := tbl.Index(GIDFromAddr(c.addr))
			assert.True(t, ok)
			assert.Equal(t, c.idx, i)
		})
	}
	_, err = tbl.GID(3)
	assert.ErrorIs(t, err, ErrGIDIndex)
	_, err = tbl.GID(-1)
	assert.ErrorIs(t, err, ErrGIDIndex)
	_, ok := tbl.Index(GIDFromAddr(peer4))
	assert.False(t, ok)

	rep := tbl.Report("vrnic0")
	assert.Equal(t, 4, strings.Count(rep, "\n"), "header and three entries:\n%s", rep)
	assert.Contains(t, rep, "vrnic0\t0\t::ffff:10.9.0.2")
	assert.Contains(t, rep, "IPv4 10.9.0.2")

	for _, bad := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.MustParseAddr("ff02::1")} {
		_, err := NewGIDTable([]netip.Addr{bad})
		assert.ErrorIs(t, err, ErrConfig, "%v", bad)
	}
}

func TestCreateRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
	}{
		{"no queues", Config{Queues: 0}},
		{"too many queues", Config{Queues: MaxQueues + 1}},
		{"MTU too small", Config{Queues: 1, MTU: 576}},
		{"MTU too large", Config{Queues: 1, MTU: 70000}},
		{"long name", Config{Queues: 1, Name: "a-very-long-interface-name"}},
		{"name template", Config{Queues: 1, Name: "tap%d"}},
		{"multicast MAC", Config{Queues: 1, MAC: MAC{0x01, 0, 0, 0, 0, 1}}},
		{"multicast link MAC", Config{Queues: 1, LinkMAC: MAC{0x33, 0x33, 0, 0, 0, 1}}},
		{"bad address", Config{Queues: 1, Addrs: []netip.Addr{netip.IPv6Unspecified()}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Create(c.cfg)
			assert.ErrorIs(t, err, ErrConfig)
		})
	}
}

func TestNeighborConfigTimeout(t *testing.T) {
	assert.Equal(t, "1.5s", NeighborConfig{}.Timeout().String())
	assert.Equal(t, "70ms", NeighborConfig{RetryInterval: 10e6, Attempts: 3}.Timeout().String())
}
