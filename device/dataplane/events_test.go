package dataplane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/evmark"
	"github.com/vrnic/vrnic/verbs"
)

// nextEvent returns the next asynchronous event of ev (at most 10 s).
func nextEvent(t *testing.T, ev *verbs.AsyncEvents) abi.AsyncEvent {
	t.Helper()
	e, err := ev.Get(10 * time.Second)
	require.NoError(t, err)
	return e
}

func openEvents(t *testing.T, c *dpClient) *verbs.AsyncEvents {
	t.Helper()
	ev, err := c.ctx.OpenAsyncEvents()
	require.NoError(t, err)
	t.Cleanup(func() { ev.Close() })
	_, err = c.ctx.OpenAsyncEvents()
	assert.Error(t, err, "one event socket per context")
	return ev
}

// markEvents moves a new QP of c with an SRQ to ERR and checks that the
// next event of ev is its QP_LAST_WQE_REACHED, which MODIFY_QP raises
// before it replies: no event was waiting before it.
func markEvents(t *testing.T, c *dpClient, ev *verbs.AsyncEvents, msg string) {
	t.Helper()
	mark, err := evmark.Raise(c.pd, c.scq, c.rcq)
	require.NoError(t, err)
	require.Equal(t, mark, nextEvent(t, ev), msg)
}

// TestAsyncEvents: the events of a context's event socket, in order.
//
//   - A WRITE to an rkey the peer never granted: both QPs go to ERR on
//     their own. The requester's error completion (REM_ACCESS_ERR) says
//     why: no event. The responder has no completion that does (the
//     WRITE took no receive WQE): QP_ACCESS_ERR with its QPN (IBTA
//     C9-222.1.1, as Linux rxe raises it).
//   - A client's own MODIFY_QP to ERR raises no QP_FATAL: the next event
//     of that context is the CQ_ERR of a CQ it then overflows, followed by
//     the QP_FATAL of the overflowing QP.
//   - A QP with an SRQ moved to ERR by its client: QP_LAST_WQE_REACHED.
//   - An SRQ armed with a limit of 4 that 8 receives were posted to: no
//     event with 4 left, SRQ_LIMIT_REACHED with 3, and the limit reads 0.
//   - The device closing: end of file, DEVICE_FATAL.
func TestAsyncEvents(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.9.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.9.2", 1, nil)
	a, b := newDPClient(t, na, 16), newDPClient(t, nb, 16)
	eva, evb := openEvents(t, a), openEvents(t, b)
	connectRC(t, a, b, abi.MTU1024)

	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey ^ 0x5a}))
	assert.Equal(t, abi.WCRemAccessErr, pollN(t, a.scq, 1)[0].Status)
	// The completion is written after the move to ERR and its events.
	markEvents(t, a, eva, "no event for the requester, whose completion says why")
	assert.Equal(t, abi.AsyncEvent{Type: abi.EventQPAccessErr, Element: uint64(b.qp.QPN)}, nextEvent(t, evb), "responder")

	// A client's own move to ERR: no event; then a CQ overflow.
	c := newDPClient(t, na, 2) // CQs of 2 CQEs
	d := newDPClient(t, nb, 16)
	evc := openEvents(t, c)
	connectRC(t, c, d, abi.MTU1024)
	q2, err := c.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, q2.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState))
	for i := range 4 {
		require.NoError(t, c.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []abi.SGE{c.mr.SGE(0, 8)}, RemoteAddr: d.mr.Addr, RKey: d.mr.RKey}))
	}
	assert.Equal(t, abi.AsyncEvent{Type: abi.EventCQErr, Element: uint64(c.scq.Handle)}, nextEvent(t, evc),
		"the CQ's overflow, and nothing before it for the QP the client moved to ERR itself")
	assert.Equal(t, abi.AsyncEvent{Type: abi.EventQPFatal, Element: uint64(c.qp.QPN)}, nextEvent(t, evc))

	// SRQ: the limit, then LAST_WQE_REACHED.
	srq, err := b.pd.CreateSRQ(16, 1, 0)
	require.NoError(t, err)
	sq, err := b.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: b.scq, RecvCQ: b.rcq, SRQ: srq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	require.NoError(t, err)
	e := newDPClient(t, na, 16)
	connectQPs(t, e.qp, na.gid, sq, nb.gid, abi.MTU1024)
	for i := range 8 {
		require.NoError(t, srq.PostRecv(&verbs.RecvWR{WrID: uint64(100 + i), SGL: []abi.SGE{b.mr.SGE(uint32(64*i), 64)}}))
	}
	require.NoError(t, srq.Modify(4))
	send := func(n int) {
		for i := range n {
			require.NoError(t, e.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled,
				SGL: []abi.SGE{e.mr.SGE(0, 16)}}))
		}
		pollN(t, e.scq, n)
		pollN(t, b.rcq, n)
	}
	send(4) // 4 left: not below the limit
	q, err := srq.Query()
	require.NoError(t, err)
	assert.Equal(t, uint32(4), q.SRQLimit, "still armed with 4 receives left")
	send(1) // 3 left
	assert.Equal(t, abi.AsyncEvent{Type: abi.EventSRQLimitReached, Element: uint64(srq.Handle)}, nextEvent(t, evb),
		"fewer receives than the limit left")
	q, err = srq.Query()
	require.NoError(t, err)
	assert.Zero(t, q.SRQLimit, "the limit is disarmed once it fired")
	require.NoError(t, sq.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState))
	assert.Equal(t, abi.AsyncEvent{Type: abi.EventQPLastWQEReached, Element: uint64(sq.QPN)}, nextEvent(t, evb))

	// The device goes: end of file, DEVICE_FATAL once.
	na.dev.Close()
	ev := nextEvent(t, eva)
	assert.Equal(t, abi.EventDeviceFatal, ev.Type)
	_, err = eva.Get(0)
	assert.ErrorIs(t, err, verbs.ErrClosed)
}

