package link

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/tap"
)

// TestTAPGSORealDevices (root): a namespace with a bridge and three TAPs:
// ga and gb behind TAP links with the offload, gc a plain TAP without it.
// Runs that link A writes as segmented packets are flooded by the bridge
// (their destination MAC is unknown to it) to gb, which takes USO, so one
// read of link B returns the whole run and the link splits it, and to gc,
// which does not, so the kernel cuts them in software and every read of
// gc is one frame. Both must be exactly the run's frames with
// identifications 0..n-1 (and over IPv4 the full UDP checksum the
// kernel's segmentation writes), each a valid RoCE v2 frame; IPv4 and
// IPv6, long frames (runs cut at 64 KiB) and short ones (64 frames).
func TestTAPGSORealDevices(t *testing.T) {
	ns, ip, h := rootNetns(t, "vrgst", "TAP offload test needs root (network namespace, TAP devices)")
	addBridge(ns, ip)
	var links []*TAPLink
	for i, name := range []string{"ga", "gb"} {
		dev, err := tap.Create(tap.Config{Name: name, Queues: 1, MAC: tap.MAC{2, 0x4c, 0, 0, 0, byte(i + 1)}, NetNS: h})
		require.NoError(t, err)
		uso, msg := dev.Offload()
		require.True(t, uso, "offload on %s: %s", name, msg)
		ip("-n", ns, "link", "set", name, "master", "br0")
		l := tapLinkOn(t, dev)
		require.Equal(t, "uso", l.Offload())
		links = append(links, l)
	}
	plain, err := tap.Create(tap.Config{Name: "gc", Queues: 1, MAC: tap.MAC{2, 0x4c, 0, 0, 0, 3}, NetNS: h, NoOffload: true})
	require.NoError(t, err)
	t.Cleanup(func() { plain.Close() })
	uso, _ := plain.Offload()
	require.False(t, uso)
	ip("-n", ns, "link", "set", "gc", "master", "br0")
	time.Sleep(50 * time.Millisecond) // ports forwarding

	pa, pb := links[0].Ports()[0], links[1].Ports()[0]
	for _, v6 := range []bool{false, true} {
		for _, c := range []struct{ n, seg, last int }{{20, 4096, 4096}, {8, 4096, 1000}, {64, 32, 32}, {64, 8, 4}, {2, 1024, 0}} {
			t.Run(fmt.Sprintf("v6=%v/%d×%d+%d", v6, c.n, c.seg, c.last), func(t *testing.T) {
				run := gsoRun(t, v6, c.n, c.seg, c.last)
				gsoBefore, txBefore := pa.Counters.TxGSO.Load(), pa.Counters.TxGSOFrames.Load()
				rxBefore := pb.Counters.RxGSO.Load()
				n, err := pa.SendBatch(run, nil)
				require.NoError(t, err)
				require.Equal(t, c.n, n)
				writes := pa.Counters.TxGSO.Load() - gsoBefore
				assert.EqualValues(t, c.n, pa.Counters.TxGSOFrames.Load()-txBefore, "every frame in a segmented write")
				assert.Zero(t, pa.Counters.TxErrors.Load())

				// Numbering restarts at every write: frame k of a write
				// carries identification k.
				want := make([][]byte, c.n)
				k := 0
				for i := range run {
					if i > 0 && (len(run[i-1]) != len(run[0]) || k == tapGSOMaxSegs ||
						ipSum(run[i-k:i+1]) > ipMaxLen) {
						k = 0
					}
					want[i] = wireFrame(run[i], k)
					k++
				}

				got := recvTAP(t, pb, c.n)
				assert.EqualValues(t, writes, pb.Counters.RxGSO.Load()-rxBefore, "one read per segmented write")
				assertFrames(t, want, got)

				var raw [][]byte
				bufs, sizes := newBufs(16), make([]int, 16)
				deadline := time.Now().Add(recvTimeout)
				for len(raw) < c.n && time.Now().Before(deadline) {
					for i := range bufs {
						bufs[i] = bufs[i][:cap(bufs[i])]
					}
					m, err := plain.Queue(0).TryReadBatch(bufs, sizes, 0)
					require.NoError(t, err)
					for i := range m {
						f := bufs[i][:sizes[i]]
						if _, ok := roceDestQP(f); ok {
							raw = append(raw, append([]byte(nil), f...))
						}
					}
					if m == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				assertFrames(t, want, raw)
			})
		}
	}
}

// ipSum is the IP datagram length of a segmented write of frames.
func ipSum(frames [][]byte) int {
	h, _ := parseHdrs(frames[0])
	n := len(frames[0]) - h.l3
	for _, f := range frames[1:] {
		n += len(f) - h.hl
	}
	return n
}

func assertFrames(t *testing.T, want, got [][]byte) {
	t.Helper()
	require.Len(t, got, len(want))
	var pkt roce.Packet
	for i := range want {
		require.NoError(t, roce.Parse(got[i], &pkt), "frame %d: valid RoCE v2 (ICRC over its real headers)", i)
		require.Equal(t, want[i], got[i], "frame %d", i)
	}
}

// TestTAPGSOToKernelUDP (root): segmented writes into a TAP whose kernel
// side holds the destination address reach the kernel's IP stack whole
// (the TAP takes USO); the UDP socket, which does not take GSO, gets them
// cut (udp_rcv_segment) into one datagram per frame, each the frame's UDP
// payload with the ICRC renumbered for its identification. This is the
// path a Soft-RoCE (rxe) peer's tunnel socket receives them on: the IPv4
// header checksum of the segmented packet, its lengths and the partial
// UDP checksum must all pass the stack's checks. IPv4 and IPv6.
func TestTAPGSOToKernelUDP(t *testing.T) {
	ns, ip, h := rootNetns(t, "vrgsk", "TAP offload test needs root (network namespace, TAP devices)")
	nicMAC, kMAC := tap.MAC{2, 0x4c, 0, 0, 0, 0x11}, tap.MAC{2, 0x4c, 0, 0, 0, 0x10}
	dev, err := tap.Create(tap.Config{Name: "gk", Queues: 1, MAC: nicMAC, LinkMAC: kMAC, NetNS: h})
	require.NoError(t, err)
	l := tapLinkOn(t, dev)
	require.Equal(t, "uso", l.Offload())
	ip("-n", ns, "link", "set", "lo", "up")
	ip("-n", ns, "addr", "add", "10.99.0.1/24", "dev", "gk")
	ip("-n", ns, "addr", "add", "fd99::1/64", "dev", "gk", "nodad")
	var conns [2]*net.UDPConn
	inNetns(t, ns, func() {
		for i, a := range []string{"10.99.0.1:4791", "[fd99::1]:4791"} {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(a)))
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			conns[i] = c
		}
	})
	p := l.Ports()[0]
	for i, v6 := range []bool{false, true} {
		for _, c := range []struct{ n, seg, last int }{{8, 4096, 1000}, {64, 8, 4}} {
			t.Run(fmt.Sprintf("v6=%v/%d×%d+%d", v6, c.n, c.seg, c.last), func(t *testing.T) {
				run := gsoRun(t, v6, c.n, c.seg, c.last)
				src, dst := "10.99.0.2", "10.99.0.1"
				if v6 {
					src, dst = "fd99::2", "fd99::1"
				}
				path := tapPath(v6)
				path.SrcMAC, path.DstMAC = nicMAC, kMAC
				path.Src, path.Dst = netip.MustParseAddr(src), netip.MustParseAddr(dst)
				for k := range run {
					hd := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCWriteMiddle, PKey: 0xffff, DestQP: 0x4711, PSN: uint32(k)}}
					size := c.seg
					if k == c.n-1 {
						size, hd.BTH.Opcode = c.last, roce.OpRCWriteLast
					}
					run[k] = bytes.Clone(buildFrame(t, path, &hd, size))
				}
				gso := p.Counters.TxGSO.Load()
				_, err := p.SendBatch(run, nil)
				require.NoError(t, err)
				require.Equal(t, gso+1, p.Counters.TxGSO.Load(), "one segmented write")
				conn := conns[i]
				require.NoError(t, conn.SetReadDeadline(time.Now().Add(recvTimeout)))
				buf := make([]byte, 1<<16)
				for k := range run {
					n, from, err := conn.ReadFromUDPAddrPort(buf)
					require.NoError(t, err, "datagram %d of %d", k, c.n)
					assert.Equal(t, src, from.Addr().Unmap().String())
					w := wireFrame(run[k], k)
					hh, _ := parseHdrs(w)
					require.Equal(t, w[hh.hl:], buf[:n], "datagram %d: the frame's UDP payload, ICRC for identification %d", k, k)
				}
			})
		}
	}
}
