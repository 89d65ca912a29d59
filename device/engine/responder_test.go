package engine

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// captureLink keeps a copy of every frame the worker sends, and its
// peer, and never receives.
type captureLink struct {
	ready  chan struct{}
	frames [][]byte
	peers  []netip.AddrPort
}

func (l *captureLink) SendBatch(f [][]byte, peers []netip.AddrPort) (int, error) {
	for i, b := range f {
		l.frames = append(l.frames, append([]byte(nil), b...))
		l.peers = append(l.peers, peers[i])
	}
	return len(f), nil
}
func (l *captureLink) RecvBatch([][]byte, []netip.AddrPort) (int, error) { return 0, nil }
func (l *captureLink) Ready() <-chan struct{}                            { return l.ready }

// sent is one frame the responder sent, decoded.
type sent struct {
	op      roce.Opcode
	psn     uint32
	syn     roce.Syndrome
	msn     uint32
	orig    uint64
	payload []byte
}

// take decodes and forgets the frames sent so far.
func (l *captureLink) take(t *testing.T) []sent {
	t.Helper()
	var out []sent
	for _, f := range l.frames {
		var p roce.Packet
		require.NoError(t, roce.Parse(f, &p))
		s := sent{op: p.BTH.Opcode(), psn: p.BTH.PSN()}
		if len(p.Payload) > 0 {
			s.payload = append([]byte(nil), p.Payload...)
		}
		if p.AETH != nil {
			s.syn, s.msn = p.AETH.Syndrome(), p.AETH.MSN()
		}
		if p.AtomicAckETH != nil {
			s.orig = p.AtomicAckETH.OrigRemoteData()
		}
		out = append(out, s)
	}
	l.frames, l.peers = nil, nil
	return out
}

// respRig is a worker that is not started, driven by the test, owning QP
// 0x11 in RTS (path MTU 256, expected PSN 100, 4 responder resources)
// whose peer is 10.0.0.2, with 64 KiB of memory at 0x1000 (key 0x200) and
// receives posted into it.
type respRig struct {
	w    *worker
	qp   *QP
	link *captureLink
	mem  []byte
	rcq  *fakeCQ
	st   *stateRec
}

func newRespRig(t *testing.T) *respRig {
	l := &captureLink{ready: make(chan struct{}, 1)}
	e, err := New(Config{Links: []Link{l}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	r := &respRig{w: e.workers[0], link: l, mem: make([]byte, 1<<16), rcq: newFakeCQ(64), st: &stateRec{}}
	mem := newFakeMem()
	require.Equal(t, uint32(0x200), mem.reg(r.mem, 0x1000, abi.AccessAll))
	rq := newFakeRQ(64)
	for i := range 8 {
		require.NoError(t, rq.post(uint64(i), abi.SGE{Addr: 0x1000 + 4096*uint64(i), Length: 4096, LKey: 0x200}))
	}
	r.qp = createOn(t, r.w, QPConfig{QPN: 0x11, SQ: newFakeSQ(16), RQ: rq, SendCQ: newFakeCQ(64), RecvCQ: r.rcq,
		Mem: mem, SQDepth: 16, MaxSendSGE: 4, MaxRecvSGE: 4, State: r.st})
	for _, a := range []QPAttr{
		{Mask: abi.QPAttrState | abi.QPAttrAccessFlags, State: abi.QPSInit, AccessFlags: abi.AccessAll},
		{Mask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic,
			State: abi.QPSRTR, LocalAddr: netip.MustParseAddr("10.0.0.1"), RemoteAddr: netip.MustParseAddr("10.0.0.2"),
			PathMTU: roce.MTU256, DestQPN: 0x22, RQPSN: 100, MaxDestRdAtomic: 4},
		{Mask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt, State: abi.QPSRTS, SQPSN: 500, Timeout: 10, RetryCnt: 7},
	} {
		require.NoError(t, r.qp.modify(&a))
	}
	return r
}

// in delivers a request from the peer (opcode op, PSN psn, payload, the
// extension headers in h) and returns what the responder sends in answer.
func (r *respRig) in(t *testing.T, op roce.Opcode, psn uint32, payload []byte, h roce.Headers) []sent {
	t.Helper()
	p := roce.Path{Mode: roce.ModeEthernet, Src: netip.MustParseAddr("10.0.0.2"), Dst: netip.MustParseAddr("10.0.0.1"), SrcPort: 1234, TTL: 64}
	buf := make([]byte, DefaultFrameCap)
	off := p.Headroom(op)
	copy(buf[off:], payload)
	h.BTH = roce.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x11, PSN: psn, AckReq: true}
	f, err := p.Build(buf, off, len(payload), &h)
	require.NoError(t, err)
	r.w.input(f, netip.AddrPort{})
	r.w.service(r.qp)
	r.w.flush()
	return r.link.take(t)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)*7 + seed
	}
	return b
}

