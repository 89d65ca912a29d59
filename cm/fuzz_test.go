package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecode feeds arbitrary bytes to Decode: it must never panic, and
// whatever it accepts must encode back to a MAD that decodes to the same
// message, with the same header.
func FuzzDecode(f *testing.F) {
	for _, m := range []Message{sampleREQ(), &MRA{}, &REJ{Reason: 1}, &REP{}, &RTU{}, &DREQ{}, &DREP{}, &SIDRReq{}, &SIDRRep{}} {
		mad, err := Marshal(0x1234, 5, m)
		require.NoError(f, err)
		f.Add(mad)
	}
	f.Add([]byte{})
	f.Add(make([]byte, MADLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, m, err := Decode(b)
		if err != nil {
			require.Nil(t, m)
			return
		}
		mad, err := Marshal(h.TID, h.AttrModifier, m)
		require.NoError(t, err, "a decoded message must encode")
		h2, m2, err := Decode(mad)
		require.NoError(t, err)
		require.Equal(t, m, m2)
		h.Status, h.ClassSpecific = 0, 0 // not part of the CM message
		require.Equal(t, h, h2)
	})
}
