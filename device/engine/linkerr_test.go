package engine

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// flakyLink fails its first send call and every receive call while
// failRecv is set; otherwise it is the link it wraps.
type flakyLink struct {
	Link
	sends    atomic.Int32
	failRecv atomic.Bool
}

var errInjectedSend = errors.New("injected send failure")

func (l *flakyLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if l.sends.Add(1) == 1 {
		return 0, errInjectedSend
	}
	return l.Link.SendBatch(frames, peers)
}

func (l *flakyLink) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	if l.failRecv.Load() {
		l.failRecv.Store(false)
		return 0, errors.New("injected receive failure")
	}
	return l.Link.RecvBatch(frames, peers)
}

// TestLinkErrorsKeepTheirCause: a failed send call and a failed receive
// call of the link count each in its own counter, once per call, and the
// newest one's text is kept; the frames a failed send did not take go out
// with the next call, so the WRITE still lands.
func TestLinkErrorsKeepTheirCause(t *testing.T) {
	nw := newNetworkMode(t, modes[0], 64, 64)
	flaky := &flakyLink{}
	na := newNodeWrap(t, nw, "10.0.0.1", 1, nil, func(l Link) Link { flaky.Link = l; return flaky })
	nb := newNode(t, nw, "10.0.0.2", 1, nil)
	o := defaultOpts()
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	src := na.buffer(100, 0x1000, abi.AccessAll, 1)
	dst := nb.buffer(100, 0x1000, abi.AccessAll, 2)
	a.send(t, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 100))
	require.True(t, a.scq.wait(1, waitFor))
	wantCQE(t, a.scq.all()[0], abi.CQE{WrID: 1, Opcode: abi.WCRDMAWrite, QPNum: a.qpn})
	assert.Equal(t, src.b, dst.b)

	c := na.eng.WorkerCounters(0)
	assert.Equal(t, uint64(1), c.LinkSendErrors.Load())
	assert.Zero(t, c.LinkRecvErrors.Load())
	e := c.LastLinkError()
	require.NotNil(t, e)
	assert.Equal(t, "send", e.Op)
	assert.Equal(t, errInjectedSend.Error(), e.Text)

	// A receive failure: its own counter, and it becomes the newest.
	flaky.failRecv.Store(true)
	a.send(t, abi.SendWQE{WrID: 2, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 100))
	require.True(t, a.scq.wait(2, waitFor))
	// The failure was set before the WRITE was posted: the call it
	// failed came before the one that read the WRITE's ACK.
	assert.Equal(t, uint64(1), c.LinkRecvErrors.Load())
	assert.Equal(t, uint64(1), c.LinkSendErrors.Load())
	e = c.LastLinkError()
	require.NotNil(t, e)
	assert.Equal(t, "receive", e.Op)
	assert.Equal(t, "injected receive failure", e.Text)
	assert.Nil(t, nb.eng.WorkerCounters(0).LastLinkError(), "the other side's link never failed")
}
