package ebpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
	"golang.org/x/sys/unix"
)

var (
	src4 = netip.MustParseAddr("10.1.0.1")
	dst4 = netip.MustParseAddr("10.1.0.2")
	src6 = netip.MustParseAddr("fd00:1::1")
	dst6 = netip.MustParseAddr("fd00:1::2")
)

func run(t testing.TB, prog *ebpf.Program, frame []byte) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
	require.NoError(t, err)
	return ret
}

// testRunRefuses tells whether BPF_PROG_TEST_RUN rejects frame[:n] with
// EINVAL by itself (net/bpf/test_run.c, bpf_prog_test_run_skb): shorter
// than an Ethernet header, or an untagged IPv4/IPv6 frame shorter than
// its fixed IP header. Those lengths cannot reach the program in a test
// run; VLAN-tagged frames (EtherType 0x8100) cover truncated IP headers.
func testRunRefuses(frame []byte, n int) bool {
	if n < ethHLen {
		return true
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeV4:
		return n < ethHLen+20
	case etherTypeV6:
		return n < ethHLen+40
	}
	return false
}

// runTruncated runs prog on frame[:n]; refused reports a length the
// kernel does not test-run (asserted to be one testRunRefuses expects).
func runTruncated(t *testing.T, prog *ebpf.Program, frame []byte, n int) (ret uint32, refused bool) {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame[:n]})
	if err != nil {
		require.ErrorIs(t, err, unix.EINVAL, "len %d", n)
		require.True(t, testRunRefuses(frame, n), "len %d refused unexpectedly: %v", n, err)
		return 0, true
	}
	require.False(t, testRunRefuses(frame, n), "len %d accepted", n)
	return ret, false
}

func TestSteerRoCEFrames(t *testing.T) {
	const queues = 4
	p := loadOrSkip(t, queues)
	cases := []struct {
		name string
		f    roceFrame
	}{
		{"ipv4", roceFrame{src: src4, dst: dst4}},
		{"ipv4 options 4 bytes", roceFrame{src: src4, dst: dst4, ipOptions: 4}},
		{"ipv4 options 40 bytes", roceFrame{src: src4, dst: dst4, ipOptions: 40}},
		{"ipv6", roceFrame{src: src6, dst: dst6}},
		{"vlan ipv4", roceFrame{src: src4, dst: dst4, vlan: true}},
		{"vlan ipv6", roceFrame{src: src6, dst: dst6, vlan: true}},
		{"ipv4 payload 3000", roceFrame{src: src4, dst: dst4, payload: 3000}}, // test runs take at most a page
	}
	want := make([]uint64, queues)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, qpn := range []uint32{0, 1, 17, 0x1234, 0xfffffe, 0xffffff, uint32(i) * 7919} {
				c.f.qpn = qpn
				ret := run(t, p.SteerProgram(), buildRoCEFrame(c.f))
				assert.Equal(t, roce.SteerHash(qpn), ret, "qpn %#x", qpn)
				assert.Equal(t, roce.SteerQueue(qpn, queues), int(uint16(ret))%queues)
				want[roce.SteerQueue(qpn, queues)]++
			}
		})
	}
	st, err := p.SteerStats()
	require.NoError(t, err)
	assert.Equal(t, want, st.Steered, "per-queue counters")
	assert.Zero(t, st.NonRoCE)
}

// nonRoCEFrames are frames the steering program sends to queue 0 and the
// filter drops, each with the filter's reason.
func nonRoCEFrames() []struct {
	name   string
	frame  []byte
	reason FilterReason
} {
	udpOther := buildRoCEFrame(roceFrame{src: src4, dst: dst4, dport: 4789})
	udpOther6 := buildRoCEFrame(roceFrame{src: src6, dst: dst6, dport: 53})
	tcp := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	tcp[ethHLen+9] = 6
	tcp6 := buildRoCEFrame(roceFrame{src: src6, dst: dst6})
	tcp6[ethHLen+6] = 6
	frag := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	binary.BigEndian.PutUint16(frag[ethHLen+6:], 0x2000) // MF
	fragOff := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	binary.BigEndian.PutUint16(fragOff[ethHLen+6:], 0x0010) // offset 128
	hopByHop := buildRoCEFrame(roceFrame{src: src6, dst: dst6})
	hopByHop[ethHLen+6] = 0 // hop-by-hop options header first
	badVer := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	badVer[ethHLen] = 0x65
	badIHL := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	badIHL[ethHLen] = 0x44
	qinq := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	binary.BigEndian.PutUint16(qinq[12:], 0x88a8)
	arpOther := arpFrame(1, netip.MustParseAddr("10.1.0.9"), false)
	return []struct {
		name   string
		frame  []byte
		reason FilterReason
	}{
		{"udp other port", udpOther, FilterDropUDPPort},
		{"udp6 other port", udpOther6, FilterDropUDPPort},
		{"tcp", tcp, FilterDropL4Proto},
		{"tcp6", tcp6, FilterDropL4Proto},
		{"ipv4 fragment MF", frag, FilterDropIPFragment},
		{"ipv4 fragment offset", fragOff, FilterDropIPFragment},
		{"ipv6 extension header", hopByHop, FilterDropL4Proto},
		{"ipv4 version 6", badVer, FilterDropIPMalformed},
		{"ipv4 ihl 4", badIHL, FilterDropIPMalformed},
		{"802.1ad outer tag", qinq, FilterDropEtherType},
		{"arp not ours", arpOther, FilterDropARPNotOurs},
	}
}

