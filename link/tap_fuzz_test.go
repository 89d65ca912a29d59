package link

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
)

// FuzzTAPClassify: roceDestQP reads any received frame without panicking
// or reading out of bounds, and accepts a frame only if the engine's
// parser finds a BTH with the same destination QP where it said (the
// parser may still reject it later, e.g. for its ICRC).
func FuzzTAPClassify(f *testing.F) {
	for i, v6 := range []bool{false, true} {
		f.Add(roceFrameFor(f, 0x1234+uint32(i), 7, 100, v6))
	}
	f.Add(roceFrameFor(f, 0x42, 1, 0, false)[:40])
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, frame []byte) {
		qpn, ok := roceDestQP(frame)
		if !ok {
			return
		}
		require.LessOrEqual(t, qpn, uint32(roce.PSNMask), "24-bit QPN")
		var pkt roce.Packet
		if err := roce.Parse(frame, &pkt); err == nil {
			assert.Equal(t, pkt.BTH.DestQP(), qpn)
		}
	})
}
