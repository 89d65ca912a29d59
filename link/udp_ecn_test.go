package link

import (
	"fmt"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/roce"
)

// setTOS sets the ECN-relevant byte every datagram p sends carries
// (IP_TOS, IPV6_TCLASS): how the test plays a queue that marked CE.
func setTOS(t *testing.T, p *UDPPort, tos int) {
	t.Helper()
	var err error
	require.NoError(t, p.rc.Control(func(fd uintptr) {
		if p.v6 {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_TCLASS, tos)
		} else {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TOS, tos)
		}
	}))
	require.NoError(t, err)
}

// recvECN receives one datagram on a plain socket with IP_RECVTOS /
// IPV6_RECVTCLASS and returns its ECN field.
func recvECN(t *testing.T, fd int) byte {
	t.Helper()
	tv := unix.NsecToTimeval(int64(recvTimeout))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
	buf, oob := make([]byte, testFrameCap), make([]byte, 64)
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
	require.NoError(t, err)
	e, ok := cmsgECN(oob[:oobn])
	require.True(t, ok, "a TOS control message")
	return e
}

// TestUDPECN: a link with ECN sends ECT(0); the frames of a datagram it
// receives marked CE reach the engine with the BTH FECN bit set (and
// their ICRC still valid), unmarked ones without; a link without ECN
// neither marks nor reads. Over IPv4 and IPv6, with and without receive
// coalescing (a segmented CE datagram marks every frame it holds).
func TestUDPECN(t *testing.T) {
	for _, fam := range []string{"IPv4", "IPv6"} {
		for _, noOffload := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/offload=%v", fam, !noOffload), func(t *testing.T) {
				var la, lb netip.AddrPort
				if fam == "IPv4" {
					la, lb = loopback4(t), loopback4(t)
				} else {
					la = loopback6(t)
					lb = netip.AddrPortFrom(la.Addr(), freePort(t, la.Addr()).Port())
				}
				mod := func(c *UDPConfig) { c.ECN, c.NoOffload, c.SegmentIPv4 = true, noOffload, SegmentAlways }
				a := newTestLink(t, la, 1, mod).Ports()[0]
				b := newTestLink(t, lb, 1, mod).Ports()[0]

				// What a sends is ECT(0).
				family := unix.AF_INET
				if fam == "IPv6" {
					family = unix.AF_INET6
				}
				fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
				require.NoError(t, err)
				defer unix.Close(fd)
				plain := freePort(t, la.Addr())
				if fam == "IPv6" {
					require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1))
				} else {
					require.NoError(t, unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1))
				}
				require.NoError(t, unix.Bind(fd, sockaddrOf(plain)))
				sendAll(t, a, [][]byte{buildFrame(t, pathBetween(la, plain), &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x12}}, 64)}, plain)
				assert.Equal(t, byte(ecnECT0), recvECN(t, fd), "sent ECT(0)")

				run := func(tos int, wantFECN bool) {
					setTOS(t, a, tos)
					frames := make([][]byte, 8)
					for i := range frames {
						h := &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCWriteMiddle, PKey: 0xffff, DestQP: 0x12, PSN: uint32(i)}}
						frames[i] = buildFrame(t, pathBetween(la, lb), h, 1024)
					}
					ce0 := b.Counters.RxCE.Load()
					sendAll(t, a, frames, lb)
					got := recvN(t, b, len(frames))
					for i, d := range got {
						var pkt roce.Packet
						require.NoError(t, parseFrom(d.b, d.from, lb, &pkt), "frame %d: ICRC holds", i)
						assert.Equal(t, wantFECN, pkt.BTH.FECN(), "frame %d (TOS %#x)", i, tos)
						assert.Equal(t, uint32(i), pkt.BTH.PSN())
					}
					ce := b.Counters.RxCE.Load() - ce0
					if wantFECN {
						assert.NotZero(t, ce)
						assert.LessOrEqual(t, ce, uint64(len(frames)))
					} else {
						assert.Zero(t, ce)
					}
				}
				run(ecnECT0, false)
				run(ecnCE, true)
				run(0x01, false) // ECT(1): not CE either
				run(ecnCE|0xb8, true)
				if !noOffload && a.gso && b.groRx != nil {
					assert.NotZero(t, b.Counters.RxGRO.Load(), "the coalesced case was run")
				}

				// A link without ECN neither reads the field nor marks.
				lc := loopback4(t)
				if fam == "IPv6" {
					lc = netip.AddrPortFrom(la.Addr(), freePort(t, la.Addr()).Port())
				}
				c := newTestLink(t, lc, 1, func(c *UDPConfig) { c.NoOffload = noOffload }).Ports()[0]
				setTOS(t, a, ecnCE)
				sendAll(t, a, [][]byte{buildFrame(t, pathBetween(la, lc), &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x12}}, 64)}, lc)
				d := recvN(t, c, 1)[0]
				assert.False(t, roce.BTH(d.b).FECN())
				assert.Zero(t, c.Counters.RxCE.Load())
			})
		}
	}
}

// TestCmsgECN walks control messages as the kernel lays them out: the
// TOS after a UDP_GRO message, IPv6's int, truncated and bogus headers.
func TestCmsgECN(t *testing.T) {
	put := func(b []byte, level, typ int32, data []byte) []byte {
		h := make([]byte, unix.CmsgSpace(len(data)))
		hdr := (*unix.Cmsghdr)(ptrOf(h))
		hdr.Level, hdr.Type = level, typ
		hdr.SetLen(unix.CmsgLen(len(data)))
		copy(h[unix.SizeofCmsghdr:], data)
		return append(b, h...)
	}
	gro := put(nil, unix.SOL_UDP, unix.UDP_GRO, []byte{0, 4, 0, 0})
	e, ok := cmsgECN(put(gro, unix.IPPROTO_IP, unix.IP_TOS, []byte{0xbb}))
	assert.True(t, ok)
	assert.Equal(t, byte(3), e)
	e, ok = cmsgECN(put(nil, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, []byte{0x02, 0, 0, 0}))
	assert.True(t, ok)
	assert.Equal(t, byte(2), e)
	_, ok = cmsgECN(gro)
	assert.False(t, ok)
	_, ok = cmsgECN(nil)
	assert.False(t, ok)
	bad := put(nil, unix.IPPROTO_IP, unix.IP_TOS, []byte{3})
	(*unix.Cmsghdr)(ptrOf(bad)).SetLen(1000) // longer than the buffer
	_, ok = cmsgECN(bad)
	assert.False(t, ok)
	(*unix.Cmsghdr)(ptrOf(bad)).SetLen(3) // shorter than a header
	_, ok = cmsgECN(bad)
	assert.False(t, ok)
}

func ptrOf(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