// TestResponderDuplicates: a retransmitted request the responder has
// already executed (IBTA 9.7.5.1.2, 9.7.5.2.2): a duplicate SEND or RDMA
// WRITE is acknowledged again and not executed again (no second receive
// completion, memory untouched); a duplicate READ is executed again from
// the PSN and address it carries (whole, or a tail of it), reading memory
// as it is now; a duplicate atomic is answered from the saved result and
// never executed twice, the latest and older ones alike. A request beyond
// the expected PSN gets one NAK-PSN sequence error per gap.
func TestResponderDuplicates(t *testing.T) {
	r := newRespRig(t)
	ack := roce.ACKSyndrome(roce.CreditsInvalid)

	// SEND 200 bytes at PSN 100 into RQE 0 (0x1000).
	first := pattern(200, 1)
	got := r.in(t, roce.OpRCSendOnly, 100, first, roce.Headers{})
	assert.Equal(t, []sent{{op: roce.OpRCAck, psn: 100, syn: ack, msn: 1}}, got)
	require.Len(t, r.rcq.all(), 1)
	wantCQE(t, r.rcq.all()[0], abi.CQE{WrID: 0, Opcode: abi.WCRecv, QPNum: 0x11, ByteLen: 200})
	// The same PSN again, other bytes: re-ACKed, not executed.
	got = r.in(t, roce.OpRCSendOnly, 100, pattern(200, 99), roce.Headers{})
	assert.Equal(t, []sent{{op: roce.OpRCAck, psn: 100, syn: ack, msn: 1}}, got, "re-ACK")
	assert.Len(t, r.rcq.all(), 1, "no second receive completion")
	assert.Equal(t, first, r.mem[:200], "the duplicate's bytes are not placed")
	assert.Equal(t, uint64(1), r.qp.Counters.Rare().Duplicates.Load())

	// RDMA WRITE 100 bytes at PSN 101, then a duplicate with other bytes.
	wr := pattern(100, 2)
	reth := roce.Headers{RETH: roce.RETHFields{VA: 0x1000 + 40000, RKey: 0x200, DMALength: 100}}
	got = r.in(t, roce.OpRCWriteOnly, 101, wr, reth)
	assert.Equal(t, []sent{{op: roce.OpRCAck, psn: 101, syn: ack, msn: 2}}, got)
	got = r.in(t, roce.OpRCWriteOnly, 101, pattern(100, 77), reth)
	assert.Equal(t, []sent{{op: roce.OpRCAck, psn: 101, syn: ack, msn: 2}}, got, "re-ACK")
	assert.Equal(t, wr, r.mem[40000:40100], "the duplicate WRITE is not executed")

	// READ 600 bytes at PSN 102: three responses (MTU 256), PSNs 102-104.
	copy(r.mem[50000:], pattern(600, 3))
	rd := roce.Headers{RETH: roce.RETHFields{VA: 0x1000 + 50000, RKey: 0x200, DMALength: 600}}
	got = r.in(t, roce.OpRCReadRequest, 102, nil, rd)
	require.Len(t, got, 3)
	assert.Equal(t, []roce.Opcode{roce.OpRCReadResponseFirst, roce.OpRCReadResponseMiddle, roce.OpRCReadResponseLast},
		[]roce.Opcode{got[0].op, got[1].op, got[2].op})
	assert.Equal(t, []uint32{102, 103, 104}, []uint32{got[0].psn, got[1].psn, got[2].psn})
	assert.Equal(t, pattern(600, 3), append(append(got[0].payload, got[1].payload...), got[2].payload...))
	// The memory changes; the duplicate READ is executed again and reads it.
	copy(r.mem[50000:], pattern(600, 4))
	got = r.in(t, roce.OpRCReadRequest, 102, nil, rd)
	require.Len(t, got, 3, "the whole READ again")
	assert.Equal(t, []uint32{102, 103, 104}, []uint32{got[0].psn, got[1].psn, got[2].psn})
	assert.Equal(t, pattern(600, 4), append(append(got[0].payload, got[1].payload...), got[2].payload...))
	// A tail of it (the requester got the first response only): from PSN
	// 103 and the address 256 bytes on.
	got = r.in(t, roce.OpRCReadRequest, 103, nil, roce.Headers{RETH: roce.RETHFields{VA: 0x1000 + 50256, RKey: 0x200, DMALength: 344}})
	require.Len(t, got, 2)
	assert.Equal(t, []roce.Opcode{roce.OpRCReadResponseFirst, roce.OpRCReadResponseLast}, []roce.Opcode{got[0].op, got[1].op})
	assert.Equal(t, []uint32{103, 104}, []uint32{got[0].psn, got[1].psn})
	assert.Equal(t, pattern(600, 4)[256:], append(got[0].payload, got[1].payload...))

	// FETCH_AND_ADD at PSN 105, CMP_AND_SWP at 106, on the word at 0x1000+60000.
	binary.LittleEndian.PutUint64(r.mem[60000:], 100)
	word := func() uint64 { return binary.LittleEndian.Uint64(r.mem[60000:]) }
	faa := roce.Headers{AtomicETH: roce.AtomicETHFields{VA: 0x1000 + 60000, RKey: 0x200, SwapAdd: 5}}
	cas := roce.Headers{AtomicETH: roce.AtomicETHFields{VA: 0x1000 + 60000, RKey: 0x200, Compare: 105, SwapAdd: 7}}
	atomicAck := func(psn uint32, orig uint64, msn uint32) []sent {
		return []sent{{op: roce.OpRCAtomicAck, psn: psn, syn: ack, msn: msn, orig: orig}}
	}
	assert.Equal(t, atomicAck(105, 100, 4), r.in(t, roce.OpRCFetchAdd, 105, nil, faa))
	assert.Equal(t, uint64(105), word())
	assert.Equal(t, atomicAck(105, 100, 4), r.in(t, roce.OpRCFetchAdd, 105, nil, faa), "replayed, same original value")
	assert.Equal(t, uint64(105), word(), "not added twice")
	assert.Equal(t, atomicAck(106, 105, 5), r.in(t, roce.OpRCCompareSwap, 106, nil, cas))
	assert.Equal(t, uint64(7), word())
	assert.Equal(t, atomicAck(106, 105, 5), r.in(t, roce.OpRCCompareSwap, 106, nil, cas), "replayed: a second execution would return 7")
	assert.Equal(t, atomicAck(105, 100, 5), r.in(t, roce.OpRCFetchAdd, 105, nil, faa), "an older atomic replays too")
	assert.Equal(t, uint64(7), word(), "never executed twice")

	// Ahead of the expected PSN (107): one NAK-PSN sequence error for the
	// gap, then silence until 107 arrives.
	seqNAK := []sent{{op: roce.OpRCAck, psn: 107, syn: roce.NAKSyndrome(roce.NAKPSNSequenceError), msn: 5}}
	assert.Equal(t, seqNAK, r.in(t, roce.OpRCWriteOnly, 109, wr, reth))
	assert.Empty(t, r.in(t, roce.OpRCWriteOnly, 110, wr, reth), "one NAK per gap")
	assert.Equal(t, []sent{{op: roce.OpRCAck, psn: 107, syn: ack, msn: 6}}, r.in(t, roce.OpRCWriteOnly, 107, wr, reth))
	assert.Equal(t, abi.QPSRTS, r.qp.state)
	assert.Equal(t, uint64(1), r.qp.Counters.Rare().SeqNAKsSent.Load())
	assert.Len(t, r.rcq.all(), 1, "one receive completion in all")
}

