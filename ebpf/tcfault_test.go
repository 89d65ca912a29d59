package ebpf

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// tc verdicts as BPF_PROG_TEST_RUN returns them.
const (
	tcPass = math.MaxUint32 // TC_ACT_UNSPEC (-1): the next program, else pass
	tcShot = 2              // TC_ACT_SHOT
)

func u32(v uint32) *uint32 { return &v }

// loadTCOrSkip loads the injector unattached, for BPF_PROG_TEST_RUN.
func loadTCOrSkip(t *testing.T) *TCFaults {
	t.Helper()
	testenv.NeedRoot(t, "needs root (CAP_BPF) to load the tc program and run BPF_PROG_TEST_RUN")
	f, err := loadTCFaults(TCFaultConfig{Interface: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, f.Close()) })
	return f
}

// tcFrame is an Ethernet RoCE v2 frame (IPv4 or IPv6) with BTH opcode
// op, destination QP qpn and PSN psn, 32 bytes of payload and ICRC, a
// correct IPv4 header checksum and, if csum, a correct UDP checksum.
func tcFrame(v6 bool, op uint8, qpn, psn uint32, csum bool) []byte {
	f := roceFrame{src: src4, dst: dst4, qpn: qpn, payload: 32 + 4}
	if v6 {
		f.src, f.dst = src6, dst6
	}
	b := buildRoCEFrame(f)
	l4 := ethHLen + 20
	if v6 {
		l4 = ethHLen + 40
	} else {
		binary.BigEndian.PutUint16(b[ethHLen+10:], ipv4Checksum(b[ethHLen:l4]))
	}
	bth := l4 + udpHLen
	b[bth] = op
	b[bth+9], b[bth+10], b[bth+11] = byte(psn>>16), byte(psn>>8), byte(psn)
	if csum {
		binary.BigEndian.PutUint16(b[l4+6:], udpChecksum(b, v6))
	}
	return b
}

// onesSum is the ones' complement sum of b as 16-bit big-endian words.
func onesSum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

func ipv4Checksum(h []byte) uint16 {
	c := make([]byte, len(h))
	copy(c, h)
	c[10], c[11] = 0, 0
	return ^fold(onesSum(0, c))
}

// udpChecksum computes the UDP checksum of frame b (the checksum field
// taken as 0); a valid frame's checksum field makes udpSumOK true.
func udpChecksum(b []byte, v6 bool) uint16 {
	l3, l4 := ethHLen, ethHLen+20
	var sum uint32
	if v6 {
		l4 = ethHLen + 40
		sum = onesSum(sum, b[l3+8:l3+40])
	} else {
		sum = onesSum(sum, b[l3+12:l3+20])
	}
	udp := make([]byte, len(b)-l4)
	copy(udp, b[l4:])
	udp[6], udp[7] = 0, 0
	sum += 17 + uint32(len(udp))
	sum = onesSum(sum, udp)
	c := ^fold(sum)
	if c == 0 {
		c = 0xffff
	}
	return c
}

func udpSumOK(b []byte, v6 bool) bool {
	l4 := ethHLen + 20
	if v6 {
		l4 = ethHLen + 40
	}
	return binary.BigEndian.Uint16(b[l4+6:]) == udpChecksum(b, v6)
}

// runTC runs the program on frame and returns its verdict and the frame
// as the program left it.
func runTC(t *testing.T, f *TCFaults, frame []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := f.objs.VrnicTcfault.Run(opts)
	require.NoError(t, err)
	return ret, opts.DataOut
}

func counts(t *testing.T, f *TCFaults, n int) []TCFaultCount {
	t.Helper()
	c, err := f.Counts(n)
	require.NoError(t, err)
	return c
}

// TestTCFaultDrawReference: the draw is SplitMix64's output, whose first
// value from state 0 is the reference generator's 0xe220a8397b1dcdaf.
func TestTCFaultDrawReference(t *testing.T) {
	assert.Equal(t, uint32(0xe220a839), TCFaultDraw(0, 0))
	assert.NotEqual(t, TCFaultDraw(1, 0), TCFaultDraw(2, 0))
	assert.NotEqual(t, TCFaultDraw(1, 0), TCFaultDraw(1, 1))
	r := TCFaultRule{Action: TCDrop, Skip: 3}
	assert.False(t, TCFaultTakes(r, 2))
	assert.True(t, TCFaultTakes(r, 3), "probability 0 takes every match")
}

