package ebpf

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	other4   = netip.MustParseAddr("10.1.0.77")
	other6   = netip.MustParseAddr("fd00:1::77")
	allNodes = netip.MustParseAddr("ff02::1")
)

func loadFilterOrSkip(t *testing.T) *Programs {
	p := loadOrSkip(t, 2)
	require.NoError(t, p.SetAddrs([]netip.Addr{dst4, dst6, netip.MustParseAddr("::ffff:10.1.0.3")}))
	return p
}

// passFrame is a frame the filter keeps and the length it needs to see.
type passFrame struct {
	name   string
	frame  []byte
	need   int // bytes the filter must read to pass the frame
	reason FilterReason
}

func passFrames() []passFrame {
	roce := func(f roceFrame) passFrame {
		r := FilterPassRoCEv6
		if f.dst.Is4() {
			r = FilterPassRoCEv4
		}
		return passFrame{"roce to " + f.dst.String(), buildRoCEFrame(f), qpnEnd(f) + 4, r}
	}
	return []passFrame{
		{"arp request", arpFrame(1, dst4, false), 42, FilterPassARP},
		{"arp reply", arpFrame(2, dst4, false), 42, FilterPassARP},
		{"arp request second address", arpFrame(1, netip.MustParseAddr("10.1.0.3"), false), 42, FilterPassARP},
		{"vlan arp request", arpFrame(1, dst4, true), 46, FilterPassARP},
		{"ns to solicited-node", ndFrame(135, src6, solicitedNode(dst6), dst6, 255, true), 78, FilterPassND},
		{"ns unicast", ndFrame(135, src6, dst6, dst6, 255, false), 78, FilterPassND},
		{"na to device", ndFrame(136, src6, dst6, src6, 255, true), 78, FilterPassND},
		{"na to all-nodes", ndFrame(136, src6, allNodes, src6, 255, false), 78, FilterPassND},
		roce(roceFrame{src: src4, dst: dst4, qpn: 5}),
		roce(roceFrame{src: src4, dst: dst4, qpn: 5, ipOptions: 8, payload: 64}),
		roce(roceFrame{src: src4, dst: netip.MustParseAddr("10.1.0.3"), qpn: 5}),
		roce(roceFrame{src: src6, dst: dst6, qpn: 5}),
		roce(roceFrame{src: src4, dst: dst4, qpn: 5, vlan: true}),
		roce(roceFrame{src: src6, dst: dst6, qpn: 5, vlan: true, payload: 2048}),
	}
}

func TestFilterVerdicts(t *testing.T) {
	p := loadFilterOrSkip(t)
	type tc struct {
		name   string
		frame  []byte
		reason FilterReason
	}
	var cases []tc
	for _, f := range passFrames() {
		cases = append(cases, tc{f.name, f.frame, f.reason})
	}
	for _, f := range nonRoCEFrames() {
		cases = append(cases, tc{f.name, f.frame, f.reason})
	}
	arpBadHType := arpFrame(1, dst4, false)
	arpBadHType[15] = 6
	arpBadOp := arpFrame(3, dst4, false)
	echo6 := ndFrame(128, src6, dst6, dst6, 64, false)
	unknownICMP := ndFrame(134, src6, allNodes, dst6, 255, false) // router advertisement
	ipv6BadVer := buildRoCEFrame(roceFrame{src: src6, dst: dst6})
	ipv6BadVer[ethHLen] = 0x40
	ndBadCode := ndFrame(135, src6, solicitedNode(dst6), dst6, 255, false)
	ndBadCode[ethHLen+40+1] = 1
	cases = append(cases,
		tc{"roce to other ipv4", buildRoCEFrame(roceFrame{src: src4, dst: other4}), FilterDropAddrNotOurs},
		tc{"roce to other ipv6", buildRoCEFrame(roceFrame{src: src6, dst: other6}), FilterDropAddrNotOurs},
		tc{"arp bad hardware type", arpBadHType, FilterDropARPMalformed},
		tc{"arp op 3", arpBadOp, FilterDropARPMalformed},
		tc{"icmpv6 echo", echo6, FilterDropICMPv6Other},
		tc{"router advertisement", unknownICMP, FilterDropICMPv6Other},
		tc{"ns for other target", ndFrame(135, src6, solicitedNode(other6), other6, 255, false), FilterDropNDNotOurs},
		tc{"ns to wrong group", ndFrame(135, src6, solicitedNode(other6), dst6, 255, false), FilterDropNDNotOurs},
		tc{"na to other node", ndFrame(136, src6, other6, src6, 255, false), FilterDropNDNotOurs},
		tc{"ns hop limit 64", ndFrame(135, src6, solicitedNode(dst6), dst6, 64, false), FilterDropNDMalformed},
		tc{"ns code 1", ndBadCode, FilterDropNDMalformed},
		tc{"ipv6 version 4", ipv6BadVer, FilterDropIPMalformed},
		tc{"ethernet header only", arpFrame(1, dst4, false)[:ethHLen], FilterDropTruncated},
		tc{"vlan tag cut", arpFrame(1, dst4, true)[:ethHLen+1], FilterDropTruncated},
	)
	var want FilterStats
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, err := p.FilterStats()
			require.NoError(t, err)
			ret := run(t, p.FilterProgram(), c.frame)
			if c.reason.Pass() {
				// BPF_PROG_TEST_RUN pulls the Ethernet header: skb->len
				// is the frame length minus 14, and the program keeps
				// all of it.
				assert.Equal(t, uint32(len(c.frame)-ethHLen), ret, "kept length")
			} else {
				assert.Zero(t, ret, "dropped")
			}
			after, err := p.FilterStats()
			require.NoError(t, err)
			for r := range after {
				d := after[r] - before[r]
				if FilterReason(r) == c.reason {
					assert.Equal(t, uint64(1), d, "counter %v", FilterReason(r))
				} else {
					assert.Zero(t, d, "counter %v", FilterReason(r))
				}
			}
		})
		want[c.reason]++
	}
	got, err := p.FilterStats()
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, want.Dropped(), got.Dropped())
}

