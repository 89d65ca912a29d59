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

// copyVariant is one implementation of crcCopy; min is the shortest
// source it takes.
type copyVariant struct {
	name string
	min  int
	f    func(c uint32, dst, src []byte) uint32
}

// copyVariants are the portable path, the dispatching crcCopy and each
// architecture kernel this CPU runs, forced.
func copyVariants() []copyVariant {
	return append([]copyVariant{
		{"generic", 0, crcCopyGeneric},
		{"dispatch", 0, crcCopy},
	}, archCopyVariants()...)
}

// checkCopy asserts every variant that takes src copies it to
// dst[:len(src)] (leaving the 16 bytes before and after alone and src
// unchanged) and returns the CRC hash/crc32 gives.
func checkCopy(t *testing.T, c uint32, dst, src []byte) bool {
	want := ^crc32.Update(^c, crc32.IEEETable, src)
	orig := bytes.Clone(src)
	guard := bytes.Repeat([]byte{0x5a}, 16)
	ok := true
	for _, v := range copyVariants() {
		if len(src) < v.min {
			continue
		}
		d := dst[:16+len(src)+16]
		copy(d, guard)
		copy(d[16+len(src):], guard)
		ok = assert.Equal(t, want, v.f(c, d[16:16+len(src)], src), "%s len %d", v.name, len(src)) && ok
		ok = assert.True(t, bytes.Equal(orig, d[16:16+len(src)]), "%s: copy of %d bytes", v.name, len(src)) && ok
		ok = assert.True(t, bytes.Equal(orig, src), "%s wrote to src", v.name) && ok
		ok = assert.Equal(t, guard, d[:16], "%s wrote before dst", v.name) && ok
		ok = assert.Equal(t, guard, d[16+len(src):], "%s wrote past the copy of %d", v.name, len(src)) && ok
	}
	return ok
}

// TestCRCCopyVariants checks every crcCopy implementation against
// hash/crc32 and copy for every length 0..600 and assorted large ones,
// at every source alignment mod 64 and several destination alignments.
func TestCRCCopyVariants(t *testing.T) {
	for _, v := range copyVariants() {
		t.Logf("variant %s (from %d bytes)", v.name, v.min)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	buf := make([]byte, 65536+128)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	dst := make([]byte, 65536+128+32)
	for _, n := range icrcLengths(0, 600) {
		off := rng.IntN(64)
		if !checkCopy(t, rng.Uint32(), dst[rng.IntN(64):], buf[off:off+n]) {
			return
		}
	}
}

// TestCRCCopyPieces splits random buffers into random pieces (lengths
// and alignments arbitrary, many below the fold's minimum, some empty)
// and chains crcCopy over them: the result is the CRC of the whole and
// the copy is the whole.
func TestCRCCopyPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for iter := range 2000 {
		n := rng.IntN(9000)
		if iter%4 == 0 {
			n = rng.IntN(600)
		}
		so := rng.IntN(64)
		src := make([]byte, so+n)[so:]
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		do := rng.IntN(64)
		dst := make([]byte, do+n)[do:]
		c0 := rng.Uint32()
		for _, v := range copyVariants() {
			clear(dst)
			c := c0
			for at := 0; at < n; {
				k := min(n-at, pieceLen(rng))
				if k < v.min {
					c = crcCopy(c, dst[at:], src[at:at+k])
				} else {
					c = v.f(c, dst[at:], src[at:at+k])
				}
				at += k
			}
			if !assert.Equal(t, ^crc32.Update(^c0, crc32.IEEETable, src), c, "%s len %d", v.name, n) ||
				!assert.Equal(t, src, dst, "%s len %d", v.name, n) {
				return
			}
		}
	}
}

// pieceLen picks a piece length: empty, short, around the fold's block
// sizes, or long.
func pieceLen(rng *rand.Rand) int {
	switch rng.IntN(5) {
	case 0:
		return rng.IntN(17)
	case 1:
		return rng.IntN(70)
	case 2:
		return 240 + rng.IntN(40)
	case 3:
		return rng.IntN(1100)
	}
	return rng.IntN(5000)
}

