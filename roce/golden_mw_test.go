package roce

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// Memory windows on the wire. A window's rkey is an R_Key like any other
// (IBTA 10.6.7: the responder tells MRs and windows apart, the packet
// does not): an RDMA WRITE names it in the RETH, a SEND with Invalidate
// in the IETH (IBTA 9.3.4, 4 bytes after the BTH, network order), and an
// access through a window that was invalidated is answered with a NAK
// Remote Access Error (9.7.5.2.4). The exchange below is what two vrnic
// daemons send for TestMW's "type 2 window, WRITE, SEND with Invalidate,
// WRITE again" (the keys and addresses fixed here: the daemon draws them
// at random). The SEND payloads are not 8 bytes long: Wireshark's
// RPC-over-RDMA heuristic takes so short a SEND payload for its header and
// reports it malformed.

const goldenMWFile = "testdata/golden_mw.pcap"

// goldenMWRKey is a type 2 window's rkey after a bind: the window's key
// index (0x01a3c7) and the consumer's 8-bit key (0x56).
const goldenMWRKey = 0x01a3c756

func goldenMWCases() []goldenCase {
	const qpA, qpB = 0x000123, 0x000456
	req := goldenPath(false, qpA)
	resp := req
	resp.Src, resp.Dst, resp.SrcMAC, resp.DstMAC = req.Dst, req.Src, req.DstMAC, req.SrcMAC
	resp.SrcPort = UDPSrcPortForFlow(0, qpB, qpB)
	pay := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + seed)
		}
		return b
	}
	bth := func(op Opcode, qp, psn uint32, ack bool) BTHFields {
		return BTHFields{Opcode: op, PKey: DefaultPKey, DestQP: qp, PSN: psn, AckReq: ack}
	}
	const va = 0x00007f3a12342000 // the window's first byte (not zero-based)
	ack := func(psn, msn uint32, s Syndrome) goldenCase {
		return goldenCase{name: "ack", path: resp, h: Headers{BTH: bth(OpRCAck, qpA, psn, false), AETH: AETHFields{Syndrome: s, MSN: msn}}}
	}
	return []goldenCase{
		{name: "write through the window", path: req, payload: pay(64, 1),
			h: Headers{BTH: bth(OpRCWriteOnly, qpB, 100, true), RETH: RETHFields{VA: va + 0x40, RKey: goldenMWRKey, DMALength: 64}}},
		ack(100, 1, ACKSyndrome(CreditsInvalid)),
		{name: "send first", path: req, payload: pay(256, 2), h: Headers{BTH: bth(OpRCSendFirst, qpB, 101, false)}},
		{name: "send last with invalidate", path: req, payload: pay(37, 3),
			h: Headers{BTH: bth(OpRCSendLastInv, qpB, 102, true), InvRKey: goldenMWRKey}},
		ack(102, 2, ACKSyndrome(CreditsInvalid)),
		{name: "send only with invalidate", path: req, payload: pay(40, 4),
			h: Headers{BTH: bth(OpRCSendOnlyInv, qpB, 103, true), InvRKey: goldenMWRKey}},
		ack(103, 3, ACKSyndrome(CreditsInvalid)),
		{name: "write through the invalidated window", path: req, payload: pay(8, 5),
			h: Headers{BTH: bth(OpRCWriteOnly, qpB, 104, true), RETH: RETHFields{VA: va, RKey: goldenMWRKey, DMALength: 8}}},
		ack(104, 3, NAKSyndrome(NAKRemoteAccessError)),
	}
}

// TestGoldenMWFrames compares the exchange with testdata/golden_mw.pcap
// (-update rewrites it) and parses every frame back to its fields.
func TestGoldenMWFrames(t *testing.T) {
	cs := goldenMWCases()
	var b bytes.Buffer
	pw, err := NewPcapWriter(&b, false)
	require.NoError(t, err)
	for i, c := range cs {
		require.NoError(t, pw.WritePacket(time.Unix(1700000100+int64(i), 0), buildCase(t, c)))
	}
	if *update {
		require.NoError(t, os.WriteFile(goldenMWFile, b.Bytes(), 0o644))
	}
	want, err := os.ReadFile(goldenMWFile)
	require.NoError(t, err, "run go test -run TestGoldenMW -update to create it")
	assert.Equal(t, hex.EncodeToString(want), hex.EncodeToString(b.Bytes()))
	pr, err := NewPcapReader(bytes.NewReader(want))
	require.NoError(t, err)
	for _, c := range cs {
		_, frame, err := pr.Next()
		require.NoError(t, err, c.name)
		var pkt Packet
		require.NoError(t, Parse(frame, &pkt), c.name)
		assertRoundTrip(t, c, &pkt)
		if c.h.BTH.Opcode.Info().Has(HdrIETH) {
			// The IETH is the 4 bytes after the BTH, the R_Key big-endian.
			assert.Equal(t, "01a3c756", hex.EncodeToString(frame[14+20+8+12:][:4]), c.name)
		}
	}
}

// TestGoldenMWTshark: Wireshark reads the window's rkey in the RETH and
// the IETH, the NAK as a Remote Access Error, and reports no malformed
// frame and no expert warning.
func TestGoldenMWTshark(t *testing.T) {
	testenv.NeedTool(t, "tshark")
	fields := []string{"infiniband.bth.opcode", "infiniband.bth.psn", "infiniband.reth.va", "infiniband.reth.r_key",
		"infiniband.reth.dmalen", "infiniband.ieth", "infiniband.aeth.syndrome.opcode", "infiniband.aeth.syndrome.error_code",
		"infiniband.aeth.msn"}
	args := []string{"-r", goldenMWFile, "-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command("tshark", args...).Output()
	require.NoError(t, err)
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	cs := goldenMWCases()
	require.Len(t, lines, len(cs))
	for i, c := range cs {
		col := strings.Split(lines[i], "|")
		require.Len(t, col, len(fields), c.name)
		h, info := c.h, c.h.BTH.Opcode.Info()
		assert.Equal(t, strconv.Itoa(int(h.BTH.Opcode)), col[0], c.name)
		assert.Equal(t, strconv.Itoa(int(h.BTH.PSN)), col[1], c.name)
		if info.Has(HdrRETH) {
			assert.Equal(t, fmt.Sprintf("0x%016x", h.RETH.VA), col[2], c.name)
			assert.Equal(t, "0x01a3c756", col[3], c.name)
			assert.Equal(t, strconv.Itoa(int(h.RETH.DMALength)), col[4], c.name)
		}
		if info.Has(HdrIETH) {
			assert.Equal(t, "01a3c756", firstOf(col[5]), c.name)
		} else {
			assert.Empty(t, col[5], c.name)
		}
		if info.Has(HdrAETH) {
			s := h.AETH.Syndrome
			assert.Equal(t, strconv.Itoa(int(s.Kind())), col[6], c.name)
			if s.Kind() == SyndromeNAK {
				assert.Equal(t, strconv.Itoa(int(NAKRemoteAccessError)), col[7], c.name)
			}
			assert.Equal(t, strconv.Itoa(int(h.AETH.MSN)), col[8], c.name)
		}
	}
	bad, err := exec.Command("tshark", "-r", goldenMWFile, "-Y", "_ws.malformed || _ws.expert.severity >= warning",
		"-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message").Output()
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(bad)), "malformed frames or expert warnings")
}
