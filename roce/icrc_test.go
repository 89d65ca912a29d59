package roce

import (
	"bytes"
	"hash/crc32"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refICRC is the ICRC computed the plain way, straight from the Annex A17
// text: copy the IP packet, set the variant fields to ones, prepend 8
// bytes of ones and take the CRC-32 of everything before the ICRC.
func refICRC(ip []byte) uint32 {
	m := bytes.Clone(ip[:len(ip)-ICRCLen])
	var udp int
	if m[0]>>4 == 6 {
		m[0] |= 0x0f // traffic class, high nibble
		m[1], m[2], m[3] = 0xff, 0xff, 0xff
		m[7] = 0xff // hop limit
		udp = 40
	} else {
		m[1] = 0xff // TOS
		m[8] = 0xff // TTL
		m[10], m[11] = 0xff, 0xff
		udp = int(m[0]&0xf) * 4
	}
	m[udp+6], m[udp+7] = 0xff, 0xff // UDP checksum
	m[udp+8+4] = 0xff               // FECN, BECN, Resv6a
	return crc32.ChecksumIEEE(append(bytes.Repeat([]byte{0xff}, 8), m...))
}

// TestICRCMatchesReference checks the optimised ICRC against refICRC on
// every golden frame, IPv4 and IPv6, with and without an 802.1Q tag.
func TestICRCMatchesReference(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, c := range goldenCases(v6) {
			f := buildCase(t, c)
			var pkt Packet
			require.NoError(t, Parse(f, &pkt))
			ip := f[len(pkt.Eth):]
			assert.Equal(t, refICRC(ip), pkt.ICRC, c.name)
		}
	}
}

// TestICRCPseudoMatchesReference checks icrcPseudo against refICRC over a
// real IP and UDP header holding the pseudo header's values, for lengths
// that exercise every alignment of the tail.
func TestICRCPseudoMatchesReference(t *testing.T) {
	pairs := []Pseudo{
		{},
		{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("198.51.100.7"), SrcPort: 0xc123, DstPort: 4791},
		{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8:ffff::2"), SrcPort: 4791},
		{Src: netip.MustParseAddr("::ffff:10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 1},
	}
	for _, ps := range pairs {
		for n := 0; n < 40; n++ {
			body := make([]byte, BTHLen+n)
			for i := range body {
				body[i] = byte(i*37 + n)
			}
			tlen := len(body) + ICRCLen
			src, dst := ps.Src.Unmap(), ps.Dst.Unmap()
			dport := ps.DstPort
			if dport == 0 {
				dport = UDPPort
			}
			var hdr []byte
			if src.Is6() || dst.Is6() {
				hdr = make([]byte, IPv6HeaderLen+UDPHeaderLen)
				IPv6(hdr).Encode(&IPv6Fields{PayloadLength: uint16(UDPHeaderLen + tlen), NextHeader: ProtocolUDP, Src: addr16(src), Dst: addr16(dst)})
			} else {
				hdr = make([]byte, IPv4HeaderLen+UDPHeaderLen)
				IPv4(hdr).Encode(&IPv4Fields{TotalLength: uint16(IPv4HeaderLen + UDPHeaderLen + tlen), FlagsFragment: IPv4FlagDF, Protocol: ProtocolUDP, Src: addr4(src), Dst: addr4(dst)})
			}
			UDP(hdr[len(hdr)-UDPHeaderLen:]).Encode(&UDPFields{SrcPort: ps.SrcPort, DstPort: dport, Length: uint16(UDPHeaderLen + tlen)})
			ip := append(append(hdr, body...), 0, 0, 0, 0)
			assert.Equal(t, refICRC(ip), icrcPseudo(&ps, body), "%+v n=%d", ps, n)
		}
	}
}

// TestICRCSeed: the state after 8 bytes of ones is Linux rxe's starting
// value 0xdebb20e3 (rxe_icrc.c), in raw (not inverted) form.
func TestICRCSeed(t *testing.T) {
	assert.Equal(t, uint32(0xdebb20e3), ^icrcSeed)
}