// framerPaths are paths of every shape Build handles: IPv4 and IPv6,
// with an 802.1Q tag, with the IPv4 UDP checksum, and the UDP link's
// pseudo headers over IPv4, IPv6 and zero addresses.
func framerPaths() map[string]Path {
	v4 := Path{
		Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("198.51.100.7"),
		SrcPort: 0xc123, TTL: 64, TOS: 26<<2 | 2, DontFragment: true,
		SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2},
	}
	v6 := v4
	v6.Src, v6.Dst = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:ffff::2")
	v6.FlowLabel = 0x12345
	vlan := v4
	vlan.VLAN, vlan.VLANTCI = true, 3<<13|100
	csum := v4
	csum.UDPChecksum = true
	mapped := v4
	mapped.Src, mapped.Dst = netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("::ffff:10.0.0.2")
	u4, u6, u0 := v4, v6, Path{SrcPort: 4791, DstPort: 5000}
	u4.Mode, u6.Mode, u0.Mode = ModeUDP, ModeUDP, ModeUDP
	return map[string]Path{"ipv4": v4, "ipv6": v6, "vlan": vlan, "udpcsum": csum, "mapped": mapped,
		"udp4": u4, "udp6": u6, "udp0": u0}
}

// TestFramerMatchesBuild builds random packets of every opcode that
// carries a payload on every path shape twice: with Build around a
// payload already in place, and with Begin, Put of random pieces, Finish.
// The two must be byte for byte the same (Build's output is what the
// golden captures pin).
func TestFramerMatchesBuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var f Framer
	for name, p := range framerPaths() {
		t.Run(name, func(t *testing.T) {
			for _, op := range allOpcodes() {
				info := op.Info()
				if info.Flags&OpPayload == 0 {
					continue
				}
				for iter := range 40 {
					n := rng.IntN(4200)
					if iter < 8 {
						n = iter
					}
					if info.Flags&(OpFirst|OpMiddle) != 0 {
						n &^= 3
					}
					h := randomHeaders(rng, op)
					payload := make([]byte, n)
					for i := range payload {
						payload[i] = byte(rng.Uint32())
					}
					hr := p.Headroom(op)
					want := make([]byte, hr+n+MaxTailroom+8)
					copy(want[hr:], payload)
					wf, err := p.Build(want, hr, n, &h)
					require.NoError(t, err)

					got := make([]byte, len(want))
					for i := range got {
						got[i] = 0xee // pad and headers must be written, not assumed zero
					}
					require.NoError(t, p.Begin(&f, got, hr, n, &h))
					for at := 0; at < n; {
						k := min(n-at, pieceLen(rng))
						so := rng.IntN(64)
						src := make([]byte, so+k)[so:]
						copy(src, payload[at:at+k])
						f.Put(src)
						at += k
					}
					gf, err := f.Finish()
					require.NoError(t, err)
					if !assert.Equal(t, wf, gf, "%v, %d payload bytes", op, n) {
						return
					}
				}
			}
		})
	}
}

// TestFramerKeptPseudoState: over the UDP link a Framer keeps the
// pseudo header's CRC state from packet to packet. Runs of packets with
// one path, opcode and length (fused and not, with a BTH alone or a RETH
// too, random fields and payloads), the runs' paths and lengths changing,
// must each be the packet Build makes, and most must come from the kept
// state.
func TestFramerKeptPseudoState(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	paths := framerPaths()
	udp := []Path{paths["udp4"], paths["udp6"], paths["udp0"]}
	ops := []Opcode{OpRCSendMiddle, OpRCWriteFirst, OpRCSendOnly, OpRCWriteOnly, OpRCAck}
	var f Framer
	kept := 0
	for run := range 300 {
		p := udp[rng.IntN(len(udp))]
		op := ops[rng.IntN(len(ops))]
		n := []int{0, 8, 100, 1024, 4096}[rng.IntN(5)]
		if op.Info().Flags&OpPayload == 0 {
			n = 0
		}
		for k := range 1 + rng.IntN(4) {
			h := randomHeaders(rng, op)
			hr := p.Headroom(op)
			want := make([]byte, hr+n+MaxTailroom)
			for i := range want[hr : hr+n] {
				want[hr+i] = byte(rng.Uint32())
			}
			got := bytes.Clone(want)
			wf, err := p.Build(want, hr, n, &h)
			require.NoError(t, err)
			ps := p.Pseudo()
			if f.pt.tlen == len(wf) && f.pt.ps.same(&ps) {
				kept++
			}
			require.NoError(t, p.Begin(&f, got, hr, n, &h))
			f.Put(got[hr : hr+n])
			gf, err := f.Finish()
			require.NoError(t, err)
			require.Equal(t, wf, gf, "run %d packet %d: %v, %d payload bytes, %+v", run, k, op, n, ps)
		}
	}
	require.Greater(t, kept, 300, "packets built from a kept pseudo header state")
}

