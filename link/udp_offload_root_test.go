package link

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
)

// TestUDPOffloadWireHeaders looks at the IP and UDP headers the kernel
// writes for the segments of a UDP_SEGMENT send, over IPv4 and IPv6, and
// checks what udp_offload.go says about their ICRC: the link sends to a
// peer routed through a TUN device (which takes no GSO packets, so the
// kernel cuts them into segments in software, as for a NIC without UDP
// segmentation offload) in a private network namespace, and the test
// reads the segments from the TUN and checks each as a whole RoCE v2
// packet (roce.Parse, the ICRC over the real headers):
//
//   - the lengths are each segment's own;
//   - IPv6: every segment's ICRC matches its real headers;
//   - IPv4: segment k carries identification k, so only segment 0 matches;
//     with the identification set back to 0 every one does (the
//     identification is the only covered field the pseudo header does
//     not predict).
func TestUDPOffloadWireHeaders(t *testing.T) {
	testenv.NeedRoot(t, "needs root (network namespace, TUN device)")
	testenv.NeedTool(t, "ip")
	ns, ip := testNetns(t, "vrgso")

	local4, peer4 := netip.MustParseAddrPort("10.99.0.1:4791"), netip.MustParseAddrPort("10.99.0.2:4791")
	local6, peer6 := netip.MustParseAddrPort("[fd99::1]:4791"), netip.MustParseAddrPort("[fd99::2]:4791")
	var tun *os.File
	var l4, l6 *UDPLink
	inNetns(t, ns, func() {
		tun = openTUN(t, "vrgso0")
		ip("-n", ns, "link", "set", "lo", "up")
		ip("-n", ns, "link", "set", "vrgso0", "up")
		ip("-n", ns, "addr", "add", "10.99.0.1/24", "dev", "vrgso0")
		ip("-n", ns, "addr", "add", "fd99::1/64", "dev", "vrgso0", "nodad")
		l4 = newTestLink(t, local4, 1, func(c *UDPConfig) { c.SegmentIPv4 = SegmentAlways })
		l6 = newTestLink(t, local6, 1, nil)
	})
	t.Cleanup(func() { tun.Close() })

	for _, c := range []struct {
		name        string
		p           *UDPPort
		local, peer netip.AddrPort
	}{{"IPv4", l4.Ports()[0], local4, peer4}, {"IPv6", l6.Ports()[0], local6, peer6}} {
		t.Run(c.name, func(t *testing.T) {
			if !c.p.gso {
				t.Skip("the kernel has no UDP_SEGMENT")
			}
			frames := segmentRun(t, pathBetween(c.local, c.peer))
			sendAll(t, c.p, frames, c.peer)
			require.Equal(t, uint64(1), c.p.Counters.TxGSO.Load(), "one segmented datagram")

			segs := readRoCE(t, tun, len(frames))
			for k, pkt := range segs {
				v6 := pkt[0]>>4 == 6
				require.Equal(t, c.name == "IPv6", v6)
				hl := roce.IPv4HeaderLen
				if v6 {
					hl = roce.IPv6HeaderLen
				}
				udp := pkt[hl:]
				require.Equal(t, frames[k], udp[roce.UDPHeaderLen:], "segment %d: the frame", k)
				assert.Equal(t, len(udp), int(binary.BigEndian.Uint16(udp[4:])), "segment %d: UDP length", k)
				var p roce.Packet
				err := roce.Parse(etherOf(pkt), &p)
				if v6 {
					assert.Equal(t, len(udp), int(binary.BigEndian.Uint16(pkt[4:])), "segment %d: payload length", k)
					assert.NoError(t, err, "segment %d: ICRC over the real IPv6 headers", k)
					continue
				}
				h := roce.IPv4(pkt)
				assert.Equal(t, len(pkt), int(h.TotalLength()), "segment %d: total length", k)
				assert.Equal(t, uint16(k), h.ID(), "segment %d: identification", k)
				if k == 0 {
					assert.NoError(t, err, "segment 0: ICRC over the real IPv4 headers")
				} else {
					assert.ErrorIs(t, err, roce.ErrICRC, "segment %d: identification %d is not the pseudo header's", k, k)
				}
				h.SetID(0)
				h.SetChecksum(0)
				h.SetChecksum(h.CalculateChecksum())
				assert.NoError(t, roce.Parse(etherOf(pkt), &p), "segment %d with identification 0", k)
			}
		})
	}
}

// inNetns runs f on a thread in network namespace ns (sockets and devices
// it creates stay there).
func inNetns(t *testing.T, ns string, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	require.NoError(t, err)
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, netns.Set(h))
	defer func() { require.NoError(t, netns.Set(orig)) }()
	f()
}

// openTUN creates a TUN device (IP packets, no packet information) and
// returns its non-blocking fd.
func openTUN(t *testing.T, name string) *os.File {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	require.NoError(t, err)
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:], name)
	binary.NativeEndian.PutUint16(req[unix.IFNAMSIZ:], unix.IFF_TUN|unix.IFF_NO_PI)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0])))
	if e != 0 {
		unix.Close(fd)
		require.NoError(t, e, "TUNSETIFF")
	}
	return os.NewFile(uintptr(fd), name)
}

