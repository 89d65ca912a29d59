package roce

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPSNArithmetic(t *testing.T) {
	tests := []struct {
		a, b uint32
		diff int32
	}{
		{0, 0, 0},
		{1, 0, 1},
		{0, 1, -1},
		{0, 0xffffff, 1},          // wrap: 0 comes right after 0xffffff
		{0xffffff, 0, -1},         // and 0xffffff right before 0
		{0x7fffff, 0, 0x7fffff},   // largest forward distance
		{0x800000, 0, -0x800000},  // half way round counts as behind
		{0x10, 0xfffff0, 0x20},    // across the wrap
		{0x1000005, 0x000003, 2},  // high bits ignored
		{0xff000005, 0x000003, 2}, // high bits ignored
	}
	for _, tt := range tests {
		assert.Equal(t, tt.diff, PSNDiff(tt.a, tt.b), "PSNDiff(%#x, %#x)", tt.a, tt.b)
		want := 0
		if tt.diff < 0 {
			want = -1
		} else if tt.diff > 0 {
			want = 1
		}
		assert.Equal(t, want, PSNCompare(tt.a, tt.b), "PSNCompare(%#x, %#x)", tt.a, tt.b)
		assert.Equal(t, want < 0, PSNBefore(tt.a, tt.b))
		assert.Equal(t, want > 0, PSNAfter(tt.a, tt.b))
	}
	assert.Equal(t, uint32(0), PSNAdd(0xffffff, 1))
	assert.Equal(t, uint32(4), PSNAdd(0xfffffe, 6))
	assert.Equal(t, uint32(0xffffff), PSNAdd(0, 0xffffffff))
	// Adding n moves PSNDiff by n for every start and n < 2^23.
	for _, start := range []uint32{0, 1, 0x7fffff, 0x800000, 0xfffff0, 0xffffff} {
		for _, n := range []uint32{0, 1, 15, 0x7fffff} {
			assert.Equal(t, int32(n), PSNDiff(PSNAdd(start, n), start), "start %#x n %#x", start, n)
		}
	}
}

func TestSyndromes(t *testing.T) {
	tests := []struct {
		s    Syndrome
		raw  uint8
		kind SyndromeKind
		val  uint8
	}{
		{ACKSyndrome(CreditsInvalid), 0x1f, SyndromeACK, 31}, // what rxe sends
		{ACKSyndrome(0), 0x00, SyndromeACK, 0},
		{ACKSyndrome(0xff), 0x1f, SyndromeACK, 31},
		{RNRNAKSyndrome(0), 0x20, SyndromeRNRNAK, 0},
		{RNRNAKSyndrome(14), 0x2e, SyndromeRNRNAK, 14},
		{RNRNAKSyndrome(31), 0x3f, SyndromeRNRNAK, 31},
		{NAKSyndrome(NAKPSNSequenceError), 0x60, SyndromeNAK, 0},
		{NAKSyndrome(NAKInvalidRequest), 0x61, SyndromeNAK, 1},
		{NAKSyndrome(NAKRemoteAccessError), 0x62, SyndromeNAK, 2},
		{NAKSyndrome(NAKRemoteOperationalErr), 0x63, SyndromeNAK, 3},
		{NAKSyndrome(NAKInvalidRDRequest), 0x64, SyndromeNAK, 4},
	}
	for _, tt := range tests {
		t.Run(tt.s.String(), func(t *testing.T) {
			assert.Equal(t, tt.raw, uint8(tt.s))
			assert.Equal(t, tt.kind, tt.s.Kind())
			assert.Equal(t, tt.val, tt.s.Value())
			assert.True(t, tt.s.Valid())
		})
	}
	assert.Equal(t, RNRTimer(14), RNRNAKSyndrome(14).Timer())
	assert.Equal(t, NAKRemoteAccessError, NAKSyndrome(NAKRemoteAccessError).NAK())
	assert.Equal(t, uint8(3), ACKSyndrome(3).Credits())
	assert.False(t, Syndrome(0x40).Valid(), "reserved op 10")
	assert.False(t, Syndrome(0x80).Valid(), "reserved bit 7")
	assert.False(t, Syndrome(0x65).Valid(), "undefined NAK code")
	assert.Equal(t, "NAK(REMOTE_ACCESS_ERROR)", NAKSyndrome(NAKRemoteAccessError).String())
	assert.Equal(t, "RNR_NAK(1.28ms)", RNRNAKSyndrome(14).String())
	assert.Equal(t, "ACK(credits=31)", ACKSyndrome(CreditsInvalid).String())
}