// TestTCFaultRuleErrors: bad rules are refused, naming what is wrong, and
// change nothing.
func TestTCFaultRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		r    TCFaultRule
		want string
	}{
		{TCFaultRule{}, "unknown action 0"},
		{TCFaultRule{Action: 9}, "unknown action 9"},
		{TCFaultRule{Action: TCDrop, QPN: u32(1 << 24)}, "wider than 24 bits"},
		{TCFaultRule{Action: TCDrop, PSN: &[2]uint32{5, 4}}, "PSN range 5-4"},
		{TCFaultRule{Action: TCDrop, PSN: &[2]uint32{0, 1 << 24}}, "PSN range"},
		{TCFaultRule{Action: TCDrop, Prob: 1.5}, "probability 1.5"},
		{TCFaultRule{Action: TCDrop, Prob: math.NaN()}, "probability NaN"},
		{TCFaultRule{Action: TCDuplicate, Copies: 9}, "9 copies"},
	} {
		_, err := tc.r.encode()
		assert.ErrorIs(t, err, ErrConfig)
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := ParseTCFaultAction("explode")
	assert.ErrorContains(t, err, `unknown action "explode"`)
	for _, a := range []TCFaultAction{TCDrop, TCCorrupt, TCDuplicate, TCECN} {
		got, err := ParseTCFaultAction(a.String())
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
}

// TestTCFaultMatch: a drop rule takes exactly the frames its fields
// match; frames that are not RoCE v2 pass untouched and uncounted.
func TestTCFaultMatch(t *testing.T) {
	f := loadTCOrSkip(t)
	const rcSend, udSend = 0x04, 0x64
	notRoCE := buildRoCEFrame(roceFrame{src: src4, dst: dst4, dport: 4792, qpn: 0x11, payload: 36})
	for _, tc := range []struct {
		name  string
		rule  TCFaultRule
		frame []byte
		drop  bool
	}{
		{"any", TCFaultRule{}, tcFrame(false, rcSend, 0x11, 1, false), true},
		{"any v6", TCFaultRule{}, tcFrame(true, rcSend, 0x11, 1, false), true},
		{"qpn", TCFaultRule{QPN: u32(0x11)}, tcFrame(false, rcSend, 0x11, 1, false), true},
		{"other qpn", TCFaultRule{QPN: u32(0x12)}, tcFrame(false, rcSend, 0x11, 1, false), false},
		{"qpn 24 bits", TCFaultRule{QPN: u32(0xabcdef)}, tcFrame(true, rcSend, 0xabcdef, 1, false), true},
		{"opcode", TCFaultRule{Opcode: rcSend, OpcodeMask: 0xff}, tcFrame(false, rcSend, 1, 1, false), true},
		{"other opcode", TCFaultRule{Opcode: 0x0a, OpcodeMask: 0xff}, tcFrame(false, rcSend, 1, 1, false), false},
		{"RC class", TCFaultRule{Opcode: 0x00, OpcodeMask: 0xe0}, tcFrame(false, rcSend, 1, 1, false), true},
		{"RC class, UD frame", TCFaultRule{Opcode: 0x00, OpcodeMask: 0xe0}, tcFrame(false, udSend, 1, 1, false), false},
		{"psn first", TCFaultRule{PSN: &[2]uint32{100, 200}}, tcFrame(false, rcSend, 1, 100, false), true},
		{"psn last", TCFaultRule{PSN: &[2]uint32{100, 200}}, tcFrame(false, rcSend, 1, 200, false), true},
		{"psn below", TCFaultRule{PSN: &[2]uint32{100, 200}}, tcFrame(false, rcSend, 1, 99, false), false},
		{"psn above", TCFaultRule{PSN: &[2]uint32{100, 200}}, tcFrame(false, rcSend, 1, 201, false), false},
		{"psn 24 bits", TCFaultRule{PSN: &[2]uint32{0xfffffe, 0xffffff}}, tcFrame(false, rcSend, 1, 0xffffff, false), true},
		{"not RoCE", TCFaultRule{}, notRoCE, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rule.Action = TCDrop
			require.NoError(t, f.SetRules([]TCFaultRule{tc.rule}))
			ret, out := runTC(t, f, tc.frame)
			c := counts(t, f, 1)[0]
			if tc.drop {
				assert.Equal(t, uint32(tcShot), ret)
				assert.Equal(t, TCFaultCount{Matched: 1, Taken: 1, Applied: 1}, c)
			} else {
				assert.Equal(t, uint32(tcPass), ret)
				assert.Equal(t, tc.frame, out, "a frame no rule takes is not changed")
				assert.Equal(t, TCFaultCount{}, c)
			}
		})
	}
}

