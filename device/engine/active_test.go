package engine

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// countingSQ counts the polls of a send source.
type countingSQ struct {
	SendSource
	polls atomic.Uint64
}

func (c *countingSQ) PollSend(w *SendWork) (bool, error) {
	c.polls.Add(1)
	return c.SendSource.PollSend(w)
}

// waitActive waits until the node's workers have n QPs on their active
// lists together.
func waitActive(t *testing.T, n *node, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		var sum int64
		for i := range n.eng.Workers() {
			sum += n.eng.WorkerCounters(i).ActiveQPs.Load()
		}
		return sum == want
	}, waitFor, activeLinger/1000*1000, "active QPs")
}

// TestIdleQPsAreNotServiced: connected QPs with nothing to do leave their
// worker's active list, and traffic on another QP of the same worker
// never polls their send queues; a doorbell (Kick) puts one back, it does
// its work and leaves again.
func TestIdleQPsAreNotServiced(t *testing.T) {
	const idle = 200
	nw := newNetwork(t)
	na := newNode(t, nw, "10.0.0.1", 1, nil)
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := defaultOpts()
	o.sqDepth = 16
	var sqs []*countingSQ
	var qa []*tqp
	for i := range idle {
		a := na.newQPWith(t, uint32(0x100+i), o, func(s SendSource) SendSource {
			c := &countingSQ{SendSource: s}
			sqs = append(sqs, c)
			return c
		})
		b := nb.newQP(t, uint32(0x100+i), o)
		connect(t, a, b, o)
		qa = append(qa, a)
	}
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	waitActive(t, na, 0)
	waitActive(t, nb, 0)

	before := make([]uint64, idle)
	for i, c := range sqs {
		before[i] = c.polls.Load()
	}
	src := na.buffer(4096, 0x10000, abi.AccessAll, 1)
	dst := nb.buffer(4096, 0x20000, abi.AccessAll, 2)
	const n = 500
	for i := range n {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 64))
	}
	require.True(t, a.scq.wait(n, waitFor), "completions of the traffic")
	for i, c := range sqs {
		assert.Equal(t, before[i], c.polls.Load(), "idle QP %d: its SQ was polled during another QP's traffic", i)
	}

	// A doorbell on an idle QP: it joins the list, does its WRITE, and
	// leaves once it has had nothing to do for a while.
	q := qa[idle/2]
	q.send(t, abi.SendWQE{WrID: 7, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 64))
	require.True(t, q.scq.wait(1, waitFor), "completion of the idle QP's WRITE")
	require.Equal(t, abi.WCSuccess, q.scq.all()[0].Status)
	waitActive(t, na, 0)
}
