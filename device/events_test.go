package device_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/verbs"
)

// TestAsyncEventsNeverBlock: a client that never reads its event socket
// loses its own events, nothing more: 600 QPs with an SRQ moved to ERR by
// their client raise 600 QP_LAST_WQE_REACHED events, more than the socket
// holds; every MODIFY_QP is answered (the device never waits on the
// socket), the events that did not fit are counted as dropped, and the
// ones that fit arrive in order.
func TestAsyncEventsNeverBlock(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	ev, err := c.OpenAsyncEvents()
	require.NoError(t, err)
	defer ev.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(16, 1, 0)
	require.NoError(t, err)
	const n = 600
	qpns := make([]uint32, 0, n)
	for range n {
		qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq,
			Cap: abi.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
		require.NoError(t, err)
		require.NoError(t, qp.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState))
		qpns = append(qpns, qp.QPN)
	}
	ctr := s.Device.Counters()
	sent, dropped := ctr.AsyncEvents.Load(), ctr.AsyncEventsDropped.Load()
	assert.Equal(t, uint64(n), sent+dropped)
	assert.NotZero(t, dropped, "600 events fit the socket: make n larger")
	for i := range int(sent) {
		e, err := ev.Get(time.Second)
		require.NoError(t, err)
		require.Equal(t, abi.AsyncEvent{Type: abi.EventQPLastWQEReached, Element: uint64(qpns[i])}, e, "event %d", i)
	}
	_, err = ev.Get(0)
	assert.ErrorIs(t, err, verbs.ErrNoEvent, "nothing beyond what was counted sent")
}
