package abi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestECEString(t *testing.T) {
	for opts, want := range map[uint32]string{
		0: "none", ECESelectiveRepeat: "sr", ECEAdaptiveRTO: "rto", ECEOptions: "sr,rto",
		ECESelectiveRepeat | 1<<8: "sr,0x100", 1 << 31: "0x80000000",
	} {
		assert.Equal(t, want, ECEString(opts), "%#x", opts)
	}
}

func TestParseECE(t *testing.T) {
	for in, want := range map[string]uint32{
		"": 0, "none": 0, "0": 0, "sr": ECESelectiveRepeat, "rto": ECEAdaptiveRTO, "sr,rto": ECEOptions,
		" rto , sr ": ECEOptions, "all": ECEOptions, "selective-repeat": ECESelectiveRepeat,
		"adaptive-rto,": ECEAdaptiveRTO, "none,sr": ECESelectiveRepeat,
	} {
		got, err := ParseECE(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"SR", "sack", "sr,rto,x", "1"} {
		_, err := ParseECE(in)
		assert.ErrorContains(t, err, "want sr, rto, all or none", "%q", in)
	}
	// Every named option round-trips.
	for _, n := range eceNames {
		got, err := ParseECE(ECEString(n.bit))
		require.NoError(t, err)
		assert.Equal(t, n.bit, got)
	}
	assert.Equal(t, ECEOptions, func() uint32 {
		var all uint32
		for _, n := range eceNames {
			all |= n.bit
		}
		return all
	}(), "every option has a name")
}
