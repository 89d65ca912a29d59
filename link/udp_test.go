package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/roce"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// linkIface is the engine's Link (device/engine/iface.go), restated so
// this package's tests do not depend on the engine.
type linkIface interface {
	SendBatch(frames [][]byte) (int, error)
	RecvBatch(frames [][]byte) (int, error)
	Ready() <-chan struct{}
}

var _ linkIface = (*UDPPort)(nil)

// opcodeCases covers every opcode family the RC engine sends.
func opcodeCases() []struct {
	name string
	h    roce.Headers
	n    int
} {
	bth := func(op roce.Opcode, psn uint32) roce.BTHFields {
		return roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x12345, PSN: psn, AckReq: true}
	}
	reth := roce.RETHFields{VA: 0x7f00_1234_5000, RKey: 0xabcd, DMALength: 3 * 1024}
	return []struct {
		name string
		h    roce.Headers
		n    int
	}{
		{"send-only", roce.Headers{BTH: bth(roce.OpRCSendOnly, 1)}, 100},
		{"send-only-4096", roce.Headers{BTH: bth(roce.OpRCSendOnly, 2)}, 4096},
		{"send-only-imm", roce.Headers{BTH: bth(roce.OpRCSendOnlyImm, 3), Imm: 0xdeadbeef}, 13},
		{"write-first", roce.Headers{BTH: bth(roce.OpRCWriteFirst, 4), RETH: reth}, 1024},
		{"write-middle", roce.Headers{BTH: bth(roce.OpRCWriteMiddle, 5)}, 1024},
		{"write-last", roce.Headers{BTH: bth(roce.OpRCWriteLast, 6)}, 1021},
		{"write-only-reth", roce.Headers{BTH: bth(roce.OpRCWriteOnly, 7), RETH: reth}, 4096},
		{"read-request", roce.Headers{BTH: bth(roce.OpRCReadRequest, 8), RETH: reth}, 0},
		{"read-response-first", roce.Headers{BTH: bth(roce.OpRCReadResponseFirst, 9), AETH: roce.AETHFields{Syndrome: roce.ACKSyndrome(31), MSN: 1}}, 1024},
		{"read-response-middle", roce.Headers{BTH: bth(roce.OpRCReadResponseMiddle, 10)}, 1024},
		{"read-response-last", roce.Headers{BTH: bth(roce.OpRCReadResponseLast, 11), AETH: roce.AETHFields{Syndrome: roce.ACKSyndrome(31), MSN: 1}}, 1024},
		{"ack", roce.Headers{BTH: bth(roce.OpRCAck, 12), AETH: roce.AETHFields{Syndrome: roce.ACKSyndrome(5), MSN: 77}}, 0},
		{"nak", roce.Headers{BTH: bth(roce.OpRCAck, 13), AETH: roce.AETHFields{Syndrome: roce.NAKSyndrome(roce.NAKCode(1)), MSN: 78}}, 0},
		{"compare-swap", roce.Headers{BTH: bth(roce.OpRCCompareSwap, 14), AtomicETH: roce.AtomicETHFields{VA: 0x1000, RKey: 9, SwapAdd: 5, Compare: 6}}, 0},
		{"fetch-add", roce.Headers{BTH: bth(roce.OpRCFetchAdd, 15), AtomicETH: roce.AtomicETHFields{VA: 0x1008, RKey: 9, SwapAdd: 1}}, 0},
		{"atomic-ack", roce.Headers{BTH: bth(roce.OpRCAtomicAck, 16), AETH: roce.AETHFields{Syndrome: roce.ACKSyndrome(31), MSN: 9}, AtomicAckETH: roce.AtomicAckETHFields{OrigRemoteData: 0x1122334455667788}}, 0},
		{"send-last-inv", roce.Headers{BTH: bth(roce.OpRCSendLastInv, 17), InvRKey: 0x4242}, 64},
	}
}