// TestTCFaultSeededDraw: a probabilistic rule takes exactly the matches
// TCFaultTakes predicts for its seed (the program and the Go model
// agree), about its probability of them, and another seed takes others.
func TestTCFaultSeededDraw(t *testing.T) {
	f := loadTCOrSkip(t)
	const n = 2000
	dropped := func(seed uint64) []int {
		rule := TCFaultRule{Action: TCDrop, Prob: 0.3, Seed: seed}
		require.NoError(t, f.SetRules([]TCFaultRule{rule}))
		var got, want []int
		for k := range n {
			if ret, _ := runTC(t, f, tcFrame(false, 0x04, 7, uint32(k), false)); ret == tcShot {
				got = append(got, k)
			}
			if TCFaultTakes(rule, uint64(k)) {
				want = append(want, k)
			}
		}
		assert.Equal(t, want, got, "seed %d: the program's drops are the model's", seed)
		c := counts(t, f, 1)[0]
		assert.Equal(t, TCFaultCount{Matched: n, Taken: uint64(len(got)), Applied: uint64(len(got))}, c)
		return got
	}
	a, b := dropped(42), dropped(43)
	assert.InDelta(t, 0.3*n, len(a), 0.05*n)
	assert.InDelta(t, 0.3*n, len(b), 0.05*n)
	assert.NotEqual(t, a, b, "another seed, other drops")
	assert.Equal(t, a, dropped(42), "the same seed, the same drops")
}

// TestTCFaultSkipLimitOrder: Skip lets the first matches through, Limit
// caps the frames taken; a rule that does not apply leaves the frame to
// the next rule, and the first rule that applies ends its turn.
func TestTCFaultSkipLimitOrder(t *testing.T) {
	f := loadTCOrSkip(t)
	require.NoError(t, f.SetRules([]TCFaultRule{
		{Action: TCDrop, Skip: 2, Limit: 3},
		{Action: TCECN, PSN: &[2]uint32{0, 5}},
	}))
	var dropped, marked []uint32
	for psn := range uint32(10) {
		ret, out := runTC(t, f, tcFrame(false, 0x04, 7, psn, false))
		switch {
		case ret == tcShot:
			dropped = append(dropped, psn)
		case out[ethHLen+1]&3 == 3:
			marked = append(marked, psn)
		}
	}
	assert.Equal(t, []uint32{2, 3, 4}, dropped)
	assert.Equal(t, []uint32{0, 1, 5}, marked, "frames the first rule let through, in the second's PSN range")
	assert.Equal(t, []TCFaultCount{{Matched: 10, Taken: 8, Applied: 3}, {Matched: 3, Taken: 3, Applied: 3}}, counts(t, f, 2))
}

// TestTCFaultCorrupt: the byte at the offset (from the BTH, or from the
// end) is XORed, nothing else changes but the UDP checksum, which stays
// valid where the frame has one; an offset outside the frame fails the
// action and leaves the frame alone.
func TestTCFaultCorrupt(t *testing.T) {
	f := loadTCOrSkip(t)
	for _, v6 := range []bool{false, true} {
		for _, csum := range []bool{false, true} {
			bth := ethHLen + 20 + udpHLen
			if v6 {
				bth = ethHLen + 40 + udpHLen
			}
			frame := tcFrame(v6, 0x04, 7, 1, csum)
			for _, tc := range []struct {
				off int32
				xor uint8
				at  int
			}{
				{12, 0x5a, bth + 12},
				{13, 0x01, bth + 13},
				{-1, 0, len(frame) - 1},
				{-4, 0x80, len(frame) - 4},
				{0, 0x10, bth},
			} {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCCorrupt, CorruptOffset: tc.off, CorruptXOR: tc.xor}}))
				ret, out := runTC(t, f, frame)
				assert.Equal(t, uint32(tcPass), ret)
				require.Len(t, out, len(frame))
				want := append([]byte(nil), frame...)
				x := tc.xor
				if x == 0 {
					x = 0xff
				}
				want[tc.at] ^= x
				l4 := bth - udpHLen
				assert.Equal(t, want[:l4+6], out[:l4+6], "v6 %v csum %v off %d", v6, csum, tc.off)
				assert.Equal(t, want[l4+8:], out[l4+8:], "v6 %v csum %v off %d", v6, csum, tc.off)
				if csum {
					assert.True(t, udpSumOK(out, v6), "v6 %v off %d: UDP checksum updated", v6, tc.off)
				} else {
					assert.Equal(t, []byte{0, 0}, out[l4+6:l4+8], "a zero UDP checksum stays zero")
				}
				assert.Equal(t, TCFaultCount{Matched: 1, Taken: 1, Applied: 1}, counts(t, f, 1)[0])
			}
			for _, off := range []int32{int32(len(frame)), -int32(len(frame)), -int32(len(frame) - bth + 1)} {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCCorrupt, CorruptOffset: off}}))
				ret, out := runTC(t, f, frame)
				assert.Equal(t, uint32(tcPass), ret)
				assert.Equal(t, frame, out, "offset %d is outside the BTH..end", off)
				assert.Equal(t, TCFaultCount{Matched: 1, Taken: 1, Failed: 1}, counts(t, f, 1)[0])
			}
		}
	}
}

