package dataplane_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

// newDPQP creates a QP of type typ beside c's RC QP (same PD and CQs).
func newDPQP(t testing.TB, c *dpClient, typ abi.QPType) *verbs.QP {
	t.Helper()
	qp, err := c.pd.CreateQP(verbs.QPInitAttr{Type: typ, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 128}})
	require.NoError(t, err)
	return qp
}

// dpTwoQPs starts two devices on one in-memory network, a client on each
// and a QP of type typ per client.
func dpTwoQPs(t testing.TB, typ abi.QPType) (na, nb *dpNode, a, b *dpClient, qa, qb *verbs.QP) {
	t.Helper()
	nw := newDPNetwork(t)
	na = newDPNode(t, nw, "10.9.0.1", 2, nil)
	nb = newDPNode(t, nw, "10.9.0.2", 2, nil)
	a, b = newDPClient(t, na, 256), newDPClient(t, nb, 256)
	return na, nb, a, b, newDPQP(t, a, typ), newDPQP(t, b, typ)
}

// udUp brings a UD QP to RTS with Q_Key qkey.
func udUp(t testing.TB, qp *verbs.QP, qkey uint32) {
	t.Helper()
	require.NoError(t, qp.ToInit(0, qkey))
	require.NoError(t, qp.ToRTR(verbs.RTRAttr{}))
	require.NoError(t, qp.ToRTS(verbs.RTSAttr{SQPSN: 0x123}))
}

// TestDataPlaneUD sends UD datagrams between two devices through real
// rings, an AH made with CREATE_AH and the receivers' buffers: the GRH
// (20 zero bytes and the IPv4 header, checksum valid), the payload, the
// completion fields, a Q_Key violation and a datagram without a receive
// WR (both dropped and counted), a message longer than the port's MTU
// (LOC_LEN_ERR, the QP in SQE until it is moved back to RTS).
func TestDataPlaneUD(t *testing.T) {
	_, nb, a, b, qa, qb := dpTwoQPs(t, abi.QPTUD)
	udUp(t, qa, 0x1111)
	udUp(t, qb, 0x2222)
	ah, err := a.pd.CreateAH(abi.AHAttr{DGID: nb.gid, PortNum: 1})
	require.NoError(t, err)
	fillRand(a.buf.Bytes[:8192], 3)

	const slot = 8192
	for i := range 3 {
		require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: uint64(10 + i), SGL: []abi.SGE{b.mr.SGE(uint32(i*slot), slot)}}))
	}
	sizes := []int{4096, 7, 0}
	for i, n := range sizes {
		wr := &verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah, RemoteQPN: qb.QPN,
			RemoteQKey: 0x2222, SGL: []abi.SGE{a.mr.SGE(uint32(i*100), uint32(n))}}
		if i == 1 {
			wr.Opcode, wr.ImmData = abi.WRSendWithImm, 0x01020304
		}
		require.NoError(t, qa.PostSend(wr))
	}
	for _, c := range pollN(t, a.scq, 3) {
		assert.Equal(t, abi.WCSuccess, c.Status)
		assert.Equal(t, qa.QPN, c.QPNum)
	}
	got := pollN(t, b.rcq, 3)
	for i, c := range got {
		n := sizes[i]
		assert.Equal(t, abi.WCSuccess, c.Status)
		assert.Equal(t, uint64(10+i), c.WrID)
		assert.Equal(t, abi.WCRecv, c.Opcode)
		assert.Equal(t, uint32(abi.GRHLen+n), c.ByteLen)
		assert.Equal(t, qa.QPN, c.SrcQP)
		assert.Equal(t, qb.QPN, c.QPNum)
		wantFlags := abi.WCGRH
		if i == 1 {
			wantFlags |= abi.WCWithImm
			assert.Equal(t, uint32(0x01020304), c.ImmOrInv)
		}
		assert.Equal(t, wantFlags, c.WCFlags)
		assert.Equal(t, uint8(0xa), c.SL, "SL: RoCE v2 over IPv4")
		buf := b.buf.Bytes[i*slot:]
		assert.Equal(t, make([]byte, 20), buf[:20], "GRH: 20 zero bytes before the IPv4 header")
		ip := roce.IPv4(buf[20:40])
		assert.Equal(t, uint8(0x45), buf[20])
		assert.Equal(t, netip.MustParseAddr("10.9.0.1"), ip.Src())
		assert.Equal(t, netip.MustParseAddr("10.9.0.2"), ip.Dst())
		assert.Equal(t, uint16(0), roce.Checksum(buf[20:40]), "the IPv4 header checksum verifies")
		assert.Equal(t, a.buf.Bytes[i*100:i*100+n], buf[abi.GRHLen:abi.GRHLen+n])
	}

	// Q_Key violation and no receive WR: dropped, counted, the sends
	// complete anyway.
	before := nb.dev.DataPathTotals()
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 20, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x2223, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 21, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x2222, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	for _, c := range pollN(t, a.scq, 2) {
		assert.Equal(t, abi.WCSuccess, c.Status)
	}
	require.Eventually(t, func() bool {
		d := nb.dev.DataPathTotals()
		return d.QKeyViolations == before.QKeyViolations+1 && d.NoRecvWQE == before.NoRecvWQE+1
	}, waitLong, pollEvery)
	noMore(t, b.rcq)

	// Longer than the port's MTU (4096): LOC_LEN_ERR, SQE, flushed, back
	// to RTS.
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 30, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x2222, SGL: []abi.SGE{a.mr.SGE(0, 4097)}}))
	c := pollN(t, a.scq, 1)[0]
	assert.Equal(t, abi.WCLocLenErr, c.Status)
	requireState(t, qa, abi.QPSSQE, "a UD send error moves the QP to SQE")
	require.NoError(t, qa.Modify(&abi.QPAttr{QPState: abi.QPSRTS, CurQPState: abi.QPSSQE}, abi.QPAttrState|abi.QPAttrCurState))
	require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: 40, SGL: []abi.SGE{b.mr.SGE(0, slot)}}))
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 31, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x8000_0000 | 5, SGL: []abi.SGE{a.mr.SGE(0, 16)}}))
	assert.Equal(t, abi.WCSuccess, pollN(t, a.scq, 1)[0].Status)
	// Bit 31: qa's own Q_Key (0x1111), not qb's: dropped.
	require.Eventually(t, func() bool { return nb.dev.DataPathTotals().QKeyViolations == before.QKeyViolations+2 }, waitLong, pollEvery)

	// DESTROY_AH: a later WR naming it fails.
	require.NoError(t, ah.Destroy())
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 32, Opcode: abi.WRSend, Flags: abi.SendSignaled, AH: ah,
		RemoteQPN: qb.QPN, RemoteQKey: 0x2222, SGL: []abi.SGE{a.mr.SGE(0, 16)}}))
	assert.Equal(t, abi.WCLocQPOpErr, pollN(t, a.scq, 1)[0].Status)
}

