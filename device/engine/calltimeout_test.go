package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// wedgeLink is a link whose RecvBatch blocks while wedged: the worker that
// reads it is stuck, as a worker would be that blocked on something (a bug,
// or formerly a client's completion eventfd).
type wedgeLink struct {
	nullLink
	wedged  atomic.Bool
	release chan struct{}
}

func (l *wedgeLink) RecvBatch(f [][]byte, _ []netip.AddrPort) (int, error) {
	if l.wedged.Load() {
		<-l.release
	}
	return 0, nil
}

// TestCallTimeout: control operations on a stuck worker return ErrTimeout
// (wrapping ETIMEDOUT) within Config.CallTimeout; after the first, calls
// to the same worker do not wait at all. An operation the worker had not
// taken is abandoned (a CreateQP did not create the QP, even after the
// worker recovers); a DestroyQP stays queued and its channel is closed
// when the recovered worker applies it. Calls wait normally again once
// the worker took its queue.
func TestCallTimeout(t *testing.T) {
	l := &wedgeLink{nullLink: nullLink{ready: make(chan struct{}, 1)}, release: make(chan struct{})}
	const bound = 150 * time.Millisecond
	e, err := New(Config{Links: []Link{l}, Mode: roce.ModeEthernet, CallTimeout: bound})
	require.NoError(t, err)
	e.Start()
	defer e.Close()
	qpConfig := func(qpn uint32) QPConfig {
		return QPConfig{QPN: qpn, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16), RecvCQ: newFakeCQ(16),
			Mem: newFakeMem(), SQDepth: 16}
	}
	_, err = e.CreateQP(qpConfig(1))
	require.NoError(t, err)
	_, err = e.CreateQP(qpConfig(4))
	require.NoError(t, err)

	l.wedged.Store(true)
	l.ready <- struct{}{} // wake the worker into RecvBatch
	time.Sleep(20 * time.Millisecond)

	start := time.Now()
	_, err = e.CreateQP(qpConfig(2))
	took := time.Since(start)
	require.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, unix.ETIMEDOUT)
	assert.GreaterOrEqual(t, took, bound)
	assert.Less(t, took, bound+2*time.Second)

	start = time.Now()
	err = e.ModifyQP(4, QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr})
	require.ErrorIs(t, err, ErrTimeout)
	applied, err := e.DestroyQP(1)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Less(t, time.Since(start), bound, "a worker known to be behind: no second wait")
	select {
	case <-applied:
		t.Fatal("the removal was reported applied while the worker is stuck")
	default:
	}

	l.wedged.Store(false)
	close(l.release)
	select {
	case <-applied:
	case <-time.After(5 * time.Second):
		t.Fatal("the queued removal was not applied after the worker recovered")
	}
	_, err = e.Counters(1)
	assert.ErrorIs(t, err, ErrNoQP, "QP 1 removed")
	_, err = e.Counters(2)
	assert.ErrorIs(t, err, ErrNoQP, "the abandoned CreateQP did not happen")
	_, err = e.CreateQP(qpConfig(2))
	require.NoError(t, err, "the worker answers again")
	applied, err = e.DestroyQP(2)
	require.NoError(t, err)
	select {
	case <-applied:
	default:
		t.Fatal("a DestroyQP that returned nil has applied closed")
	}
}

// TestQueueError: QueueError moves a QP to ERR once its worker takes its
// queue, without waiting: a posted receive completes flushed.
func TestQueueError(t *testing.T) {
	_, b := pair(t, 1, nil, nil, defaultOpts())
	b.recv(t, 7)
	b.n.eng.QueueError(b.qpn)
	require.True(t, b.rcq.wait(1, 5*time.Second), "the receive WR completes")
	c := b.rcq.all()[0]
	assert.Equal(t, uint64(7), c.WrID)
	assert.Equal(t, abi.WCWRFlushErr, c.Status)
}
