package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/vrnic/vrnic/roce"
)

// Fuzz tests of the two byte-level halves of the UDP link: conform reads
// frames handed to SendBatch; synth4/synth6 write the headers of received
// datagrams, whose payload comes from the wire.

var (
	fuzzA4 = netip.MustParseAddrPort("127.0.0.7:4791")
	fuzzB4 = netip.MustParseAddrPort("127.0.0.8:4791")
	fuzzA6 = netip.MustParseAddrPort("[fd00::7]:4791")
	fuzzB6 = netip.MustParseAddrPort("[fd00::8]:4791")
)

func fuzzSeedFrames(f *testing.F) {
	for _, pair := range [][2]netip.AddrPort{{fuzzA4, fuzzB4}, {fuzzA6, fuzzB6}} {
		path := pathBetween(pair[0], pair[1])
		for _, c := range opcodeCases() {
			if c.n > 256 {
				c.n = 256
			}
			f.Add(buildFrame(f, path, &c.h, c.n))
		}
		p := *path
		p.DontFragment = false
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCAck, PKey: 0xffff}}
		f.Add(buildFrame(f, &p, &h, 0))
	}
	f.Add([]byte{})
	f.Add(make([]byte, UDPHeadroom4))
}

// within reports whether sub is a sub-slice of b (same backing array,
// inside b's length).
func within(sub, b []byte) bool {
	i := cap(b) - cap(sub)
	if len(sub) == 0 || i < 0 || i+len(sub) > len(b) {
		return len(sub) == 0
	}
	return &b[i] == &sub[0]
}

// FuzzUDPConform: conform never panics; what it accepts is a payload
// inside the frame; the frame the receiver synthesizes for it has the
// same ICRC-covered IP and UDP fields, so a frame whose ICRC verifies
// before the link verifies after it.
func FuzzUDPConform(f *testing.F) {
	fuzzSeedFrames(f)
	f.Fuzz(func(t *testing.T, frame []byte) {
		for _, v6 := range []bool{false, true} {
			loc := udpLocal{v6: v6, port: roce.UDPPort, peerPort: 5000}
			if v6 {
				loc.addr = fuzzA6.Addr().As16()
			} else {
				copy(loc.addr[:], fuzzA4.Addr().AsSlice())
			}
			var name [sockaddrLen]byte
			orig := bytes.Clone(frame)
			payload, namelen, why, ok := loc.conform(frame, &name)
			if !bytes.Equal(orig, frame) {
				t.Fatal("conform modified the frame")
			}
			if !ok {
				if why >= numUDPDrops {
					t.Fatalf("drop reason %d out of range", why)
				}
				continue
			}
			if !within(payload, frame) || len(payload) < udpMinPayload {
				t.Fatalf("payload of %d bytes not inside the %d-byte frame", len(payload), len(frame))
			}
			// The receiver's view: the datagram from loc to the sockaddr.
			hl := UDPHeadroom4
			var dst [16]byte
			if v6 {
				hl = UDPHeadroom6
				copy(dst[:], name[8:24])
				if namelen != sockaddrLen {
					t.Fatalf("namelen %d", namelen)
				}
			} else {
				copy(dst[:4], name[4:8])
				if namelen != sockaddr4Len {
					t.Fatalf("namelen %d", namelen)
				}
			}
			dport := binary.BigEndian.Uint16(name[2:])
			got := make([]byte, hl+len(payload))
			copy(got[hl:], payload)
			if v6 {
				synth6(got, len(payload), &loc.addr, loc.port, &dst, dport)
			} else {
				synth4(got, len(payload), &loc.addr, loc.port, &dst, dport)
			}
			if !bytes.Equal(maskedIPUDP(frame[:hl], v6), maskedIPUDP(got[:hl], v6)) {
				t.Fatalf("covered IP/UDP fields differ:\nsent %x\nrecv %x", frame[:hl], got[:hl])
			}
			var sp, rp roce.Packet
			if roce.Parse(frame, &sp) == nil {
				if err := roce.Parse(got, &rp); err != nil {
					t.Fatalf("sent frame verifies, received one fails: %v", err)
				}
				if !bytes.Equal(sp.Payload, rp.Payload) || sp.ICRC != rp.ICRC {
					t.Fatal("payload or ICRC differ")
				}
			}
		}
	})
}

// maskedIPUDP returns the IP and UDP headers of a frame without
// Ethernet, with the fields the ICRC masks cleared.
func maskedIPUDP(h []byte, v6 bool) []byte {
	b := bytes.Clone(h[roce.EthernetHeaderLen:])
	if v6 {
		b[0] &^= 0x0f
		b[1], b[2], b[3], b[7] = 0, 0, 0, 0
		b[roce.IPv6HeaderLen+6], b[roce.IPv6HeaderLen+7] = 0, 0
		return b
	}
	b[1], b[8], b[10], b[11] = 0, 0, 0, 0
	b[roce.IPv4HeaderLen+6], b[roce.IPv4HeaderLen+7] = 0, 0
	return b
}

// FuzzUDPSynth: for any payload and sender, the synthesized frame is
// roce.AppendCaptureFrame's, and the engine's roce.Parse of it reaches
// the same verdict as roce.ParseUDP of the bare payload under the pseudo
// header (the ModeUDP definition of the ICRC).
func FuzzUDPSynth(f *testing.F) {
	for _, pair := range [][2]netip.AddrPort{{fuzzA4, fuzzB4}, {fuzzA6, fuzzB6}} {
		path := pathBetween(pair[0], pair[1])
		for _, c := range opcodeCases()[:6] {
			fr := buildFrame(f, path, &c.h, min(c.n, 200))
			hl := UDPHeadroom4
			if pair[0].Addr().Is6() {
				hl = UDPHeadroom6
			}
			f.Add(fr[hl:], pair[0].Addr().Is6(), pair[0].Port())
		}
	}
	f.Add([]byte{1, 2, 3}, false, uint16(1))
	f.Fuzz(func(t *testing.T, payload []byte, v6 bool, sport uint16) {
		if len(payload) > 9000 {
			return
		}
		src, dst := fuzzA4, fuzzB4
		hl := UDPHeadroom4
		if v6 {
			src, dst, hl = fuzzA6, fuzzB6, UDPHeadroom6
		}
		var s, d [16]byte
		copy(s[:], src.Addr().AsSlice())
		copy(d[:], dst.Addr().AsSlice())
		fr := make([]byte, hl+len(payload))
		copy(fr[hl:], payload)
		if v6 {
			synth6(fr, len(payload), &s, sport, &d, dst.Port())
		} else {
			synth4(fr, len(payload), &s, sport, &d, dst.Port())
		}
		ps := roce.Pseudo{Src: src.Addr(), Dst: dst.Addr(), SrcPort: sport, DstPort: dst.Port()}
		if want := roce.AppendCaptureFrame(nil, &ps, UDPRemoteMAC, UDPLocalMAC, payload); !bytes.Equal(want, fr) {
			t.Fatalf("synthesized frame differs from the capture frame:\n%x\n%x", fr, want)
		}
		var p1, p2 roce.Packet
		e1 := roce.Parse(fr, &p1)
		e2 := roce.ParseUDP(payload, &ps, &p2)
		if (e1 == nil) != (e2 == nil) || errors.Is(e1, roce.ErrICRC) != errors.Is(e2, roce.ErrICRC) {
			t.Fatalf("Parse: %v, ParseUDP: %v", e1, e2)
		}
	})
}
