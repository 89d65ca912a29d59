package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// wedgeLink is a link whose RecvBatch blocks while wedged: the worker that
// reads it is stuck, as a worker would be that blocked on something (a bug,
// or formerly a client's completion eventfd).
type wedgeLink struct {
	nullLink
	wedged  atomic.Bool
	inside  chan struct{} // told when RecvBatch blocks
	release chan struct{}
}

func (l *wedgeLink) RecvBatch(f [][]byte, _ []netip.AddrPort) (int, error) {
	if l.wedged.Load() {
		l.inside <- struct{}{}
		<-l.release
	}
	return 0, nil
}

// stateRecorder is a QP's StateObserver.
type stateRecorder struct{ s atomic.Uint32 }

func (r *stateRecorder) TransportState(s abi.QPState) { r.s.Store(uint32(s)) }
func (r *stateRecorder) TransportError(abi.EventType) { r.s.Store(uint32(abi.QPSErr)) }

// TestControlNeverWaits: CreateQP, ModifyQP and DestroyQP return while the
// QP's worker is stuck (they queue; nobody waits for a worker), and the
// worker applies them in order once it runs again: the QP created while it
// was stuck exists, the one moved to ERR is in ERR with its receive
// flushed, the removed one is gone and its channel closed only then.
func TestControlNeverWaits(t *testing.T) {
	l := &wedgeLink{nullLink: nullLink{ready: make(chan struct{}, 1)}, inside: make(chan struct{}), release: make(chan struct{})}
	e, err := New(Config{Links: []Link{l}, Mode: roce.ModeEthernet})
	require.NoError(t, err)
	e.Start()
	defer e.Close()
	var st4 stateRecorder
	rq4, rcq4 := newFakeRQ(16), newFakeCQ(16)
	qpConfig := func(qpn uint32) QPConfig {
		return QPConfig{QPN: qpn, SQ: newFakeSQ(16), RQ: newFakeRQ(16), SendCQ: newFakeCQ(16), RecvCQ: newFakeCQ(16),
			Mem: newFakeMem(), SQDepth: 16}
	}
	_, err = e.CreateQP(qpConfig(1))
	require.NoError(t, err)
	cfg4 := qpConfig(4)
	cfg4.RQ, cfg4.RecvCQ, cfg4.State = rq4, rcq4, &st4
	_, err = e.CreateQP(cfg4)
	require.NoError(t, err)
	require.NoError(t, rq4.post(44))
	_, err = e.Counters(4) // both created (Counters waits for the worker)
	require.NoError(t, err)

	l.wedged.Store(true)
	l.ready <- struct{}{} // wake the worker into RecvBatch
	<-l.inside            // it is stuck there now

	done := make(chan struct{})
	var applied <-chan struct{}
	go func() {
		defer close(done)
		_, err := e.CreateQP(qpConfig(2))
		assert.NoError(t, err)
		assert.NoError(t, e.ModifyQP(4, QPAttr{Mask: abi.QPAttrState, State: abi.QPSErr}))
		applied = e.DestroyQP(1)
		assert.ErrorIs(t, e.ModifyQP(4, QPAttr{Mask: abi.QPAttrPathMTU, PathMTU: 7}), ErrInvalid,
			"what can be checked without the worker is checked at once")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a control operation waited for a stuck worker")
	}
	select {
	case <-applied:
		t.Fatal("the removal was reported applied while the worker is stuck")
	default:
	}
	assert.Equal(t, uint32(0), st4.s.Load(), "nothing applied while the worker is stuck")

	l.wedged.Store(false)
	close(l.release)
	select {
	case <-applied:
	case <-time.After(10 * time.Second):
		t.Fatal("the queued removal was not applied after the worker recovered")
	}
	_, err = e.Counters(1)
	assert.ErrorIs(t, err, ErrNoQP, "QP 1 removed")
	_, err = e.Counters(2)
	assert.NoError(t, err, "the QP created while the worker was stuck exists")
	assert.Equal(t, uint32(abi.QPSErr), st4.s.Load())
	require.True(t, rcq4.wait(1, 10*time.Second), "the receive of the QP moved to ERR completes")
	c := rcq4.all()[0]
	assert.Equal(t, uint64(44), c.WrID)
	assert.Equal(t, abi.WCWRFlushErr, c.Status)
}

// holdLink holds its worker inside the next RecvBatch once armed, before
// it reads the link, until released.
type holdLink struct {
	Link
	armed           atomic.Bool
	inside, release chan struct{}
}

func (l *holdLink) RecvBatch(f [][]byte, p []netip.AddrPort) (int, error) {
	if l.armed.CompareAndSwap(true, false) {
		l.inside <- struct{}{}
		<-l.release
	}
	return l.Link.RecvBatch(f, p)
}

// TestModifyAppliedBeforeLaterFrames: a MODIFY_QP posted while the worker
// is inside RecvBatch (it took its control queue before) applies before
// the frames that batch returns are handled, so a frame the peer sent
// after the change was posted (a client's RTR, then its peer's first
// SEND) finds the QP in the new state, not dropped for a retransmission.
// The worker is held inside RecvBatch while b's move to RTR is posted and
// a's SEND reaches b's link.
func TestModifyAppliedBeforeLaterFrames(t *testing.T) {
	o := defaultOpts()
	o.timeout = 20 // 4 s: a retransmission would be seen, not raced
	nw := newNetwork(t)
	hold := &holdLink{inside: make(chan struct{}), release: make(chan struct{})}
	na := newNode(t, nw, "10.0.0.1", 1, nil)
	nb := newNodeWrap(t, nw, "10.0.0.2", 1, nil, func(l Link) Link { hold.Link = l; return hold })
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	bringUp(t, a, b, o, abi.QPSRTS)
	bringUp(t, b, a, o, abi.QPSInit)
	_, err := nb.eng.Counters(b.qpn) // b's INIT applied
	require.NoError(t, err)
	require.NoError(t, b.rq.post(9))

	hold.armed.Store(true)
	nb.eng.Kick(b.qpn)
	<-hold.inside // b's worker: control queue taken, b in INIT, inside RecvBatch
	require.NoError(t, nb.eng.ModifyQP(b.qpn, rtrAttr(b, a, o)))
	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled})
	require.Eventually(t, func() bool { return nb.ports[0].Queued() >= 1 },
		10*time.Second, time.Millisecond, "a's SEND waits on b's link")
	close(hold.release)

	require.True(t, b.rcq.wait(1, 10*time.Second), "b received the SEND sent after its change to RTR")
	assert.Equal(t, abi.WCSuccess, b.rcq.all()[0].Status)
	require.True(t, a.scq.wait(1, 10*time.Second))
	assert.Equal(t, abi.WCSuccess, a.scq.all()[0].Status)
	ca, err := na.eng.Counters(a.qpn)
	require.NoError(t, err)
	assert.Zero(t, ca.Rare().Retransmits.Load(), "the SEND was taken the first time, not dropped and sent again")
}
