package roce

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

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
		// Mixed and odd forms: one address missing (zeros in its family),
		// the IPv6 unspecified address (native, though all zeros), a zone
		// (not covered), IPv4-mapped against native IPv6 (IPv6).
		{Dst: netip.MustParseAddr("2001:db8::9"), SrcPort: 0x1234, DstPort: 0x5678},
		{Src: netip.MustParseAddr("2001:db8::9")},
		{Src: netip.MustParseAddr("203.0.113.5"), SrcPort: 0xffff},
		{Dst: netip.MustParseAddr("203.0.113.5")},
		{Src: netip.IPv6Unspecified()},
		{Src: netip.MustParseAddr("::ffff:0.0.0.0"), Dst: netip.IPv4Unspecified()},
		{Src: netip.MustParseAddr("fe80::1%eth0"), Dst: netip.MustParseAddr("fe80::2")},
		{Src: netip.MustParseAddr("::ffff:192.0.2.1"), Dst: netip.MustParseAddr("2001:db8::2")},
		{Src: netip.MustParseAddr("::1"), Dst: netip.MustParseAddr("::ffff:127.0.0.1")},
	}
	lengths := append(icrcLengths(0, 300), 1000, 4096+RETHLen, 9000)
	for _, ps := range pairs {
		for _, n := range lengths {
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

// TestPseudoRxMatchesPseudo: a PseudoRx made for a local address and
// port gives the ICRC icrcPseudo gives with the same pseudo header, for
// every family mix and length (the forms TestICRCPseudoMatchesReference
// checks against the reference).
func TestPseudoRxMatchesPseudo(t *testing.T) {
	addrs := []netip.Addr{{}, netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"),
		netip.MustParseAddr("::ffff:10.0.0.1"), netip.IPv6Unspecified(), netip.IPv4Unspecified(),
		netip.MustParseAddr("fe80::1%eth0"), netip.MustParseAddr("::1")}
	ports := []uint16{0, 1, 4791, 0xc123}
	lengths := append(icrcLengths(0, 200), 1000, 4096+RETHLen)
	for _, src := range addrs {
		for _, dst := range addrs {
			for _, sp := range ports {
				for _, dp := range ports[:2] {
					ps := Pseudo{Src: src, Dst: dst, SrcPort: sp, DstPort: dp}
					r := NewPseudoRx(netip.AddrPortFrom(dst, dp))
					from := netip.AddrPortFrom(src, sp)
					for _, n := range lengths {
						body := make([]byte, BTHLen+n)
						for i := range body {
							body[i] = byte(i*29 + n)
						}
						require.Equal(t, icrcPseudo(&ps, body), ^r.crc(from, body, len(body)+ICRCLen), "%+v n=%d", ps, n)
					}
				}
			}
		}
	}
}

// TestPseudoStatesMatchPseudo: a PseudoTx, and a PseudoRx per local
// address, given packets in runs of one pseudo header and length (whose
// bodies differ) between changes of address, port or length, give the
// ICRC icrcPseudo gives for every packet, and serve from their kept state
// from the second packet of a run.
func TestPseudoStatesMatchPseudo(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.7"),
		netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("::ffff:10.0.0.1"), {}}
	ports := []uint16{0, 4791, 0xc123}
	lengths := []int{0, 4, 8, 16, 24, 100, 1000, 4096 + RETHLen}
	rng := rand.New(rand.NewPCG(3, 5))
	var tx PseudoTx
	rxs := map[netip.AddrPort]*PseudoRx{}
	hitsTx, hitsRx, k := 0, 0, 0
	for range 3000 {
		ps := Pseudo{Src: addrs[rng.IntN(len(addrs))], Dst: addrs[rng.IntN(len(addrs))],
			SrcPort: ports[rng.IntN(len(ports))], DstPort: ports[rng.IntN(2)]}
		n := lengths[rng.IntN(len(lengths))]
		local := netip.AddrPortFrom(ps.Dst, ps.DstPort)
		r := rxs[local]
		if r == nil {
			rx := NewPseudoRx(local)
			r = &rx
			rxs[local] = r
		}
		from := netip.AddrPortFrom(ps.Src, ps.SrcPort)
		for range 1 + rng.IntN(4) {
			body := make([]byte, BTHLen+n)
			for i := range body {
				body[i] = byte(i*29 + k)
			}
			k++
			tlen := len(body) + ICRCLen
			want := icrcPseudo(&ps, body)
			if tx.ok && tx.tlen == tlen && tx.ps == ps {
				hitsTx++
			}
			require.Equal(t, want, tx.icrc(&ps, body), "PseudoTx %+v n=%d", ps, n)
			if r.ok && r.tlen == tlen && r.from == from {
				hitsRx++
			}
			require.Equal(t, want, ^r.crc(from, body, tlen), "PseudoRx %+v n=%d", ps, n)
		}
	}
	require.Greater(t, hitsTx, 1000)
	require.Greater(t, hitsRx, 1000)
}

// TestCRCUnshift: crcUnshift(s, n) is the state that n zero bytes take
// to s, and icrcSeed4 the one 4 zero bytes take to the ICRC's seed.
func TestCRCUnshift(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	zeros := make([]byte, 40)
	for n := range zeros {
		for range 20 {
			s := rng.Uint32()
			require.Equal(t, s, crcWords(crcUnshift(s, n), zeros[:n]), "n=%d s=%#x", n, s)
		}
	}
	require.Equal(t, ^icrcSeed, crcWords(icrcSeed4, zeros[:4]))
	require.NotEqual(t, icrcSeed4, ^icrcSeed)
}

// TestICRCSeed: the state after 8 bytes of ones is Linux rxe's starting
// value 0xdebb20e3 (rxe_icrc.c), in raw (not inverted) form.
func TestICRCSeed(t *testing.T) {
	assert.Equal(t, uint32(0xdebb20e3), ^icrcSeed)
}

// icrcLengths returns every length from lo to hi and some large ones
// around the fold paths' block sizes and common MTUs.
func icrcLengths(lo, hi int) []int {
	var ns []int
	for n := lo; n <= hi; n++ {
		ns = append(ns, n)
	}
	return append(ns, 383, 384, 511, 512, 513, 1023, 1024, 1040, 1500, 2047, 4152, 4172, 8191, 9000, 65536+7)
}

// icrcVariant is one implementation of crcMasked; takes reports whether
// it accepts a buffer of n bytes under a mask of span m (nil: any).
type icrcVariant struct {
	name  string
	takes func(n, m int) bool
	f     func(c uint32, p []byte, mk *icrcMask, m int) uint32
}

// icrcVariants are the portable path, the dispatching crcMasked and each
// architecture kernel this CPU runs, forced.
func icrcVariants() []icrcVariant {
	return append([]icrcVariant{
		{"generic", nil, crcMaskedGeneric},
		{"dispatch", nil, crcMasked},
	}, archICRCVariants()...)
}

// icrcLayout is a named mask with the span (a multiple of 8) covering
// its nonzero bytes.
type icrcLayout struct {
	name string
	mk   *icrcMask
	span int
}

// maskSpan returns the smallest multiple of 8 covering mk's nonzero bytes.
func maskSpan(mk *icrcMask) int {
	n := 0
	for i, b := range mk {
		if b != 0 {
			n = i + 1
		}
	}
	return (n + 7) &^ 7
}

// icrcLayouts are every mask the package uses (IPv4 IHL 5..15, IPv6, the
// pseudo-header BTH mask), no mask, all ones and a random one.
func icrcLayouts(rng *rand.Rand) []icrcLayout {
	var ls []icrcLayout
	add := func(name string, mk *icrcMask) { ls = append(ls, icrcLayout{name, mk, maskSpan(mk)}) }
	for ihl := 5; ihl <= 15; ihl++ {
		add(fmt.Sprintf("ipv4-ihl%d", ihl), &icrcMasks[ihl])
	}
	add("ipv6", &icrcMasks[16])
	add("bth", &icrcBTHMask)
	add("none", new(icrcMask))
	ones, rnd := new(icrcMask), new(icrcMask)
	for i := range ones {
		ones[i], rnd[i] = 0xff, byte(rng.Uint32())
	}
	add("ones", ones)
	add("random", rnd)
	return ls
}

// refMasked is crcMasked the plain way: copy, OR the mask in, CRC.
func refMasked(c uint32, p []byte, mk *icrcMask) uint32 {
	q := bytes.Clone(p)
	for i := range min(len(q), icrcMaskLen) {
		q[i] |= mk[i]
	}
	return ^crc32.Update(^c, crc32.IEEETable, q)
}

// checkVariants asserts every variant that takes p under layout l
// agrees with refMasked and leaves p as it was.
func checkVariants(t *testing.T, c uint32, p []byte, l icrcLayout) bool {
	orig := bytes.Clone(p)
	want := refMasked(c, p, l.mk)
	ok := true
	for _, v := range icrcVariants() {
		if len(p) < l.span || v.takes != nil && !v.takes(len(p), l.span) {
			continue
		}
		ok = assert.Equal(t, want, v.f(c, p, l.mk, l.span), "%s %s len %d", v.name, l.name, len(p)) && ok
		ok = assert.Equal(t, orig, p, "%s wrote to p", v.name) && ok
	}
	return ok
}

// TestCRCMaskedVariants checks every implementation against refMasked
// for every mask layout, every length 0..300 and assorted large ones, at
// varying alignments and start states.
func TestCRCMaskedVariants(t *testing.T) {
	for _, v := range icrcVariants() {
		t.Logf("variant %s", v.name)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 65536+64)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, l := range icrcLayouts(rng) {
		t.Run(l.name, func(t *testing.T) {
			for _, n := range icrcLengths(0, 300) {
				off := n % 16
				if !checkVariants(t, rng.Uint32(), buf[off:off+n], l) {
					return
				}
			}
		})
	}
}

// TestICRCIPRandom checks icrcIP against refICRC on random packets of
// every header layout (IPv4 IHL 5..15, IPv6) and length.
func TestICRCIPRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for hl := 5; hl <= 16; hl++ {
		v6, iphl := hl == 16, hl*4
		if v6 {
			iphl = IPv6HeaderLen
		}
		t.Run(fmt.Sprintf("v6=%v/iphl=%d", v6, iphl), func(t *testing.T) {
			for _, n := range icrcLengths(iphl+UDPHeaderLen+BTHLen+ICRCLen, 300) {
				ip := make([]byte, n)
				for i := range ip {
					ip[i] = byte(rng.Uint32())
				}
				ip[0] = 0x40 | byte(hl)
				if v6 {
					ip[0] = 0x60 | ip[0]&0xf
				}
				if !assert.Equal(t, refICRC(ip), icrcIP(ip[:n-ICRCLen], v6, iphl), "len %d", n) {
					return
				}
			}
		})
	}
}

