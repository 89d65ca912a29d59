package dataplane_test

import (
	"context"
	"errors"
	"golang.org/x/sys/unix"
	"net/netip"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/verbs"
)

// resolveLog records Resolve calls and fails those for unreachable.
type resolveLog struct {
	mu          sync.Mutex
	calls       []netip.Addr
	unreachable netip.Addr
}

func (r *resolveLog) resolve(ctx context.Context, peer netip.Addr) error {
	r.mu.Lock()
	r.calls = append(r.calls, peer)
	r.mu.Unlock()
	if peer == r.unreachable {
		return errors.New("no answer")
	}
	return nil
}

func (r *resolveLog) snapshot() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netip.Addr(nil), r.calls...)
}

// newResolveNode is newDPNode with a Resolve hook, reporting a TAP link.
func newResolveNode(t *testing.T, addr string, resolve func(context.Context, netip.Addr) error) *dpNode {
	t.Helper()
	a := netip.MustParseAddr(addr)
	ports, err := newDPNetwork(t).Attach(a, 1, nil)
	require.NoError(t, err)
	return startNode(t, nodeSpec{addr: a, links: []engine.Link{ports[0]}, linkType: abi.LinkTAP, dp: dataplane.Config{Resolve: resolve}})
}

// TestDataPlaneResolveOnRTR: the peer is resolved when an RC QP goes from
// INIT to RTR, and a QP whose peer cannot be resolved never reaches the
// engine as RTR: MODIFY_QP fails with EHOSTUNREACH instead of hanging.
func TestDataPlaneResolveOnRTR(t *testing.T) {
	good, bad := netip.MustParseAddr("10.77.0.2"), netip.MustParseAddr("10.77.0.9")
	rl := &resolveLog{unreachable: bad}
	n := newResolveNode(t, "10.77.0.1", rl.resolve)
	c := newDPClient(t, n, 64)

	require.NoError(t, c.qp.ToInit(abi.AccessAll, 0))
	assert.Empty(t, rl.snapshot(), "no resolution before RTR")
	rtr := func(peer netip.Addr) verbs.RTRAttr {
		return verbs.RTRAttr{AV: abi.AHAttr{DGID: peer.As16(), HopLimit: 64, PortNum: 1}, PathMTU: abi.MTU1024, DestQPN: 0x42, MaxDestRdAtomic: 4}
	}
	require.NoError(t, c.qp.ToRTR(rtr(good)))
	calls := rl.snapshot()
	require.NotEmpty(t, calls)
	for _, a := range calls {
		assert.Equal(t, good, a, "the QP's destination GID is resolved")
	}
	require.NoError(t, c.qp.ToRTS(verbs.RTSAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}))
	assert.Len(t, rl.snapshot(), len(calls), "RTR to RTS resolves nothing")
	r, err := c.qp.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTS, r.Attr.QPState)

	// An unreachable peer.
	qp2, err := c.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, qp2.ToInit(abi.AccessAll, 0))
	err = qp2.ToRTR(rtr(bad))
	require.Error(t, err, "the device consults CheckModifyQP: the MODIFY_QP fails")
	assert.ErrorIs(t, err, unix.EHOSTUNREACH)
	assert.ErrorContains(t, err, bad.String())
	r2, err := qp2.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSInit, r2.Attr.QPState, "the refused change is not applied")
	assert.Contains(t, rl.snapshot(), bad)
}
