package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// TestLatencyBuckets: a latency lands in the first bucket whose bound is
// at least it (bounds inclusive, as Prometheus' le), beyond the last bound
// in the overflow bucket, and the sum adds the latencies (a negative one,
// which a pass clock never gives, as 0).
func TestLatencyBuckets(t *testing.T) {
	for _, c := range []struct {
		d    int64
		want int
	}{
		{-5, 0}, {0, 0}, {1, 0}, {1024, 0}, {1025, 1}, {2048, 1}, {2049, 2},
		{int64(LatencyBound(LatencyBuckets - 1)), LatencyBuckets - 1},
		{int64(LatencyBound(LatencyBuckets-1)) + 1, LatencyBuckets},
		{1 << 62, LatencyBuckets},
	} {
		var h LatencyHist
		h.record(c.d)
		assert.Equal(t, uint64(1), h.Buckets[c.want], "latency %d", c.d)
		assert.Equal(t, uint64(1), h.Count())
		assert.Equal(t, uint64(max(c.d, 0)), h.SumNanos)
	}
	for i := range LatencyBuckets {
		assert.Equal(t, uint64(1)<<(LatencyMinShift+i), LatencyBound(i))
	}
	var a, b Latencies
	a[LatRead].record(3000)
	b[LatRead].record(5000)
	b[LatRecv].record(1)
	a.Add(&b)
	assert.Equal(t, uint64(2), a[LatRead].Count())
	assert.Equal(t, uint64(8000), a[LatRead].SumNanos)
	assert.Equal(t, uint64(1), a[LatRecv].Count())
	assert.Equal(t, "recv_rdma_with_imm", LatRecvWriteImm.String())
	assert.Equal(t, "unknown", NumLatencyOps.String())
}

// TestCompletionLatency: every successful signaled completion counts once
// in its opcode's histogram, on the side that wrote it: WRITEs, READs and
// SENDs on the requester, the receives on the responder; unsignaled WRITEs
// and flushed WQEs count nowhere. A WRITE's latency covers at least its
// round trip, so it is not all in the first bucket's zero.
func TestCompletionLatency(t *testing.T) {
	a, b := pair(t, 2, nil, nil, defaultOpts())
	src := a.n.buffer(4096, 0x1000, abi.AccessAll, 1)
	dst := b.n.buffer(4096, 0x1000, abi.AccessAll, 2)
	const n = 8
	for i := range n {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 4096))
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 64)) // unsignaled
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 4096))
		b.recv(t, uint64(i), dst.sge(0, 4096))
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 100))
	}
	require.True(t, a.scq.wait(3*n, 20*time.Second))
	require.True(t, b.rcq.wait(n, 20*time.Second))
	for _, c := range append(a.scq.all(), b.rcq.all()...) {
		require.Equal(t, abi.WCSuccess, c.Status)
	}
	la, err := a.n.eng.CompletionLatency()
	require.NoError(t, err)
	lb, err := b.n.eng.CompletionLatency()
	require.NoError(t, err)
	assert.Equal(t, uint64(n), la[LatWrite].Count())
	assert.Equal(t, uint64(n), la[LatRead].Count())
	assert.Equal(t, uint64(n), la[LatSend].Count())
	assert.Zero(t, la[LatRecv].Count())
	assert.Equal(t, uint64(n), lb[LatRecv].Count())
	assert.Zero(t, lb[LatWrite].Count()+lb[LatSend].Count())
	assert.Positive(t, la[LatWrite].SumNanos, "a WRITE waits for its ACK: passes later")
	for _, op := range []LatencyOp{LatWrite, LatRead, LatSend} {
		var sum uint64
		for i, c := range la[op].Buckets[:LatencyBuckets] {
			sum += c * LatencyBound(i)
		}
		assert.LessOrEqual(t, la[op].SumNanos, sum, "%v: each latency at most its bucket's bound", op)
	}

	// A WQE flushed by ERR counts nowhere.
	require.NoError(t, a.n.eng.ModifyQP(a.qpn, QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr}))
	a.send(t, abi.SendWQE{WrID: 99, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 8))
	require.True(t, a.scq.wait(3*n+1, 20*time.Second))
	la2, err := a.n.eng.CompletionLatency()
	require.NoError(t, err)
	assert.Equal(t, la[LatWrite].Count(), la2[LatWrite].Count())

	a.n.eng.Close()
	_, err = a.n.eng.CompletionLatency()
	assert.ErrorIs(t, err, ErrClosed)
}

// TestZeroAllocLatency: recording completion latency allocates nothing on
// the steady SEND/RECV path, and reading it does not disturb that path.
func TestZeroAllocLatency(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, b := steadyMode(t, roce.ModeUDP)
	src := a.n.buffer(64, 0x1000, abi.AccessAll, 1)
	dst := b.n.buffer(64, 0x1000, abi.AccessAll, 2)
	wr := abi.SendWQE{Opcode: abi.WRSend, Flags: abi.SendSignaled}
	assert.Zero(t, sendAllocs(a, b, wr, []abi.SGE{src.sge(0, 64)}, dst.sge(0, 64)))
	la, err := a.n.eng.CompletionLatency()
	require.NoError(t, err)
	lb, err := b.n.eng.CompletionLatency()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, la[LatSend].Count(), uint64(250))
	assert.Equal(t, la[LatSend].Count(), lb[LatRecv].Count())
}
