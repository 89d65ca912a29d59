package suite

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/evmark"
)

// pair starts two daemons and connects an RC QP on each; the cleanup
// stops both by PID.
func pair(t *testing.T, o ConnOpts) (*Daemon, *Daemon, *Endpoint, *Endpoint) {
	t.Helper()
	a, b, err := StartPair(Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, a.Stop())
		assert.NoError(t, b.Stop())
	})
	ea, eb, err := Connect(a, b, o)
	require.NoError(t, err)
	t.Cleanup(func() { ea.Close(); eb.Close() })
	return a, b, ea, eb
}

func verbRule(verb string, qpn *uint32, cq *uint32, count uint64) admin.FaultRule {
	return admin.FaultRule{QPN: qpn, CQ: cq, Count: count, Action: admin.FaultAction{Type: "verb", Verb: verb}}
}

// noEventBefore checks that e's context has no asynchronous event waiting:
// it moves a new QP with an SRQ to ERR, which raises QP_LAST_WQE_REACHED
// before MODIFY_QP replies, and that is the next event. What happened
// before the call (a QP's move to ERR, which raises its events before the
// completions that follow it are written) raised nothing.
func noEventBefore(t *testing.T, e *Endpoint, msg string) {
	t.Helper()
	mark, err := evmark.Raise(e.PD, e.CQ, e.CQ)
	require.NoError(t, err)
	evs, err := e.WaitEvent(abi.EventQPLastWQEReached, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []abi.AsyncEvent{mark}, evs, msg)
}

func applied(t *testing.T, d *Daemon, id uint32) uint64 {
	t.Helper()
	rs, err := d.Rules()
	require.NoError(t, err)
	for _, r := range rs {
		if r.ID == id {
			return r.Applied
		}
	}
	t.Fatalf("no rule %d on %s", id, d.Name)
	return 0
}

func sends(n, size int) []Op {
	ops := make([]Op, n)
	for i := range ops {
		ops[i] = Op{Kind: Send, Size: size}
	}
	return ops
}

// TestVerbRNRRecovers: B answers its next 3 receives with RNR NAKs
// although RECVs are posted; A (rnr_retry 7, infinite) retries after each
// and both SENDs succeed once the injection is spent; A counted the 3
// RNR NAKs, the rule applied 3 times. The ACK timeout is long (code 18,
// about 1 s): a retransmission after a stall of the machine (code 10's
// 4 ms under -race beside other busy tests) changes which requests the
// injected NAKs answer and how many A acts on, which is not what this
// test is about.
func TestVerbRNRRecovers(t *testing.T) {
	_, b, ea, eb := pair(t, ConnOpts{Timeout: U8(18)})
	rs, err := b.AddRules(verbRule("rnr", &eb.QP.QPN, nil, 3))
	require.NoError(t, err)
	res, err := Workload{Ops: sends(2, 3000), Seed: 1}.Run(ea, eb, 20*time.Second)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	require.NoError(t, res.CheckCompletions(AllSucceed))
	require.NoError(t, res.CheckData(0, 0))
	assert.Equal(t, uint64(3), res.A.RNRNAKsReceived, "A saw every injected RNR NAK")
	assert.Equal(t, uint64(3), applied(t, b, rs[0].ID))
}

// TestVerbRNRRetryExceeded: with rnr_retry 2 on A and more injected RNR
// NAKs than that, A's SEND completes with RNR_RETRY_EXC_ERR after 3 RNR
// NAKs (the first and two retries), the next WR is flushed, and A's QP
// is in ERR; the completion says why, so no asynchronous event is raised
// (as on Linux). B's RECVs stay posted: B is fine.
func TestVerbRNRRetryExceeded(t *testing.T) {
	_, b, ea, eb := pair(t, ConnOpts{RNRRetry: U8(2)})
	_, err := b.AddRules(verbRule("rnr", &eb.QP.QPN, nil, 10))
	require.NoError(t, err)
	res, err := Workload{Ops: sends(2, 100)}.Run(ea, eb, 5*time.Second)
	require.NoError(t, err)
	// B's RECVs never complete: only A's side is expected.
	require.ErrorIs(t, res.Err, ErrTimeout)
	var st []abi.WCStatus
	for _, c := range res.Completions {
		require.Equal(t, "a", c.Side, "B completes nothing")
		st = append(st, c.Status)
	}
	assert.Equal(t, []abi.WCStatus{abi.WCRNRRetryExcErr, abi.WCWRFlushErr}, st)
	assert.Equal(t, uint64(3), res.A.RNRNAKsReceived)
	qa, err := ea.QP.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSErr, qa.Attr.QPState)
	noEventBefore(t, ea, "no QP_FATAL: RNR_RETRY_EXC_ERR says why")
	q, err := eb.QP.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTS, q.Attr.QPState, "the responder's QP is untouched")
}