func TestSteerNonRoCEToQueueZero(t *testing.T) {
	p := loadOrSkip(t, 4)
	frames := nonRoCEFrames()
	frames = append(frames, struct {
		name   string
		frame  []byte
		reason FilterReason
	}{"arp request", arpFrame(1, dst4, false), FilterPassARP}, struct {
		name   string
		frame  []byte
		reason FilterReason
	}{"neighbour solicitation", ndFrame(135, src6, solicitedNode(dst6), dst6, 255, false), FilterPassND})
	for _, c := range frames {
		t.Run(c.name, func(t *testing.T) {
			assert.Zero(t, run(t, p.SteerProgram(), c.frame))
		})
	}
	st, err := p.SteerStats()
	require.NoError(t, err)
	assert.Equal(t, uint64(len(frames)), st.NonRoCE)
	assert.Equal(t, make([]uint64, 4), st.Steered)
}

// qpnEnd returns the frame length needed to read the BTH destination QP.
func qpnEnd(f roceFrame) int {
	n := ethHLen + udpHLen + 8
	if f.vlan {
		n += vlanHLen
	}
	if f.dst.Is4() {
		return n + 20 + f.ipOptions
	}
	return n + 40
}

func TestSteerTruncatedAtEveryLength(t *testing.T) {
	p := loadOrSkip(t, 3)
	for _, f := range []roceFrame{
		{src: src4, dst: dst4, qpn: 0x4567},
		{src: src4, dst: dst4, qpn: 0x4567, ipOptions: 12},
		{src: src6, dst: dst6, qpn: 0x4567},
		{src: src4, dst: dst4, qpn: 0x4567, vlan: true},
		{src: src6, dst: dst6, qpn: 0x4567, vlan: true},
	} {
		t.Run(f.dst.String(), func(t *testing.T) {
			frame := buildRoCEFrame(f)
			for n := 0; n <= len(frame); n++ {
				ret, refused := runTruncated(t, p.SteerProgram(), frame, n)
				if refused {
					continue
				}
				if n < qpnEnd(f) {
					assert.Zero(t, ret, "len %d: QPN not present, queue 0", n)
				} else {
					assert.Equal(t, roce.SteerHash(f.qpn), ret, "len %d", n)
				}
			}
		})
	}
}

func TestSteeringAgreesWithSteerQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	qpns := []uint32{0, 1, 2, 0xffffff, 0x800000, 0x7fffff, 0xff000001}
	for range 2000 {
		qpns = append(qpns, rng.Uint32())
	}
	for _, queues := range []int{1, 2, 3, 4, 7, 8, 64, 256} {
		t.Run(fmt.Sprintf("queues=%d", queues), func(t *testing.T) {
			p := loadOrSkip(t, queues)
			require.NoError(t, p.VerifySteering(qpns), "queues %d", queues)
		})
	}
}

// The agreement check must be able to fail: a program computing another
// hash is caught.
func TestVerifySteeringDetectsMismatch(t *testing.T) {
	p := loadOrSkip(t, 4)
	spec, err := loadSteer()
	require.NoError(t, err)
	// Replace the program with one returning a constant.
	ps := spec.Programs["vrnic_steer"].Copy()
	ps.Instructions = asmReturn(3)
	ps.License = "Dual MIT/GPL"
	prog, err := ebpf.NewProgram(ps)
	require.NoError(t, err)
	defer prog.Close()
	err = verifySteering(prog, []uint32{0x10, 0x11, 0x12}, p.Queues())
	assert.ErrorIs(t, err, ErrSteeringMismatch)
}

func TestLoadRejectsBadQueueCount(t *testing.T) {
	for _, q := range []int{0, -1, MaxQueues + 1} {
		_, err := Load(q)
		assert.ErrorIs(t, err, ErrConfig, "queues %d", q)
	}
}
