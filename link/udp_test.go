package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
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
	SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
	RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
	Ready() <-chan struct{}
}

var (
	_ linkIface = (*UDPPort)(nil)
	_ linkIface = (*Port)(nil)
)

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

// TestUDPOpcodes sends a packet of every opcode family from one link to
// another over loopback: it arrives byte for byte as sent, beside the
// sender's bound address and port, and with them and the receiver's
// address it parses and verifies its ICRC (roce.ParseUDP), as does the
// Ethernet frame a pcap tap rebuilds from them (roce.AppendCaptureFrame).
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
			sendAll(t, a, frames, bAddr)
			got := recvN(t, b, len(frames))
			for i, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					sent, recv := frames[i], got[i]
					assert.Equal(t, sent, recv.b, "the payload as sent")
					assert.Equal(t, aAddr, recv.from, "the sender's bound address and port")
					var pkt roce.Packet
					require.NoError(t, parseFrom(recv.b, recv.from, bAddr, &pkt), "received payload must verify its ICRC")
					assert.Equal(t, c.h.BTH.Opcode, pkt.Opcode())
					want := c.h.BTH
					want.PadCount = -c.n & 3
					assert.Equal(t, want, pkt.Headers().BTH)
					assert.Equal(t, c.n, len(pkt.Payload))
					ps := roce.Pseudo{Src: recv.from.Addr(), SrcPort: recv.from.Port(), Dst: bAddr.Addr(), DstPort: bAddr.Port()}
					var cp roce.Packet
					require.NoError(t, roce.Parse(roce.AppendCaptureFrame(nil, &ps, [6]byte{2}, [6]byte{4}, recv.b), &cp), "capture frame verifies")
					assert.Equal(t, pkt.Headers().BTH, cp.Headers().BTH)
				})
			}
			assert.Equal(t, uint64(len(frames)), a.Counters.TxFrames.Load())
			assert.Equal(t, uint64(len(frames)), b.Counters.RxFrames.Load())
		})
	}
}

// TestUDPSockaddr checks the destinations SendBatch accepts and the
// sockaddr it writes for them, and that the sender decoded from a
// received sockaddr is the address that was written.
func TestUDPSockaddr(t *testing.T) {
	for _, c := range []struct {
		ap string
		v6 bool
		ok bool
	}{
		{"127.0.0.8:4791", false, true},
		{"10.1.2.3:5000", false, true},
		{"[::ffff:10.1.2.3]:4791", false, true}, // IPv4-mapped: IPv4
		{"[fd00::8]:4791", true, true},
		{"[::1]:1", true, true},
		{"127.0.0.8:0", false, false},
		{"0.0.0.0:4791", false, false},
		{"0.1.2.3:4791", false, false},
		{"224.0.0.1:4791", false, false},
		{"239.1.1.1:4791", false, false},
		{"240.0.0.1:4791", false, false},
		{"255.255.255.255:4791", false, false},
		{"[fd00::8]:4791", false, false}, // IPv6 on an IPv4 link
		{"10.1.2.3:4791", true, false},   // IPv4 on an IPv6 link
		{"[::ffff:10.1.2.3]:4791", true, false},
		{"[::]:4791", true, false},
		{"[ff02::1]:4791", true, false},
		{"[fe80::1%lo]:4791", true, false},
		{"", false, false},
		{"", true, false},
	} {
		t.Run(fmt.Sprintf("%s/v6=%v", c.ap, c.v6), func(t *testing.T) {
			var ap netip.AddrPort
			if c.ap != "" {
				ap = netip.MustParseAddrPort(c.ap)
			}
			var name [sockaddrLen]byte
			namelen, ok := putSockaddr(&name, ap, c.v6)
			require.Equal(t, c.ok, ok)
			if !ok {
				return
			}
			want := sockaddrOf(ap)
			switch sa := want.(type) {
			case *unix.SockaddrInet4:
				assert.Equal(t, uint32(sockaddr4Len), namelen)
				assert.Equal(t, uint16(unix.AF_INET), binary.NativeEndian.Uint16(name[0:]))
				assert.Equal(t, sa.Addr[:], name[4:8])
			case *unix.SockaddrInet6:
				assert.Equal(t, uint32(sockaddrLen), namelen)
				assert.Equal(t, uint16(unix.AF_INET6), binary.NativeEndian.Uint16(name[0:]))
				assert.Equal(t, sa.Addr[:], name[8:24])
			}
			assert.Equal(t, ap.Port(), binary.BigEndian.Uint16(name[2:]))
			back, ok := sockaddrAddrPort(&name, namelen, c.v6)
			require.True(t, ok)
			assert.Equal(t, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), back)
			_, ok = sockaddrAddrPort(&name, namelen, !c.v6)
			assert.False(t, ok, "another family than the link's")
			_, ok = sockaddrAddrPort(&name, namelen-1, c.v6)
			assert.False(t, ok, "short")
		})
	}
}