// TestUDPOpcodes sends a frame of every opcode family from one link to
// another over loopback and checks that it arrives, parses, verifies its
// ICRC, equals the sent frame in every ICRC-covered field, and is the
// frame roce.AppendCaptureFrame builds from the pseudo header.
func TestUDPOpcodes(t *testing.T) {
	for _, fam := range []string{"ipv4", "ipv6"} {
		t.Run(fam, func(t *testing.T) {
			var aAddr, bAddr netip.AddrPort
			if fam == "ipv4" {
				aAddr, bAddr = loopback4(t), loopback4(t)
			} else {
				bAddr = loopback6(t)
				aAddr = freePort(t, netip.IPv6Loopback())
			}
			a := newTestLink(t, aAddr, 1, nil).Ports()[0]
			b := newTestLink(t, bAddr, 1, nil).Ports()[0]
			path := pathBetween(aAddr, bAddr)
			cases := opcodeCases()
			frames := make([][]byte, len(cases))
			for i := range cases {
				frames[i] = buildFrame(t, path, &cases[i].h, cases[i].n)
			}
			sendAll(t, a, frames)
			got := recvN(t, b, len(frames))
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					sent, recv := frames[i], got[i]
					var sp, rp roce.Packet
					require.NoError(t, roce.Parse(sent, &sp))
					require.NoError(t, roce.Parse(recv, &rp), "received frame must parse and verify its ICRC")
					assert.Equal(t, c.h.BTH.Opcode, rp.Opcode())
					assert.Equal(t, sp.Headers(), rp.Headers())
					assert.Equal(t, sp.Payload, rp.Payload)
					assert.Equal(t, sp.ICRC, rp.ICRC)
					assert.Equal(t, transport(t, sent), transport(t, recv), "BTH..ICRC byte-identical")
					assert.Equal(t, coveredHeaders(t, sent), coveredHeaders(t, recv), "covered IP/UDP fields")
					// The conventions: the masked fields the sender set differ.
					if rp.IPv4 != nil {
						assert.Equal(t, uint8(0), rp.IPv4.TOS())
						assert.Equal(t, uint8(UDPTTL), rp.IPv4.TTL())
						assert.Equal(t, uint16(0), rp.UDP.Checksum())
					} else {
						assert.Equal(t, uint8(UDPTTL), rp.IPv6.HopLimit())
					}
					ps := roce.Pseudo{Src: aAddr.Addr(), Dst: bAddr.Addr(), SrcPort: aAddr.Port(), DstPort: bAddr.Port()}
					assert.Equal(t, roce.AppendCaptureFrame(nil, &ps, UDPRemoteMAC, UDPLocalMAC, transport(t, sent)), recv)
				})
			}
			assert.Equal(t, uint64(len(frames)), a.Counters.TxFrames.Load())
			assert.Equal(t, uint64(len(frames)), b.Counters.RxFrames.Load())
		})
	}
}