func TestCreditCount(t *testing.T) {
	want := map[uint8]uint32{0: 0, 1: 1, 4: 4, 5: 6, 6: 8, 7: 12, 8: 16, 16: 256, 20: 1024, 30: 32768}
	for code, n := range want {
		got, ok := CreditCount(code)
		assert.True(t, ok)
		assert.Equal(t, n, got, "code %d", code)
	}
	_, ok := CreditCount(CreditsInvalid)
	assert.False(t, ok)
	prev := uint32(0)
	for c := uint8(1); c < 31; c++ {
		n, _ := CreditCount(c)
		assert.Greater(t, n, prev, "strictly increasing at %d", c)
		prev = n
	}
}

// TestRNRTimerTable checks IBTA table 45 entry by entry (values in
// milliseconds as the spec prints them).
func TestRNRTimerTable(t *testing.T) {
	ms := []float64{
		655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48,
		0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
		40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
	}
	require.Len(t, ms, 32)
	for code, v := range ms {
		want := time.Duration(v*1000+0.5) * time.Microsecond
		assert.Equal(t, want, RNRTimer(code).Duration(), "code %d", code)
	}
	assert.Equal(t, RNRTimer(1).Duration(), RNRTimer(33).Duration(), "only 5 bits count")
	assert.Equal(t, RNRTimer(1), RNRTimerFor(0))
	assert.Equal(t, RNRTimer(1), RNRTimerFor(10*time.Microsecond))
	assert.Equal(t, RNRTimer(2), RNRTimerFor(11*time.Microsecond))
	assert.Equal(t, RNRTimer(14), RNRTimerFor(time.Millisecond+280*time.Microsecond))
	assert.Equal(t, RNRTimer(31), RNRTimerFor(491520*time.Microsecond))
	assert.Equal(t, RNRTimer(0), RNRTimerFor(500*time.Millisecond))
}

func TestMTU(t *testing.T) {
	want := map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096}
	for m, n := range want {
		assert.True(t, m.Valid())
		assert.Equal(t, n, m.Bytes())
		got, ok := MTUFromBytes(n)
		assert.True(t, ok)
		assert.Equal(t, m, got)
	}
	assert.Equal(t, uint8(1), uint8(MTU256))
	assert.Equal(t, uint8(5), uint8(MTU4096))
	for _, m := range []MTU{0, 6, 255} {
		assert.False(t, m.Valid())
		assert.Zero(t, m.Bytes())
	}
	_, ok := MTUFromBytes(1500)
	assert.False(t, ok)
	m, ok := MTUForLinkMTU(1500, false)
	assert.True(t, ok)
	assert.Equal(t, MTU1024, m)
	m, ok = MTUForLinkMTU(9000, true)
	assert.True(t, ok)
	assert.Equal(t, MTU4096, m)
	m, ok = MTUForLinkMTU(4096+IPv4HeaderLen+UDPHeaderLen+BTHLen+RETHLen+ImmDtLen+ICRCLen, false)
	assert.True(t, ok)
	assert.Equal(t, MTU4096, m, "exactly fits")
	_, ok = MTUForLinkMTU(200, false)
	assert.False(t, ok)
}

func TestUDPSrcPort(t *testing.T) {
	seen := map[uint16]bool{}
	for qpn := uint32(0); qpn < 4096; qpn++ {
		p := UDPSrcPort(qpn)
		assert.GreaterOrEqual(t, p, uint16(49152))
		seen[p] = true
		q := UDPSrcPortForFlow(0, qpn, qpn+1)
		assert.GreaterOrEqual(t, q, uint16(49152))
		assert.Equal(t, q, UDPSrcPortForFlow(0, qpn+1, qpn), "both ends of a connection agree")
	}
	assert.Greater(t, len(seen), 4000, "consecutive QPNs spread over the range")
	assert.Equal(t, UDPSrcPort(0x1234), UDPSrcPort(0x1234), "stable")
	// A non-zero flow label wins over the QPNs.
	assert.Equal(t, UDPSrcPortForFlow(0x12345, 1, 2), UDPSrcPortForFlow(0x12345, 3, 4))
	assert.Equal(t, uint16(0xc000|(0x12345&0x3fff^0x12345>>14)), UDPSrcPortForFlow(0x12345, 1, 2))
}

