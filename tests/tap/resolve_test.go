package tap

import (
	"golang.org/x/sys/unix"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// TestUnreachablePeer: a QP whose peer does not answer ARP (on the link)
// or is not on the link at all does not hang: MODIFY_QP to RTR fails with
// EHOSTUNREACH and a message naming the peer within the resolution
// timeout, and the QP stays in INIT.
func TestUnreachablePeer(t *testing.T) {
	tp := newTopo(t)
	d := tp.startDaemon(t, tp.nsA, "tu", "vtu", 2, nil, "10.77.0.1/24")
	c, err := verbs.Open(d.sock, verbs.WithClientName("unreachable"))
	require.NoError(t, err)
	defer c.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	// How each gives up: an on-link peer after its requests went
	// unanswered (tap.ErrUnresolved), or when the data plane's
	// ResolveTimeout ends the wait; an off-link one without a gateway
	// at once. Either way by the daemon's own bounds, whatever the
	// wall time on a loaded machine.
	for peer, why := range map[string]string{
		"10.77.0.99": `did not answer \d+ requests|context deadline exceeded`,
		"192.0.2.1":  `192\.0\.2\.1 is not on the link`,
	} {
		t.Run(peer, func(t *testing.T) {
			qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)
			require.NoError(t, qp.ToInit(abi.AccessAll, 0))
			start := time.Now()
			err = qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: netip.MustParseAddr("::ffff:" + peer).As16(), HopLimit: 64, PortNum: 1},
				PathMTU: abi.MTU1024, DestQPN: 7, MaxDestRdAtomic: 1})
			require.Error(t, err, "MODIFY_QP to RTR with an unreachable peer fails")
			assert.ErrorIs(t, err, unix.EHOSTUNREACH)
			assert.ErrorContains(t, err, peer, "the error names the peer")
			t.Logf("refused after %v: %v", time.Since(start), err)
			assert.Regexp(t, why, err.Error(), "how the resolution gave up")
			r, qerr := qp.Query()
			require.NoError(t, qerr)
			assert.Equal(t, abi.QPSInit, r.Attr.QPState, "the refused change is not applied")
		})
	}
}