// TestUDPConform checks every send convention on the frame parser alone.
func TestUDPConform(t *testing.T) {
	a4 := netip.MustParseAddrPort("127.0.0.7:4791")
	b4 := netip.MustParseAddrPort("127.0.0.8:4791")
	a6 := netip.MustParseAddrPort("[fd00::7]:4791")
	b6 := netip.MustParseAddrPort("[fd00::8]:4791")
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 3}}
	v4 := buildFrame(t, pathBetween(a4, b4), &h, 32)
	v6 := buildFrame(t, pathBetween(a6, b6), &h, 32)
	loc4 := udpLocal{port: 4791, peerPort: 5000}
	copy(loc4.addr[:], a4.Addr().AsSlice())
	loc6 := udpLocal{v6: true, port: 4791, addr: a6.Addr().As16()}

	const ip, udp4, udp6 = roce.EthernetHeaderLen, UDPHeadroom4 - 8, UDPHeadroom6 - 8
	be := binary.BigEndian
	cases := []struct {
		name string
		v6   bool
		mod  func(f []byte) []byte
		want UDPDrop // numUDPDrops: accepted
	}{
		{"v4-ok", false, func(f []byte) []byte { return f }, numUDPDrops},
		{"v4-peer-port", false, func(f []byte) []byte { be.PutUint16(f[udp4+2:], 5000); return f }, numUDPDrops},
		{"v4-eth-trailer", false, func(f []byte) []byte { return append(f, 0, 0, 0, 0) }, numUDPDrops},
		{"v6-ok", true, func(f []byte) []byte { return f }, numUDPDrops},
		{"short-frame", false, func(f []byte) []byte { return f[:30] }, UDPDropMalformed},
		{"arp", false, func(f []byte) []byte { be.PutUint16(f[12:], roce.EtherTypeARP); return f }, UDPDropMalformed},
		{"vlan", false, func(f []byte) []byte { be.PutUint16(f[12:], roce.EtherTypeVLAN); return f }, UDPDropVLAN},
		{"v6-on-v4", true, func(f []byte) []byte { return f }, UDPDropFamily},
		{"v4-on-v6", false, func(f []byte) []byte { return f }, UDPDropFamily},
		{"v4-version", false, func(f []byte) []byte { f[ip] = 0x65; return f }, UDPDropMalformed},
		{"v4-options", false, func(f []byte) []byte { f[ip] = 0x46; return f }, UDPDropIPv4Header},
		{"v4-id", false, func(f []byte) []byte { be.PutUint16(f[ip+4:], 1); return f }, UDPDropIPv4Header},
		{"v4-no-df", false, func(f []byte) []byte { be.PutUint16(f[ip+6:], 0); return f }, UDPDropIPv4Header},
		{"v4-fragment", false, func(f []byte) []byte { be.PutUint16(f[ip+6:], 0x4000|roce.IPv4FlagMF); return f }, UDPDropIPv4Header},
		{"v4-offset", false, func(f []byte) []byte { be.PutUint16(f[ip+6:], 0x4001); return f }, UDPDropIPv4Header},
		{"v4-tcp", false, func(f []byte) []byte { f[ip+9] = 6; return f }, UDPDropMalformed},
		{"v4-total-long", false, func(f []byte) []byte { be.PutUint16(f[ip+2:], uint16(len(f))); return f }, UDPDropMalformed},
		{"v4-total-short", false, func(f []byte) []byte { be.PutUint16(f[ip+2:], 27); return f }, UDPDropMalformed},
		{"v4-udp-len", false, func(f []byte) []byte { be.PutUint16(f[udp4+4:], 9); return f }, UDPDropMalformed},
		{"v4-src", false, func(f []byte) []byte { f[ip+15]++; return f }, UDPDropSrcAddr},
		{"v4-dst-zero", false, func(f []byte) []byte { copy(f[ip+16:], []byte{0, 0, 0, 0}); return f }, UDPDropDstAddr},
		{"v4-dst-multicast", false, func(f []byte) []byte { f[ip+16] = 239; return f }, UDPDropDstAddr},
		{"v4-dst-broadcast", false, func(f []byte) []byte { copy(f[ip+16:], []byte{255, 255, 255, 255}); return f }, UDPDropDstAddr},
		{"v4-sport", false, func(f []byte) []byte { be.PutUint16(f[udp4:], 0xc000); return f }, UDPDropSrcPort},
		{"v4-dport", false, func(f []byte) []byte { be.PutUint16(f[udp4+2:], 4792); return f }, UDPDropDstPort},
		{"v4-short-payload", false, func(f []byte) []byte {
			f = f[:UDPHeadroom4+12]
			be.PutUint16(f[ip+2:], 20+8+12)
			be.PutUint16(f[udp4+4:], 8+12)
			return f
		}, UDPDropShort},
		{"v6-version", true, func(f []byte) []byte { f[ip] = 0x40; return f }, UDPDropMalformed},
		{"v6-ext-header", true, func(f []byte) []byte { f[ip+6] = 0; return f }, UDPDropMalformed},
		{"v6-payload-len", true, func(f []byte) []byte { be.PutUint16(f[ip+4:], 0xffff); return f }, UDPDropMalformed},
		{"v6-src", true, func(f []byte) []byte { f[ip+23]++; return f }, UDPDropSrcAddr},
		{"v6-dst-multicast", true, func(f []byte) []byte { f[ip+24] = 0xff; return f }, UDPDropDstAddr},
		{"v6-sport", true, func(f []byte) []byte { be.PutUint16(f[udp6:], 1); return f }, UDPDropSrcPort},
		{"v6-dport-not-peer", true, func(f []byte) []byte { be.PutUint16(f[udp6+2:], 5000); return f }, UDPDropDstPort},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, loc := v4, &loc4
			if c.v6 {
				src, loc = v6, &loc6
			}
			switch c.name { // family mismatches: the link of the other family
			case "v6-on-v4":
				loc = &loc4
			case "v4-on-v6":
				loc = &loc6
			}
			f := c.mod(bytes.Clone(src))
			var name [sockaddrLen]byte
			payload, namelen, why, ok := loc.conform(f, &name)
			if c.want == numUDPDrops {
				require.True(t, ok, "dropped: %v", why)
				var pkt roce.Packet
				require.NoError(t, roce.Parse(src, &pkt))
				assert.Equal(t, transport(t, src), payload)
				if c.v6 {
					assert.Equal(t, uint32(sockaddrLen), namelen)
					assert.Equal(t, uint16(unix.AF_INET6), binary.NativeEndian.Uint16(name[0:]))
					assert.Equal(t, b6.Addr().AsSlice(), name[8:24])
				} else {
					assert.Equal(t, uint32(sockaddr4Len), namelen)
					assert.Equal(t, uint16(unix.AF_INET), binary.NativeEndian.Uint16(name[0:]))
					assert.Equal(t, b4.Addr().AsSlice(), name[4:8])
				}
				dp := udp4 + 2
				if c.v6 {
					dp = udp6 + 2
				}
				assert.Equal(t, be.Uint16(f[dp:]), be.Uint16(name[2:]), "destination port from the UDP header")
				return
			}
			assert.False(t, ok)
			assert.Equal(t, c.want, why, "drop reason")
		})
	}
}

