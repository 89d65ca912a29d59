package roce

import (
	"bytes"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// realFrame is one frame of the real-traffic vectors.
type realFrame struct {
	name  string
	frame []byte
}

// loadRxeFrames returns the Ethernet frames of every rxe capture,
// including the non-RoCE ones (ARP, TCP).
func loadRxeFrames(t testing.TB) []realFrame {
	t.Helper()
	files, err := filepath.Glob("testdata/rxe/*.pcap")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	var out []realFrame
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		pr, err := NewPcapReader(bytes.NewReader(b))
		require.NoError(t, err, f)
		require.Equal(t, uint32(LinkTypeEthernet), pr.LinkType(), f)
		for i := 0; ; i++ {
			_, data, err := pr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err, f)
			out = append(out, realFrame{name: filepath.Base(f) + "#" + itoa(i), frame: bytes.Clone(data)})
		}
	}
	return out
}

// loadConnectXFrames parses testdata/connectx_vectors.txt.
func loadConnectXFrames(t testing.TB) []realFrame {
	t.Helper()
	b, err := os.ReadFile("testdata/connectx_vectors.txt")
	require.NoError(t, err)
	var out []realFrame
	var cur *realFrame
	var hexs strings.Builder
	flush := func() {
		if cur != nil {
			fr, err := hex.DecodeString(hexs.String())
			require.NoError(t, err, cur.name)
			cur.frame = fr
			out = append(out, *cur)
		}
		hexs.Reset()
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			flush()
			cur = &realFrame{name: strings.Trim(line, "[]")}
		default:
			hexs.WriteString(strings.Join(strings.Fields(line), ""))
		}
	}
	flush()
	require.Len(t, out, 3)
	return out
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestRealTrafficParses(t *testing.T) {
	frames := append(loadRxeFrames(t), loadConnectXFrames(t)...)
	roce := 0
	for _, f := range frames {
		var pkt Packet
		err := Parse(f.frame, &pkt)
		if errors.Is(err, ErrRoCEv1) {
			t.Logf("%s: RoCE v1, skipped: vrnic speaks RoCE v2 only", f.name)
			continue
		}
		if isRoCEv2(f.frame) {
			roce++
			if assert.NoError(t, err, f.name) {
				t.Logf("%s: %v", f.name, pkt.Opcode())
			}
		} else {
			assert.Error(t, err, f.name)
		}
	}
	assert.Greater(t, roce, 100)
}

// isRoCEv2 reports whether frame is IPv4/UDP to port 4791, judged
// without the parser.
func isRoCEv2(f []byte) bool {
	return len(f) > 42 && f[12] == 0x08 && f[13] == 0 && f[23] == 17 && f[36] == 0x12 && f[37] == 0xb7
}

// TestRealTrafficRebuilds re-builds every real RoCE v2 frame from its
// parsed fields and expects the same bytes.
func TestRealTrafficRebuilds(t *testing.T) {
	frames := append(loadRxeFrames(t), loadConnectXFrames(t)...)
	n := 0
	for _, f := range frames {
		var pkt Packet
		if Parse(f.frame, &pkt) != nil {
			continue
		}
		n++
		path := pkt.Path()
		h := pkt.Headers()
		buf := make([]byte, MaxHeadroom+len(pkt.Payload)+MaxTailroom)
		copy(buf[MaxHeadroom:], pkt.Payload)
		out, err := path.Build(buf, MaxHeadroom, len(pkt.Payload), &h)
		require.NoError(t, err, f.name)
		assert.Equal(t, hex.EncodeToString(f.frame), hex.EncodeToString(out), f.name)
	}
	assert.Greater(t, n, 100)
}

// pickFrames returns one real frame per distinct opcode (and the CNP), the
// frames the exhaustive bit tests run on.
func pickFrames(t testing.TB) []realFrame {
	seen := map[Opcode]bool{}
	var out []realFrame
	for _, f := range append(loadRxeFrames(t), loadConnectXFrames(t)...) {
		var pkt Packet
		if Parse(f.frame, &pkt) != nil || seen[pkt.Opcode()] {
			continue
		}
		seen[pkt.Opcode()] = true
		out = append(out, f)
	}
	require.GreaterOrEqual(t, len(out), 10)
	return out
}

