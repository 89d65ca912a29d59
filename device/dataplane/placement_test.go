package dataplane_test

import (
	"bytes"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// TestVerbsAtomicWriteFlushTraffic: the IBTA 1.5 Memory Placement
// Extensions through the Go client between two devices. ATOMIC WRITE
// stores exactly its 8 bytes (the neighbours untouched) and completes
// ATOMIC_WRITE; FLUSH of a range and of a whole MR after WRITEs completes
// FLUSH with the data in place; the IBTA's error cases complete with the
// status it names: ATOMIC WRITE without remote write access and FLUSH
// without flush access REM_ACCESS_ERR, a misaligned ATOMIC WRITE
// REM_INV_REQ_ERR; and FlushWR refuses what ibv_wr_flush refuses.
func TestVerbsAtomicWriteFlushTraffic(t *testing.T) {
	a, b := rcClients(t, "10.0.7.9", "10.0.7.10", 16)
	qa := a.qp.QPN
	dev, err := a.ctx.QueryDeviceEx()
	require.NoError(t, err)
	require.NotZero(t, dev.DeviceCapFlagsEx&verbs.DeviceCapExAtomicWrite, "ATOMIC_WRITE reported")
	require.NotZero(t, dev.DeviceCapFlagsEx&verbs.DeviceCapExFlushGlobal, "FLUSH_GLOBAL reported")
	assert.Zero(t, dev.DeviceCapFlagsEx&verbs.DeviceCapExFlushPersistent, "no persistence domain")

	// ATOMIC WRITE: 8 bytes at b+8192.
	val := [8]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88}
	wr := verbs.AtomicWriteWR(1, abi.SendSignaled, b.mr.Addr+8192, b.mr.RKey, val)
	require.NoError(t, a.qp.PostSend(&wr))
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCAtomicWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, val[:], b.buf.Bytes[8192:8200])
	assert.Equal(t, make([]byte, 64), b.buf.Bytes[8128:8192], "before it untouched")
	assert.Equal(t, make([]byte, 64), b.buf.Bytes[8200:8264], "after it untouched")

	// WRITEs, then FLUSH of their range, then of the whole MR.
	pat := bytes.Repeat([]byte{0xa5, 0x5a, 0x3c}, 1000)
	copy(a.buf.Bytes[0:], pat)
	require.NoError(t, a.qp.PostSend(writeWR(2, abi.WRRDMAWrite, a.mr.SGE(0, uint32(len(pat))), b.mr.Addr+4096, b.mr.RKey)))
	fl, err := verbs.FlushWR(3, abi.SendSignaled, b.mr.Addr+4096, b.mr.RKey, uint64(len(pat)), abi.FlushGlobal, abi.FlushRange)
	require.NoError(t, err)
	require.NoError(t, a.qp.PostSend(&fl))
	flMR, err := verbs.FlushWR(4, abi.SendSignaled, 0, b.mr.RKey, 0, abi.FlushGlobal, abi.FlushMR)
	require.NoError(t, err)
	require.NoError(t, a.qp.PostSend(&flMR))
	got := pollN(t, a.scq, 3)
	assert.Equal(t, []abi.CQE{
		{WrID: 2, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa},
		{WrID: 3, Status: abi.WCSuccess, Opcode: abi.WCFlush, QPNum: qa},
		{WrID: 4, Status: abi.WCSuccess, Opcode: abi.WCFlush, QPNum: qa},
	}, got)
	assert.Equal(t, pat, b.buf.Bytes[4096:4096+len(pat)], "the flushed WRITE's data in place")

	// The error cases, each on a freshly connected pair (an error
	// completion moves the QPs to ERR).
	noRW, err := b.pd.RegMR(b.buf, abi.AccessLocalWrite|abi.AccessRemoteRead|abi.AccessFlushGlobal)
	require.NoError(t, err)
	noFlush, err := b.pd.RegMR(b.buf, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		wr   func() verbs.SendWR
		want abi.CQE
	}{
		{"atomic write without remote write", func() verbs.SendWR {
			return verbs.AtomicWriteWR(10, abi.SendSignaled, noRW.Addr, noRW.RKey, val)
		}, abi.CQE{WrID: 10, Status: abi.WCRemAccessErr, Opcode: abi.WCAtomicWrite, QPNum: qa, VendorErr: 1}},
		{"misaligned atomic write", func() verbs.SendWR {
			return verbs.AtomicWriteWR(11, abi.SendSignaled, b.mr.Addr+8193, b.mr.RKey, val)
		}, abi.CQE{WrID: 11, Status: abi.WCRemInvReqErr, Opcode: abi.WCAtomicWrite, QPNum: qa, VendorErr: 1}},
		{"flush without flush access", func() verbs.SendWR {
			w, err := verbs.FlushWR(12, abi.SendSignaled, noFlush.Addr, noFlush.RKey, 64, abi.FlushGlobal, abi.FlushRange)
			require.NoError(t, err)
			return w
		}, abi.CQE{WrID: 12, Status: abi.WCRemAccessErr, Opcode: abi.WCFlush, QPNum: qa, VendorErr: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := append([]byte(nil), b.buf.Bytes[8192:8208]...)
			w := c.wr()
			require.NoError(t, a.qp.PostSend(&w))
			assert.Equal(t, c.want, pollN(t, a.scq, 1)[0])
			assert.Equal(t, before, b.buf.Bytes[8192:8208], "nothing stored")
			reconnectRC(t, a, b)
		})
	}

	// What ibv_wr_flush refuses, FlushWR refuses, before any post.
	for _, bad := range []struct {
		placement, level uint8
		length           uint64
	}{{0, abi.FlushRange, 8}, {1 << 3, abi.FlushRange, 8}, {abi.FlushGlobal, 2, 8}, {abi.FlushGlobal, abi.FlushRange, abi.MaxMsgBytes + 1}} {
		_, err := verbs.FlushWR(20, 0, 0, 0, bad.length, bad.placement, bad.level)
		assert.ErrorIs(t, err, syscall.EINVAL, "%+v", bad)
	}
}