// TestUDPConventionsOnTheWire sends a batch mixing conforming and
// non-conforming frames: the non-conforming ones are counted per reason
// and never reach the peer; the others arrive in order.
func TestUDPConventionsOnTheWire(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	a := newTestLink(t, aAddr, 1, nil).Ports()[0]
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	path := pathBetween(aAddr, bAddr)
	mk := func(psn uint32) []byte {
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 7, PSN: psn}}
		return buildFrame(t, path, &h, 64)
	}
	bad := func(psn uint32, mod func(p *roce.Path)) []byte {
		p := *path
		mod(&p)
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 7, PSN: psn}}
		return buildFrame(t, &p, &h, 64)
	}
	frames := [][]byte{
		mk(1),
		bad(100, func(p *roce.Path) { p.DontFragment = false }),
		bad(101, func(p *roce.Path) { p.SrcPort = roce.UDPSrcPort(7) }),
		mk(2),
		bad(102, func(p *roce.Path) { p.DstPort = 9999 }),
		bad(103, func(p *roce.Path) { p.Src = netip.MustParseAddr("127.0.0.1") }),
		bad(104, func(p *roce.Path) { p.VLAN = true }),
		{1, 2, 3},
		mk(3),
	}
	n, err := a.SendBatch(frames)
	require.NoError(t, err)
	assert.Equal(t, len(frames), n, "dropped frames count as taken")
	got := recvN(t, b, 3)
	for i, f := range got {
		var pkt roce.Packet
		require.NoError(t, roce.Parse(f, &pkt))
		assert.Equal(t, uint32(i+1), pkt.BTH.PSN())
	}
	c := &a.Counters
	assert.Equal(t, uint64(3), c.TxFrames.Load())
	assert.Equal(t, uint64(1), c.Dropped(UDPDropIPv4Header))
	assert.Equal(t, uint64(1), c.Dropped(UDPDropSrcPort))
	assert.Equal(t, uint64(1), c.Dropped(UDPDropDstPort))
	assert.Equal(t, uint64(1), c.Dropped(UDPDropSrcAddr))
	assert.Equal(t, uint64(1), c.Dropped(UDPDropVLAN))
	assert.Equal(t, uint64(1), c.Dropped(UDPDropMalformed))
	// Nothing else arrives.
	k, err := b.RecvBatch(newBufs(4))
	require.NoError(t, err)
	assert.Zero(t, k)
}