// TestUDPSendInvalid sends a batch mixing valid frames with frames too
// short to be a packet and frames for destinations the link cannot
// send to: those are counted (TxInvalid), taken and never reach the
// peer; the others arrive in order.
func TestUDPSendInvalid(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	a := newTestLink(t, aAddr, 1, nil).Ports()[0]
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	path := pathBetween(aAddr, bAddr)
	mk := func(psn uint32) []byte {
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 7, PSN: psn}}
		return buildFrame(t, path, &h, 64)
	}
	frames := [][]byte{mk(1), mk(100), mk(101), mk(2), mk(102), {}, mk(103)[:udpMinPayload-1], mk(3), mk(104)}
	peers := []netip.AddrPort{
		bAddr,
		netip.MustParseAddrPort("[fd00::1]:4791"), // family
		netip.AddrPortFrom(bAddr.Addr(), 0),       // port
		bAddr,
		netip.MustParseAddrPort("255.255.255.255:4791"),
		bAddr,
		bAddr,
		bAddr,
		{},
	}
	_, err := a.SendBatch(frames, peers[:3])
	require.ErrorIs(t, err, ErrInvalid, "a peer for every frame")
	n, err := a.SendBatch(frames, peers)
	require.NoError(t, err)
	assert.Equal(t, len(frames), n, "dropped frames count as taken")
	got := recvN(t, b, 3)
	for i, d := range got {
		var pkt roce.Packet
		require.NoError(t, parseFrom(d.b, d.from, bAddr, &pkt))
		assert.Equal(t, uint32(i+1), pkt.BTH.PSN())
	}
	c := &a.Counters
	assert.Equal(t, uint64(3), c.TxFrames.Load())
	assert.Equal(t, uint64(6), c.TxInvalid.Load())
	assert.Zero(t, c.SendErrors.Load())
	// Nothing else arrives.
	k, err := b.RecvBatch(newBufs(4), make([]netip.AddrPort, 4))
	require.NoError(t, err)
	assert.Zero(t, k)
	_, err = b.RecvBatch(newBufs(4), make([]netip.AddrPort, 3))
	assert.ErrorIs(t, err, ErrInvalid, "a peer slot for every frame")
}

// TestUDPCorruptedDatagram crafts datagrams on a plain socket, as a
// damaged network would deliver them: intact ones verify at the receiver
// (with the sender beside them), a flipped bit anywhere the ICRC covers
// fails with ErrICRC, a flipped masked bit (FECN) does not.
func TestUDPCorruptedDatagram(t *testing.T) {
	bAddr := loopback4(t)
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	plain, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback4(t).Addr(), 0)))
	require.NoError(t, err)
	defer plain.Close()
	from := plain.LocalAddr().(*net.UDPAddr).AddrPort()
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCWriteOnly, PKey: 0xffff, DestQP: 0x42, PSN: 5}, RETH: roce.RETHFields{VA: 1 << 20, RKey: 3, DMALength: 256}}
	tp := bytes.Clone(buildFrame(t, pathBetween(from, bAddr), &h, 256))

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
			got := recvN(t, b, 1)[0]
			assert.Equal(t, from, got.from)
			var pkt roce.Packet
			err = parseFrom(got.b, got.from, bAddr, &pkt)
			if c.err == nil {
				require.NoError(t, err)
				assert.Equal(t, uint32(5), pkt.BTH.PSN())
				return
			}
			assert.ErrorIs(t, err, c.err)
		})
	}
}

