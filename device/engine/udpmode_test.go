package engine

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// TestNewModes: ModeUDP needs the links' local address (port 0 is 4791);
// unknown modes are refused.
func TestNewModes(t *testing.T) {
	links := []Link{&nullLink{ready: make(chan struct{}, 1)}}
	for _, c := range []struct {
		name  string
		mode  roce.Mode
		local netip.AddrPort
		err   bool
	}{
		{"ethernet", roce.ModeEthernet, netip.AddrPort{}, false},
		{"udp", roce.ModeUDP, netip.MustParseAddrPort("10.0.0.1:4791"), false},
		{"udp-port-0", roce.ModeUDP, netip.MustParseAddrPort("10.0.0.1:0"), false},
		{"udp-no-local", roce.ModeUDP, netip.AddrPort{}, true},
		{"udp-unspecified", roce.ModeUDP, netip.MustParseAddrPort("0.0.0.0:4791"), true},
		{"unknown", roce.Mode(7), netip.AddrPort{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := New(Config{Links: links, Mode: c.mode, Local: c.local})
			if c.err {
				assert.ErrorIs(t, err, ErrInvalid)
				return
			}
			require.NoError(t, err)
			if c.mode == roce.ModeUDP {
				assert.Equal(t, netip.AddrPortFrom(c.local.Addr(), roce.UDPPort), e.workers[0].local)
			}
		})
	}
}

// TestUDPPeerCheck: in ModeUDP a packet reaches its QP only from the
// QP's peer, as the address beside it says: its source is the QP's
// destination GID and the links' address is its source GID (DESIGN 5).
// A packet whose ICRC was computed for the address beside it but that
// comes from elsewhere is dropped and counted (BadPeer); one whose
// sender lies about its address beside it fails its ICRC (the pseudo
// header covers the address).
func TestUDPPeerCheck(t *testing.T) {
	send := func(t *testing.T, w *worker, from netip.AddrPort, icrcFrom netip.AddrPort, psn uint32) {
		t.Helper()
		p := roce.Path{Mode: roce.ModeUDP, Src: icrcFrom.Addr(), SrcPort: icrcFrom.Port(), Dst: fuzzLocal.Addr(), DstPort: fuzzLocal.Port()}
		buf := make([]byte, DefaultFrameCap)
		off := p.Headroom(roce.OpRCSendOnly)
		h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x11, PSN: psn, AckReq: true}}
		f, err := p.Build(buf, off, 8, &h)
		require.NoError(t, err)
		w.input(f, from)
	}
	stranger := netip.MustParseAddrPort("10.0.0.3:4791")
	t.Run("peer", func(t *testing.T) {
		w, qp := fuzzWorker(t, roce.ModeUDP)
		send(t, w, fuzzPeer, fuzzPeer, 100)
		assert.Equal(t, uint64(1), qp.Counters.PacketsReceived.Load())
		mapped := netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.0.2"), fuzzPeer.Port())
		send(t, w, mapped, fuzzPeer, 101)
		assert.Equal(t, uint64(2), qp.Counters.PacketsReceived.Load(), "IPv4-mapped or not")
		assert.Zero(t, w.Counters.BadPeer.Load())
		assert.Equal(t, uint32(2), qp.resp.msn, "both SENDs executed")
	})
	t.Run("other-port", func(t *testing.T) {
		// Another process on the peer's host: the peer's address, not
		// the peer daemon's port.
		w, qp := fuzzWorker(t, roce.ModeUDP)
		other := netip.AddrPortFrom(fuzzPeer.Addr(), 50000)
		send(t, w, other, other, 100)
		assert.Equal(t, uint64(1), w.Counters.BadPeer.Load())
		assert.Zero(t, w.Counters.ICRCErrors.Load())
		assert.Zero(t, qp.Counters.PacketsReceived.Load())
		assert.Equal(t, uint32(100), qp.resp.epsn, "not executed")
	})
	t.Run("stranger", func(t *testing.T) {
		w, qp := fuzzWorker(t, roce.ModeUDP)
		send(t, w, stranger, stranger, 100)
		assert.Equal(t, uint64(1), w.Counters.BadPeer.Load())
		assert.Zero(t, w.Counters.ICRCErrors.Load())
		assert.Zero(t, qp.Counters.PacketsReceived.Load())
		assert.Equal(t, uint32(100), qp.resp.epsn, "not executed")
	})
	t.Run("spoofed", func(t *testing.T) {
		w, qp := fuzzWorker(t, roce.ModeUDP)
		send(t, w, stranger, fuzzPeer, 100) // built as if from the peer
		assert.Equal(t, uint64(1), w.Counters.ICRCErrors.Load())
		assert.Zero(t, w.Counters.BadPeer.Load())
		assert.Zero(t, qp.Counters.PacketsReceived.Load())
	})
	t.Run("after-the-peer", func(t *testing.T) {
		// The peer's frames pass; one from elsewhere for the same QP
		// after them is still refused, and after a new address vector
		// the old peer is a stranger.
		w, qp := fuzzWorker(t, roce.ModeUDP)
		send(t, w, fuzzPeer, fuzzPeer, 100)
		send(t, w, fuzzPeer, fuzzPeer, 101)
		other := netip.AddrPortFrom(fuzzPeer.Addr(), 50000)
		send(t, w, other, other, 102)
		send(t, w, stranger, stranger, 102)
		assert.Equal(t, uint64(2), w.Counters.BadPeer.Load())
		assert.Equal(t, uint64(2), qp.Counters.PacketsReceived.Load())
		send(t, w, fuzzPeer, fuzzPeer, 102)
		assert.Equal(t, uint64(3), qp.Counters.PacketsReceived.Load())
		a := QPAttr{Mask: abi.QPAttrAV, LocalAddr: fuzzLocal.Addr(), RemoteAddr: stranger.Addr()}
		require.NoError(t, qp.modify(&a))
		send(t, w, fuzzPeer, fuzzPeer, 103)
		assert.Equal(t, uint64(3), w.Counters.BadPeer.Load(), "the old peer after a new address vector")
		send(t, w, stranger, stranger, 103)
		assert.Equal(t, uint64(4), qp.Counters.PacketsReceived.Load())
		assert.Equal(t, uint32(4), qp.resp.msn)
	})
	t.Run("not-our-address", func(t *testing.T) {
		w, qp := fuzzWorker(t, roce.ModeUDP)
		a := QPAttr{Mask: abi.QPAttrAV, LocalAddr: netip.MustParseAddr("10.0.0.9"), RemoteAddr: fuzzPeer.Addr()}
		require.NoError(t, qp.modify(&a))
		send(t, w, fuzzPeer, fuzzPeer, 100)
		assert.Equal(t, uint64(1), w.Counters.BadPeer.Load(), "the QP's source GID is not the links' address")
		assert.Zero(t, qp.Counters.PacketsReceived.Load())
	})
}

