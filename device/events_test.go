package device_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

// openWithEvents opens a context on s with its event socket; t's cleanup
// closes the socket.
func openWithEvents(t *testing.T, s *devicetest.Server) (*verbs.Context, *verbs.AsyncEvents) {
	t.Helper()
	c := open(t, s)
	ev, err := c.OpenAsyncEvents()
	require.NoError(t, err)
	t.Cleanup(func() { ev.Close() })
	return c, ev
}

// qpsToErr creates n RC QPs with an SRQ on c and moves each to ERR by its
// client: n QP_LAST_WQE_REACHED events. It returns their QPNs in order.
func qpsToErr(t *testing.T, c *verbs.Context, n int) []uint32 {
	t.Helper()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(16, 1, 0)
	require.NoError(t, err)
	qpns := make([]uint32, 0, n)
	for range n {
		qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq,
			Cap: abi.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
		require.NoError(t, err)
		require.NoError(t, qp.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState))
		qpns = append(qpns, qp.QPN)
	}
	return qpns
}

// readEvents reads the QP_LAST_WQE_REACHED events of qpns, in order, then
// finds nothing more.
func readEvents(t *testing.T, ev *verbs.AsyncEvents, qpns []uint32) {
	t.Helper()
	for i, qpn := range qpns {
		e, err := ev.Get(5 * time.Second)
		require.NoError(t, err, "event %d", i)
		require.Equal(t, abi.AsyncEvent{Type: abi.EventQPLastWQEReached, Element: uint64(qpn)}, e, "event %d", i)
	}
	_, err := ev.Get(0)
	assert.ErrorIs(t, err, verbs.ErrNoEvent, "nothing beyond what was counted sent")
}

// TestAsyncEventsNeverBlock: a client that does not read its event socket
// holds up nothing and loses nothing: 600 QPs with an SRQ moved to ERR by
// their client raise 600 QP_LAST_WQE_REACHED events, more than the socket
// holds; every MODIFY_QP is answered (the device never waits on the
// socket), what did not fit waits in the device, and when the client
// reads it gets all 600, in order.
func TestAsyncEventsNeverBlock(t *testing.T) {
	s := startServer(t, device.Limits{})
	c, ev := openWithEvents(t, s)
	const n = 600
	qpns := qpsToErr(t, c, n)
	ctr := s.Device.Counters()
	assert.Less(t, ctr.AsyncEvents.Load(), uint64(n), "600 events fit the socket: make n larger")
	assert.Zero(t, ctr.AsyncEventsDropped.Load())
	readEvents(t, ev, qpns)
	assert.Equal(t, uint64(n), ctr.AsyncEvents.Load())
	assert.Zero(t, ctr.AsyncEventsDropped.Load())
}

// TestAsyncEventBacklogBound: what waits for room in a context's socket is
// bounded; beyond the bound, events are dropped and counted, and the
// client reads the ones kept, in order. A context closed while events
// wait lets them go (its goroutines end: TestMain checks).
func TestAsyncEventBacklogBound(t *testing.T) {
	const kept = 100
	t.Cleanup(device.SetEventBacklogMax(kept * 16)) // after the server stops
	s := startServer(t, device.Limits{})
	c, ev := openWithEvents(t, s)
	const n = 600
	qpns := qpsToErr(t, c, n)
	ctr := s.Device.Counters()
	inSocket := int(ctr.AsyncEvents.Load())
	require.Less(t, inSocket+kept, n)
	assert.Equal(t, uint64(n-inSocket-kept), ctr.AsyncEventsDropped.Load())
	readEvents(t, ev, qpns[:inSocket+kept])
	assert.Equal(t, uint64(inSocket+kept), ctr.AsyncEvents.Load())

	// Another context fills its socket and backlog, then goes.
	c2, ev2 := openWithEvents(t, s)
	qpsToErr(t, c2, inSocket+kept/2)
	require.NoError(t, c2.Close())
	_, err := ev2.Get(time.Second)
	require.NoError(t, err, "what the socket took is still there")
}

// TestEventSinkClosedDuringFlush: the context's event sink closes right
// after its flush goroutine sent an event of the backlog, before it takes
// the event off (a hook there closes the sink): the goroutine sees the
// sink closed and ends, the daemon goes on (TestMain checks that no
// goroutine is left).
func TestEventSinkClosedDuringFlush(t *testing.T) {
	var once sync.Once
	closed := make(chan struct{})
	t.Cleanup(device.SetEventAfterSend(func(closeSink func()) {
		once.Do(func() { closeSink(); close(closed) })
	}))
	s := startServer(t, device.Limits{})
	c, ev := openWithEvents(t, s)
	qpsToErr(t, c, 600) // more than the socket holds: a backlog
	// Reading makes room (the socket counts as writable again once it
	// holds a quarter of its buffer): the flush goroutine sends, the
	// hook closes the sink, and the client reads what the socket held,
	// then end of file.
	var err error
	for {
		if _, err = ev.Get(time.Second); err != nil {
			break
		}
	}
	require.NotErrorIs(t, err, verbs.ErrNoEvent, "the flush goroutine sent nothing")
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("the event socket ended (%v) but the hook did not close it", err)
	}
	// The daemon still answers.
	_, err = c.AllocPD()
	require.NoError(t, err)
}
