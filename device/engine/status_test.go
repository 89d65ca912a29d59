package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/queues"
	"github.com/vrnic/vrnic/roce"
)

// TestStatusTable feeds every cause to the table and checks the status
// and NAK code the IBTA names for it (status.go).
func TestStatusTable(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		// What a Memory implementation returns: a wrapped sentinel, or
		// (package device) an error that unwraps to the sentinel and the
		// dma cause.
		dmaCause := errors.New("dma: cause")
		for _, c := range []struct {
			name      string
			err       error
			local     abi.WCStatus
			remoteNAK roce.NAKCode
			recv      abi.WCStatus
			recvNAK   roce.NAKCode
		}{
			{"protection", fmt.Errorf("x: %w", ErrMemProtection), abi.WCLocProtErr, roce.NAKRemoteAccessError, abi.WCLocProtErr, roce.NAKRemoteOperationalErr},
			{"protection_joined", errors.Join(ErrMemProtection, dmaCause), abi.WCLocProtErr, roce.NAKRemoteAccessError, abi.WCLocProtErr, roce.NAKRemoteOperationalErr},
			{"length", fmt.Errorf("x: %w", ErrMemLength), abi.WCLocLenErr, roce.NAKInvalidRequest, abi.WCLocLenErr, roce.NAKInvalidRequest},
			{"length_joined", errors.Join(ErrMemLength, dmaCause), abi.WCLocLenErr, roce.NAKInvalidRequest, abi.WCLocLenErr, roce.NAKInvalidRequest},
			{"bounds", fmt.Errorf("x: %w", ErrMemBounds), abi.WCLocProtErr, roce.NAKRemoteAccessError, abi.WCLocProtErr, roce.NAKRemoteOperationalErr},
			{"bounds_joined", errors.Join(ErrMemBounds, dmaCause), abi.WCLocProtErr, roce.NAKRemoteAccessError, abi.WCLocProtErr, roce.NAKRemoteOperationalErr},
			// Unclassified: fails closed, as a protection error.
			{"other", dmaCause, abi.WCLocProtErr, roce.NAKRemoteAccessError, abi.WCLocProtErr, roce.NAKRemoteOperationalErr},
		} {
			t.Run(c.name, func(t *testing.T) {
				assert.Equal(t, c.local, localMemStatus(c.err), "requester, own buffers")
				assert.Equal(t, c.remoteNAK, remoteMemNAK(c.err), "responder, R_Key range")
				st, nak := recvMemStatus(c.err)
				assert.Equal(t, c.recv, st, "responder, receive WQE buffers: receive status")
				assert.Equal(t, c.recvNAK, nak, "responder, receive WQE buffers: NAK")
			})
		}
	})
	t.Run("nak", func(t *testing.T) {
		for _, c := range []struct {
			nak  roce.NAKCode
			want abi.WCStatus
		}{
			{roce.NAKInvalidRequest, abi.WCRemInvReqErr},
			{roce.NAKRemoteAccessError, abi.WCRemAccessErr},
			{roce.NAKRemoteOperationalErr, abi.WCRemOpErr},
			{roce.NAKInvalidRDRequest, abi.WCRemInvRdReqErr},
			{5, abi.WCRemOpErr},  // reserved
			{31, abi.WCRemOpErr}, // reserved
		} {
			assert.Equal(t, c.want, nakStatus(c.nak), "%v", c.nak)
		}
	})
	t.Run("reason", func(t *testing.T) {
		for _, c := range []struct {
			r    queues.Reason
			want abi.WCStatus
		}{
			{queues.ReasonNone, abi.WCLocQPOpErr}, // a source bug: never SUCCESS
			{queues.ReasonOpcode, abi.WCLocQPOpErr},
			{queues.ReasonFlags, abi.WCLocQPOpErr},
			{queues.ReasonReserved, abi.WCLocQPOpErr},
			{queues.ReasonTooManySGE, abi.WCLocLenErr},
			{queues.ReasonInlineTooLong, abi.WCLocLenErr},
			{queues.ReasonInlineWithSGE, abi.WCLocQPOpErr},
			{queues.ReasonInlineOpcode, abi.WCLocQPOpErr},
			{queues.ReasonAtomicSGE, abi.WCLocLenErr},
			{queues.ReasonLength, abi.WCLocLenErr},
			{200, abi.WCLocQPOpErr},
		} {
			t.Run(c.r.String(), func(t *testing.T) {
				assert.Equal(t, c.want, reasonStatus(c.r))
				we := &queues.WQEError{WrID: 7, Index: 3, Reason: c.r}
				assert.Equal(t, c.want, sourceStatus(we), "as the source returns it")
				assert.Equal(t, c.want, sourceStatus(fmt.Errorf("wrapped: %w", we)), "wrapped")
			})
		}
		for r := range 256 {
			assert.NotEqual(t, abi.WCSuccess, reasonStatus(queues.Reason(r)), "reason %d", r)
		}
	})
	t.Run("source", func(t *testing.T) {
		// Package device wraps a broken ring as "%w: %w" of its own
		// sentinel and the queues error.
		broken := fmt.Errorf("%w: %w", errors.New("device: work queue index out of range"), fmt.Errorf("%w: pi 9 ci 0", queues.ErrIndex))
		assert.Equal(t, abi.WCLocQPOpErr, sourceStatus(broken), "broken ring")
		assert.Equal(t, abi.WCLocQPOpErr, sourceStatus(errFakeRing), "broken ring (fake)")
		assert.Equal(t, abi.WCLocQPOpErr, sourceStatus(errors.New("device: WQE larger than the engine's private copy")), "other source error")
	})
	t.Run("other", func(t *testing.T) {
		assert.Equal(t, abi.WCLocProtErr, invalidateRecvStatus, "SEND with Invalidate of a bad key: receive status")
		assert.Equal(t, roce.NAKInvalidRequest, invalidateNAK, "SEND with Invalidate of a bad key: NAK")
		assert.Equal(t, roce.NAKRemoteOperationalErr, recvSourceNAK, "RecvSource error: NAK")
		assert.Equal(t, abi.WCLocQPOpErr, unsupportedOpStatus, "opcode the engine does not execute")
	})
}

