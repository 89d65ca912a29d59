package dataplane_test

import (
	"context"
	"encoding/binary"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// The ABI 1.4 memory and CQ features through the Go client (verbs), with
// RC traffic between two devices: rereg MR, device memory, resize CQ and
// completion timestamps.

// reconnectRC brings a and b back to RTS after an error completion: RESET,
// then connected again.
func reconnectRC(t testing.TB, a, b *dpClient) {
	t.Helper()
	for _, c := range []*dpClient{a, b} {
		require.NoError(t, c.qp.Modify(&abi.QPAttr{QPState: abi.QPSReset}, abi.QPAttrState))
	}
	connectRC(t, a, b, abi.MTU1024)
}

// writeWR is a signaled RDMA WRITE (or READ, op) of sge to raddr/rkey.
func writeWR(id uint64, op abi.WROpcode, sge abi.SGE, raddr uint64, rkey uint32) *verbs.SendWR {
	return &verbs.SendWR{WrID: id, Opcode: op, Flags: abi.SendSignaled, SGL: []abi.SGE{sge}, RemoteAddr: raddr, RKey: rkey}
}

// remAccessErr is the send completion of a WRITE the responder refused
// (NAK remote access error).
func remAccessErr(id uint64, qpn uint32) abi.CQE {
	return abi.CQE{WrID: id, Status: abi.WCRemAccessErr, Opcode: abi.WCRDMAWrite, QPNum: qpn, VendorErr: 1}
}

// TestVerbsReregMRTraffic: after each kind of re-registration a WRITE
// lands where the MR now points, every byte checked on both the new and
// the old range; the old translation, the access taken away and another
// PD are refused with REM_ACCESS_ERR, the old bytes untouched.
func TestVerbsReregMRTraffic(t *testing.T) {
	a, b := rcClients(t, "10.0.7.1", "10.0.7.2", 16)
	qa := a.qp.QPN
	const n = 6000 // two pages, not page aligned
	b1, err := b.ctx.Alloc(n, 4096)
	require.NoError(t, err)
	b2, err := b.ctx.Alloc(n+64, 4096)
	require.NoError(t, err)
	mr, err := b.pd.RegMR(b1, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	require.NoError(t, err)
	lkey, rkey := mr.LKey, mr.RKey
	src := a.buf.Bytes[:n]

	fillRand(src, 1)
	require.NoError(t, a.qp.PostSend(writeWR(1, abi.WRRDMAWrite, a.mr.SGE(0, n), b1.Addr(), rkey)))
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	require.Equal(t, src, b1.Bytes)
	old := append([]byte(nil), b1.Bytes...)

	// CHANGE_TRANSLATION to b2 at b2's address + 8 (a 64-byte aligned
	// buffer: +8 keeps the page offset of a sub-range).
	sub := &verbs.Buffer{Bytes: b2.Bytes[8 : 8+n], PA: b2.PA + 8}
	require.NoError(t, mr.Rereg(abi.ReregChangeTranslation, nil, sub, 0))
	assert.Equal(t, sub.Addr(), mr.Addr)
	assert.Equal(t, uint64(n), mr.Length)
	assert.Equal(t, lkey, mr.LKey, "keys kept")
	assert.Equal(t, rkey, mr.RKey, "keys kept")
	fillRand(src, 2)
	require.NoError(t, a.qp.PostSend(writeWR(2, abi.WRRDMAWrite, a.mr.SGE(0, n), mr.Addr, rkey)))
	assert.Equal(t, abi.CQE{WrID: 2, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, src, b2.Bytes[8:8+n], "the WRITE lands in the new range")
	assert.Zero(t, sum8(b2.Bytes[:8]), "nothing before the new range")
	assert.Zero(t, sum8(b2.Bytes[8+n:]), "nothing past the new range")
	assert.Equal(t, old, b1.Bytes, "the old range keeps its bytes")

	// The old translation is refused.
	require.NoError(t, a.qp.PostSend(writeWR(3, abi.WRRDMAWrite, a.mr.SGE(0, 16), b1.Addr(), rkey)))
	assert.Equal(t, remAccessErr(3, qa), pollN(t, a.scq, 1)[0])
	assert.Equal(t, old, b1.Bytes, "the refused WRITE wrote nothing")
	reconnectRC(t, a, b)

	// CHANGE_ACCESS: remote write taken away, then remote read given.
	require.NoError(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite))
	want := append([]byte(nil), b2.Bytes...)
	require.NoError(t, a.qp.PostSend(writeWR(4, abi.WRRDMAWrite, a.mr.SGE(0, 16), mr.Addr, rkey)))
	assert.Equal(t, remAccessErr(4, qa), pollN(t, a.scq, 1)[0])
	assert.Equal(t, want, b2.Bytes, "the refused WRITE wrote nothing")
	reconnectRC(t, a, b)
	require.NoError(t, mr.Rereg(abi.ReregChangeAccess, nil, nil, abi.AccessLocalWrite|abi.AccessRemoteRead))
	dst := a.buf.Bytes[8192 : 8192+n]
	clear(dst)
	require.NoError(t, a.qp.PostSend(writeWR(5, abi.WRRDMARead, a.mr.SGE(8192, n), mr.Addr, rkey)))
	assert.Equal(t, abi.CQE{WrID: 5, Status: abi.WCSuccess, Opcode: abi.WCRDMARead, QPNum: qa, ByteLen: n}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, b2.Bytes[8:8+n], dst)

	// CHANGE_PD: the QP's PD no longer matches; back again, it does.
	pd2, err := b.ctx.AllocPD()
	require.NoError(t, err)
	require.NoError(t, mr.Rereg(abi.ReregChangeAccess|abi.ReregChangePD, pd2, nil, abi.AccessLocalWrite|abi.AccessRemoteWrite))
	require.NoError(t, a.qp.PostSend(writeWR(6, abi.WRRDMAWrite, a.mr.SGE(0, 16), mr.Addr, rkey)))
	assert.Equal(t, remAccessErr(6, qa), pollN(t, a.scq, 1)[0])
	assert.Equal(t, want, b2.Bytes)
	reconnectRC(t, a, b)
	assert.ErrorIs(t, pd2.Dealloc(), syscall.EBUSY, "the MR is in pd2")
	require.NoError(t, mr.Rereg(abi.ReregChangePD, b.pd, nil, 0))
	require.NoError(t, pd2.Dealloc())

	// All three at once, to a range of more than 64 pages (its page list
	// travels in host memory, pbl_pa).
	big, err := b.ctx.Alloc(300<<10, 4096)
	require.NoError(t, err)
	require.NoError(t, mr.Rereg(abi.ReregAll, b.pd, big, abi.AccessLocalWrite|abi.AccessRemoteWrite))
	assert.Equal(t, big.Addr(), mr.Addr)
	assert.Equal(t, uint64(300<<10), mr.Length)
	bigSrc := a.buf.Bytes[:300<<10]
	fillRand(bigSrc, 7)
	require.NoError(t, a.qp.PostSend(writeWR(7, abi.WRRDMAWrite, a.mr.SGE(0, 300<<10), mr.Addr, rkey)))
	assert.Equal(t, abi.CQE{WrID: 7, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, bigSrc, big.Bytes)
	require.NoError(t, mr.Dereg())
	noMore(t, a.scq, a.rcq, b.scq, b.rcq)
}

// TestVerbsDMTraffic: device memory as the target of RDMA WRITEs and the
// source of a READ and of a WRITE, read back with CopyFrom; a WRITE past
// the DM MR refused.
func TestVerbsDMTraffic(t *testing.T) {
	a, b := rcClients(t, "10.0.7.3", "10.0.7.4", 16)
	qa := a.qp.QPN
	const n = 8192
	db, err := b.ctx.AllocDM(n)
	require.NoError(t, err)
	mb, err := b.pd.RegDMMR(db, 0, n, abi.DMMRZeroBased|abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	assert.Zero(t, mb.Addr, "zero-based")

	// a's host memory → b's DM, at offsets.
	src := a.buf.Bytes[:n]
	fillRand(src, 11)
	require.NoError(t, a.qp.PostSend(writeWR(1, abi.WRRDMAWrite, a.mr.SGE(0, 3000), 1024, mb.RKey)))
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	got := make([]byte, n)
	require.NoError(t, db.CopyFrom(0, got))
	assert.Zero(t, sum8(got[:1024]), "before the WRITE")
	assert.Equal(t, src[:3000], got[1024:4024])
	assert.Zero(t, sum8(got[4024:]), "after the WRITE")

	// b's DM → a's host memory (READ).
	pat := make([]byte, n)
	fillRand(pat, 12)
	require.NoError(t, db.CopyTo(0, pat))
	dst := a.buf.Bytes[16384 : 16384+n]
	clear(dst)
	require.NoError(t, a.qp.PostSend(writeWR(2, abi.WRRDMARead, a.mr.SGE(16384, n), 0, mb.RKey)))
	assert.Equal(t, abi.CQE{WrID: 2, Status: abi.WCSuccess, Opcode: abi.WCRDMARead, QPNum: qa, ByteLen: n}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, pat, dst)

	// a's DM (an MR at an offset of it) → b's DM.
	da, err := a.ctx.AllocDM(n)
	require.NoError(t, err)
	apat := make([]byte, n)
	fillRand(apat, 13)
	require.NoError(t, da.CopyTo(0, apat))
	ma, err := a.pd.RegDMMR(da, 4096, 4096, abi.DMMRZeroBased|abi.AccessLocalWrite)
	require.NoError(t, err)
	require.NoError(t, a.qp.PostSend(writeWR(3, abi.WRRDMAWrite, abi.SGE{Addr: 100, Length: 512, LKey: ma.LKey}, 6000, mb.RKey)))
	assert.Equal(t, abi.CQE{WrID: 3, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
	require.NoError(t, db.CopyFrom(0, got))
	assert.Equal(t, pat[:6000], got[:6000])
	assert.Equal(t, apat[4096+100:4096+100+512], got[6000:6512], "from the DM MR's address 100, DM byte 4196")
	assert.Equal(t, pat[6512:], got[6512:])

	// Past the end of the remote DM MR: refused, nothing written.
	require.NoError(t, a.qp.PostSend(writeWR(4, abi.WRRDMAWrite, a.mr.SGE(0, 8), n-4, mb.RKey)))
	assert.Equal(t, remAccessErr(4, qa), pollN(t, a.scq, 1)[0])
	require.NoError(t, db.CopyFrom(0, got))
	assert.Equal(t, pat[:6000], got[:6000])
	assert.Equal(t, pat[6512:], got[6512:])

	assert.ErrorIs(t, db.Free(), syscall.EBUSY, "an MR is on it")
	require.NoError(t, mb.Dereg())
	require.NoError(t, ma.Dereg())
	require.NoError(t, db.Free())
	require.NoError(t, da.Free())
	assert.Zero(t, a.node.dev.DMInUse())
	assert.Zero(t, b.node.dev.DMInUse())
}

// completeUnpolled posts a signaled 64-byte WRITE and waits for its
// completion through the completion channel, without polling: the CQE is
// then in the CQ, not yet consumed.
func completeUnpolled(t testing.TB, a *dpClient, cq *verbs.CQ, id uint64, raddr uint64, rkey uint32) {
	t.Helper()
	require.NoError(t, cq.ReqNotify(false))
	require.NoError(t, a.qp.PostSend(writeWR(id, abi.WRRDMAWrite, a.mr.SGE(0, 64), raddr, rkey)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := a.ch.Wait(ctx)
	require.NoError(t, err)
}

// TestVerbsResizeCQTraffic: completions written before a resize are
// polled in order after it, across a grow and a shrink; a shrink below
// them is refused with EINVAL (as rxe); the shrunk CQ wraps several
// times and keeps its order and fields.
func TestVerbsResizeCQTraffic(t *testing.T) {
	a, b := rcClients(t, "10.0.7.5", "10.0.7.6", 4)
	qa := a.qp.QPN
	fillRand(a.buf.Bytes[:64], 21)
	raddr := func(i uint64) uint64 { return b.mr.Addr + 4096 + 64*(i%8) }
	require.Equal(t, 4, a.scq.Len())
	for i := range uint64(3) {
		completeUnpolled(t, a, a.scq, 100+i, raddr(i), b.mr.RKey)
	}
	assert.ErrorIs(t, a.scq.Resize(2), syscall.EINVAL, "2 entries, 3 outstanding")
	assert.Equal(t, 4, a.scq.Len(), "a refused resize keeps the ring")
	require.NoError(t, a.scq.Resize(16))
	assert.Equal(t, 16, a.scq.Len())
	completeUnpolled(t, a, a.scq, 103, raddr(3), b.mr.RKey)
	assert.ErrorIs(t, a.scq.Resize(2), syscall.EINVAL, "2 entries, 4 outstanding")
	require.NoError(t, a.scq.Resize(4))
	assert.Equal(t, 4, a.scq.Len())
	assert.ErrorIs(t, a.scq.Resize(1), syscall.EINVAL)
	got := pollN(t, a.scq, 4)
	for i, e := range got {
		assert.Equal(t, abi.CQE{WrID: 100 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, e, "completion %d", i)
	}
	noMore(t, a.scq)
	require.NoError(t, a.scq.Resize(1))
	assert.Equal(t, 2, a.scq.Len())
	for i := range uint64(7) { // three and a half passes over 2 slots
		clear(b.buf.Bytes[raddr(i)-b.mr.Addr:][:64])
		require.NoError(t, a.qp.PostSend(writeWR(200+i, abi.WRRDMAWrite, a.mr.SGE(0, 64), raddr(i), b.mr.RKey)))
		assert.Equal(t, abi.CQE{WrID: 200 + i, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, pollN(t, a.scq, 1)[0])
		assert.Equal(t, a.buf.Bytes[:64], b.buf.Bytes[raddr(i)-b.mr.Addr:][:64])
	}
	// Two outstanding on the 2-entry ring, then grown: still in order.
	completeUnpolled(t, a, a.scq, 300, raddr(0), b.mr.RKey)
	completeUnpolled(t, a, a.scq, 301, raddr(1), b.mr.RKey)
	require.NoError(t, a.scq.Resize(8))
	got = pollN(t, a.scq, 2)
	assert.Equal(t, uint64(300), got[0].WrID)
	assert.Equal(t, uint64(301), got[1].WrID)
	assert.False(t, a.scq.Overflowed())
	noMore(t, a.scq, a.rcq, b.scq, b.rcq)
}

// tsPair is a second RC connection between a and b whose CQs carry
// completion timestamps.
type tsPair struct {
	cqA, cqB *verbs.CQ
	qpA, qpB *verbs.QP
}

func newTSPair(t testing.TB, a, b *dpClient, cqe int) tsPair {
	t.Helper()
	var p tsPair
	var err error
	p.cqA, err = a.ctx.CreateCQWithTimestamps(cqe, a.ch)
	require.NoError(t, err)
	p.cqB, err = b.ctx.CreateCQWithTimestamps(cqe, b.ch)
	require.NoError(t, err)
	require.True(t, p.cqA.Timestamps())
	cp := abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	p.qpA, err = a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: p.cqA, RecvCQ: p.cqA, Cap: cp})
	require.NoError(t, err)
	p.qpB, err = b.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: p.cqB, RecvCQ: p.cqB, Cap: cp})
	require.NoError(t, err)
	connectQPs(t, p.qpA, a.node.gid, p.qpB, b.node.gid, abi.MTU1024)
	return p
}

// pollTS polls n completions of cq with their timestamps.
func pollTS(t testing.TB, cq *verbs.CQ, n int) ([]abi.CQE, []uint64) {
	t.Helper()
	wc, ts := make([]abi.CQE, n), make([]uint64, n)
	got := 0
	deadline := time.Now().Add(20 * time.Second)
	for got < n && time.Now().Before(deadline) {
		k := cq.PollTS(wc[got:], ts[got:])
		if k == 0 {
			time.Sleep(50 * time.Microsecond)
		}
		got += k
	}
	require.Equal(t, n, got, "completions before the deadline")
	for i := range wc {
		wc[i].Owner = 0
	}
	return wc, ts
}

// TestVerbsCompletionTimestamps: every completion of a timestamped CQ
// carries the CLOCK_REALTIME nanoseconds of its generation, between the
// clock readings around the exchange (QueryRTValues), non-decreasing
// within the CQ, the receive's before the send's (whose completion waits
// for the receiver's ACK); they survive a resize; a CQ without the flag
// reports none.
func TestVerbsCompletionTimestamps(t *testing.T) {
	a, b := twoClients(t, "10.0.7.7", "10.0.7.8", 4)
	p := newTSPair(t, a, b, 8)

	x, err := a.ctx.QueryDeviceEx()
	require.NoError(t, err)
	assert.Equal(t, ^uint64(0), x.CompletionTimestampMask)
	assert.Equal(t, uint64(verbs.HCACoreClockKHz), x.HCACoreClock)

	const sends = 5
	before, err := a.ctx.QueryRTValues()
	require.NoError(t, err)
	for i := range uint64(sends) {
		binary.LittleEndian.PutUint64(a.buf.Bytes[8*i:], 0x5e0d0000+i)
		require.NoError(t, p.qpB.PostRecv(&verbs.RecvWR{WrID: 10 + i, SGL: []abi.SGE{b.mr.SGE(uint32(8*i), 8)}}))
		require.NoError(t, p.qpA.PostSend(&verbs.SendWR{WrID: 20 + i, Opcode: abi.WRSend, Flags: abi.SendSignaled,
			SGL: []abi.SGE{a.mr.SGE(uint32(8*i), 8)}}))
	}
	sw, sts := pollTS(t, p.cqA, sends)
	rw, rts := pollTS(t, p.cqB, sends)
	after, err := a.ctx.QueryRTValues()
	require.NoError(t, err)
	for i := range sends {
		assert.Equal(t, abi.CQE{WrID: 20 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: p.qpA.QPN}, sw[i])
		assert.Equal(t, abi.CQE{WrID: 10 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: p.qpB.QPN, ByteLen: 8}, rw[i])
		assert.Equal(t, uint64(0x5e0d0000+i), binary.LittleEndian.Uint64(b.buf.Bytes[8*i:]))
		for _, ts := range []uint64{sts[i], rts[i]} {
			assert.GreaterOrEqual(t, ts, before, "completion %d", i)
			assert.LessOrEqual(t, ts, after, "completion %d", i)
		}
		assert.LessOrEqual(t, rts[i], sts[i], "the receive of SEND %d completed before its send", i)
		if i > 0 {
			assert.GreaterOrEqual(t, sts[i], sts[i-1], "send completions in time order")
			assert.GreaterOrEqual(t, rts[i], rts[i-1], "receive completions in time order")
		}
	}

	// Two completions not yet polled survive a resize with their
	// timestamps, and the resized CQ still has them.
	before, err = a.ctx.QueryRTValues()
	require.NoError(t, err)
	for i := range uint64(2) {
		require.NoError(t, p.cqA.ReqNotify(false))
		require.NoError(t, p.qpA.PostSend(writeWR(30+i, abi.WRRDMAWrite, a.mr.SGE(0, 8), b.mr.Addr+64, b.mr.RKey)))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := a.ch.Wait(ctx)
		cancel()
		require.NoError(t, err)
	}
	after, err = a.ctx.QueryRTValues()
	require.NoError(t, err)
	require.NoError(t, p.cqA.Resize(32))
	require.True(t, p.cqA.Timestamps())
	wc, ts := pollTS(t, p.cqA, 2)
	for i := range 2 {
		assert.Equal(t, abi.CQE{WrID: 30 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: p.qpA.QPN}, wc[i])
		assert.GreaterOrEqual(t, ts[i], before)
		assert.LessOrEqual(t, ts[i], after)
	}
	assert.LessOrEqual(t, ts[0], ts[1])

	// A CQ without timestamps: PollTS gives 0.
	require.False(t, a.scq.Timestamps())
	require.NoError(t, a.qp.ToInit(abi.AccessAll, 0)) // a's first QP is not connected: use it only to see a flush
	require.NoError(t, a.qp.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 40, Opcode: abi.WRSend, Flags: abi.SendSignaled}))
	wc, ts = pollTS(t, a.scq, 1)
	assert.Equal(t, abi.CQE{WrID: 40, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qp.QPN}, wc[0])
	assert.Zero(t, ts[0])
}

// twoClients starts two single-worker devices at addresses ipA and ipB on
// one in-memory network, each with a client whose CQs have cqe entries.
func twoClients(t *testing.T, ipA, ipB string, cqe int) (a, b *dpClient) {
	t.Helper()
	nw := newDPNetwork(t)
	a = newDPClient(t, newDPNode(t, nw, ipA, 1, nil), cqe)
	b = newDPClient(t, newDPNode(t, nw, ipB, 1, nil), cqe)
	return a, b
}

// rcClients is twoClients with the clients' QPs connected (RC, MTU 1024).
func rcClients(t *testing.T, ipA, ipB string, cqe int) (a, b *dpClient) {
	t.Helper()
	a, b = twoClients(t, ipA, ipB, cqe)
	connectRC(t, a, b, abi.MTU1024)
	return a, b
}