func TestFilterTruncatedAtEveryLength(t *testing.T) {
	p := loadFilterOrSkip(t)
	for _, f := range passFrames() {
		t.Run(f.name, func(t *testing.T) {
			require.LessOrEqual(t, f.need, len(f.frame))
			before, err := p.FilterStats()
			require.NoError(t, err)
			refusals := 0
			for n := 0; n <= len(f.frame); n++ {
				ret, refused := runTruncated(t, p.FilterProgram(), f.frame, n)
				if refused {
					if n >= ethHLen {
						refusals++
					}
					continue
				}
				if n < f.need {
					assert.Zero(t, ret, "len %d dropped", n)
				} else {
					assert.Equal(t, uint32(n-ethHLen), ret, "len %d kept", n)
				}
			}
			after, err := p.FilterStats()
			require.NoError(t, err)
			assert.Equal(t, uint64(f.need-ethHLen-refusals), after[FilterDropTruncated]-before[FilterDropTruncated], "truncated counter")
			assert.Equal(t, uint64(len(f.frame)-f.need+1), after[f.reason]-before[f.reason], "pass counter")
		})
	}
}

func TestFilterSetAddrsReplaces(t *testing.T) {
	p := loadFilterOrSkip(t)
	frame := buildRoCEFrame(roceFrame{src: src4, dst: dst4})
	frame6 := buildRoCEFrame(roceFrame{src: src6, dst: dst6})
	require.NotZero(t, run(t, p.FilterProgram(), frame))
	require.NotZero(t, run(t, p.FilterProgram(), frame6))

	require.NoError(t, p.SetAddrs([]netip.Addr{other4}))
	assert.Zero(t, run(t, p.FilterProgram(), frame), "old IPv4 address removed")
	assert.Zero(t, run(t, p.FilterProgram(), frame6), "old IPv6 address removed")
	assert.NotZero(t, run(t, p.FilterProgram(), buildRoCEFrame(roceFrame{src: src4, dst: other4})))

	assert.ErrorIs(t, p.SetAddrs([]netip.Addr{{}}), ErrConfig)
}

func TestFilterReasonNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumFilterReasons {
		name := FilterReason(r).String()
		assert.NotEmpty(t, name, "reason %d has a name", r)
		assert.False(t, seen[name], "duplicate name %q", name)
		seen[name] = true
		assert.Equal(t, r <= int(FilterPassRoCEv6), FilterReason(r).Pass())
	}
	assert.Equal(t, "FilterReason(99)", FilterReason(99).String())
}
