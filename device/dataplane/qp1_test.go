package dataplane_test

import (
	"net/netip"
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