// randomHeaders returns headers for op with random field values.
func randomHeaders(rng *rand.Rand, op Opcode) Headers {
	return Headers{
		BTH:          BTHFields{Opcode: op, PKey: DefaultPKey, DestQP: rng.Uint32() & 0xffffff, PSN: rng.Uint32() & 0xffffff, AckReq: rng.IntN(2) == 0, SE: rng.IntN(2) == 0},
		DETH:         DETHFields{QKey: rng.Uint32(), SrcQP: rng.Uint32() & 0xffffff},
		RETH:         RETHFields{VA: rng.Uint64(), RKey: rng.Uint32(), DMALength: rng.Uint32()},
		AETH:         AETHFields{Syndrome: ACKSyndrome(CreditsInvalid), MSN: rng.Uint32() & 0xffffff},
		Imm:          rng.Uint32(),
		InvRKey:      rng.Uint32(),
		IPID:         uint16(rng.Uint32()),
		AtomicAckETH: AtomicAckETHFields{OrigRemoteData: rng.Uint64()},
	}
}

// TestFramerMisuse: a payload put short or long, or Finish without
// Begin, fails; a failed Begin leaves nothing to finish.
func TestFramerMisuse(t *testing.T) {
	p := framerPaths()["ipv4"]
	h := Headers{BTH: BTHFields{Opcode: OpRCWriteOnly, PKey: DefaultPKey}}
	buf := make([]byte, 256)
	hr := p.Headroom(OpRCWriteOnly)
	var f Framer

	_, err := f.Finish()
	assert.Error(t, err, "no Begin")

	require.NoError(t, p.Begin(&f, buf, hr, 16, &h))
	f.Put(make([]byte, 8))
	_, err = f.Finish()
	assert.ErrorIs(t, err, ErrOpcodeLength, "short")

	require.NoError(t, p.Begin(&f, buf, hr, 16, &h))
	f.Put(make([]byte, 8))
	f.Put(make([]byte, 9))
	_, err = f.Finish()
	assert.ErrorIs(t, err, ErrOpcodeLength, "long")
	_, err = f.Finish()
	assert.Error(t, err, "finished twice")

	assert.ErrorIs(t, p.Begin(&f, buf[:hr+8], hr, 16, &h), ErrNoRoom)
	f.Put(make([]byte, 16))
	_, err = f.Finish()
	assert.Error(t, err, "after a failed Begin")
}

// TestFramerZeroAlloc: Begin, Put, Finish allocate nothing.
func TestFramerZeroAlloc(t *testing.T) {
	for name, p := range framerPaths() {
		h := Headers{BTH: BTHFields{Opcode: OpRCWriteFirst, PKey: DefaultPKey}}
		buf := make([]byte, 4096+MaxHeadroom+MaxTailroom)
		src := make([]byte, 4096)
		hr := p.Headroom(OpRCWriteFirst)
		var f Framer
		allocs := testing.AllocsPerRun(100, func() {
			if p.Begin(&f, buf, hr, 4096, &h) != nil {
				panic("begin")
			}
			f.Put(src[:1000])
			f.Put(src[1000:])
			if _, err := f.Finish(); err != nil {
				panic(err)
			}
		})
		assert.Zero(t, allocs, name)
	}
}

