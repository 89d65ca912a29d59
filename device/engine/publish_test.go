package engine

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// pubSQ is a SendSource whose consumer index the engine publishes
// (SendPublisher): taken counts the WQEs PollSend handed out, published
// what PublishSend last made visible, publishes the calls.
type pubSQ struct {
	*fakeSQ
	taken, published, publishes atomic.Int64
}

func (s *pubSQ) PollSend(w *SendWork) (bool, error) {
	ok, err := s.fakeSQ.PollSend(w)
	if ok {
		s.taken.Add(1)
	}
	return ok, err
}

func (s *pubSQ) PublishSend() {
	s.publishes.Add(1)
	s.published.Store(s.taken.Load())
}

// checkCQ is a send CQ that records, at each completion, whether every
// WQE taken from sq so far had been published.
type checkCQ struct {
	*fakeCQ
	sq    *pubSQ
	mu    sync.Mutex
	stale []int64 // WQEs taken but unpublished when a CQE was written
}

func (c *checkCQ) PushCQE(e *abi.CQE, se bool) error {
	if d := c.sq.taken.Load() - c.sq.published.Load(); d != 0 {
		c.mu.Lock()
		c.stale = append(c.stale, d)
		c.mu.Unlock()
	}
	return c.fakeCQ.PushCQE(e, se)
}

// TestSendPublishBeforeCompletion: the engine publishes an SQ's consumer
// index once per batch, not per WQE, and always before it writes a send
// completion, whatever the completion: signaled WRITEs in batches, and
// the WQEs flushed when the QP goes to ERR.
func TestSendPublishBeforeCompletion(t *testing.T) {
	nw := newNetwork(t)
	na := newNode(t, nw, "10.0.0.1", 1, nil)
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := defaultOpts()
	sq := &pubSQ{fakeSQ: newFakeSQ(4096)}
	cq := &checkCQ{fakeCQ: newFakeCQ(8192), sq: sq}
	a := &tqp{n: na, qpn: 0x11, sq: sq.fakeSQ, rq: newFakeRQ(64), scq: cq.fakeCQ, rcq: newFakeCQ(64)}
	_, err := na.eng.CreateQP(QPConfig{
		QPN: a.qpn, SQ: sq, RQ: a.rq, SendCQ: cq, RecvCQ: a.rcq, Mem: na.mem,
		SQDepth: int32(o.sqDepth), MaxSendSGE: abi.MaxSGE, MaxRecvSGE: abi.MaxSGE, MaxInline: abi.MaxInline,
	})
	require.NoError(t, err)
	b := nb.newQP(t, 0x22, o)
	connect(t, a, b, o)

	src := na.buffer(64, 0x1000, abi.AccessAll, 1)
	dst := nb.buffer(64, 0x1000, abi.AccessAll, 2)
	const batches, per = 20, 32
	for i := range batches {
		for j := range per {
			w := abi.SendWQE{WrID: uint64(i*per + j), Opcode: abi.WRRDMAWrite, RemoteAddr: dst.va, RKey: dst.key}
			if j == per-1 {
				w.Flags = abi.SendSignaled
			}
			require.NoError(t, sq.post(w, []abi.SGE{src.sge(0, 64)}, nil))
		}
		na.eng.Kick(a.qpn)
		require.True(t, cq.wait(i+1, waitFor))
	}
	assert.Equal(t, int64(batches*per), sq.taken.Load())
	assert.Equal(t, sq.taken.Load(), sq.published.Load(), "everything taken is published")
	assert.Less(t, sq.publishes.Load(), int64(batches*per), "published per batch, not per WQE")

	// Flushed in ERR: posted after a bad rkey moved the QP to ERR, taken
	// from the SQ and completed in one go.
	require.NoError(t, sq.post(abi.SendWQE{WrID: 9000, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key ^ 0xff},
		[]abi.SGE{src.sge(0, 64)}, nil))
	na.eng.Kick(a.qpn)
	require.True(t, cq.wait(batches+1, waitFor))
	for k := range 8 {
		require.NoError(t, sq.post(abi.SendWQE{WrID: uint64(9001 + k), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key},
			[]abi.SGE{src.sge(0, 64)}, nil))
	}
	na.eng.Kick(a.qpn)
	require.True(t, cq.wait(batches+9, 10*time.Second))
	cqes := cq.all()
	assert.Equal(t, abi.WCRemAccessErr, cqes[batches].Status)
	assert.Equal(t, abi.WCWRFlushErr, cqes[len(cqes)-1].Status)

	cq.mu.Lock()
	defer cq.mu.Unlock()
	assert.Empty(t, cq.stale, "completions written with taken WQEs unpublished")
}
