package device_test

// The ABI limits through the real control socket: QUERY_DEVICE reports
// them, and a client creating resources at every limit at once gets them,
// fills them through package verbs, and the daemon's views of the rings
// (package queues over the pinned ring memory and the doorbell records,
// as the data plane builds them) decode every WQE exactly.

import (
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
	"github.com/vrnic/vrnic/verbs"
)

// limitsView is the daemon's side of a QP as an engine sees it at
// CREATE_QP.
type limitsView struct {
	cap           abi.QPCap
	sq            []byte
	sqBlocks      uint32
	rq            []byte
	rqSize        uint32
	page          *doorbell.Page
	rec           uint32
	cq            []byte
	cqN, cqRec    uint32
	hasSRQ        bool
	srq           []byte
	srqN, srqSize uint32
	srqRec        uint32
}

// limitsEngine records the daemon's view of every QP created.
type limitsEngine struct {
	devicetest.NopDataPlane
	mu    sync.Mutex
	views map[uint32]limitsView
}

func (e *limitsEngine) CreateQP(q *device.QP) error {
	v := limitsView{cap: q.Cap(), rec: q.DBIndex()}
	v.sq, v.sqBlocks = q.SQ()
	v.rq, v.rqSize = q.RQ()
	v.page = q.Doorbells()
	v.cq, v.cqN = q.SendCQ().Ring()
	v.cqRec = q.SendCQ().DBIndex()
	if s := q.SRQ(); s != nil {
		v.hasSRQ = true
		v.srq, v.srqN, v.srqSize = s.Ring()
		v.srqRec = s.DBIndex()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.views[q.QPN()] = v
	return nil
}

func (e *limitsEngine) view(t *testing.T, qpn uint32) limitsView {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	v, ok := e.views[qpn]
	require.True(t, ok, "QP %d not seen by the engine", qpn)
	return v
}

func startLimitsDevice(t *testing.T) (*limitsEngine, *verbs.Context) {
	t.Helper()
	eng := &limitsEngine{views: map[uint32]limitsView{}}
	s, err := devicetest.Start(devicetest.Options{DataPlane: eng})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	c, err := verbs.Open(s.SocketPath, verbs.WithClientName(t.Name()))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return eng, c
}

// TestQueryDeviceReportsABILimits: the QUERY_DEVICE reply carries the ABI
// limits (VRNIC_MAX_* in vrnic_abi.h).
func TestQueryDeviceReportsABILimits(t *testing.T) {
	_, c := startLimitsDevice(t)
	a, err := c.QueryDevice()
	require.NoError(t, err)
	assert.Equal(t, uint32(abi.MaxInline), a.MaxInline)
	assert.Equal(t, uint32(abi.MaxCQE), a.MaxCQE)
	assert.Equal(t, uint32(abi.MaxQPWR), a.MaxQPWR)
	assert.Equal(t, uint32(abi.MaxSGE), a.MaxSGE)
	assert.Equal(t, uint32(abi.MaxSRQWR), a.MaxSRQWR)
	assert.Equal(t, uint32(abi.MaxSGE), a.MaxSRQSGE, "SRQ WQEs have the RQ's SGE limit")
	assert.Equal(t, uint32(abi.MaxRdAtomic), a.MaxQPRdAtom)
	assert.Equal(t, uint32(abi.MaxRdAtomic), a.MaxQPInitRdAtom)
	assert.Equal(t, uint64(abi.MaxMRSize), a.MaxMRSize)
	// The values themselves, as the ABI documents them.
	assert.Equal(t, []uint32{512, 262144, 16384, 32, 16384, 32},
		[]uint32{a.MaxInline, a.MaxCQE, a.MaxQPWR, a.MaxSGE, a.MaxSRQWR, a.MaxSRQSGE})
}

// limitsSGL returns abi.MaxSGE distinct SGEs of mr for WQE i.
// checkRecvRing consumes the n receive WQEs posted with WrIDs base+i and
// the SGE lists of limitsSGL, and checks each as the daemon decodes it.
func checkRecvRing(t *testing.T, q *queues.RecvQueue, n int, base uint64, mr *verbs.MR) {
	t.Helper()
	got, err := q.Poll()
	require.NoError(t, err)
	require.Equal(t, uint32(n), got)
	var wr queues.RecvWR
	for i := range uint32(n) {
		ok, err := q.Next(&wr)
		require.True(t, ok)
		require.NoError(t, err, "WQE %d", i)
		require.Equal(t, uint64(i)+base, wr.WrID)
		require.Equal(t, limitsSGL(mr, i), wr.SGEs(), "WQE %d: all %d SGEs", i, abi.MaxSGE)
	}
	q.Publish()
}

func limitsSGL(mr *verbs.MR, i uint32) []abi.SGE {
	sgl := make([]abi.SGE, abi.MaxSGE)
	for j := range sgl {
		sgl[j] = mr.SGE(uint32(j)<<12|i%4096, uint32(j)+1+i%100)
	}
	return sgl
}

// limitsInline returns abi.MaxInline bytes for WQE i.
func limitsInline(i uint32) []byte {
	b := make([]byte, abi.MaxInline)
	for j := range b {
		b[j] = byte(j) ^ byte(j>>8)*0x55 ^ byte(i) ^ byte(i>>8)*31
	}
	return b
}

func limitsLen(sgl []abi.SGE) (n uint64) {
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	return n
}

// TestCreateAndPostAtABILimits creates a CQ of abi.MaxCQE entries, a QP
// whose SQ and RQ hold abi.MaxQPWR WRs of abi.MaxSGE SGEs (abi.MaxInline
// inline bytes on the SQ) and an SRQ of abi.MaxSRQWR WRs of abi.MaxSGE
// SGEs; fills every ring through verbs, alternating 32-SGE and 512-byte
// inline sends, and checks the daemon's queues decode all of it.
func TestCreateAndPostAtABILimits(t *testing.T) {
	eng, c := startLimitsDevice(t)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(abi.MaxCQE, nil)
	require.NoError(t, err)
	require.Equal(t, abi.MaxCQE, cq.Len())
	buf, err := c.Alloc(abi.MaxSGE<<12+4096, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite)
	require.NoError(t, err)

	want := abi.QPCap{MaxSendWR: abi.MaxQPWR, MaxRecvWR: abi.MaxQPWR, MaxSendSGE: abi.MaxSGE, MaxRecvSGE: abi.MaxSGE, MaxInlineData: abi.MaxInline}
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: want})
	require.NoError(t, err)
	assert.Equal(t, want, qp.Cap, "granted as asked")

	v := eng.view(t, qp.QPN)
	assert.Equal(t, want, v.cap)
	// 32 SGEs or 512 inline bytes: 1+8 blocks of 64 bytes per SQ slot;
	// 16+32*16 bytes rounded up to 576 per RQ slot.
	require.Equal(t, uint32(9), v.sqBlocks)
	require.Len(t, v.sq, abi.MaxQPWR*9*abi.WQEBlock)
	require.Equal(t, uint32(576), v.rqSize)
	require.Len(t, v.rq, abi.MaxQPWR*576)
	require.Equal(t, uint32(abi.MaxCQE), v.cqN)
	require.Len(t, v.cq, abi.MaxCQE*abi.SizeofCQE)
	rec, err := v.page.QP(v.rec)
	require.NoError(t, err)

	t.Run("SQ", func(t *testing.T) {
		for i := range uint32(abi.MaxQPWR) {
			wr := verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled}
			if i%2 == 0 {
				wr.Opcode, wr.SGL, wr.RemoteAddr, wr.RKey = abi.WRRDMAWrite, limitsSGL(mr, i), uint64(i)<<12, i
			} else {
				wr.Flags |= abi.SendInline
				wr.Inline = limitsInline(i)
			}
			require.NoError(t, qp.PostSend(&wr), "WR %d", i)
		}
		assert.ErrorIs(t, qp.PostSend(&verbs.SendWR{Opcode: abi.WRSend}), verbs.ErrQueueFull, "the ring holds exactly abi.MaxQPWR")

		// The daemon's consumer, configured as the data plane does.
		sq, err := queues.NewSQ(v.sq, queues.SQConfig{Slots: v.cap.MaxSendWR, MaxSGE: v.cap.MaxSendSGE, MaxInline: v.cap.MaxInlineData}, rec.SQPI, rec.SQCI)
		require.NoError(t, err)
		n, err := sq.Poll()
		require.NoError(t, err)
		require.Equal(t, uint32(abi.MaxQPWR), n)
		var wr queues.SendWR
		for i := range uint32(abi.MaxQPWR) {
			ok, err := sq.Next(&wr)
			require.True(t, ok)
			require.NoError(t, err, "WQE %d", i)
			require.Equal(t, uint64(i), wr.WrID)
			if i%2 == 0 {
				sgl := limitsSGL(mr, i)
				require.Equal(t, abi.WRRDMAWrite, wr.Opcode)
				require.Equal(t, sgl, wr.SGEs(), "WQE %d: all %d SGEs", i, abi.MaxSGE)
				require.Equal(t, limitsLen(sgl), wr.Length)
				require.Equal(t, uint64(i)<<12, wr.RemoteAddr)
				require.Equal(t, i, wr.RKey)
			} else {
				require.Equal(t, abi.SendInline|abi.SendSignaled, wr.Flags)
				require.Zero(t, wr.NumSGE)
				require.Equal(t, limitsInline(i), wr.Inline, "WQE %d: all %d inline bytes", i, abi.MaxInline)
			}
		}
		sq.Publish()
		require.NoError(t, qp.PostSend(&verbs.SendWR{WrID: 1 << 20, Opcode: abi.WRSend, Flags: abi.SendInline, Inline: limitsInline(7)}),
			"the consumed ring takes WRs again")
		n, err = sq.Poll()
		require.NoError(t, err)
		require.Equal(t, uint32(1), n)
		ok, err := sq.Next(&wr)
		require.True(t, ok)
		require.NoError(t, err)
		assert.Equal(t, uint64(1<<20), wr.WrID, "slot 0 again, after the wrap")
		assert.Equal(t, limitsInline(7), wr.Inline)
	})

	t.Run("RQ", func(t *testing.T) {
		for i := range uint32(abi.MaxQPWR) {
			require.NoError(t, qp.PostRecv(&verbs.RecvWR{WrID: uint64(i) + 100, SGL: limitsSGL(mr, i)}), "WR %d", i)
		}
		assert.ErrorIs(t, qp.PostRecv(&verbs.RecvWR{}), verbs.ErrQueueFull)
		rq, err := queues.NewRQ(v.rq, queues.RecvConfig{Slots: v.cap.MaxRecvWR, MaxSGE: v.cap.MaxRecvSGE}, rec.RQPI, rec.RQCI)
		require.NoError(t, err)
		checkRecvRing(t, rq, abi.MaxQPWR, 100, mr)
	})

	t.Run("CQ", func(t *testing.T) {
		crec, err := v.page.CQ(v.cqRec)
		require.NoError(t, err)
		// The daemon's producer over the pinned ring; the client polls it
		// through verbs.
		q, err := queues.NewCQ(v.cq, v.cqN, queues.CQWords{CI: crec.CI, PI: crec.PI, Overflow: crec.Overflow})
		require.NoError(t, err)
		for i := range uint32(abi.MaxCQE) {
			require.NoError(t, q.Push(&abi.CQE{WrID: uint64(i), ByteLen: i, QPNum: qp.QPN, Opcode: abi.WCRecv}), "CQE %d", i)
		}
		require.ErrorIs(t, q.Push(&abi.CQE{}), queues.ErrCQFull, "abi.MaxCQE entries fill it")
		q.Publish()
		assert.True(t, cq.Overflowed())
		wc := make([]abi.CQE, 1000)
		next := uint32(0)
		for next < abi.MaxCQE {
			n := cq.Poll(wc)
			require.Positive(t, n, "after %d CQEs", next)
			for _, e := range wc[:n] {
				require.Equal(t, uint64(next), e.WrID)
				require.Equal(t, next, e.ByteLen)
				require.Equal(t, qp.QPN, e.QPNum)
				next++
			}
		}
		assert.Zero(t, cq.Poll(wc))
		// Consumed: the daemon may write again, in the next pass's phase.
		require.NoError(t, q.Push(&abi.CQE{WrID: 1 << 40}))
		require.Equal(t, 1, cq.Poll(wc))
		assert.Equal(t, uint64(1<<40), wc[0].WrID)
	})

	t.Run("SRQ", func(t *testing.T) {
		srq, err := pd.CreateSRQ(abi.MaxSRQWR, abi.MaxSGE, 0)
		require.NoError(t, err)
		qp2, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: abi.QPCap{MaxSendWR: 1}})
		require.NoError(t, err)
		v2 := eng.view(t, qp2.QPN)
		require.True(t, v2.hasSRQ)
		require.Equal(t, uint32(abi.MaxSRQWR), v2.srqN)
		require.Equal(t, uint32(576), v2.srqSize)
		require.Len(t, v2.srq, abi.MaxSRQWR*576)
		for i := range uint32(abi.MaxSRQWR) {
			require.NoError(t, srq.PostRecv(&verbs.RecvWR{WrID: uint64(i) + 7, SGL: limitsSGL(mr, i)}), "WR %d", i)
		}
		assert.ErrorIs(t, srq.PostRecv(&verbs.RecvWR{}), verbs.ErrQueueFull)
		srec, err := v2.page.SRQ(v2.srqRec)
		require.NoError(t, err)
		q, err := queues.NewSRQ(v2.srq, queues.RecvConfig{Slots: v2.srqN, MaxSGE: abi.MaxSGE}, srec.PI, srec.CI)
		require.NoError(t, err)
		checkRecvRing(t, q, abi.MaxSRQWR, 7, mr)
	})
}

