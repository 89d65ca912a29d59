package device_test

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

// TestLifecycleBusy checks every "in use" rule: the object is refused
// with EBUSY while its user exists and destroyed once the user is gone.
func TestLifecycleBusy(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	hm, err := c.AddHostMem(1 << 20)
	require.NoError(t, err)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	buf, err := hm.Alloc(8192, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite)
	require.NoError(t, err)
	t.Run("PD with MR", func(t *testing.T) {
		err := pd.Dealloc()
		assert.Equal(t, syscall.EBUSY, errno(t, err))
		assert.Contains(t, err.Error(), "in use")
	})
	t.Run("host memory with MR", func(t *testing.T) {
		assert.Equal(t, syscall.EBUSY, errno(t, hm.Remove()))
	})
	require.NoError(t, mr.Dereg())

	scq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	rcq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	srq, err := pd.CreateSRQ(8, 1, 0)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: scq, RecvCQ: rcq, SRQ: srq, Cap: abi.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	require.NoError(t, err)
	t.Run("send CQ in use", func(t *testing.T) {
		err := scq.Destroy()
		assert.Equal(t, syscall.EBUSY, errno(t, err))
		assert.Contains(t, err.Error(), "in use by 1 QPs")
	})
	t.Run("recv CQ in use", func(t *testing.T) { assert.Equal(t, syscall.EBUSY, errno(t, rcq.Destroy())) })
	t.Run("SRQ in use", func(t *testing.T) { assert.Equal(t, syscall.EBUSY, errno(t, srq.Destroy())) })
	t.Run("PD with QP and SRQ", func(t *testing.T) { assert.Equal(t, syscall.EBUSY, errno(t, pd.Dealloc())) })
	require.NoError(t, qp.Destroy())
	require.NoError(t, scq.Destroy())
	require.NoError(t, rcq.Destroy())
	t.Run("PD with SRQ", func(t *testing.T) { assert.Equal(t, syscall.EBUSY, errno(t, pd.Dealloc())) })
	require.NoError(t, srq.Destroy())
	require.NoError(t, pd.Dealloc())
	require.NoError(t, hm.Remove())
	cnt := s.Device.Counts()
	assert.Equal(t, 0, cnt.PD+cnt.MR+cnt.CQ+cnt.QP+cnt.SRQ+cnt.AH)
}

// TestRingPinsHostMemory checks that a ring keeps its host memory region
// in place: REMOVE_HOST_MEM is EBUSY until the CQ is destroyed.
func TestRingPinsHostMemory(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	cq, err := c.CreateCQ(4, nil)
	require.NoError(t, err)
	// The ring came from the context's first arena region: its handle is
	// the only host memory handle of the context.
	arena := onlyHostMem(t, s)
	assert.Equal(t, syscall.EBUSY, errno(t, c.Destroy(abi.CmdRemoveHostMem, arena)))
	require.NoError(t, cq.Destroy())
	require.NoError(t, c.Destroy(abi.CmdRemoveHostMem, arena))
}

func onlyHostMem(t *testing.T, s *devicetest.Server) uint32 {
	t.Helper()
	items := adminList[admin.HostMemInfo](t, s.SocketPath, admin.HostMemCmd)
	require.Len(t, items, 1)
	return items[0].Handle
}

func TestLimits(t *testing.T) {
	lim := device.Limits{
		PerClient: device.ResourceCounts{PD: 2, CQ: 2, QP: 1, MR: 1, SRQ: 1, AH: 1, HostMem: 3},
		PerDevice: device.ResourceCounts{Contexts: 3, PD: 3},
		// One uid (this process's) opens every context.
		PerUID: device.UIDLimits{Contexts: 4},
	}
	s := startServer(t, lim)
	c := open(t, s)
	pd1, err := c.AllocPD()
	require.NoError(t, err)
	_, err = c.AllocPD()
	require.NoError(t, err)
	_, err = c.AllocPD()
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client PD limit")
	// A second client may take the device's last PD, then the device is full.
	c2 := open(t, s)
	_, err = c2.AllocPD()
	require.NoError(t, err)
	_, err = c2.AllocPD()
	err2 := err
	assert.Equal(t, syscall.ENOMEM, errno(t, err2), "per-device PD limit")
	assert.Contains(t, err2.Error(), "device limit of 3 PDs")

	buf, err := c.Alloc(4096, 4096)
	require.NoError(t, err)
	_, err = pd1.RegMR(buf, 0)
	require.NoError(t, err)
	_, err = pd1.RegMR(buf, 0)
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client MR limit")

	cq1, err := c.CreateCQ(2, nil)
	require.NoError(t, err)
	_, err = c.CreateCQ(2, nil)
	require.NoError(t, err)
	_, err = c.CreateCQ(2, nil)
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client CQ limit")
	_, err = pd1.CreateQP(verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: cq1, RecvCQ: cq1, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	require.NoError(t, err)
	_, err = pd1.CreateQP(verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: cq1, RecvCQ: cq1, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client QP limit")
	_, err = pd1.CreateSRQ(2, 1, 0)
	require.NoError(t, err)
	_, err = pd1.CreateSRQ(2, 1, 0)
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client SRQ limit")
	_, err = pd1.CreateAH(testAV())
	require.NoError(t, err)
	_, err = pd1.CreateAH(testAV())
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client AH limit")
	_, err = c.AddHostMem(4096)
	require.NoError(t, err)
	_, err = c.AddHostMem(4096)
	require.NoError(t, err)
	_, err = c.AddHostMem(4096)
	assert.Equal(t, syscall.EAGAIN, errno(t, err), "per-client host memory limit")

	// Contexts: the third fits, the fourth is refused.
	open(t, s)
	_, err = verbs.Open(s.SocketPath)
	assert.Equal(t, syscall.ENOMEM, errno(t, err), "device context limit")

	// Closing a client frees its share.
	require.NoError(t, c2.Close())
	require.Eventually(t, func() bool { return s.Device.Counts().Contexts == 2 }, timeout, tick)
	c4, err := verbs.Open(s.SocketPath)
	require.NoError(t, err)
	_, err = c4.AllocPD()
	assert.NoError(t, err)
	c4.Close()
}