// TestDataPlaneUDResolve: on a TAP device CREATE_AH resolves the
// destination and fails with EHOSTUNREACH when nobody answers; a UD QP
// needs no peer to reach RTS.
func TestDataPlaneUDResolve(t *testing.T) {
	good, bad := netip.MustParseAddr("10.77.0.2"), netip.MustParseAddr("10.77.0.9")
	rl := &resolveLog{unreachable: bad}
	n := newResolveNode(t, "10.77.0.1", rl.resolve)
	c := newDPClient(t, n, 64)
	qp := newDPQP(t, c, abi.QPTUD)
	udUp(t, qp, 1)
	assert.Empty(t, rl.snapshot(), "a UD QP resolves nothing on its way to RTS")
	_, err := c.pd.CreateAH(abi.AHAttr{DGID: good.As16(), PortNum: 1})
	require.NoError(t, err)
	_, err = c.pd.CreateAH(abi.AHAttr{DGID: bad.As16(), PortNum: 1})
	require.ErrorIs(t, err, unix.EHOSTUNREACH)
	assert.Contains(t, err.Error(), bad.String())
	assert.Equal(t, []netip.Addr{good, bad}, rl.snapshot())
}

// TestDataPlaneUC: UC SEND and RDMA WRITE with immediate between two
// devices through real rings; no ACK comes back.
func TestDataPlaneUC(t *testing.T) {
	na, nb, a, b, qa, qb := dpTwoQPs(t, abi.QPTUC)
	connectQPs(t, qa, na.gid, qb, nb.gid, abi.MTU1024)
	fillRand(a.buf.Bytes[:65536], 5)
	require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{b.mr.SGE(0, 8192)}}))
	require.NoError(t, qb.PostRecv(&verbs.RecvWR{WrID: 2, SGL: []abi.SGE{b.mr.SGE(0, 1)}}))
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 5000)}}))
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 2, Opcode: abi.WRRDMAWriteWithImm, Flags: abi.SendSignaled, ImmData: 9,
		RemoteAddr: b.mr.Addr + 16384, RKey: b.mr.RKey, SGL: []abi.SGE{a.mr.SGE(8192, 30000)}}))
	for i, c := range pollN(t, a.scq, 2) {
		assert.Equal(t, abi.WCSuccess, c.Status, "send %d", i)
	}
	got := pollN(t, b.rcq, 2)
	assert.Equal(t, abi.CQE{WrID: 1, ByteLen: 5000, QPNum: qb.QPN, Opcode: abi.WCRecv}, got[0])
	assert.Equal(t, abi.CQE{WrID: 2, ByteLen: 30000, QPNum: qb.QPN, Opcode: abi.WCRecvRDMAWithImm, WCFlags: abi.WCWithImm, ImmOrInv: 9}, got[1])
	assert.Equal(t, a.buf.Bytes[:5000], b.buf.Bytes[:5000])
	assert.Equal(t, a.buf.Bytes[8192:8192+30000], b.buf.Bytes[16384:16384+30000])
	// No READ on UC: the WR fails and the QP goes to SQE.
	require.NoError(t, qa.PostSend(&verbs.SendWR{WrID: 3, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
		RemoteAddr: b.mr.Addr, RKey: b.mr.RKey, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	assert.Equal(t, abi.WCLocQPOpErr, pollN(t, a.scq, 1)[0].Status)
	requireState(t, qa, abi.QPSSQE, "a UC send error moves the QP to SQE")
}

const (
	waitLong  = 20 * time.Second
	pollEvery = time.Millisecond
)