// TestAsyncEventsUDDeadMR: a UD QP's posted receive WQE points into an MR
// the client has since deregistered (as a client tearing down does when
// it frees its receive buffers before it destroys the QP), and a datagram
// arrives. The receive completes with LOC_PROT_ERR, the WQE behind it is
// flushed and the QP is in ERR; the completion says why, so no
// asynchronous event is raised (Linux raises none with an error
// completion: rxe moves the QP to ERR silently, mlx5 raises QP_FATAL only
// for a WQ catastrophic error). The sender is untouched.
func TestAsyncEventsUDDeadMR(t *testing.T) {
	_, nb, a, b, qa, qb := dpTwoQPs(t, abi.QPTUD)
	eva, evb := openEvents(t, a), openEvents(t, b)
	udUp(t, qa, 0x1111)
	udUp(t, qb, 0x2222)
	ah, err := a.pd.CreateAH(abi.AHAttr{DGID: nb.gid, PortNum: 1})
	require.NoError(t, err)
	gone, err := b.ctx.Alloc(8192, 4096)
	require.NoError(t, err)
	goneMR, err := b.pd.RegMR(gone, abi.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{goneMR.SGE(0, 4096)}}))
	require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: 2, SGL: []abi.SGE{b.mr.SGE(0, 4096)}}))
	require.NoError(t, goneMR.Dereg())

	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 10, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x2222, SGL: []abi.SGE{a.mr.SGE(0, 64)}}))
	assert.Equal(t, abi.WCSuccess, pollN(t, a.scq, 1)[0].Status)
	rc := pollN(t, b.rcq, 2)
	rc[0].VendorErr = 0 // not this test's subject
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCLocProtErr, Opcode: abi.WCRecv, QPNum: qb.QPN}, rc[0])
	assert.Equal(t, abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: qb.QPN}, rc[1])
	requireState(t, qb, abi.QPSErr, "the receiver's QP is in ERR")
	requireState(t, qa, abi.QPSRTS, "the sender's QP is untouched")
	// The flush follows the move to ERR and whatever event it raised.
	markEvents(t, b, evb, "no QP_FATAL: the receive's LOC_PROT_ERR says why")
	markEvents(t, a, eva, "nothing for the sender")
}
