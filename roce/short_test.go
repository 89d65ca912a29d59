package roce

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBuildShortMatchesBuild builds random Short packets both ways, over
// IPv4 and IPv6 paths: BuildShort must write what Build writes. Packets
// come in runs of four on one path, mostly of one length, so that each
// path's PseudoTx serves from its kept state; every fifth goes without.
func TestBuildShortMatchesBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	paths := []Path{
		{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 4791, DstPort: 4791},
		{Mode: ModeUDP, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 50000},
	}
	var pts [2]PseudoTx
	n, hits := 0, 0
	for i := range 2000 {
		p := &paths[i/4%len(paths)]
		pt := &pts[i/4%len(paths)]
		if i%5 == 0 {
			pt = nil
		}
		s := Short{WriteOnly: i/4%3 != 0, SE: rng.IntN(2) == 0, AckReq: rng.IntN(2) == 0,
			PKey: uint16(rng.Uint32()), DestQP: rng.Uint32(), PSN: rng.Uint32(),
			VA: rng.Uint64(), RKey: rng.Uint32(), DMALen: rng.Uint32()}
		if i%4 == 0 || i%11 == 0 {
			n = rng.IntN(FuseMin)
			if i%7 == 0 {
				n = rng.IntN(9)
			}
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
		if pt != nil && pt.tlen == hl+n+(-n&3)+ICRCLen && pt.ps == p.Pseudo() {
			hits++
		}
		frame, ok := p.BuildShort(got, &s, n, pt)
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
	require.Greater(t, hits, 500, "packets built from a kept pseudo header state")
}

// TestBuildShortRefuses: not ModeUDP, a payload of FuseMin or more, or a
// buffer too short: not built, buf untouched.
func TestBuildShortRefuses(t *testing.T) {
	s := Short{WriteOnly: true}
	udp := Path{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
	eth := udp
	eth.Mode = ModeEthernet
	buf := make([]byte, 64)
	_, ok := eth.BuildShort(buf, &s, 8, nil)
	require.False(t, ok)
	_, ok = udp.BuildShort(make([]byte, 4096), &s, FuseMin, nil)
	require.False(t, ok)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen+1, nil)
	require.False(t, ok)
	require.Equal(t, make([]byte, 64), buf)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen, &PseudoTx{})
	require.True(t, ok)
}
