package roce

import (
	"net/netip"
	"testing"
)

// shortCase is one packet of BenchmarkICRCShort: an RDMA WRITE ONLY of n
// bytes (BTH + RETH + payload), or with ack an ACK (BTH + AETH).
type shortCase struct {
	name string
	ack  bool
	n    int
}

var shortCases = []shortCase{
	{"write8", false, 8},
	{"ack", true, 0},
	{"write4k", false, 4096},
}

// shortPaths are the link layouts of BenchmarkICRCShort.
var shortPaths = []struct {
	name string
	mode Mode
	v6   bool
}{
	{"udp-ipv4", ModeUDP, false},
	{"udp-ipv6", ModeUDP, true},
	{"ethernet-ipv4", ModeEthernet, false},
	{"ethernet-ipv6", ModeEthernet, true},
}

// BenchmarkICRCShort measures the per-message cost of building and
// verifying small packets, where the ICRC over the headers dominates: an
// 8-byte RDMA WRITE ONLY and an ACK (and a 4 KiB WRITE for scale), built
// as the engine builds them (Path.Begin, Framer.Put, Framer.Finish) and
// verified as it receives them (ParseUDP under a Pseudo made from the
// datagram's addresses, or Parse). Meant for instruction counts
// (callgrind) as much as for time.
func BenchmarkICRCShort(b *testing.B) {
	for _, lp := range shortPaths {
		for _, sc := range shortCases {
			p := goldenPath(lp.v6, 0x11)
			p.Mode = lp.mode
			h := Headers{
				BTH:  BTHFields{Opcode: OpRCWriteOnly, PKey: DefaultPKey, DestQP: 0x11, PSN: 0x123456, AckReq: true},
				RETH: RETHFields{VA: 0x7f0000000000, RKey: 0x1234, DMALength: uint32(sc.n)},
				IPID: 7,
			}
			if sc.ack {
				h = Headers{
					BTH:  BTHFields{Opcode: OpRCAck, PKey: DefaultPKey, DestQP: 0x11, PSN: 0x123456},
					AETH: AETHFields{Syndrome: ACKSyndrome(CreditsInvalid), MSN: 9},
				}
			}
			payload := make([]byte, sc.n)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			buf := make([]byte, MaxHeadroom+sc.n+MaxTailroom)
			off := p.Headroom(h.BTH.Opcode)
			var f Framer
			build := func() []byte {
				if err := p.Begin(&f, buf, off, sc.n, &h); err != nil {
					b.Fatal(err)
				}
				f.Put(payload)
				frame, err := f.Finish()
				if err != nil {
					b.Fatal(err)
				}
				return frame
			}
			b.Run(lp.name+"/"+sc.name+"/build", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					h.BTH.PSN++
					build()
				}
			})
			frame := build()
			// What a receiver knows of a datagram: the addresses and ports
			// of the socket pair, the peer's as recvmsg gives them.
			from := netip.AddrPortFrom(p.Src, p.SrcPort)
			local := netip.AddrPortFrom(p.Dst, UDPPort)
			b.Run(lp.name+"/"+sc.name+"/verify", func(b *testing.B) {
				b.ReportAllocs()
				var pkt Packet
				for b.Loop() {
					var err error
					if lp.mode == ModeUDP {
						ps := Pseudo{Src: from.Addr(), SrcPort: from.Port(), Dst: local.Addr(), DstPort: local.Port()}
						err = ParseUDP(frame, &ps, &pkt)
					} else {
						err = Parse(frame, &pkt)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
