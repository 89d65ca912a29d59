package link

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/roce"
)

// ackFrame builds a plain ACK (or, with syn, another AETH syndrome) of
// psn for QP qpn on path p.
func ackFrame(t *testing.T, p *roce.Path, qpn, psn uint32, syn roce.Syndrome) []byte {
	return buildFrame(t, p, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCAck, PKey: 0xffff, DestQP: qpn, PSN: psn},
		AETH: roce.AETHFields{Syndrome: syn, MSN: psn}}, 0)
}

// TestUDPCoalescedACKs: plain ACKs for QPs of both workers of a
// two-worker receiver go as one segmented datagram, which the kernel
// hands whole to the socket of its first ACK's QP; that port hands each
// ACK for the other port's QP over, and every ACK reaches the port that
// owns its QP, in the order sent, with its ICRC intact.
func TestUDPCoalescedACKs(t *testing.T) {
	aAddr, a := segmentingPort(t)
	bAddr := loopback4(t)
	lb := newTestLink(t, bAddr, 2, nil)
	path := pathBetween(aAddr, bAddr)
	var frames [][]byte
	want := make([][]uint32, 2) // QPNs by owning port, in order
	for q := uint32(1); q <= 16; q++ {
		frames = append(frames, ackFrame(t, path, q, 100+q, roce.Syndrome(0x1f)))
		want[roce.SteerQueue(q, 2)] = append(want[roce.SteerQueue(q, 2)], q)
	}
	require.NotEmpty(t, want[0])
	require.NotEmpty(t, want[1])
	sendAll(t, a, frames, bAddr)
	assert.Equal(t, uint64(1), a.Counters.TxDatagrams.Load(), "16 ACKs for 16 QPs in one datagram")
	assert.Equal(t, uint64(1), a.Counters.TxGSO.Load())
	// The port the datagram went to reads first: it hands the others
	// over as it reads (each worker reads its own port all the time).
	first := roce.SteerQueue(1, 2)
	for _, i := range []int{first, 1 - first} {
		p := lb.Ports()[i]
		got := recvN(t, p, len(want[i]))
		if i == first {
			// The segments after its own last one may still be on
			// their way (the kernel may deliver them later, from its
			// softirq thread): read on until every one of the other
			// port's ACKs was handed over.
			bufs, peers := newBufs(16), make([]netip.AddrPort, 16)
			assert.Eventually(t, func() bool {
				k, err := p.RecvBatch(bufs, peers)
				return err == nil && k == 0 && p.Counters.RxForwarded.Load() == uint64(len(want[1-first]))
			}, recvTimeout, time.Millisecond, "port %d hands the other port's ACKs over", first)
		}
		var qpns []uint32
		for _, f := range got {
			var pkt roce.Packet
			require.NoError(t, parseFrom(f.b, f.from, bAddr, &pkt), "port %d", i)
			assert.Equal(t, aAddr, f.from)
			assert.Equal(t, 100+pkt.BTH.DestQP(), pkt.BTH.PSN())
			qpns = append(qpns, pkt.BTH.DestQP())
		}
		assert.Equal(t, want[i], qpns, "port %d: its QPs' ACKs, in order", i)
	}
	assert.Equal(t, uint64(len(want[1-first])), lb.Ports()[first].Counters.RxForwarded.Load(), "handed over")
	assert.Zero(t, lb.Ports()[1-first].Counters.RxForwarded.Load())
	var st [2]uint64
	for i, s := range lb.Stats() {
		st[i] = s.RxForwarded
		assert.Zero(t, s.RxForwardDrops)
	}
	assert.Equal(t, uint64(len(want[1-first])), st[first], "Stats")
}

