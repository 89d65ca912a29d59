package dataplane_test

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/device/dataplane"
)

// startQP1 starts QP1 on n and stops it when the test ends.
func startQP1(t testing.TB, n *dpNode) *dataplane.QP1 {
	t.Helper()
	q, err := n.dp.StartQP1(n.addr)
	require.NoError(t, err)
	t.Cleanup(q.Close)
	return q
}

type gotMAD struct {
	src [16]byte
	mad []byte
}

// TestQP1ExchangesMADs: QP1 of two devices carry 256-byte MADs both ways
// as UD datagrams; the receiver learns the sender's GID from the GRH, a
// MAD of a class nobody registered is dropped and counted.
func TestQP1ExchangesMADs(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.9.0.1", 2, nil)
	nb := newDPNode(t, nw, "10.9.0.2", 2, nil)
	qa, qb := startQP1(t, na), startQP1(t, nb)
	ga, gb := make(chan gotMAD, 200), make(chan gotMAD, 200)
	agent := func(ch chan gotMAD) func([16]byte, []byte) {
		return func(src [16]byte, mad []byte) { ch <- gotMAD{src, append([]byte(nil), mad...)} }
	}
	qa.RegisterAgent(0x07, agent(ga))
	qb.RegisterAgent(0x07, agent(gb))

	mad := func(class, seq byte) []byte {
		m := make([]byte, 256)
		m[0], m[1], m[2], m[3] = 1, class, 2, 3
		m[255] = seq
		return m
	}
	const n = 150 // more than QP1's send slots: they are recycled
	// UD does not wait for a receiver: the sender keeps at most 32 MADs
	// ahead of what b took, within b's 64 receive slots, so that none is
	// dropped for want of a posted receive however the two are scheduled.
	const ahead = 32
	for i := range n {
		require.Eventually(t, func() bool { return qb.Counters.Received.Load()+ahead > uint64(i) },
			5*time.Second, 50*time.Microsecond, "b took %d MADs of %d", qb.Counters.Received.Load(), i)
		for qa.SendMAD(nb.gid, mad(0x07, byte(i))) != nil {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range n {
		select {
		case g := <-gb:
			assert.Equal(t, na.gid, g.src)
			assert.Equal(t, mad(0x07, byte(i)), g.mad)
		case <-time.After(5 * time.Second):
			t.Fatalf("MAD %d did not arrive (b received %d, dropped %d)", i, qb.Counters.Received.Load(), qb.Counters.Dropped.Load())
		}
	}
	require.NoError(t, qb.SendMAD(na.gid, mad(0x07, 9)))
	select {
	case g := <-ga:
		assert.Equal(t, netip.MustParseAddr("10.9.0.2"), netip.AddrFrom16(g.src).Unmap())
	case <-time.After(5 * time.Second):
		t.Fatal("the answer did not arrive")
	}
	require.NoError(t, qa.SendMAD(nb.gid, mad(0x04, 1)))
	assert.Eventually(t, func() bool { return qb.Counters.Dropped.Load() == 1 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, uint64(n+1), qa.Counters.Sent.Load())
	assert.Zero(t, qa.Counters.SendErrors.Load())
	assert.Equal(t, uint64(n), qb.Counters.Received.Load())
}

// TestQP1SendBurst: a burst of MADs far beyond QP1's 64 send slots (a
// thousand connection requests at once) waits for slots instead of being
// dropped: every SendMAD succeeds and every MAD is handed to the engine.
func TestQP1SendBurst(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.9.1.1", 1, nil)
	nb := newDPNode(t, nw, "10.9.1.2", 1, nil)
	qa := startQP1(t, na)
	startQP1(t, nb)
	const n = 600
	m := make([]byte, 256)
	m[0], m[1], m[2] = 1, 0x07, 2
	for i := range n {
		m[255] = byte(i)
		require.NoError(t, qa.SendMAD(nb.gid, m), "MAD %d", i)
	}
	require.Eventually(t, func() bool { return qa.Counters.Sent.Load() == n }, 10*time.Second, time.Millisecond,
		"sent %d of %d", qa.Counters.Sent.Load(), n)
	assert.Zero(t, qa.Counters.SendDropped.Load())
	assert.Zero(t, qa.Counters.SendErrors.Load())
}

// TestQP1AnswersNotDropped: closing thousands of connections at once
// makes the CM send a REJ for each, far more than QP1's send slots and
// backlog hold. QP1 drops none of them (nor any message the CM sends only
// once): every one is handed to the transport. Requests the CM repeats
// (here REQs, interleaved) are refused past the backlog's bound and
// counted. UD has no flow control: what the receiver's 512 receive slots
// cannot hold is dropped by its transport, and counted there too; every
// MAD sent is received or counted.
func TestQP1AnswersNotDropped(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.9.2.1", 1, nil)
	nb := newDPNode(t, nw, "10.9.2.2", 1, nil)
	qa, qb := startQP1(t, na), startQP1(t, nb)
	var rejs, reqs atomic.Uint64
	qb.RegisterAgent(0x07, func(_ [16]byte, mad []byte) {
		switch mad[17] {
		case 0x12:
			rejs.Add(1)
		case 0x10:
			reqs.Add(1)
		}
	})
	mad := func(attr byte, i int) []byte {
		m := make([]byte, 256)
		m[0], m[1], m[2], m[3], m[17] = 1, 0x07, 2, 3, attr
		binary.BigEndian.PutUint32(m[24:], uint32(i))
		return m
	}
	const n = 32768
	var reqsRefused int
	for i := range n {
		require.NoError(t, qa.SendMAD(nb.gid, mad(0x12, i)), "REJ %d", i)
		if i%8 == 0 {
			if err := qa.SendMAD(nb.gid, mad(0x10, i)); err != nil {
				require.ErrorIs(t, err, dataplane.ErrQP1Busy)
				reqsRefused++
			}
		}
	}
	reqsSent := uint64(n/8 - reqsRefused)
	require.Eventually(t, func() bool { return qa.Counters.Sent.Load() == n+reqsSent }, 60*time.Second, time.Millisecond)
	assert.Equal(t, uint64(reqsRefused), qa.Counters.SendDropped.Load(), "REQs refused, counted")
	assert.NotZero(t, reqsRefused, "the burst did not reach the backlog's bound")
	assert.NotZero(t, qa.Counters.Overflow.Load(), "no REJ waited past the bound")
	assert.Zero(t, qa.Counters.SendErrors.Load())
	// Every MAD sent arrives or is counted as dropped for want of a
	// receive slot.
	arrived := func() uint64 { return rejs.Load() + reqs.Load() + qb.Stats().NoRecvSlot }
	require.Eventually(t, func() bool { return arrived() == n+reqsSent }, 10*time.Second, time.Millisecond)
	t.Logf("a: %d REJs and %d REQs sent, %d REQs refused, %d REJs queued past the bound; b: %d REJs and %d REQs received, %d dropped for want of a receive slot",
		n, reqsSent, reqsRefused, qa.Counters.Overflow.Load(), rejs.Load(), reqs.Load(), qb.Stats().NoRecvSlot)
}
