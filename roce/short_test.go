package roce

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBuildShortMatchesBuild builds random Short packets both ways, over
// IPv4 and IPv6 paths of both modes (Ethernet with and without VLAN, DF
// and UDP checksum): BuildShort must write what Build writes, and Parse
// must take it. Packets come in runs of four on one path, mostly of one
// length, so that each path's PseudoTx serves from its kept state; in
// ModeUDP every fifth goes without one. Two of the Ethernet paths share a
// PseudoTx, so its link headers change path between runs.
func TestBuildShortMatchesBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	mac1, mac2 := [6]byte{2, 0, 0, 0, 0, 1}, [6]byte{2, 0, 0, 0, 0, 2}
	paths := []Path{
		{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 4791, DstPort: 4791},
		{Mode: ModeUDP, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 50000},
		{Mode: ModeEthernet, SrcMAC: mac1, DstMAC: mac2, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
			SrcPort: 49152, TOS: 0x68, TTL: 64, DontFragment: true},
		{Mode: ModeEthernet, SrcMAC: mac2, DstMAC: mac1, Src: netip.MustParseAddr("::ffff:10.0.0.2"), Dst: netip.MustParseAddr("::ffff:10.0.0.1"),
			SrcPort: 50001, TTL: 1, VLAN: true, VLANTCI: 0x6007, UDPChecksum: true},
		{Mode: ModeEthernet, SrcMAC: mac1, DstMAC: mac2, Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"),
			SrcPort: 50002, TOS: 0xb8, TTL: 255, FlowLabel: 0xabcde},
	}
	pts := make([]PseudoTx, len(paths))
	n := 0
	var hits, ethHits [2]int
	for i := range 4000 {
		k := i / 4 % len(paths)
		p := &paths[k]
		pt := &pts[k]
		if k == 4 {
			pt = &pts[3] // paths 3 and 4 share one
		}
		if i%5 == 0 && p.Mode == ModeUDP {
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
		off, ok := p.ShortOffset(&s, pt)
		require.True(t, ok)
		require.Equal(t, p.Headroom(OpRCSendOnly)+s.ShortHeaderLen()-BTHLen, off, "the payload's place")
		tlen := s.ShortHeaderLen() + n + (-n & 3) + ICRCLen
		got := make([]byte, 2048)
		for j := range got {
			got[j] = 0xa5 // garbage where pad and headers go
		}
		copy(got[off:], payload)
		if pt != nil && p.Mode == ModeUDP && pt.tlen == tlen && pt.ps == p.Pseudo() {
			hits[0]++
		}
		if p.Mode == ModeEthernet && pt.etlen == tlen {
			hits[1]++
			if pt.eok && p.IPv6() {
				ethHits[1]++
			} else if pt.eok {
				ethHits[0]++
			}
		}
		frame, ok := p.BuildShort(got, &s, n, pt)
		require.True(t, ok)

		h := Headers{BTH: BTHFields{Opcode: OpRCSendOnly, SE: s.SE, AckReq: s.AckReq, PKey: s.PKey, DestQP: s.DestQP, PSN: s.PSN}}
		if s.WriteOnly {
			h.BTH.Opcode = OpRCWriteOnly
			h.RETH = RETHFields{VA: s.VA, RKey: s.RKey, DMALength: s.DMALen}
		}
		want := make([]byte, 2048)
		copy(want[off:], payload)
		wframe, err := p.Build(want, off, n, &h)
		require.NoError(t, err)
		require.Equal(t, wframe, frame, "packet %d on path %d (%+v, %d bytes)", i, k, s, n)
		var pkt Packet
		if p.Mode == ModeUDP {
			ps := p.Pseudo()
			require.NoError(t, ParseUDP(frame, &ps, &pkt), "the receiver's parse and ICRC check")
		} else {
			require.NoError(t, Parse(frame, &pkt), "the receiver's parse and ICRC check")
		}
		require.Equal(t, payload, pkt.Payload)
	}
	require.Greater(t, hits[0], 500, "ModeUDP packets built from a kept pseudo header state")
	require.Greater(t, hits[1], 500, "ModeEthernet packets after one of the same path and length")
	require.Greater(t, ethHits[0], 100, "IPv4 ModeEthernet packets built from a kept state")
	require.Greater(t, ethHits[1], 100, "IPv6 ModeEthernet packets built from a kept state")
}

// TestBuildShortRefuses: ModeEthernet without a PseudoTx or without
// ShortOffset's preparation for the path, a payload of FuseMin or more,
// or a buffer too short: not built, buf untouched.
func TestBuildShortRefuses(t *testing.T) {
	s := Short{WriteOnly: true}
	udp := Path{Mode: ModeUDP, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
	eth := udp
	eth.Mode = ModeEthernet
	buf := make([]byte, 64)
	_, ok := eth.BuildShort(buf, &s, 8, nil)
	require.False(t, ok)
	_, ok = eth.ShortOffset(&s, nil)
	require.False(t, ok)
	var pt PseudoTx
	_, ok = eth.BuildShort(make([]byte, 256), &s, 8, &pt)
	require.False(t, ok, "not prepared by ShortOffset")
	other := eth
	_, ok = other.ShortOffset(&s, &pt)
	require.True(t, ok)
	_, ok = eth.BuildShort(make([]byte, 256), &s, 8, &pt)
	require.False(t, ok, "prepared for another path")
	// A path changed in place, after Forget: the new headers.
	path := eth
	_, ok = path.ShortOffset(&s, &pt)
	require.True(t, ok)
	pt.Forget()
	path.DstMAC[5], path.TTL = 9, 3
	off, ok := path.ShortOffset(&s, &pt)
	require.True(t, ok)
	got, ok := path.BuildShort(make([]byte, 256), &s, 8, &pt)
	require.True(t, ok)
	h := Headers{BTH: BTHFields{Opcode: OpRCWriteOnly}}
	want, err := path.Build(make([]byte, 256), off, 8, &h)
	require.NoError(t, err)
	require.Equal(t, want, got)
	bad := eth
	bad.Dst = netip.MustParseAddr("fd00::2")
	_, ok = bad.ShortOffset(&s, &pt)
	require.False(t, ok, "a path of two families")
	_, ok = udp.BuildShort(make([]byte, 4096), &s, FuseMin, nil)
	require.False(t, ok)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen+1, nil)
	require.False(t, ok)
	require.Equal(t, make([]byte, 64), buf)
	_, ok = udp.BuildShort(buf, &s, 64-BTHLen-RETHLen-ICRCLen, &PseudoTx{})
	require.True(t, ok)
}

// TestPathSame: Path.same tells apart two paths that differ in any one
// field, whichever it is (a field added to Path and not to same fails
// here).
func TestPathSame(t *testing.T) {
	p := Path{Mode: ModeEthernet, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}
	q := p
	require.True(t, p.same(&q))
	pv := reflect.ValueOf(&q).Elem()
	for i := range pv.NumField() {
		q = p
		f := pv.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Uint8, reflect.Uint16, reflect.Uint32:
			f.SetUint(f.Uint() + 1)
		case reflect.Array:
			f.Index(f.Len() - 1).SetUint(1)
		case reflect.Struct: // netip.Addr
			f.Set(reflect.ValueOf(netip.MustParseAddr("10.0.0.3")))
		default:
			t.Fatalf("field %s of kind %v: teach this test to change it", pv.Type().Field(i).Name, f.Kind())
		}
		require.False(t, p.same(&q), "paths differing in %s", pv.Type().Field(i).Name)
		require.NotEqual(t, p, q)
	}
}