// TestUDPCorruptedDatagram crafts datagrams on a plain socket, as a
// damaged network would deliver them: intact ones verify at the receiver,
// a flipped bit anywhere the ICRC covers fails with ErrICRC, a flipped
// masked bit (FECN) does not.
func TestUDPCorruptedDatagram(t *testing.T) {
	bAddr := loopback4(t)
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	plain, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback4(t).Addr(), 0)))
	require.NoError(t, err)
	defer plain.Close()
	from := plain.LocalAddr().(*net.UDPAddr).AddrPort()
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCWriteOnly, PKey: 0xffff, DestQP: 0x42, PSN: 5}, RETH: roce.RETHFields{VA: 1 << 20, RKey: 3, DMALength: 256}}
	tp := transport(t, buildFrame(t, pathBetween(from, bAddr), &h, 256))

	cases := []struct {
		name string
		off  int // byte flipped in BTH..ICRC, -1: none
		bit  byte
		err  error
	}{
		{"intact", -1, 0, nil},
		{"bth-psn", 11, 0x01, roce.ErrICRC},
		{"bth-destqp", 7, 0x10, roce.ErrICRC},
		{"reth-rkey", 12 + 11, 0x80, roce.ErrICRC},
		{"payload", 12 + 16 + 100, 0x04, roce.ErrICRC},
		{"icrc", len(tp) - 1, 0x01, roce.ErrICRC},
		{"fecn-masked", 4, 0x80, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := bytes.Clone(tp)
			if c.off >= 0 {
				d[c.off] ^= c.bit
			}
			_, err := plain.WriteToUDPAddrPort(d, bAddr)
			require.NoError(t, err)
			f := recvN(t, b, 1)[0]
			var pkt roce.Packet
			err = roce.Parse(f, &pkt)
			if c.err == nil {
				require.NoError(t, err)
				assert.Equal(t, from.Addr(), pkt.Src())
				assert.Equal(t, from.Port(), pkt.UDP.SrcPort())
				return
			}
			assert.ErrorIs(t, err, c.err)
		})
	}
}

// TestUDPTruncatedAndCompaction: a datagram longer than the frame
// capacity allows is dropped and counted, even when the buffers are
// larger; the frames around it arrive in order, in consecutive slots.
func TestUDPTruncatedAndCompaction(t *testing.T) {
	const fcap = 1000
	bAddr := loopback4(t)
	b := newTestLink(t, bAddr, 1, func(c *UDPConfig) { c.FrameCap = fcap }).Ports()[0]
	plain, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bAddr.Addr(), 0)))
	require.NoError(t, err)
	defer plain.Close()
	most := fcap - UDPHeadroom4
	for _, d := range [][]byte{
		bytes.Repeat([]byte{1}, 100),
		bytes.Repeat([]byte{2}, most+1),
		bytes.Repeat([]byte{3}, most),
		make([]byte, testFrameCap),
		bytes.Repeat([]byte{5}, 200),
	} {
		_, err := plain.WriteToUDPAddrPort(d, bAddr)
		require.NoError(t, err)
	}
	got := recvN(t, b, 3) // buffers of testFrameCap > fcap
	require.Len(t, got, 3)
	assert.Equal(t, UDPHeadroom4+100, len(got[0]))
	assert.Equal(t, fcap, len(got[1]))
	assert.Equal(t, byte(3), got[1][UDPHeadroom4])
	assert.Equal(t, UDPHeadroom4+200, len(got[2]))
	assert.Equal(t, byte(5), got[2][UDPHeadroom4])
	assert.Equal(t, uint64(2), b.Counters.RxTruncated.Load())
}

// TestUDPSynthMatchesCapture: the receive headers are those of
// roce.AppendCaptureFrame for the pseudo header of the datagram.
func TestUDPSynthMatchesCapture(t *testing.T) {
	payload := bytes.Repeat([]byte{0xa5}, 77)
	for _, c := range []struct{ src, dst netip.AddrPort }{
		{netip.MustParseAddrPort("10.1.2.3:49152"), netip.MustParseAddrPort("10.9.8.7:4791")},
		{netip.MustParseAddrPort("[2001:db8::1]:50000"), netip.MustParseAddrPort("[2001:db8::2]:4791")},
	} {
		v6 := c.src.Addr().Is6()
		hl := UDPHeadroom4
		var s, d [16]byte
		if v6 {
			hl, s, d = UDPHeadroom6, c.src.Addr().As16(), c.dst.Addr().As16()
		} else {
			copy(s[:], c.src.Addr().AsSlice())
			copy(d[:], c.dst.Addr().AsSlice())
		}
		f := make([]byte, hl+len(payload))
		copy(f[hl:], payload)
		if v6 {
			synth6(f, len(payload), &s, c.src.Port(), &d, c.dst.Port())
		} else {
			synth4(f, len(payload), &s, c.src.Port(), &d, c.dst.Port())
		}
		ps := roce.Pseudo{Src: c.src.Addr(), Dst: c.dst.Addr(), SrcPort: c.src.Port(), DstPort: c.dst.Port()}
		assert.Equal(t, roce.AppendCaptureFrame(nil, &ps, UDPRemoteMAC, UDPLocalMAC, payload), f, "%v", c.src)
		if !v6 {
			ip := roce.IPv4(f[roce.EthernetHeaderLen:])
			assert.Equal(t, ip.CalculateChecksum(), ip.Checksum())
		}
	}
}

