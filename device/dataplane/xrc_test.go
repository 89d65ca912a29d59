package dataplane_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// TestVerbsXRCTraffic: XRC through the Go client between two devices. An
// initiator QP on a, connected to a target QP on b, sends to two XRC SRQs
// of b's domain by number: each SEND lands in the SRQ it names, every byte
// checked, and completes on that SRQ's CQ with the target QP's number;
// WRITE and READ go through the target QP to b's memory. A SEND naming an
// SRQ of another domain completes REM_INV_REQ_ERR and lands nowhere. The
// domain is shared through a file (O_CREATE, then O_EXCL: EEXIST; no
// O_CREATE on a new file: ENOENT), and cannot be closed while in use.
func TestVerbsXRCTraffic(t *testing.T) {
	a, b := twoClients(t, "10.0.7.11", "10.0.7.12", 16)
	f, err := os.Create(filepath.Join(t.TempDir(), "xrcd"))
	require.NoError(t, err)
	defer f.Close()
	x, err := b.ctx.OpenXRCD(f, os.O_CREATE)
	require.NoError(t, err)
	_, err = b.ctx.OpenXRCD(f, os.O_CREATE|os.O_EXCL)
	assert.ErrorIs(t, err, syscall.EEXIST)
	g, err := os.Create(filepath.Join(t.TempDir(), "none"))
	require.NoError(t, err)
	defer g.Close()
	_, err = b.ctx.OpenXRCD(g, 0)
	assert.ErrorIs(t, err, syscall.ENOENT)
	_, err = b.ctx.OpenXRCD(nil, os.O_CREATE)
	assert.ErrorIs(t, err, syscall.EINVAL)
	other, err := b.ctx.OpenXRCD(nil, 0) // a domain of b's context alone
	require.NoError(t, err)

	srqCQ, err := b.ctx.CreateCQ(16, nil)
	require.NoError(t, err)
	var srqs [2]*verbs.SRQ
	for i := range srqs {
		srqs[i], err = b.pd.CreateXRCSRQ(x, srqCQ, 8, 1, 0)
		require.NoError(t, err)
		require.NotZero(t, srqs[i].XRCNum)
		// Receives at b+64 KiB*(i+1), 4 KiB each.
		for k := range 2 {
			off := uint32(64<<10*(i+1) + 4096*k)
			require.NoError(t, srqs[i].PostRecv(&verbs.RecvWR{WrID: uint64(100*(i+1) + k), SGL: []abi.SGE{b.mr.SGE(off, 4096)}}))
		}
	}
	assert.NotEqual(t, srqs[0].XRCNum, srqs[1].XRCNum)
	foreign, err := b.pd.CreateXRCSRQ(other, srqCQ, 2, 1, 0)
	require.NoError(t, err)
	assert.ErrorIs(t, x.Close(), syscall.EBUSY, "SRQs in it")

	ini, err := a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTXRCSend, SendCQ: a.scq, Cap: abi.QPCap{MaxSendWR: 8, MaxSendSGE: 1}})
	require.NoError(t, err)
	_, err = a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTXRCSend, SendCQ: a.scq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	assert.ErrorIs(t, err, syscall.EINVAL, "an initiator has no receive queue")
	tgt, err := x.CreateTargetQP()
	require.NoError(t, err)
	connectQPs(t, ini, a.node.gid, tgt, b.node.gid, abi.MTU1024)

	// SENDs to each SRQ, by number.
	for i, s := range srqs {
		pat := bytes.Repeat([]byte{byte(0x30 + i), 0xc3}, 1500) // 3000 bytes, three packets
		copy(a.buf.Bytes[8192:], pat)
		wr := &verbs.SendWR{WrID: uint64(i + 1), Opcode: abi.WRSend, Flags: abi.SendSignaled,
			SGL: []abi.SGE{a.mr.SGE(8192, uint32(len(pat)))}, RemoteQPN: s.XRCNum}
		require.NoError(t, ini.PostSend(wr))
		assert.Equal(t, abi.CQE{WrID: uint64(i + 1), Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: ini.QPN}, pollN(t, a.scq, 1)[0])
		assert.Equal(t, abi.CQE{WrID: uint64(100 * (i + 1)), Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: tgt.QPN,
			ByteLen: uint32(len(pat))}, pollN(t, srqCQ, 1)[0], "the completion of SRQ %d, with the target QP", i)
		off := 64 << 10 * (i + 1)
		assert.Equal(t, pat, b.buf.Bytes[off:off+len(pat)])
	}

	// WRITE and READ through the target QP.
	copy(a.buf.Bytes[0:], "written through the target QP")
	require.NoError(t, ini.PostSend(&verbs.SendWR{WrID: 10, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 29)}, RemoteAddr: b.mr.Addr + 200, RKey: b.mr.RKey, RemoteQPN: srqs[0].XRCNum}))
	assert.Equal(t, abi.CQE{WrID: 10, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: ini.QPN}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, "written through the target QP", string(b.buf.Bytes[200:229]))
	require.NoError(t, ini.PostSend(&verbs.SendWR{WrID: 11, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(1000, 29)}, RemoteAddr: b.mr.Addr + 200, RKey: b.mr.RKey, RemoteQPN: srqs[0].XRCNum}))
	assert.Equal(t, abi.CQE{WrID: 11, Status: abi.WCSuccess, Opcode: abi.WCRDMARead, QPNum: ini.QPN, ByteLen: 29}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, "written through the target QP", string(a.buf.Bytes[1000:1029]))

	// An SRQ of another domain: REM_INV_REQ_ERR, nothing lands.
	require.NoError(t, foreign.PostRecv(&verbs.RecvWR{WrID: 900, SGL: []abi.SGE{b.mr.SGE(512<<10, 4096)}}))
	require.NoError(t, ini.PostSend(&verbs.SendWR{WrID: 12, Opcode: abi.WRSend, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 64)}, RemoteQPN: foreign.XRCNum}))
	assert.Equal(t, abi.CQE{WrID: 12, Status: abi.WCRemInvReqErr, Opcode: abi.WCSend, QPNum: ini.QPN, VendorErr: 1}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, make([]byte, 64), b.buf.Bytes[512<<10:512<<10+64])

	// Teardown in order; then the domain closes.
	require.NoError(t, tgt.Destroy())
	require.NoError(t, ini.Destroy())
	for _, s := range srqs {
		require.NoError(t, s.Destroy())
	}
	require.NoError(t, foreign.Destroy())
	require.NoError(t, x.Close())
	require.NoError(t, other.Close())
}