// TestCRCTail checks crcTail against hash/crc32 for every tail length.
func TestCRCTail(t *testing.T) {
	b := []byte("0123456789abcdef")
	for n := range 16 {
		for _, c := range []uint32{0, 1, 0xdebb20e3, 0xffffffff} {
			assert.Equal(t, ^crc32.Update(^c, crc32.IEEETable, b[:n]), crcTail(c, b[:n]), "n=%d c=%#x", n, c)
		}
	}
}

// FuzzCRCMasked compares every implementation of crcMasked (portable,
// dispatching, each architecture kernel) with refMasked on arbitrary
// bytes, start state and mask layout.
func FuzzCRCMasked(f *testing.F) {
	for _, n := range []int{0, 7, 40, 127, 128, 143, 255, 256, 300, 1040, 4172} {
		f.Add(bytes.Repeat([]byte{0xa5, 0x3c, 0x00}, n)[:n], uint32(n)*0x9e3779b9, uint8(n))
	}
	layouts := icrcLayouts(rand.New(rand.NewPCG(5, 6)))
	f.Fuzz(func(t *testing.T, data []byte, c uint32, layout uint8) {
		checkVariants(t, c, data, layouts[int(layout)%len(layouts)])
	})
}

// BenchmarkCRCMaskedKernels measures each crcMasked implementation under
// the IPv6 mask against plain crc32.ChecksumIEEE over the same bytes, in
// alternating blocks like BenchmarkICRCvsCRC32: variant/crc32 is the
// median of (crc32 block time / variant block time).
func BenchmarkCRCMaskedKernels(b *testing.B) {
	for _, n := range []int{64, 96, 128, 256, 512, 1024, 4172} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		for _, v := range icrcVariants() {
			if v.takes != nil && !v.takes(n, 56) {
				continue
			}
			b.Run(fmt.Sprintf("%s/%d", v.name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(n))
				const block = 32
				ratios := make([]float64, 0, b.N/block+1)
				for done := 0; done < b.N; done += block {
					t0 := time.Now()
					for range block {
						sink ^= crc32.ChecksumIEEE(p)
					}
					t1 := time.Now()
					for range block {
						sink ^= v.f(^icrcSeed, p, &icrcMasks[16], 56)
					}
					t2 := time.Now()
					ratios = append(ratios, float64(t1.Sub(t0))/float64(t2.Sub(t1)))
				}
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "variant/crc32")
			})
		}
	}
}

