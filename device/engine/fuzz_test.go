package engine

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// nullLink accepts and discards every frame and never receives.
type nullLink struct{ ready chan struct{} }

func (l *nullLink) SendBatch(f [][]byte, _ []netip.AddrPort) (int, error) { return len(f), nil }
func (l *nullLink) RecvBatch([][]byte, []netip.AddrPort) (int, error)     { return 0, nil }
func (l *nullLink) Ready() <-chan struct{}                                { return l.ready }

// The addresses of the fuzzed worker (10.0.0.1) and its QP's peer.
var (
	fuzzLocal = netip.MustParseAddrPort("10.0.0.1:4791")
	fuzzPeer  = netip.MustParseAddrPort("10.0.0.2:4791")
)

// fuzzWorker builds an engine that is not started and one QP in RTS on
// its only worker, driven directly by the test; in ModeUDP the links'
// address is fuzzLocal.
func fuzzWorker(t testing.TB, mode roce.Mode) (*worker, *QP) {
	rq := newFakeRQ(64)
	for i := range 32 {
		require.NoError(t, rq.post(uint64(i), abi.SGE{Addr: 0x1000, Length: 1 << 15, LKey: 0x200}))
	}
	return fuzzWorkerRQ(t, mode, rq)
}

// fuzzWorkerRQ is fuzzWorker with the QP's receive queue rq, whose SGEs
// may name the 64 KiB registered at 0x1000 with key 0x200.
func fuzzWorkerRQ(t testing.TB, mode roce.Mode, rq *fakeRQ) (*worker, *QP) {
	e, err := New(Config{Links: []Link{&nullLink{ready: make(chan struct{}, 1)}}, Mode: mode, Local: fuzzLocal})
	require.NoError(t, err)
	w := e.workers[0]
	mem := newFakeMem()
	buf := make([]byte, 1<<16)
	mem.reg(buf, 0x1000, abi.AccessAll) // key 0x200
	qp := createOn(t, w, QPConfig{QPN: 0x11, SQ: newFakeSQ(16), RQ: rq, SendCQ: newFakeCQ(1024), RecvCQ: newFakeCQ(1024),
		Mem: mem, SQDepth: 16, MaxSendSGE: 4, MaxRecvSGE: 4})
	for _, a := range []QPAttr{
		{Mask: abi.QPAttrState | abi.QPAttrAccessFlags, State: abi.QPSInit, AccessFlags: abi.AccessAll},
		{Mask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic,
			State: abi.QPSRTR, LocalAddr: netip.MustParseAddr("10.0.0.1"), RemoteAddr: netip.MustParseAddr("10.0.0.2"),
			PathMTU: roce.MTU256, DestQPN: 0x22, RQPSN: 100, MaxDestRdAtomic: 4},
		{Mask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt, State: abi.QPSRTS, SQPSN: 500, Timeout: 10, RetryCnt: 7},
	} {
		require.NoError(t, qp.modify(&a))
	}
	return w, qp
}

// createOn creates a QP on w, an engine's worker the test drives itself
// (the engine is not started).
func createOn(t testing.TB, w *worker, cfg QPConfig) *QP {
	qp, err := newQP(cfg, w)
	require.NoError(t, err)
	w.apply(&ctlMsg{op: ctlCreate, qp: qp})
	require.Same(t, qp, w.qps[qp.qpn])
	return qp
}

// seedFrame builds a valid frame from 10.0.0.2 to QP 0x11: an Ethernet
// frame, or in ModeUDP the payload of a datagram from fuzzPeer to
// fuzzLocal.
func seedFrame(t testing.TB, mode roce.Mode, op roce.Opcode, psn uint32, payload int, h roce.Headers) []byte {
	p := roce.Path{Mode: mode, Src: fuzzPeer.Addr(), Dst: fuzzLocal.Addr(), SrcPort: 1234, TTL: 64}
	if mode == roce.ModeUDP {
		p.SrcPort, p.DstPort = fuzzPeer.Port(), fuzzLocal.Port()
	}
	buf := make([]byte, 2048)
	off := p.Headroom(op)
	for i := range payload {
		buf[off+i] = byte(i)
	}
	h.BTH = roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x11, PSN: psn, AckReq: true}
	f, err := p.Build(buf, off, payload, &h)
	require.NoError(t, err)
	return append([]byte(nil), f...)
}

// FuzzInput feeds arbitrary frames to a worker owning a QP in RTS, in
// either mode (in ModeUDP beside the QP's peer address, or another
// sender): the engine must never panic, whatever the wire brings
// (ICRC-valid frames with hostile headers included, as the seeds show).
func FuzzInput(f *testing.F) {
	reth := roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0x200, DMALength: 300}}
	for _, mode := range []roce.Mode{roce.ModeEthernet, roce.ModeUDP} {
		udp := mode == roce.ModeUDP
		add := func(op roce.Opcode, psn uint32, payload int, h roce.Headers) {
			f.Add(seedFrame(f, mode, op, psn, payload, h), udp, false)
		}
		add(roce.OpRCSendOnly, 100, 200, roce.Headers{})
		add(roce.OpRCSendFirst, 100, 256, roce.Headers{})
		add(roce.OpRCWriteFirst, 100, 256, reth)
		add(roce.OpRCWriteOnly, 100, 300, reth)
		add(roce.OpRCReadRequest, 100, 0, reth)
		add(roce.OpRCFetchAdd, 100, 0, roce.Headers{AtomicETH: roce.AtomicETHFields{VA: 0x1008, RKey: 0x200, SwapAdd: 1}})
		add(roce.OpRCCompareSwap, 101, 0, roce.Headers{AtomicETH: roce.AtomicETHFields{VA: 0x1003, RKey: 0x200}})
		add(roce.OpRCAck, 500, 0, roce.Headers{AETH: roce.AETHFields{Syndrome: roce.NAKSyndrome(roce.NAKPSNSequenceError)}})
		add(roce.OpRCReadResponseOnly, 500, 100, roce.Headers{})
		add(roce.OpRCAtomicAck, 500, 0, roce.Headers{AtomicAckETH: roce.AtomicAckETHFields{OrigRemoteData: 7}})
		add(roce.OpRCSendLastInv, 100, 10, roce.Headers{InvRKey: 0x200})
		f.Add([]byte{}, udp, false)
	}
	f.Add(seedFrame(f, roce.ModeUDP, roce.OpRCSendOnly, 100, 20, roce.Headers{}), true, true)
	f.Fuzz(func(t *testing.T, frame []byte, udp, stranger bool) {
		mode := roce.ModeEthernet
		if udp {
			mode = roce.ModeUDP
		}
		w, qp := fuzzWorker(t, mode)
		// Something outstanding, so responses have a WQE to match.
		require.NoError(t, qp.cfg.SQ.(*fakeSQ).post(abi.SendWQE{WrID: 1, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: 0x1000, RKey: 0x200},
			[]abi.SGE{{Addr: 0x1000, Length: 100, LKey: 0x200}}, nil))
		w.service(qp)
		from := fuzzPeer
		if stranger {
			from = netip.MustParseAddrPort("10.0.0.3:4791")
		}
		buf := make([]byte, DefaultFrameCap)
		n := copy(buf, frame)
		w.input(buf[:n], from)
		w.input(buf[:n], from) // and as a duplicate
		w.service(qp)
		w.fire()
		if udp && stranger {
			require.Zero(t, qp.Counters.PacketsReceived.Load(), "nothing is accepted from another address")
		}
	})
}