// TestUDPCoalescesOnlyPlainACKs: frames for different QPs share a
// datagram only when both are plain ACKs; a NAK, an RNR NAK or a READ
// response without payload (each as long as an ACK) does not join one,
// nor does an ACK join a datagram such a frame leads. Frames of one QP
// still do.
func TestUDPCoalescesOnlyPlainACKs(t *testing.T) {
	aAddr, a := segmentingPort(t)
	bAddr := loopback4(t)
	b := newTestLink(t, bAddr, 1, nil).Ports()[0]
	path := pathBetween(aAddr, bAddr)
	readResp := buildFrame(t, path, &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCReadResponseOnly, PKey: 0xffff, DestQP: 3, PSN: 9},
		AETH: roce.AETHFields{Syndrome: roce.Syndrome(0x1f), MSN: 9}}, 0)
	for _, tc := range []struct {
		name      string
		frames    [][]byte
		datagrams uint64
	}{
		{"ACKs", [][]byte{ackFrame(t, path, 1, 1, 0x1f), ackFrame(t, path, 2, 1, 0x1f), ackFrame(t, path, 3, 1, 0x1f)}, 1},
		{"a NAK", [][]byte{ackFrame(t, path, 1, 1, 0x1f), ackFrame(t, path, 2, 1, 0x60), ackFrame(t, path, 3, 1, 0x1f)}, 3},
		{"an RNR NAK", [][]byte{ackFrame(t, path, 1, 1, 0x1f), ackFrame(t, path, 2, 1, 0x21)}, 2},
		{"a READ response", [][]byte{ackFrame(t, path, 1, 1, 0x1f), readResp}, 2},
		{"led by a READ response", [][]byte{readResp, ackFrame(t, path, 1, 1, 0x1f)}, 2},
		{"one QP", [][]byte{readResp, ackFrame(t, path, 3, 10, 0x1f)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Len(t, tc.frames[0], len(tc.frames[len(tc.frames)-1]), "one length")
			before := a.Counters.TxDatagrams.Load()
			sendAll(t, a, tc.frames, bAddr)
			assert.Equal(t, tc.datagrams, a.Counters.TxDatagrams.Load()-before)
			got := recvN(t, b, len(tc.frames))
			for i := range got {
				assert.Equal(t, tc.frames[i], got[i].b, "frame %d", i)
			}
		})
	}
}

// TestUDPInboxFull: frames for a port that does not read fill its inbox;
// the rest are dropped and counted, never blocking the port that received
// them; the owner then returns what its inbox holds, oldest first, and
// is woken for it.
func TestUDPInboxFull(t *testing.T) {
	bAddr := loopback4(t)
	lb := newTestLink(t, bAddr, 2, nil)
	var qpn [2]uint32 // a QP of each port
	for q := uint32(1); qpn[0] == 0 || qpn[1] == 0; q++ {
		qpn[roce.SteerQueue(q, 2)] = q
	}
	from, owner := lb.Ports()[0], lb.Ports()[1]
	for len(owner.Ready()) > 0 {
		<-owner.Ready()
	}
	path := pathBetween(netip.MustParseAddrPort("127.0.0.9:4791"), bAddr)
	src := netip.MustParseAddrPort("127.0.0.9:4791")
	for i := range inboxCap + 10 {
		from.forward(1, ackFrame(t, path, qpn[1], uint32(i), 0x1f), src)
	}
	assert.Equal(t, uint64(inboxCap), from.Counters.RxForwarded.Load())
	assert.Equal(t, uint64(10), from.Counters.RxForwardDrops.Load())
	select {
	case <-owner.Ready():
	case <-time.After(recvTimeout):
		t.Fatal("the owner was not woken")
	}
	got := recvN(t, owner, inboxCap)
	require.Len(t, got, inboxCap)
	for i, f := range got {
		var pkt roce.Packet
		require.NoError(t, parseFrom(f.b, f.from, bAddr, &pkt))
		assert.Equal(t, uint32(i), pkt.BTH.PSN(), "oldest first")
		assert.Equal(t, src, f.from)
	}
	assert.Zero(t, owner.inbox.n.Load())
	assert.Equal(t, uint64(inboxCap), owner.Counters.RxFrames.Load())
}