// TestTCFaultECN: CE in the IPv4 TOS with a valid header checksum, or in
// the IPv6 traffic class; nothing else changes.
func TestTCFaultECN(t *testing.T) {
	f := loadTCOrSkip(t)
	require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCECN}}))
	v4 := tcFrame(false, 0x04, 7, 1, true)
	_, out := runTC(t, f, v4)
	assert.Equal(t, byte(3), out[ethHLen+1]&3)
	assert.Equal(t, binary.BigEndian.Uint16(out[ethHLen+10:]), ipv4Checksum(out[ethHLen:ethHLen+20]), "IPv4 header checksum")
	want := append([]byte(nil), v4...)
	want[ethHLen+1] |= 3
	copy(want[ethHLen+10:], out[ethHLen+10:ethHLen+12])
	assert.Equal(t, want, out)
	assert.True(t, udpSumOK(out, false))

	v6 := tcFrame(true, 0x04, 7, 1, true)
	_, out = runTC(t, f, v6)
	want = append([]byte(nil), v6...)
	want[ethHLen+1] |= 0x30
	assert.Equal(t, want, out)
	assert.Equal(t, uint32(3), binary.BigEndian.Uint32(out[ethHLen:])>>20&3, "ECN bits of the traffic class")
	assert.Equal(t, TCFaultCount{Matched: 2, Taken: 2, Applied: 2}, counts(t, f, 1)[0])
}

// TestTCFaultSetRulesLimits: more rules than the map holds are refused;
// an invalid rule leaves the installed ones in place.
func TestTCFaultSetRulesLimits(t *testing.T) {
	f := loadTCOrSkip(t)
	require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCDrop}}))
	assert.ErrorIs(t, f.SetRules(make([]TCFaultRule, MaxTCFaultRules+1)), ErrConfig)
	assert.ErrorContains(t, f.SetRules([]TCFaultRule{{Action: TCECN}, {Action: TCDrop, Prob: 2}}), "rule 1")
	ret, _ := runTC(t, f, tcFrame(false, 0x04, 7, 1, false))
	assert.Equal(t, uint32(tcShot), ret, "the drop rule is still installed")
	require.NoError(t, f.SetRules(nil))
	ret, _ = runTC(t, f, tcFrame(false, 0x04, 7, 1, false))
	assert.Equal(t, uint32(tcPass), ret)
	_, err := f.Counts(MaxTCFaultRules + 1)
	assert.ErrorIs(t, err, ErrConfig)
}

// TestTCFaultRuleRoundTrip: what Rules reads back is what was written
// (defaults filled in).
func TestTCFaultRuleRoundTrip(t *testing.T) {
	for _, r := range []TCFaultRule{
		{Action: TCDrop},
		{Action: TCDrop, QPN: u32(0xabcdef), PSN: &[2]uint32{1, 0xffffff}, Opcode: 0x60, OpcodeMask: 0xe0, Prob: 0.25, Seed: 1 << 60, Skip: 3, Limit: 9},
		{Action: TCCorrupt, CorruptOffset: -1, CorruptXOR: 0x10},
		{Action: TCDuplicate, Copies: 8},
		{Action: TCECN, Prob: 1},
	} {
		e, err := r.encode()
		require.NoError(t, err)
		want := r
		if want.Prob == 1 {
			want.Prob = 0
		}
		assert.Equal(t, want, decodeRule(e))
	}
	e, err := TCFaultRule{Action: TCDuplicate}.encode()
	require.NoError(t, err)
	assert.Equal(t, uint32(1), decodeRule(e).Copies, "copies default to 1")
	e, err = TCFaultRule{Action: TCCorrupt}.encode()
	require.NoError(t, err)
	assert.Equal(t, uint8(0xff), decodeRule(e).CorruptXOR, "xor defaults to 0xff")
}