// TestStatusNoAlloc: a status lookup allocates nothing.
func TestStatusNoAlloc(t *testing.T) {
	we := error(&queues.WQEError{WrID: 7, Reason: queues.ReasonTooManySGE})
	mem := error(errFakeBounds)
	joined := errors.Join(ErrMemLength, errors.New("dma: cause"))
	var sink abi.WCStatus
	var nak roce.NAKCode
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		sink = sourceStatus(we)
		sink = sourceStatus(errFakeRing)
		sink = localMemStatus(mem)
		sink = localMemStatus(joined)
		nak = remoteMemNAK(mem)
		sink, nak = recvMemStatus(joined)
		sink = nakStatus(roce.NAKRemoteAccessError)
		sink = reasonStatus(queues.ReasonLength)
	}))
	_, _ = sink, nak
}

// TestBadSendWQE: a send WQE the source consumed with an error (package
// queues rejected it, or the ring is broken) completes with the status of
// the table (num_sge > max_send_sge: LOC_LEN_ERR), the QP goes to ERR and
// everything else, posted before or after, is flushed. A rejected WQE's
// completion says why, and no asynchronous event is raised; a broken ring
// is a catastrophic error, QP_FATAL.
func TestBadSendWQE(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason queues.Reason // ReasonNone: broken ring
		wrid   uint64
		want   abi.WCStatus
		cause  string // RejectedWQEs key
	}{
		{"too_many_sge", queues.ReasonTooManySGE, 1, abi.WCLocLenErr, "too_many_sge"},
		{"inline_too_long", queues.ReasonInlineTooLong, 1, abi.WCLocLenErr, "inline_too_long"},
		{"unknown_opcode", queues.ReasonOpcode, 1, abi.WCLocQPOpErr, "unknown_opcode"},
		{"broken_ring", queues.ReasonNone, 0, abi.WCLocQPOpErr, "ring_index"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, 1, nil, nil, defaultOpts())
			src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
			dst := b.n.buffer(100, 0x1000, abi.AccessAll, 2)
			b.recv(t, 20, dst.sge(0, 100))
			a.recv(t, 9, src.sge(0, 10))
			wqe := abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, NumSGE: abi.MaxSGE + 1}
			if c.reason == queues.ReasonNone {
				a.sq.breakRing()
			} else {
				require.NoError(t, a.sq.postErr(wqe, nil, nil, &queues.WQEError{WrID: wqe.WrID, Index: 0, Reason: c.reason}))
			}
			require.NoError(t, a.sq.post(abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, []abi.SGE{src.sge(0, 100)}, nil))
			a.n.eng.Kick(a.qpn)
			require.True(t, a.scq.wait(1, waitFor))
			op := abi.WCSend
			if c.reason == queues.ReasonNone {
				op = abi.WCRDMAWrite // no WQE: the source hands a zero one
			}
			wantCQE(t, a.scq.all()[0], abi.CQE{WrID: c.wrid, Status: c.want, Opcode: op, QPNum: a.qpn})
			assert.Equal(t, uint8(1), a.scq.all()[0].VendorErr, "an error other than a flush")
			require.True(t, a.rcq.wait(1, waitFor))
			wantCQE(t, a.rcq.all()[0], abi.CQE{WrID: 9, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: a.qpn})
			// The QP is in ERR: what is posted later is flushed too.
			a.send(t, abi.SendWQE{WrID: 3, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
			if c.reason != queues.ReasonNone {
				// WQE 2 was behind the bad one; a broken ring hands out
				// nothing after it.
				require.True(t, a.scq.wait(3, waitFor))
				cq := a.scq.all()
				wantCQE(t, cq[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
				wantCQE(t, cq[2], abi.CQE{WrID: 3, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
			}
			a.recv(t, 10, src.sge(0, 10))
			require.True(t, a.rcq.wait(2, waitFor))
			wantCQE(t, a.rcq.all()[1], abi.CQE{WrID: 10, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: a.qpn})
			// Nothing reached the peer.
			ca, err := a.n.eng.Counters(a.qpn)
			require.NoError(t, err)
			assert.Zero(t, ca.PacketsSent.Load())
			assert.Zero(t, b.rcq.count.Load())
			// Counted once, under its cause.
			assert.Equal(t, map[string]uint64{c.cause: 1}, a.n.eng.WorkerCounters(0).RejectedWQEs())
			assert.Nil(t, b.n.eng.WorkerCounters(0).RejectedWQEs())
			if c.reason == queues.ReasonNone {
				wantErrEvents(t, a, abi.EventQPFatal)
			} else {
				wantErrEvents(t, a)
			}
			assert.Nil(t, b.state.events())
		})
	}
}

// TestRecvSourceError: the responder's RecvSource fails when a SEND needs
// a receive WQE (a broken RQ ring, or a malformed receive WQE). The
// responder's client gets a receive completion in error (LOC_QP_OP_ERR
// with wr_id 0 for the ring; the table's status with its wr_id for the
// WQE), the requester gets NAK Remote Operational Error (REM_OP_ERR), and
// both QPs go to ERR, flushing the rest. The responder's client hears of
// a broken ring through QP_FATAL; of a malformed receive WQE through its
// completion only, and the requester through its own (REM_OP_ERR).
func TestRecvSourceError(t *testing.T) {
	for _, c := range []struct {
		name   string
		reason queues.Reason // ReasonNone: broken ring
		wrid   uint64
		want   abi.WCStatus
		cause  string // RejectedWQEs key
	}{
		{"broken_ring", queues.ReasonNone, 0, abi.WCLocQPOpErr, "ring_index"},
		{"too_many_sge", queues.ReasonTooManySGE, 7, abi.WCLocLenErr, "too_many_sge"},
		{"reserved", queues.ReasonReserved, 7, abi.WCLocQPOpErr, "reserved_field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := pair(t, 1, nil, nil, defaultOpts())
			src := a.n.buffer(100, 0x1000, abi.AccessAll, 1)
			dst := b.n.buffer(100, 0x1000, abi.AccessAll, 2)
			if c.reason == queues.ReasonNone {
				b.rq.breakRing()
			} else {
				require.NoError(t, b.rq.postErr(7, &queues.WQEError{WrID: 7, Reason: c.reason}))
				require.NoError(t, b.rq.post(8, dst.sge(0, 100)))
			}
			a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
			a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
			require.True(t, a.scq.wait(2, waitFor))
			wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Status: abi.WCRemOpErr, Opcode: abi.WCSend, QPNum: a.qpn})
			wantCQE(t, a.scq.all()[1], abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qpn})
			require.True(t, b.rcq.wait(1, waitFor))
			wantCQE(t, b.rcq.all()[0], abi.CQE{WrID: c.wrid, Status: c.want, Opcode: abi.WCRecv, QPNum: b.qpn})
			if c.reason != queues.ReasonNone {
				require.True(t, b.rcq.wait(2, waitFor))
				wantCQE(t, b.rcq.all()[1], abi.CQE{WrID: 8, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: b.qpn})
			}
			// The responder's QP is in ERR: its sends are flushed.
			b.send(t, abi.SendWQE{WrID: 30, Opcode: abi.WRSend}, dst.sge(0, 10))
			require.True(t, b.scq.wait(1, waitFor))
			wantCQE(t, b.scq.all()[0], abi.CQE{WrID: 30, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: b.qpn})
			cb, err := b.n.eng.Counters(b.qpn)
			require.NoError(t, err)
			assert.Zero(t, cb.Rare().RNRNAKsSent.Load(), "an error, not a missing receive")
			assert.Equal(t, map[string]uint64{c.cause: 1}, b.n.eng.WorkerCounters(0).RejectedWQEs())
			if c.reason == queues.ReasonNone {
				// Its flushed send showed b in ERR; a broken ring takes
				// no receive to flush (wantErrEvents).
				assert.Equal(t, []abi.EventType{abi.EventQPFatal}, b.state.events())
			} else {
				wantErrEvents(t, b)
			}
			wantErrEvents(t, a)
		})
	}
}