// TestUDPReadyNoLostWakeup: the receiver sleeps on Ready whenever
// RecvBatch finds nothing; the sender sends one or a few datagrams at a
// time only after the previous ones were received, so arrivals land at
// every point of the receiver's loop. A lost wake-up leaves the receiver
// asleep and fails the test. While idle, nothing wakes it.
func TestUDPReadyNoLostWakeup(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	a := newTestLink(t, aAddr, 1, nil).Ports()[0]
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 9}}
	frame := buildFrame(t, pathBetween(aAddr, bAddr), &h, 16)

	const rounds = 1500
	acks := make(chan int, 1)
	done := make(chan error, 1)
	go func() {
		bufs := newBufs(4)
		total := 0
		timeout := time.NewTimer(recvTimeout)
		defer timeout.Stop()
		for total < rounds*2 {
			n, err := b.RecvBatch(bufs)
			if err != nil {
				done <- err
				return
			}
			if n > 0 {
				total += n
				acks <- total
				continue
			}
			b.ArmReady()
			select {
			case <-b.Ready():
			case <-timeout.C:
				done <- errors.New("receiver asleep with datagrams sent: lost wake-up")
				return
			}
			timeout.Reset(recvTimeout)
		}
		done <- nil
	}()
	sent := 0
	frames := [][]byte{frame, frame}
	for i := 0; sent < rounds*2; i++ {
		burst := min(1+i%2, rounds*2-sent)
		sendAll(t, a, frames[:burst])
		sent += burst
		for received := 0; received < sent; {
			select {
			case received = <-acks:
			case err := <-done:
				require.NoError(t, err, "round %d, sent %d, received %d; sender: tx %d, errors %d (errno %d); receiver: rx %d, wake-ups %d",
					i, sent, received, a.Counters.TxFrames.Load(), a.Counters.SendErrors.Load(), a.Counters.LastSendErrno.Load(),
					b.Counters.RxFrames.Load(), b.Counters.Wakeups.Load())
				require.Equal(t, rounds*2, sent)
			}
		}
	}
	require.NoError(t, <-done)
	// Idle: the waiter sleeps; no wake-up without a datagram.
	w := b.Counters.Wakeups.Load()
	assert.NotZero(t, w, "the receiver slept on Ready and was woken")
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, w, b.Counters.Wakeups.Load(), "wake-ups while idle")
	assert.Equal(t, uint64(rounds*2), b.Counters.RxFrames.Load())
}

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// TestUDPCloseReleasesEverything: Close stops every goroutine, closes
// every socket, and later calls fail with ErrUDPClosed.
func TestUDPCloseReleasesEverything(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	fds := openFDs(t)
	l, err := NewUDP(UDPConfig{Local: loopback4(t), Workers: 4, FrameCap: testFrameCap})
	require.NoError(t, err)
	assert.Equal(t, fds+4, openFDs(t), "one socket per worker")
	p := l.Ports()[2]
	k, err := p.RecvBatch(newBufs(2))
	require.NoError(t, err)
	assert.Zero(t, k)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	assert.Equal(t, fds, openFDs(t), "no fd left")
	goleak.VerifyNone(t, ignore)
	_, err = p.RecvBatch(newBufs(1))
	assert.ErrorIs(t, err, ErrUDPClosed)
	_, err = p.SendBatch([][]byte{{1}})
	assert.ErrorIs(t, err, ErrUDPClosed)
	// The address is free again.
	assert.NoError(t, probeFree(false, sockaddrOf(l.LocalAddr())))
}

