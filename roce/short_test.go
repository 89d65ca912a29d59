package roce

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBuildShortMatchesBuild builds random Short packets both ways, over
// IPv4 and IPv6 paths: BuildShort must write what Build writes.
func TestBuildShortMatchesBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	paths := []Path{
		{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 4791, DstPort: 4791},
		{Mode: ModeUDP, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 50000},
	}
	for i := range 2000 {
		p := &paths[i%len(paths)]
		s := Short{WriteOnly: rng.IntN(2) == 0, SE: rng.IntN(2) == 0, AckReq: rng.IntN(2) == 0,
			PKey: uint16(rng.Uint32()), DestQP: rng.Uint32(), PSN: rng.Uint32(),
			VA: rng.Uint64(), RKey: rng.Uint32(), DMALen: rng.Uint32()}
		n := rng.IntN(FuseMin)
		if i%7 == 0 {
			n = rng.IntN(9)
		}
		payload := make([]byte, n)
		for j := range payload {
			payload[j] = byte(rng.Uint32())
		}
		hl := s.ShortHeaderLen()
		got := make([]byte, 2048)
		for j := range got {
			got[j] = 0xa5 // garbage where pad goes
		}
		copy(got[hl:], payload)
		frame, ok := p.BuildShort(got, &s, n)
		require.True(t, ok)

		h := Headers{BTH: BTHFields{Opcode: OpRCSendOnly, SE: s.SE, AckReq: s.AckReq, PKey: s.PKey, DestQP: s.DestQP, PSN: s.PSN}}
		if s.WriteOnly {
			h.BTH.Opcode = OpRCWriteOnly
			h.RETH = RETHFields{VA: s.VA, RKey: s.RKey, DMALength: s.DMALen}
		}
		want := make([]byte, 2048)
		copy(want[hl:], payload)
		wframe, err := p.Build(want, hl, n, &h)
		require.NoError(t, err)
		require.Equal(t, wframe, frame, "packet %d (%+v, %d bytes)", i, s, n)
		var pkt Packet
		ps := p.Pseudo()
		require.NoError(t, ParseUDP(frame, &ps, &pkt), "the receiver's parse and ICRC check")
	}
}

// TestBuildShortRefuses: not ModeUDP, a payload of FuseMin or more, or a
// buffer too short: not built, buf untouched.
func TestBuildShortRefuses(t *testing.T) {
	s := Short{WriteOnly: true}
	udp := Path{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
	eth := udp
	eth.Mode = ModeEthernet
	buf := make([]byte, 64)
	_, ok := eth.BuildShort(buf, &s, 8)
	require.False(t, ok)
	_, ok = udp.BuildShort(make([]byte, 4096), &s, FuseMin)
	require.False(t, ok)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen+1)
	require.False(t, ok)
	require.Equal(t, make([]byte, 64), buf)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen)
	require.True(t, ok)
}