// TestMaxRdAtomicConfig: a device configured for 128 outstanding READs
// and atomics (Config.MaxRdAtomic, as Soft-RoCE reports) says so in
// QUERY_DEVICE, and MODIFY_QP takes max_rd_atomic and max_dest_rd_atomic
// up to it, and refuses one more.
func TestMaxRdAtomicConfig(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{MaxRdAtomic: 128})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	c, err := verbs.Open(s.SocketPath, verbs.WithClientName(t.Name()))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	a, err := c.QueryDevice()
	require.NoError(t, err)
	assert.Equal(t, uint32(128), a.MaxQPRdAtom)
	assert.Equal(t, uint32(128), a.MaxQPInitRdAtom)

	qp := newQPEnv(t, c).qp(t, abi.QPTRC)
	require.NoError(t, modify(qp, abi.QPSInit, rcInit))
	rtr := fullAttr(abi.QPSRTR)
	rtr.MaxDestRdAtomic = 129
	err = qp.Modify(&rtr, abi.QPAttrState|rcRTR)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	assert.Contains(t, err.Error(), "MAX_DEST_RD_ATOMIC 129 out of range (at most max_qp_rd_atom, 128)")
	rtr.MaxDestRdAtomic = 128
	require.NoError(t, qp.Modify(&rtr, abi.QPAttrState|rcRTR))
	rts := fullAttr(abi.QPSRTS)
	rts.MaxRdAtomic = 129
	err = qp.Modify(&rts, abi.QPAttrState|rcRTS)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	assert.Contains(t, err.Error(), "MAX_QP_RD_ATOMIC 129 out of range")
	rts.MaxRdAtomic = 128
	require.NoError(t, qp.Modify(&rts, abi.QPAttrState|rcRTS))
	q, err := qp.Query()
	require.NoError(t, err)
	assert.Equal(t, uint8(128), q.Attr.MaxRdAtomic)
	assert.Equal(t, uint8(128), q.Attr.MaxDestRdAtomic)
}
