package link

import (
	"bytes"
	"net/netip"
	"testing"
)

// FuzzUDPSockaddr fuzzes the byte-level half of the UDP link: the
// sockaddr the kernel reads the destination of a datagram from
// (putSockaddr) and writes its sender into (sockaddrAddrPort). Neither
// panics for any input; a destination putSockaddr accepts decodes to
// itself; a sender sockaddrAddrPort decodes is of the link's family and,
// when it is a valid destination, encodes to the same bytes.
func FuzzUDPSockaddr(f *testing.F) {
	for _, s := range []string{"127.0.0.8:4791", "[fd00::8]:4791", "[::ffff:10.0.0.1]:4791", "0.0.0.0:0", "[ff02::1]:1"} {
		ap := netip.MustParseAddrPort(s)
		f.Add(ap.Addr().AsSlice(), ap.Port(), ap.Addr().Is6(), uint32(sockaddrLen), []byte{})
	}
	f.Add([]byte{}, uint16(0), false, uint32(0), []byte{2, 0, 0x12, 0xb7, 127, 0, 0, 1})
	f.Add([]byte{}, uint16(0), true, uint32(28), []byte{10, 0, 0x12, 0xb7, 0, 0, 0, 0, 0xfd, 15: 1, 23: 8})
	f.Fuzz(func(t *testing.T, addr []byte, port uint16, v6 bool, namelen uint32, raw []byte) {
		a, _ := netip.AddrFromSlice(addr)
		ap := netip.AddrPortFrom(a, port)
		var name [sockaddrLen]byte
		n, ok := putSockaddr(&name, ap, v6)
		if ok {
			back, ok2 := sockaddrAddrPort(&name, n, v6)
			if !ok2 || back != netip.AddrPortFrom(a.Unmap(), port) {
				t.Fatalf("%v encoded, %v (%v) decoded", ap, back, ok2)
			}
		}

		// Whatever the kernel wrote.
		var in [sockaddrLen]byte
		copy(in[:], raw)
		from, ok := sockaddrAddrPort(&in, namelen, v6)
		if !ok {
			return
		}
		if from.Addr().Is6() != v6 || (!v6 && !from.Addr().Is4()) {
			t.Fatalf("sender %v on a link with v6=%v", from, v6)
		}
		var out [sockaddrLen]byte
		if n, ok := putSockaddr(&out, from, v6); ok {
			// Family, port and address; sin_zero, sin6_flowinfo and
			// sin6_scope_id are not part of the sender.
			same := bytes.Equal(in[:8], out[:8])
			if v6 {
				same = bytes.Equal(in[:4], out[:4]) && bytes.Equal(in[8:24], out[8:24])
			}
			if !same {
				t.Fatalf("sender %v: in %x, out %x", from, in[:n], out[:n])
			}
		}
	})
}
