package engine

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

// TestNewAHFlowLabel: the AH keeps the AV's u32 flow label as given (UCX's
// ud_verbs passes 0xffffffff), and the path its packets are built from
// carries the low 20 bits, which is what the IPv6 header holds (Linux:
// ip6_flow_hdr).
func TestNewAHFlowLabel(t *testing.T) {
	e, err := New(Config{Links: []Link{&nullLink{ready: make(chan struct{}, 1)}}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	for _, tc := range []struct {
		label, wire uint32
	}{
		{0, 0},
		{0xabcde, 0xabcde},
		{0xfffff, 0xfffff},
		{0x100000, 0},
		{0xffffffff, 0xfffff},
		{0x12345678, 0x45678},
	} {
		a, err := e.NewAH(AHAttr{Local: netip.MustParseAddr("fd00::1"), Remote: netip.MustParseAddr("fd00::2"),
			FlowLabel: tc.label, TrafficClass: 0xb8, HopLimit: 3})
		require.NoError(t, err)
		assert.Equal(t, tc.label, a.Attr().FlowLabel, "stored as given")
		assert.Equal(t, tc.wire, a.path.FlowLabel, "label %#x on the wire", tc.label)
		assert.Equal(t, uint8(0xb8), a.path.TOS)
		assert.Equal(t, uint8(3), a.path.TTL)

		// The header built from the path carries the masked label and
		// the traffic class untouched.
		var h [40]byte
		roce.IPv6(h[:]).Encode(&roce.IPv6Fields{TrafficClass: a.path.TOS, FlowLabel: a.path.FlowLabel,
			HopLimit: a.path.TTL, NextHeader: roce.ProtocolUDP})
		assert.Equal(t, tc.wire, roce.IPv6(h[:]).FlowLabel())
		assert.Equal(t, uint8(0xb8), roce.IPv6(h[:]).TrafficClass())
		assert.Equal(t, uint8(6), h[0]>>4, "version")
	}
}