// TestUDPPath: in ModeUDP a QP's packets are UDP payloads from the links'
// address and port to its destination GID, port 4791, which travels
// beside each; their ICRC verifies under that pseudo header.
func TestUDPPath(t *testing.T) {
	l := &captureLink{ready: make(chan struct{}, 1)}
	e, err := New(Config{Links: []Link{l}, Mode: roce.ModeUDP, Local: netip.MustParseAddrPort("10.0.0.1:5000")})
	require.NoError(t, err)
	w := e.workers[0]
	qp := createOn(t, w, QPConfig{QPN: 0x11, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16), RecvCQ: newFakeCQ(16),
		Mem: newFakeMem(), SQDepth: 16})
	for _, a := range []QPAttr{
		{Mask: abi.QPAttrState, State: abi.QPSInit},
		{Mask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrDestQPN | abi.QPAttrRQPSN, State: abi.QPSRTR,
			LocalAddr: netip.MustParseAddr("::ffff:10.0.0.1"), RemoteAddr: netip.MustParseAddr("::ffff:10.0.0.2"), DestQPN: 0x22, RQPSN: 100},
	} {
		require.NoError(t, qp.modify(&a))
	}
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.2:4791"), peerOf(&qp.path))
	// An ACK for a duplicate: the responder answers at once.
	qp.resp.ackPending = true
	w.service(qp)
	w.flush()
	require.Len(t, l.frames, 1)
	require.Len(t, l.peers, 1)
	assert.Equal(t, netip.MustParseAddrPort("10.0.0.2:4791"), l.peers[0])
	ps := roce.Pseudo{Src: netip.MustParseAddr("10.0.0.1"), SrcPort: 5000, Dst: netip.MustParseAddr("10.0.0.2"), DstPort: 4791}
	var pkt roce.Packet
	require.NoError(t, roce.ParseUDP(l.frames[0], &ps, &pkt))
	assert.Equal(t, roce.OpRCAck, pkt.Opcode())
	assert.Equal(t, uint32(0x22), pkt.BTH.DestQP())
}