// TestUDPTruncatedAndCompaction: a datagram longer than the frame
// capacity allows is dropped and counted, even when the buffers are
// larger; the frames around it arrive in order, in consecutive slots,
// each with its sender beside it.
func TestUDPTruncatedAndCompaction(t *testing.T) {
	const fcap = 1000
	bAddr := loopback4(t)
	b := newTestLink(t, bAddr, 1, func(c *UDPConfig) { c.FrameCap = fcap }).Ports()[0]
	plain, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bAddr.Addr(), 0)))
	require.NoError(t, err)
	defer plain.Close()
	from := plain.LocalAddr().(*net.UDPAddr).AddrPort()
	most := fcap
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
	assert.Equal(t, bytes.Repeat([]byte{1}, 100), got[0].b)
	assert.Equal(t, bytes.Repeat([]byte{3}, most), got[1].b)
	assert.Equal(t, bytes.Repeat([]byte{5}, 200), got[2].b)
	for _, d := range got {
		assert.Equal(t, from, d.from)
	}
	assert.Equal(t, uint64(2), b.Counters.RxTruncated.Load())
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
		peers := make([]netip.AddrPort, len(bufs))
		total := 0
		timeout := time.NewTimer(recvTimeout)
		defer timeout.Stop()
		for total < rounds*2 {
			n, err := b.RecvBatch(bufs, peers)
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
		sendAll(t, a, frames[:burst], bAddr)
		sent += burst
		for received := 0; received < sent; {
			select {
			case received = <-acks:
			case err := <-done:
				require.NoError(t, err, "round %d, sent %d, received %d; sender: tx %d, errors %d (errno %d); receiver: rx %d, wake-ups %d",
					i, sent, received, a.Counters.TxFrames.Load(), a.Counters.SendErrors.Load(), a.Counters.LastSendErrno.Load(),
					b.Counters.RxFrames.Load(), b.Counters.Wakeups.Load())
				require.Equal(t, rounds*2, sent)
				done <- nil // the receiver finished first: keep its word for the wait below
			}
		}
	}
	require.NoError(t, <-done)
	// Idle: the waiter sleeps; no wake-up without a datagram. (Whether
	// the rounds above ever put the receiver to sleep is the scheduler's
	// choice; TestUDPReadyArmOrders forces the orders that matter.)
	w := b.Counters.Wakeups.Load()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, w, b.Counters.Wakeups.Load(), "wake-ups while idle")
	assert.Equal(t, uint64(rounds*2), b.Counters.RxFrames.Load())
}