// TestFatalNAKPendingDropsRequests: once the responder has decided a
// fatal NAK (here: a malformed receive WQE), the QP is bound for ERR and
// takes no further request, even before the NAK is out: a retransmission
// of the request and the next request arriving in that window (in the
// same receive batch, or while the link pushes back) consume no receive
// WQE and draw no RNR NAK; the next WQE is flushed when the QP reaches
// ERR. The worker is driven by hand so that both arrive in the window.
func TestFatalNAKPendingDropsRequests(t *testing.T) {
	rq := newFakeRQ(8)
	require.NoError(t, rq.postErr(7, &queues.WQEError{WrID: 7, Reason: queues.ReasonTooManySGE}))
	require.NoError(t, rq.post(8, abi.SGE{Addr: 0x1000, Length: 1024, LKey: 0x200}))
	w, qp := fuzzWorkerRQ(t, roce.ModeUDP, rq)
	rcq := qp.cfg.RecvCQ.(*fakeCQ)
	send := func(psn uint32) {
		f := seedFrame(t, roce.ModeUDP, roce.OpRCSendOnly, psn, 100, roce.Headers{})
		buf := make([]byte, DefaultFrameCap)
		w.input(buf[:copy(buf, f)], fuzzPeer)
	}
	send(100) // takes WQE 7: malformed, the fatal NAK is queued
	require.True(t, qp.resp.nakPending && qp.resp.nakFatal)
	send(100) // a retransmission before the NAK is out
	send(101) // the next request
	send(100)
	assert.Equal(t, 1, rq.head, "WQE 8 was not taken")
	assert.Zero(t, qp.Counters.Rare().RNRNAKsSent.Load(), "no RNR NAK")
	require.Len(t, rcq.all(), 1)
	wantCQE(t, rcq.all()[0], abi.CQE{WrID: 7, Status: abi.WCLocLenErr, Opcode: abi.WCRecv, QPNum: 0x11})
	w.service(qp) // the NAK goes out, the QP to ERR
	assert.Equal(t, abi.QPSErr, qp.state)
	w.service(qp) // a QP in ERR flushes its queues
	require.Len(t, rcq.all(), 2)
	wantCQE(t, rcq.all()[1], abi.CQE{WrID: 8, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: 0x11})
}
