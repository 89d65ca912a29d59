package device_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

// mustOpenFull opens a context and creates one of every object in it.
func mustOpenFull(t *testing.T, s *devicetest.Server) *verbs.Context {
	t.Helper()
	c, err := verbs.Open(s.SocketPath)
	require.NoError(t, err)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	defer ch.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	buf, err := c.Alloc(1<<20, 4096)
	require.NoError(t, err)
	_, err = pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	cq, err := c.CreateCQ(64, ch)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(16, 1, 0)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, qp.ToInit(abi.AccessRemoteWrite, 0))
	_, err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: abi.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	require.NoError(t, err)
	_, err = pd.CreateAH(testAV())
	require.NoError(t, err)
	return c
}