// TestResponderClassCWithRQE: an RC responder's class C error (NAK Invalid
// Request or Remote Access Error) in a message that holds a receive WQE
// completes that WQE with the error, REM_INV_REQ_ERR or REM_ACCESS_ERR,
// and raises no event (IBTA C9-222.1.1: the error relates to that WQE; as
// Linux rxe: do_class_ac_error, then do_complete); the QP goes to ERR and
// flushes the other receives. The same errors in a message that holds none
// complete nothing and raise QP_REQ_ERR or QP_ACCESS_ERR.
func TestResponderClassCWithRQE(t *testing.T) {
	good := roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0x200, DMALength: 64}, Imm: 0xabcd}
	badKey := roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0xbad00, DMALength: 64}, Imm: 0xabcd}
	badLen := roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0x200, DMALength: 65}, Imm: 0xabcd}
	type pkt struct {
		op roce.Opcode
		n  int
		h  roce.Headers
	}
	for _, c := range []struct {
		name   string
		pkts   []pkt // from PSN 100; the last one fails
		nak    roce.NAKCode
		status abi.WCStatus    // of receive 0; 0: it is flushed as the others
		event  []abi.EventType // raised by the move to ERR
	}{
		{"write_imm_bad_rkey", []pkt{{roce.OpRCWriteOnlyImm, 64, badKey}},
			roce.NAKRemoteAccessError, abi.WCRemAccessErr, nil},
		{"write_imm_bad_length", []pkt{{roce.OpRCWriteOnlyImm, 64, badLen}},
			roce.NAKInvalidRequest, abi.WCRemInvReqErr, nil},
		{"send_middle_short", []pkt{{roce.OpRCSendFirst, 256, good}, {roce.OpRCSendMiddle, 100, good}},
			roce.NAKInvalidRequest, abi.WCRemInvReqErr, nil},
		{"send_then_write", []pkt{{roce.OpRCSendFirst, 256, good}, {roce.OpRCWriteOnly, 64, good}},
			roce.NAKInvalidRequest, abi.WCRemInvReqErr, nil},
		{"write_imm_last_bad_length", []pkt{{roce.OpRCWriteFirst, 256, roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0x200, DMALength: 300}}},
			{roce.OpRCWriteLastImm, 64, good}},
			roce.NAKInvalidRequest, abi.WCRemInvReqErr, nil},
		// No receive WQE held: events, as before.
		{"write_bad_rkey", []pkt{{roce.OpRCWriteOnly, 64, badKey}},
			roce.NAKRemoteAccessError, 0, []abi.EventType{abi.EventQPAccessErr}},
		{"write_first_imm_bad_rkey", []pkt{{roce.OpRCWriteFirst, 256, roce.Headers{RETH: roce.RETHFields{VA: 0x1000, RKey: 0xbad00, DMALength: 300}}}},
			roce.NAKRemoteAccessError, 0, []abi.EventType{abi.EventQPAccessErr}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRespRig(t)
			var got []sent
			for i, p := range c.pkts {
				got = r.in(t, p.op, 100+uint32(i), pattern(p.n, byte(i)), p.h)
			}
			last := uint32(100 + len(c.pkts) - 1)
			require.Len(t, got, 1, "the answer to the failing packet")
			assert.Equal(t, roce.OpRCAck, got[0].op)
			assert.Equal(t, last, got[0].psn)
			assert.Equal(t, roce.NAKSyndrome(c.nak), got[0].syn, "NAK %v", got[0].syn)
			r.w.service(r.qp) // the move to ERR flushes the receives
			cqes := r.rcq.all()
			require.Len(t, cqes, 8, "the 8 receives posted")
			first := 0
			if c.status != 0 {
				wantCQE(t, cqes[0], abi.CQE{WrID: 0, Status: c.status, Opcode: abi.WCRecv, QPNum: 0x11})
				first = 1
			}
			for i := first; i < 8; i++ {
				wantCQE(t, cqes[i], abi.CQE{WrID: uint64(i), Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: 0x11})
			}
			assert.Equal(t, abi.QPSErr, r.st.load())
			assert.Equal(t, c.event, r.st.events(), "asynchronous events")
		})
	}
}