// BenchmarkFramerStream compares the two ways of building 4 KiB-payload
// packets as a requester streams a 1 MiB message (the source walked
// once, out of cache) into a ring of 32 frame buffers: copy then Build
// (two passes over each frame) and Begin, Put, Finish (one). They run
// in alternating blocks of 32 packets, so that a busy machine slows
// both alike; framer/copy+build is the median of the blocks' time
// ratios (above 1: the framer is faster).
func BenchmarkFramerStream(b *testing.B) {
	p := framerPaths()["ipv4"]
	const n = 4096
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	frames := make([][]byte, 32)
	for i := range frames {
		frames[i] = make([]byte, n+MaxHeadroom+MaxTailroom)
	}
	op := OpRCWriteMiddle
	h := Headers{BTH: BTHFields{Opcode: op, PKey: DefaultPKey}}
	hr := p.Headroom(op)
	var f Framer
	b.SetBytes(n)
	at := 0
	next := func() ([]byte, []byte) {
		buf, s := frames[at%len(frames)], src[at*n%len(src):][:n]
		at++
		return buf, s
	}
	var ratios []float64
	for done := 0; done < b.N; done += 32 {
		t0 := time.Now()
		for range 32 {
			buf, s := next()
			copy(buf[hr:], s)
			if _, err := p.Build(buf, hr, n, &h); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		for range 32 {
			buf, s := next()
			if err := p.Begin(&f, buf, hr, n, &h); err != nil {
				b.Fatal(err)
			}
			f.Put(s)
			if _, err := f.Finish(); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		ratios = append(ratios, float64(t1.Sub(t0))/float64(t2.Sub(t1)))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "framer/copy+build")
}

// BenchmarkFramer compares building a packet by copying the payload in
// and calling Build with Begin, Put, Finish, everything in cache.
func BenchmarkFramer(b *testing.B) {
	p := framerPaths()["ipv4"]
	h := Headers{BTH: BTHFields{Opcode: OpRCWriteMiddle, PKey: DefaultPKey}}
	for _, n := range []int{8 &^ 3, 256, 1024, 4096} {
		op := OpRCWriteOnly
		h.BTH.Opcode = op
		buf := make([]byte, n+MaxHeadroom+MaxTailroom)
		src := make([]byte, n)
		hr := p.Headroom(op)
		b.Run(fmt.Sprintf("copy+build/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(buf[hr:], src)
				if _, err := p.Build(buf, hr, n, &h); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("framer/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			var f Framer
			for b.Loop() {
				if err := p.Begin(&f, buf, hr, n, &h); err != nil {
					b.Fatal(err)
				}
				f.Put(src)
				if _, err := f.Finish(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestIPv4Sum checks the 20-byte header sum against the general
// checksum code on random headers (the checksum field ignored).
func TestIPv4Sum(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	h := make([]byte, IPv4HeaderLen)
	for range 100000 {
		for i := range h {
			h[i] = byte(rng.Uint32())
		}
		if rng.IntN(4) == 0 {
			clear(h[rng.IntN(20):])
		}
		if rng.IntN(2) == 0 {
			h[0] = 0x45 // CalculateChecksum's fast path
		}
		want := checksumFold(checksumAdd(checksumAdd(0, h[:ipv4Checksum]), h[ipv4Checksum+2:]))
		if !assert.Equal(t, want, ipv4Sum(h), "% x", h) {
			return
		}
		if h[0] == 0x45 {
			assert.Equal(t, ^want, IPv4(h).CalculateChecksum())
		}
	}
}

// TestFramerTemplate: one Framer builds packets on paths that change
// from packet to packet (another path, or the same one with a field
// changed in place), with random IPv4 IDs and lengths: its link header
// template must follow, every packet the one Build makes.
func TestFramerTemplate(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	var paths []Path
	for _, p := range framerPaths() {
		paths = append(paths, p)
	}
	var f Framer
	p := paths[0]
	for i := range 20000 {
		switch rng.IntN(6) {
		case 0:
			p = paths[rng.IntN(len(paths))]
		case 1:
			p.TTL = uint8(rng.Uint32())
		case 2:
			p.TOS = uint8(rng.Uint32())
		case 3:
			p.DstMAC[rng.IntN(6)] = byte(rng.Uint32())
		case 4:
			p.SrcPort = uint16(rng.Uint32())
		}
		op := OpRCWriteOnly
		if rng.IntN(3) == 0 {
			op = OpRCAck
		}
		n := 0
		if op == OpRCWriteOnly {
			n = rng.IntN(2000)
		}
		h := randomHeaders(rng, op)
		hr := p.Headroom(op)
		want := make([]byte, hr+n+MaxTailroom)
		payload := want[hr : hr+n]
		for j := range payload {
			payload[j] = byte(rng.Uint32())
		}
		got := bytes.Clone(want)
		wf, err := p.Build(want, hr, n, &h)
		require.NoError(t, err)
		require.NoError(t, p.Begin(&f, got, hr, n, &h))
		f.Put(bytes.Clone(payload))
		gf, err := f.Finish()
		require.NoError(t, err)
		if !assert.Equal(t, wf, gf, "packet %d, path %+v", i, p) {
			return
		}
	}
}