// TestVerbQPErr: B's QP goes to ERR when A's SEND arrives: B gets
// QP_FATAL (no completion says why) and its posted RECV is flushed
// (WR_FLUSH_ERR); a QP in ERR drops what it receives without answering
// (IBTA 10.3.1), so A hears nothing: its SEND completes with
// RETRY_EXC_ERR once retry_cnt retransmissions timed out (not REM_OP_ERR,
// which only a responder that answers sends), and A's QP goes to ERR too,
// with no event: its completion says why.
func TestVerbQPErr(t *testing.T) {
	_, b, ea, eb := pair(t, ConnOpts{RetryCnt: U8(2), Timeout: U8(8)})
	_, err := b.AddRules(verbRule("qp_err", &eb.QP.QPN, nil, 1))
	require.NoError(t, err)
	res, err := Workload{Ops: sends(1, 100)}.Run(ea, eb, 20*time.Second)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	require.NoError(t, res.CheckCompletions(func(side string, _ int, _ Op) abi.WCStatus {
		if side == "a" {
			return abi.WCRetryExcErr
		}
		return abi.WCWRFlushErr
	}))
	assert.Equal(t, uint64(2), res.A.Retransmits, "retry_cnt retransmissions before the error")
	evs, err := eb.WaitEvent(abi.EventQPFatal, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []abi.AsyncEvent{{Type: abi.EventQPFatal, Element: uint64(eb.QP.QPN)}}, evs)
	noEventBefore(t, ea, "no event for A: RETRY_EXC_ERR says why")
	for _, e := range []*Endpoint{ea, eb} {
		q, err := e.QP.Query()
		require.NoError(t, err)
		assert.Equal(t, abi.QPSErr, q.Attr.QPState, e.D.Name)
	}
}

// TestVerbBadWQE: A's next send WQE is treated as malformed: it completes
// with LOC_QP_OP_ERR, the WR after it is flushed, A's QP goes to ERR
// (no asynchronous event: the completion says why), and nothing reaches
// B.
func TestVerbBadWQE(t *testing.T) {
	a, _, ea, eb := pair(t, ConnOpts{})
	_, err := a.AddRules(verbRule("bad_wqe", &ea.QP.QPN, nil, 1))
	require.NoError(t, err)
	res, err := Workload{Ops: []Op{{Kind: Write, Size: 100}, {Kind: Write, Size: 100}}}.Run(ea, eb, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	require.NoError(t, res.CheckCompletions(func(_ string, i int, _ Op) abi.WCStatus {
		return [...]abi.WCStatus{abi.WCLocQPOpErr, abi.WCWRFlushErr}[i]
	}))
	q, err := ea.QP.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSErr, q.Attr.QPState)
	noEventBefore(t, ea, "no QP_FATAL: LOC_QP_OP_ERR says why")
	assert.Zero(t, res.B.PacketsReceived, "B received nothing")
}