// TestUDPReadyArmOrders forces the orders of a worker going to sleep
// against a datagram's arrival: RecvBatch finds nothing, then the
// datagram arrives (on loopback sendmmsg queues it on the receiver before
// it returns) and only then the worker arms the waiter and sleeps: the
// edge was raised before the waiter started watching, which the waiter's
// re-check must catch; and the datagram arriving after the arm, with the
// waiter running (or about to run) its wait. Each order, many rounds; a
// lost wake-up fails at the timeout.
func TestUDPReadyArmOrders(t *testing.T) {
	aAddr, bAddr := loopback4(t), loopback4(t)
	a := newTestLink(t, aAddr, 1, nil).Ports()[0]
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 9}}
	frame := buildFrame(t, pathBetween(aAddr, bAddr), &h, 16)
	bufs := newBufs(4)
	peers := make([]netip.AddrPort, len(bufs))
	recv := func() int {
		for i := range bufs {
			bufs[i] = bufs[i][:cap(bufs[i])]
		}
		n, err := b.RecvBatch(bufs, peers)
		require.NoError(t, err)
		return n
	}
	// The waiter starts armed: spend that arm first, so that every Ready
	// below answers the round's own ArmReady.
	sendAll(t, a, [][]byte{frame}, bAddr)
	<-b.Ready()
	require.Equal(t, 1, recv())
	for _, arrivesFirst := range []bool{true, false} {
		for i := range 200 {
			require.Zero(t, recv(), "round %d: the socket is empty before the round", i)
			if arrivesFirst {
				sendAll(t, a, [][]byte{frame}, bAddr)
			}
			b.ArmReady()
			if !arrivesFirst {
				sendAll(t, a, [][]byte{frame}, bAddr)
			}
			select {
			case <-b.Ready():
			case <-time.After(recvTimeout):
				t.Fatalf("arrival first %v, round %d: no Ready for a queued datagram (lost wake-up)", arrivesFirst, i)
			}
			require.Equal(t, 1, recv(), "round %d", i)
			select {
			case <-b.Ready():
				t.Fatalf("round %d: a second Ready for one arm", i)
			default:
			}
		}
	}
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
	k, err := p.RecvBatch(newBufs(2), make([]netip.AddrPort, 2))
	require.NoError(t, err)
	assert.Zero(t, k)
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close is idempotent")
	assert.Equal(t, fds, openFDs(t), "no fd left")
	goleak.VerifyNone(t, ignore)
	_, err = p.RecvBatch(newBufs(1), make([]netip.AddrPort, 1))
	assert.ErrorIs(t, err, ErrUDPClosed)
	_, err = p.SendBatch([][]byte{{1}}, make([]netip.AddrPort, 1))
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
		{"frame-cap", UDPConfig{Local: ok, FrameCap: udpMinPayload - 1}, ErrInvalid},
		{"frame-cap-v6", UDPConfig{Local: netip.MustParseAddrPort("[::1]:4791")}, ErrInvalid},
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

// TestUDPSocketBuffersPastMax: a buffer larger than net.core.rmem_max /
// wmem_max is granted whole with CAP_NET_ADMIN (SO_*BUFFORCE); without
// it the kernel caps it at the maximum and the link warns, naming the
// sysctls.
func TestUDPSocketBuffersPastMax(t *testing.T) {
	sysMax := func(name string) int {
		b, err := os.ReadFile("/proc/sys/net/core/" + name)
		require.NoError(t, err)
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return n
	}
	rmax, wmax := sysMax("rmem_max"), sysMax("wmem_max")
	var logs bytes.Buffer // written by NewUDP, on this goroutine
	l := newTestLink(t, loopback4(t), 2, func(c *UDPConfig) {
		c.RecvBuffer, c.SendBuffer = 2*rmax, 2*wmax
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	privileged := hasCap(t, unix.CAP_NET_ADMIN)
	for _, p := range l.Ports() {
		var snd, rcv int
		require.NoError(t, p.rc.Control(func(fd uintptr) { snd, rcv = sockBuffers(int(fd)) }))
		if privileged {
			assert.Equal(t, 2*rmax, rcv, "SO_RCVBUFFORCE")
			assert.Equal(t, 2*wmax, snd, "SO_SNDBUFFORCE")
		} else {
			assert.Equal(t, rmax, rcv, "capped at rmem_max")
			assert.Equal(t, wmax, snd, "capped at wmem_max")
		}
	}
	if privileged {
		assert.NotContains(t, logs.String(), "capped")
	} else {
		assert.Contains(t, logs.String(), "net.core.rmem_max")
	}
	t.Logf("privileged %v: %s", privileged, logs.String())
}

// hasCap reports whether this process has capability c in its effective
// set (/proc/self/status CapEff).
func hasCap(t *testing.T, c int) bool {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			require.NoError(t, err)
			return m&(1<<uint(c)) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
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