// readRoCE reads IP packets from tun until it has n UDP datagrams to port
// 4791 (the kernel's own IPv6 packets, router solicitations and the
// like, are skipped).
func readRoCE(t *testing.T, tun *os.File, n int) [][]byte {
	require.NoError(t, tun.SetReadDeadline(time.Now().Add(recvTimeout)))
	var out [][]byte
	buf := make([]byte, 1<<16)
	for len(out) < n {
		k, err := tun.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read %d of %d segments from the TUN", len(out), n)
		}
		require.NoError(t, err)
		pkt := buf[:k]
		var proto byte
		var udp []byte
		switch {
		case k >= roce.IPv4HeaderLen+roce.UDPHeaderLen && pkt[0]>>4 == 4:
			proto, udp = pkt[9], pkt[int(pkt[0]&0xf)*4:]
		case k >= roce.IPv6HeaderLen+roce.UDPHeaderLen && pkt[0]>>4 == 6:
			proto, udp = pkt[6], pkt[roce.IPv6HeaderLen:]
		default:
			continue
		}
		if proto == unix.IPPROTO_UDP && binary.BigEndian.Uint16(udp[2:]) == roce.UDPPort {
			out = append(out, append([]byte(nil), pkt...))
		}
	}
	return out
}

// etherOf puts an Ethernet header in front of an IP packet.
func etherOf(pkt []byte) []byte {
	f := make([]byte, 14, 14+len(pkt))
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	if pkt[0]>>4 == 6 {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
	}
	return append(f, pkt...)
}

// TestLoopbackSegmentsStayWhole checks why an IPv4 link on a loopback
// address segments by default (kernel-notes/udp-offload.md): in a private
// network namespace, a link on 127.0.0.1 sends a run of frames to one on
// 127.0.0.2 (the default policy, so one UDP_SEGMENT message), a packet
// socket on lo records every IPv4 datagram to port 4791 that crosses it,
// and the test checks that the message crossed lo whole, as one datagram
// of identification 0 (no segment with identification k exists where a
// capture can read it), while the receiver still gets every frame with
// its ICRC intact.
func TestLoopbackSegmentsStayWhole(t *testing.T) {
	testenv.NeedRoot(t, "needs root (network namespace, packet socket)")
	testenv.NeedTool(t, "ip")
	ns, ip := testNetns(t, "vrlo")
	a, b := netip.MustParseAddrPort("127.0.0.1:4791"), netip.MustParseAddrPort("127.0.0.2:4791")
	var la, lb *UDPLink
	var pfd int
	inNetns(t, ns, func() {
		ip("-n", ns, "link", "set", "lo", "up")
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		pfd = fd
		lo, err := net.InterfaceByName("lo")
		require.NoError(t, err)
		require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lo.Index}))
		require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000}))
		la, lb = newTestLink(t, a, 1, nil), newTestLink(t, b, 1, nil)
	})
	pa := la.Ports()[0]
	if !pa.gso {
		t.Skip("the kernel has no UDP_SEGMENT")
	}

	frames := segmentRun(t, pathBetween(a, b))
	total := 0
	for _, f := range frames {
		total += len(f)
	}
	sendAll(t, pa, frames, b)
	require.Equal(t, uint64(1), pa.Counters.TxGSO.Load(), "one segmented message")

	got := recvN(t, lb.Ports()[0], len(frames))
	var pkt roce.Packet
	for k, d := range got {
		assert.Equal(t, frames[k], d.b, "frame %d", k)
		assert.NoError(t, parseFrom(d.b, d.from, b, &pkt), "frame %d: ICRC", k)
	}

	// What crossed lo: every IPv4 datagram to port 4791 (a packet socket
	// sees each twice, leaving and arriving).
	buf := make([]byte, 1<<17)
	seen := 0
	for {
		n, _, err := unix.Recvfrom(pfd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			break
		}
		require.NoError(t, err)
		p := buf[:n]
		if n < roce.IPv4HeaderLen+roce.UDPHeaderLen || p[0]>>4 != 4 || p[9] != unix.IPPROTO_UDP {
			continue
		}
		udp := p[int(p[0]&0xf)*4:]
		if binary.BigEndian.Uint16(udp[2:]) != roce.UDPPort {
			continue
		}
		seen++
		h := roce.IPv4(p)
		assert.Zero(t, h.ID(), "identification of a datagram on lo")
		assert.Equal(t, roce.UDPHeaderLen+total, int(binary.BigEndian.Uint16(udp[4:])), "the message crossed lo as one datagram")
	}
	assert.Positive(t, seen, "the packet socket saw the message")
}

// htons is the network byte order of a 16-bit protocol number.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// segmentRun builds five WRITE Middle frames of 1000 bytes and a WRITE
// Last of 200 for QP 9 on path: one segmented datagram.
func segmentRun(t *testing.T, path *roce.Path) [][]byte {
	var frames [][]byte
	for i := range 6 {
		op, n := roce.OpRCWriteMiddle, 1000
		if i == 5 {
			op, n = roce.OpRCWriteLast, 200
		}
		h := roce.Headers{BTH: roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 9, PSN: uint32(i)}}
		frames = append(frames, buildFrame(t, path, &h, n))
	}
	return frames
}