// TestVerbCQOverflow: A's CQ overflows at its next completion: A's
// context gets CQ_ERR (the CQ's handle) and QP_FATAL (its QP went to
// ERR); the completion and the flushes after it are lost with the CQ.
func TestVerbCQOverflow(t *testing.T) {
	a, _, ea, eb := pair(t, ConnOpts{})
	_, err := a.AddRules(verbRule("cq_overflow", nil, &ea.CQ.Handle, 1))
	require.NoError(t, err)
	res, err := Workload{Ops: []Op{{Kind: Write, Size: 100}}}.Run(ea, eb, 3*time.Second)
	require.NoError(t, err)
	require.ErrorIs(t, res.Err, ErrTimeout, "no completion comes out of an overflowed CQ")
	assert.Empty(t, res.Completions)
	evs, err := ea.WaitEvent(abi.EventQPFatal, 5*time.Second)
	require.NoError(t, err)
	assert.Contains(t, evs, abi.AsyncEvent{Type: abi.EventCQErr, Element: uint64(ea.CQ.Handle)})
	q, err := ea.QP.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSErr, q.Attr.QPState)
	assert.True(t, res.DataOK[0], "the WRITE itself was done before its completion overflowed")
}

// TestVerbCQEDelay: A's next completion is held back 5 s, and the one
// after it waits behind it: once B holds both WRITEs' data and A heard
// the ACK, A's CQ is still empty; then both completions come, in order.
func TestVerbCQEDelay(t *testing.T) {
	a, _, ea, eb := pair(t, ConnOpts{})
	r := verbRule("cqe_delay", nil, &ea.CQ.Handle, 1)
	r.Action.Delay = "5s"
	_, err := a.AddRules(r)
	require.NoError(t, err)
	ops := []Op{{Kind: Write, Size: 2000}, {Kind: Write, Size: 2000}}
	posted := time.Now()
	for i, o := range ops {
		require.NoError(t, ea.post(o, i, regions(ops)[i], eb))
	}
	require.Eventually(t, func() bool {
		q, err := ea.QP.Query()
		return err == nil && q.PacketsReceived > 0 && eb.Buf.Bytes[2047] == ea.Buf.Bytes[2047]
	}, 10*time.Second, time.Millisecond)
	// Both WRITEs are placed and A has heard from B; while the 5 s
	// hold lasts, A's CQ must be empty. (The hold starts after the
	// posts, so before posted+5s it has not ended, however slow the
	// machine; past that the check says nothing and is left out.)
	wc := make([]abi.CQE, 4)
	if n := ea.CQ.Poll(wc); time.Since(posted) < 5*time.Second {
		assert.Zero(t, n, "the delayed CQE and the one behind it are held")
	} else {
		t.Logf("the WRITEs took %v to be placed: past the hold, the empty CQ was not checked", time.Since(posted))
	}
	got, err := ea.PollN(2, 20*time.Second)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.GreaterOrEqual(t, time.Since(posted), 5*time.Second, "no completion before the hold ended")
	assert.Equal(t, []uint64{1, 2}, []uint64{got[0].WrID, got[1].WrID}, "in order")
	assert.Equal(t, abi.WCSuccess, got[0].Status)
}

// TestVerbPortFlap: the port of A goes down for 200 ms: every context of
// A gets PORT_ERR, then PORT_ACTIVE; a WRITE posted while it is down is
// dropped on the wire (the capture says "port down") and completes after
// a retransmission once the port is up.
func TestVerbPortFlap(t *testing.T) {
	a, _, ea, eb := pair(t, ConnOpts{Timeout: U8(16)})
	r := admin.FaultRule{Action: admin.FaultAction{Type: "verb", Verb: "port_flap", For: "200ms"}}
	_, err := a.AddRules(r)
	require.NoError(t, err)
	_, err = ea.WaitEvent(abi.EventPortErr, 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, ea.post(Op{Kind: Write, Size: 100}, 0, 0, eb))
	_, err = ea.WaitEvent(abi.EventPortActive, 5*time.Second)
	require.NoError(t, err)
	got, err := ea.PollN(1, 20*time.Second)
	require.NoError(t, err)
	assert.Equal(t, abi.WCSuccess, got[0].Status)
	q, err := ea.QP.Query()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, q.Retransmits, uint64(1))
	require.NoError(t, a.Stop())
	frames, err := a.Frames()
	require.NoError(t, err)
	down := 0
	for _, f := range frames {
		if strings.Contains(f.Comment, "port down") {
			down++
		}
	}
	assert.Positive(t, down, "the frame sent while the port was down is captured with its comment")
	require.NoError(t, CheckGoBackN(frames, a.Addr, 1024))
}
