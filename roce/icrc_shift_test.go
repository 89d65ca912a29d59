package roce

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSetIPv4ID: renumbering a built IPv4 frame gives, byte for byte, the
// frame Build writes with that identification, for every payload length
// class (the shift covers lengths from a few bytes to 4 KiB) and the
// whole 16-bit range of identifications.
func TestSetIPv4ID(t *testing.T) {
	p := Path{
		Mode: ModeEthernet, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, DstMAC: [6]byte{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddr("10.1.0.1"), Dst: netip.MustParseAddr("10.1.0.2"),
		SrcPort: 0xc123, TTL: 64, DontFragment: true, TOS: 2,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 4, 63, 64, 256, 1024, 1500, 4096} {
		op := OpRCWriteOnly
		if n == 0 {
			op = OpRCSendOnly
		}
		for _, id := range []uint16{1, 2, 63, 64, 0x00ff, 0xff00, 0xffff, uint16(rng.Uint32())} {
			build := func(id uint16) []byte {
				buf := make([]byte, MaxHeadroom+n+MaxTailroom)
				off := p.Headroom(op)
				for i := range n {
					buf[off+i] = byte(rng.Uint32())
				}
				h := Headers{BTH: BTHFields{Opcode: op, DestQP: 0x12345, PSN: 7, PKey: 0xffff},
					RETH: RETHFields{VA: 1, RKey: 2, DMALength: uint32(n)}, IPID: id}
				f, err := p.Build(buf, off, n, &h)
				if err != nil {
					t.Fatal(err)
				}
				return f
			}
			seed := rng.Uint64()
			rng = rand.New(rand.NewPCG(seed, 3))
			a := build(0)
			rng = rand.New(rand.NewPCG(seed, 3))
			want := build(id)
			SetIPv4ID(a[EthernetHeaderLen:], id)
			if !bytes.Equal(a, want) {
				t.Fatalf("payload %d, id %#x: renumbered frame differs from the built one\n got %x\nwant %x", n, id, a, want)
			}
			var pkt Packet
			if err := Parse(a, &pkt); err != nil {
				t.Fatalf("payload %d, id %#x: %v", n, id, err)
			}
			// And back.
			SetIPv4ID(a[EthernetHeaderLen:], 0)
			rng = rand.New(rand.NewPCG(seed, 3))
			if z := build(0); !bytes.Equal(a, z) {
				t.Fatalf("payload %d: renumbering back to 0 differs", n)
			}
		}
	}
}

// TestICRCShiftMatchesZeros: the shift over n zero bytes is what the CRC
// does on n zero bytes.
func TestICRCShiftMatchesZeros(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 8, 100, 4095, 65535} {
		c := uint32(0x89abcdef)
		want := c
		for range n {
			want = want>>8 ^ crcTab[0][byte(want)]
		}
		if got := multModP(uint32(NewICRCShift(n)), c); got != want {
			t.Errorf("n=%d: %#x, want %#x", n, got, want)
		}
	}
}

func BenchmarkICRCShift(b *testing.B) {
	for i := range b.N {
		_ = NewICRCShift(4000+i&63).IPv4IDDelta(0, uint16(i))
	}
}