// TestNewUDPErrors: bad configurations and a taken address fail cleanly.
func TestNewUDPErrors(t *testing.T) {
	fds := openFDs(t)
	ok := loopback4(t)
	for _, c := range []struct {
		name string
		cfg  UDPConfig
		err  error
	}{
		{"unspecified", UDPConfig{Local: netip.MustParseAddrPort("0.0.0.0:4791"), FrameCap: testFrameCap}, ErrInvalid},
		{"invalid", UDPConfig{FrameCap: testFrameCap}, ErrInvalid},
		{"multicast", UDPConfig{Local: netip.MustParseAddrPort("239.1.1.1:4791"), FrameCap: testFrameCap}, ErrInvalid},
		{"frame-cap", UDPConfig{Local: ok, FrameCap: UDPHeadroom4 + 15}, ErrInvalid},
		{"frame-cap-v6", UDPConfig{Local: netip.MustParseAddrPort("[::1]:4791"), FrameCap: UDPHeadroom4 + 16}, ErrInvalid},
		{"workers", UDPConfig{Local: ok, Workers: -1, FrameCap: testFrameCap}, ErrInvalid},
		{"buffers", UDPConfig{Local: ok, FrameCap: testFrameCap, RecvBuffer: -1}, ErrInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewUDP(c.cfg)
			assert.ErrorIs(t, err, c.err)
		})
	}
	t.Run("in-use-by-plain-socket", func(t *testing.T) {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ok))
		require.NoError(t, err)
		defer c.Close()
		_, err = NewUDP(UDPConfig{Local: ok, FrameCap: testFrameCap})
		assert.ErrorIs(t, err, ErrUDPAddrInUse)
	})
	t.Run("in-use-by-another-link", func(t *testing.T) {
		l := newTestLink(t, ok, 2, nil)
		_, err := NewUDP(UDPConfig{Local: ok, Workers: 2, FrameCap: testFrameCap})
		assert.ErrorIs(t, err, ErrUDPAddrInUse, "a second group must not join the first")
		require.NoError(t, l.Close())
	})
	t.Run("steering-refused", func(t *testing.T) {
		old := udpAttach
		t.Cleanup(func() { udpAttach = old })
		udpAttach = func(int, int) error { return unix.EPERM }
		_, err := NewUDP(UDPConfig{Local: ok, Workers: 2, FrameCap: testFrameCap})
		assert.ErrorIs(t, err, ErrUDPSteering)
		assert.ErrorContains(t, err, "operation not permitted")
		assert.NoError(t, probeFree(false, sockaddrOf(ok)), "sockets closed")
	})
	assert.Equal(t, fds, openFDs(t), "no fd left by failed NewUDP")
}

// TestUDPSocketBuffers: configured buffer sizes reach the sockets (the
// kernel doubles the value and caps it at rmem_max / wmem_max).
func TestUDPSocketBuffers(t *testing.T) {
	l := newTestLink(t, loopback4(t), 2, func(c *UDPConfig) { c.RecvBuffer, c.SendBuffer = 65536, 32768 })
	for _, p := range l.Ports() {
		var rcv, snd int
		err := p.rc.Control(func(fd uintptr) {
			rcv, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
			snd, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		})
		require.NoError(t, err)
		assert.Equal(t, 2*65536, rcv)
		assert.Equal(t, 2*32768, snd)
	}
}

// TestUDPConformPath: a path as the engine makes it for any link (UDP
// source port from the QPN, no DF, a VLAN tag) has its frames dropped;
// after ConformPath they are sent and verify at the receiver.
func TestUDPConformPath(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	la := newTestLink(t, aAddr, 1, nil)
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	a := la.Ports()[0]
	path := roce.Path{
		Mode: roce.ModeEthernet, Src: aAddr.Addr(), Dst: bAddr.Addr(),
		SrcPort: roce.UDPSrcPort(0x33), TTL: 64, VLAN: true, VLANTCI: 5,
	}
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x44, PSN: 1}}
	n, err := a.SendBatch([][]byte{buildFrame(t, &path, &h, 40)})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, uint64(1), a.Counters.Dropped(UDPDropVLAN))
	la.ConformPath(&path)
	h.BTH.PSN = 2
	sendAll(t, a, [][]byte{buildFrame(t, &path, &h, 40)})
	f := recvN(t, b, 1)[0]
	var pkt roce.Packet
	require.NoError(t, roce.Parse(f, &pkt))
	assert.Equal(t, uint32(2), pkt.BTH.PSN())
	assert.Equal(t, aAddr.Addr(), pkt.Src())
	assert.Equal(t, uint64(1), a.Counters.TxFrames.Load())
}