func TestPcapRoundTrip(t *testing.T) {
	frames := [][]byte{{1, 2, 3}, bytes.Repeat([]byte{0xab}, 9000), {}}
	ts := time.Date(2026, 11, 21, 13, 0, 0, 123456789, time.UTC)
	for _, nano := range []bool{false, true} {
		var b bytes.Buffer
		w, err := NewPcapWriter(&b, nano)
		require.NoError(t, err)
		for i, f := range frames {
			require.NoError(t, w.WritePacket(ts.Add(time.Duration(i)*time.Second), f))
		}
		raw := b.Bytes()
		magic := binary.LittleEndian.Uint32(raw)
		if nano {
			assert.Equal(t, uint32(0xa1b23c4d), magic)
		} else {
			assert.Equal(t, uint32(0xa1b2c3d4), magic)
		}
		assert.Equal(t, uint32(LinkTypeEthernet), binary.LittleEndian.Uint32(raw[20:]))
		r, err := NewPcapReader(bytes.NewReader(raw))
		require.NoError(t, err)
		for i, f := range frames {
			got, data, err := r.Next()
			require.NoError(t, err)
			assert.Equal(t, f, data)
			want := ts.Add(time.Duration(i) * time.Second)
			if !nano {
				want = want.Truncate(time.Microsecond)
			}
			assert.Equal(t, want, got)
		}
		_, _, err = r.Next()
		assert.Equal(t, io.EOF, err)
	}
}

func TestPcapReaderBigEndianAndErrors(t *testing.T) {
	// A big-endian, microsecond file with one 2-byte record.
	var b bytes.Buffer
	hdr := make([]byte, 24)
	binary.BigEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.BigEndian.PutUint16(hdr[4:], 2)
	binary.BigEndian.PutUint16(hdr[6:], 4)
	binary.BigEndian.PutUint32(hdr[16:], 65535)
	binary.BigEndian.PutUint32(hdr[20:], 1)
	b.Write(hdr)
	rec := make([]byte, 16)
	binary.BigEndian.PutUint32(rec[0:], 1)
	binary.BigEndian.PutUint32(rec[4:], 5)
	binary.BigEndian.PutUint32(rec[8:], 2)
	binary.BigEndian.PutUint32(rec[12:], 2)
	b.Write(rec)
	b.Write([]byte{0xca, 0xfe})
	r, err := NewPcapReader(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, uint32(1), r.LinkType())
	ts, data, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, []byte{0xca, 0xfe}, data)
	assert.Equal(t, time.Unix(1, 5000).UTC(), ts)

	_, err = NewPcapReader(bytes.NewReader([]byte("not a pcap file at all!!")))
	assert.ErrorIs(t, err, ErrBadPcap)
	_, err = NewPcapReader(bytes.NewReader(hdr[:10]))
	assert.ErrorIs(t, err, ErrBadPcap)
	// Truncated record data.
	r, err = NewPcapReader(bytes.NewReader(b.Bytes()[:len(b.Bytes())-1]))
	require.NoError(t, err)
	_, _, err = r.Next()
	assert.ErrorIs(t, err, ErrBadPcap)
	// Absurd record length.
	bad := bytes.Clone(b.Bytes())
	binary.BigEndian.PutUint32(bad[24+8:], 1<<30)
	r, err = NewPcapReader(bytes.NewReader(bad))
	require.NoError(t, err)
	_, _, err = r.Next()
	assert.ErrorIs(t, err, ErrBadPcap)
}

func TestPacketAddresses(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		c := goldenCases(v6)[0]
		var pkt Packet
		require.NoError(t, Parse(buildCase(t, c), &pkt))
		assert.Equal(t, c.path.Src, pkt.Src())
		assert.Equal(t, c.path.Dst, pkt.Dst())
	}
	var pkt Packet
	c := goldenCases(false)[0]
	c.path.Mode = ModeUDP
	ps := c.path.Pseudo()
	require.NoError(t, ParseUDP(buildCase(t, c), &ps, &pkt))
	assert.False(t, pkt.Src().IsValid())
	assert.False(t, pkt.Dst().IsValid())
}