// TestStoreICRC: after a built packet's bytes change, StoreICRC and
// StoreICRCUDP give it the ICRC a sender would have built, and the
// parsers accept it again.
func TestStoreICRC(t *testing.T) {
	for _, mode := range []Mode{ModeEthernet, ModeUDP} {
		p := Path{Mode: mode, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 49152, DstPort: UDPPort, TTL: 64}
		buf := make([]byte, MaxHeadroom+64+MaxTailroom)
		h := Headers{BTH: BTHFields{Opcode: OpRCSendOnly, PKey: 0xffff, DestQP: 0x11, PSN: 5}}
		pkt, err := p.Build(buf, MaxHeadroom, 64, &h)
		if err != nil {
			t.Fatal(err)
		}
		ps := Pseudo{Src: p.Src, Dst: p.Dst, SrcPort: p.SrcPort, DstPort: p.DstPort}
		parse := func() error {
			var out Packet
			if mode == ModeUDP {
				return ParseUDP(pkt, &ps, &out)
			}
			return Parse(pkt, &out)
		}
		if err := parse(); err != nil {
			t.Fatalf("%v: built packet: %v", mode, err)
		}
		pkt[len(pkt)-ICRCLen-1] ^= 0x40 // last payload byte
		if err := parse(); err != ErrICRC {
			t.Fatalf("%v: changed packet: %v, want ErrICRC", mode, err)
		}
		ok := false
		if mode == ModeUDP {
			ok = StoreICRCUDP(pkt, &ps)
		} else {
			ok = StoreICRC(pkt[EthernetHeaderLen:])
		}
		if !ok {
			t.Fatalf("%v: StoreICRC refused the packet", mode)
		}
		if err := parse(); err != nil {
			t.Fatalf("%v: after StoreICRC: %v", mode, err)
		}
	}
	if StoreICRC([]byte{0x45}) || StoreICRC(nil) || StoreICRCUDP(make([]byte, 8), &Pseudo{}) {
		t.Fatal("short packets must be refused")
	}
}
