package device_test

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

func startServer(t testing.TB, lim device.Limits) *devicetest.Server {
	t.Helper()
	s, err := devicetest.Start(devicetest.Options{Limits: lim})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func open(t testing.TB, s *devicetest.Server) *verbs.Context {
	t.Helper()
	c, err := verbs.Open(s.SocketPath, verbs.WithClientName(t.Name()))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// errno extracts the reply errno of a failed control call.
func errno(t *testing.T, err error) syscall.Errno {
	t.Helper()
	require.Error(t, err)
	var ce *abi.ControlError
	require.True(t, errors.As(err, &ce), "not a control error: %v", err)
	return ce.Errno
}

var peerGID = [16]byte{10: 0xff, 11: 0xff, 12: 127, 13: 0, 14: 0, 15: 2}

func testAV() abi.AHAttr { return abi.AHAttr{DGID: peerGID, PortNum: 1, HopLimit: 64} }

func TestQueries(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	da, err := c.QueryDevice()
	require.NoError(t, err)
	assert.Equal(t, uint32(abi.MaxQPWR), da.MaxQPWR)
	assert.Equal(t, uint32(abi.MaxSGE), da.MaxSGE)
	assert.Equal(t, uint8(1), da.PhysPortCnt)
	assert.Equal(t, uint64(1<<12|1<<21), da.PageSizeCap)
	assert.Equal(t, uint32(device.DefaultLimits.PerDevice.QP), da.MaxQP)
	assert.Contains(t, string(da.FWVer[:]), fmt.Sprintf("vrnic %d.%d", abi.VersionMajor, abi.VersionMinor))

	pa, err := c.QueryPort(1)
	require.NoError(t, err)
	assert.Equal(t, uint32(4), pa.State)
	assert.Equal(t, abi.MTU4096, pa.ActiveMTU)
	assert.Equal(t, uint32(abi.GIDTableLen), pa.GIDTblLen)
	assert.Equal(t, uint32(2), pa.LinkLayer)
	_, err = c.QueryPort(2)
	assert.Equal(t, syscall.EINVAL, errno(t, err))

	g, err := c.QueryGID(1, 0)
	require.NoError(t, err)
	assert.Equal(t, uint32(1), g.Valid)
	assert.Equal(t, uint32(2), g.GIDType)
	assert.Equal(t, byte(127), g.GID[12])
	g, err = c.QueryGID(1, 1)
	require.NoError(t, err)
	assert.Equal(t, uint32(0), g.Valid)
	_, err = c.QueryGID(1, abi.GIDTableLen)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	_, err = c.QueryGID(0, 0)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
}

func TestHostMemAndMR(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	hm, err := c.AddHostMem(1 << 20)
	require.NoError(t, err)
	assert.NotZero(t, hm.PA())
	pd, err := c.AllocPD()
	require.NoError(t, err)

	// Inline page list (3 pages) and a page list in host memory (100 pages).
	small, err := hm.Alloc(3*4096, 4096)
	require.NoError(t, err)
	mr1, err := pd.RegMR(small, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	require.NoError(t, err)
	assert.NotZero(t, mr1.LKey)
	assert.NotZero(t, mr1.RKey)
	assert.NotEqual(t, mr1.LKey, mr1.RKey, "the rkey is a key of its own")
	big, err := c.Alloc(100*4096, 4096)
	require.NoError(t, err)
	mr2, err := pd.RegMR(big, abi.AccessLocalWrite)
	require.NoError(t, err)
	assert.NotEqual(t, mr1.LKey, mr2.LKey)
	assert.NotZero(t, mr2.RKey, "every MR has an rkey, as the kernel reports")
	assert.Equal(t, 2, s.Device.Counts().MR)

	// Remote write without local write: IBTA C10-83.
	_, err = pd.RegMR(small, abi.AccessRemoteWrite)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	// Unknown access bits.
	_, err = pd.RegMR(small, 1<<7)
	assert.Equal(t, syscall.EINVAL, errno(t, err))

	// Host memory under an MR cannot go; after dereg it can.
	assert.Equal(t, syscall.EBUSY, errno(t, hm.Remove()))
	require.NoError(t, mr1.Dereg())
	assert.Equal(t, syscall.ENOENT, errno(t, mr1.Dereg()))
	require.NoError(t, hm.Remove())
	assert.Equal(t, syscall.ENOENT, errno(t, c.Destroy(abi.CmdRemoveHostMem, hm.Handle())))
	require.NoError(t, mr2.Dereg())
	require.NoError(t, pd.Dealloc())
	assert.Equal(t, syscall.ENOENT, errno(t, pd.Dealloc()))
	assert.Equal(t, device.ResourceCounts{Contexts: 1, HostMem: 1}, s.Device.Counts())
}

// TestIsolation: one client cannot name another's memory or objects.
func TestIsolation(t *testing.T) {
	s := startServer(t, device.Limits{})
	a := open(t, s)
	b := open(t, s)
	hmA, err := a.AddHostMem(1 << 20)
	require.NoError(t, err)
	pdB, err := b.AllocPD()
	require.NoError(t, err)

	// A ring in A's memory, created by B.
	rb := rawFor(t, s)
	rep := rb.call(msg(abi.CmdCreateCQ, 1, encode(t, &abi.CmdCreateCQReq{RingPA: hmA.PA(), CQECount: 4})))
	assert.Equal(t, uint32(syscall.EACCES), rep.hdr.Status, rep.errMsg())

	// An MR over A's memory, registered by B.
	bufA, err := hmA.Alloc(4096, 4096)
	require.NoError(t, err)
	_, err = pdB.RegMRAt(bufA, bufA.PA, abi.AccessLocalWrite)
	assert.Equal(t, syscall.EACCES, errno(t, err))

	// A's handles mean nothing to B.
	pdA, err := a.AllocPD()
	require.NoError(t, err)
	mrA, err := pdA.RegMR(bufA, abi.AccessLocalWrite)
	require.NoError(t, err)
	assert.Equal(t, syscall.ENOENT, errno(t, b.Destroy(abi.CmdDeregMR, mrA.Handle)))
	assert.Equal(t, syscall.ENOENT, errno(t, b.Destroy(abi.CmdRemoveHostMem, hmA.Handle())))
	if pdA.Handle != pdB.Handle {
		assert.Equal(t, syscall.ENOENT, errno(t, b.Destroy(abi.CmdDeallocPD, pdA.Handle)))
	}
}

// rawFor returns a raw connection with an open context.
func rawFor(t *testing.T, s *devicetest.Server) *rawConn {
	r := dialRaw(t, s.SocketPath)
	t.Cleanup(func() { r.c.Close() })
	r.open()
	return r
}