// TestICRCDetectsEveryBitFlip flips, one at a time, every bit from the IP
// header to the ICRC of one real frame per opcode. For every bit the ICRC
// covers (and the ICRC's own bits) the ICRC check fails and Parse rejects
// the frame; for the masked bits the ICRC still matches and Parse accepts
// the frame (after the IPv4 header checksum, which does cover TOS and TTL,
// is fixed up).
func TestICRCDetectsEveryBitFlip(t *testing.T) {
	frames := pickFrames(t)
	// The captures are IPv4 only: add golden IPv6 frames (one with an
	// 802.1Q tag).
	for _, c := range goldenCases(true) {
		switch c.name {
		case "RC_RDMA_WRITE_ONLY/vlan", "RC_SEND_ONLY_WITH_IMMEDIATE/dscp-ecn", "RC_ACKNOWLEDGE", "CNP":
			frames = append(frames, realFrame{name: "ipv6-" + c.name, frame: buildCase(t, c)})
		}
	}
	for _, f := range frames {
		var pkt Packet
		require.NoError(t, Parse(f.frame, &pkt))
		t.Run(f.name+"/"+pkt.Opcode().String(), func(t *testing.T) {
			ip := len(pkt.Eth)
			v6 := pkt.IPv6 != nil
			iphl := IPv6HeaderLen
			if !v6 {
				iphl = pkt.IPv4.HeaderLen()
			}
			end := len(f.frame) // no Ethernet padding in these frames
			masked := maskedBits(f.frame, ip, v6)
			fr := bytes.Clone(f.frame)
			covered, variant := 0, 0
			for i := ip; i < end; i++ {
				for bit := 0; bit < 8; bit++ {
					fr[i] ^= 1 << bit
					icrcOK := icrcIP(fr[ip:end-ICRCLen], v6, iphl) == getICRC(fr[end-ICRCLen:])
					var p Packet
					if masked[i]&(1<<bit) != 0 {
						variant++
						assert.True(t, icrcOK, "masked byte %d bit %d changed the ICRC", i, bit)
						if !v6 {
							IPv4(fr[ip:]).SetChecksum(IPv4(fr[ip:]).CalculateChecksum())
						}
						assert.NoError(t, Parse(fr, &p), "masked byte %d bit %d", i, bit)
					} else {
						covered++
						assert.False(t, icrcOK, "byte %d bit %d went unnoticed by the ICRC", i, bit)
						assert.Error(t, Parse(fr, &p), "byte %d bit %d", i, bit)
					}
					copy(fr, f.frame)
				}
			}
			assert.Equal(t, (end-ip)*8, covered+variant)
			assert.Positive(t, variant)
		})
	}
}

// maskedBits returns, per byte of frame, the bits the ICRC does not cover.
func maskedBits(frame []byte, ip int, v6 bool) []byte {
	m := make([]byte, len(frame))
	var udp int
	if v6 {
		m[ip] = 0x0f
		m[ip+1], m[ip+2], m[ip+3] = 0xff, 0xff, 0xff
		m[ip+7] = 0xff
		udp = ip + IPv6HeaderLen
	} else {
		m[ip+1] = 0xff
		m[ip+8] = 0xff
		m[ip+10], m[ip+11] = 0xff, 0xff
		udp = ip + int(frame[ip]&0xf)*4
	}
	m[udp+6], m[udp+7] = 0xff, 0xff
	m[udp+8+4] = 0xff
	return m
}

// TestMaskedFieldsKeepICRC rewrites the router-variant fields of real
// frames wholesale (TTL, TOS/DSCP/ECN, FECN/BECN, UDP checksum) and expects
// the frame to stay valid.
func TestMaskedFieldsKeepICRC(t *testing.T) {
	for _, f := range pickFrames(t) {
		fr := bytes.Clone(f.frame)
		var pkt Packet
		require.NoError(t, Parse(fr, &pkt))
		pkt.IPv4.SetTTL(1)
		pkt.IPv4.SetTOS(0xff) // DSCP 63, ECN CE
		pkt.IPv4.SetChecksum(pkt.IPv4.CalculateChecksum())
		pkt.UDP.SetChecksum(0x1234)
		pkt.BTH.SetFECN(!pkt.BTH.FECN())
		pkt.BTH.SetBECN(!pkt.BTH.BECN())
		fr[len(pkt.Eth)+IPv4HeaderLen+UDPHeaderLen+4] |= 0x3f // Resv6a
		var p2 Packet
		assert.NoError(t, Parse(fr, &p2), f.name)
	}
}

// TestUDPSrcPortMatchesRxe checks the source ports chosen by Linux rxe in
// the captures: RC from the QPN pair (both ends use the same QPN in these
// runs, see the .txt files), UD from the DETH source QP.
func TestUDPSrcPortMatchesRxe(t *testing.T) {
	n := 0
	for _, f := range loadRxeFrames(t) {
		var pkt Packet
		if Parse(f.frame, &pkt) != nil {
			continue
		}
		n++
		if pkt.DETH != nil {
			assert.Equal(t, UDPSrcPort(pkt.DETH.SrcQP()), pkt.UDP.SrcPort(), f.name)
			continue
		}
		qpn := pkt.BTH.DestQP()
		assert.Equal(t, UDPSrcPortForFlow(0, qpn, qpn), pkt.UDP.SrcPort(), f.name)
	}
	assert.Greater(t, n, 100)
}

// TestRoCEv1ICRCConfirmsIPv6Masking: vrnic does not speak RoCE v1, but a
// RoCE v1 frame's ICRC covers the GRH, which has the IPv6 header's layout,
// with the same variant fields (traffic class, flow label, hop limit)
// masked. The ConnectX RoCE v1 vectors therefore check maskIPv6 and the
// BTH masking against hardware, which the IPv4-only v2 captures cannot.
func TestRoCEv1ICRCConfirmsIPv6Masking(t *testing.T) {
	n := 0
	for _, f := range loadConnectXFrames(t) {
		if Ethernet(f.frame).Type() != EtherTypeRoCEv1 {
			continue
		}
		n++
		body := bytes.Clone(f.frame[EthernetHeaderLen : len(f.frame)-ICRCLen])
		grh := body[:IPv6HeaderLen]
		require.Equal(t, uint8(0x1b), grh[6], "%s: GRH next header is the IBA transport (0x1b)", f.name)
		maskIPv6(grh)
		body[IPv6HeaderLen+bthFB] = 0xff
		got := crc32.Update(icrcSeed, crc32.IEEETable, body)
		assert.Equal(t, getICRC(f.frame[len(f.frame)-ICRCLen:]), got, f.name)
	}
	assert.Equal(t, 2, n)
}
