package device_test

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

type qpEnv struct {
	c   *verbs.Context
	pd  *verbs.PD
	scq *verbs.CQ
	rcq *verbs.CQ
}

func newQPEnv(t *testing.T, c *verbs.Context) *qpEnv {
	t.Helper()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	scq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	rcq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	return &qpEnv{c, pd, scq, rcq}
}

func (e *qpEnv) qp(t *testing.T, typ abi.QPType) *verbs.QP {
	t.Helper()
	qp, err := e.pd.CreateQP(verbs.QPInitAttr{Type: typ, SendCQ: e.scq, RecvCQ: e.rcq,
		Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	require.NoError(t, err)
	return qp
}

// fullAttr is a QP attribute set with every value valid.
func fullAttr(next abi.QPState) abi.QPAttr {
	return abi.QPAttr{
		QPState: next, PathMTU: abi.MTU1024, QKey: 0x11111111, RQPSN: 0x123456, SQPSN: 0x654321,
		DestQPNum: 0x77, QPAccessFlags: abi.AccessRemoteWrite | abi.AccessRemoteRead,
		MaxRdAtomic: 4, MaxDestRdAtomic: 8, MinRNRTimer: 12, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		PortNum: 1, EnSQDAsyncNotify: 1, AHAttr: testAV(),
	}
}

// step is one MODIFY_QP on the path from RESET to a state.
type step struct {
	to   abi.QPState
	mask uint32
}

const (
	rcInit = abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags
	udInit = abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey
	rcRTR  = abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer
	rcRTS  = abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrSQPSN | abi.QPAttrMaxQPRdAtomic
	udRTS  = abi.QPAttrSQPSN
)

// pathTo returns the modifies that bring a new QP of type typ to state s.
// SQE cannot be reached by a client: the path ends in RTS and the test
// then reports a send error as the transport engine would.
func pathTo(typ abi.QPType, s abi.QPState) ([]step, bool) {
	initM, rtr, rts := uint32(rcInit), uint32(rcRTR), uint32(rcRTS)
	if typ == abi.QPTUD {
		initM, rtr, rts = udInit, 0, udRTS
	}
	p := []step{{abi.QPSInit, initM}, {abi.QPSRTR, rtr}, {abi.QPSRTS, rts}, {abi.QPSSQD, 0}}
	switch s {
	case abi.QPSReset:
		return nil, true
	case abi.QPSInit:
		return p[:1], true
	case abi.QPSRTR:
		return p[:2], true
	case abi.QPSRTS:
		return p[:3], true
	case abi.QPSSQD:
		return p[:4], true
	case abi.QPSErr:
		return []step{{abi.QPSErr, 0}}, true
	case abi.QPSSQE:
		return p[:3], typ == abi.QPTUD
	}
	return nil, false
}

func modify(qp *verbs.QP, to abi.QPState, mask uint32) error {
	a := fullAttr(to)
	return qp.Modify(&a, abi.QPAttrState|mask)
}

// required lists the required attributes of each legal transition (from
// IBTA table 91 / the libibverbs qp_state_table), written out here
// independently of the device's table.
var required = map[abi.QPType]map[[2]abi.QPState]uint32{
	abi.QPTRC: {
		{abi.QPSReset, abi.QPSReset}: 0, {abi.QPSReset, abi.QPSInit}: rcInit, {abi.QPSReset, abi.QPSErr}: 0,
		{abi.QPSInit, abi.QPSReset}: 0, {abi.QPSInit, abi.QPSErr}: 0, {abi.QPSInit, abi.QPSInit}: 0, {abi.QPSInit, abi.QPSRTR}: rcRTR,
		{abi.QPSRTR, abi.QPSReset}: 0, {abi.QPSRTR, abi.QPSErr}: 0, {abi.QPSRTR, abi.QPSRTS}: rcRTS,
		{abi.QPSRTS, abi.QPSReset}: 0, {abi.QPSRTS, abi.QPSErr}: 0, {abi.QPSRTS, abi.QPSRTS}: 0, {abi.QPSRTS, abi.QPSSQD}: 0,
		{abi.QPSSQD, abi.QPSReset}: 0, {abi.QPSSQD, abi.QPSErr}: 0, {abi.QPSSQD, abi.QPSRTS}: 0, {abi.QPSSQD, abi.QPSSQD}: 0,
		{abi.QPSErr, abi.QPSReset}: 0, {abi.QPSErr, abi.QPSErr}: 0,
	},
	abi.QPTUD: {
		{abi.QPSReset, abi.QPSReset}: 0, {abi.QPSReset, abi.QPSInit}: udInit, {abi.QPSReset, abi.QPSErr}: 0,
		{abi.QPSInit, abi.QPSReset}: 0, {abi.QPSInit, abi.QPSErr}: 0, {abi.QPSInit, abi.QPSInit}: 0, {abi.QPSInit, abi.QPSRTR}: 0,
		{abi.QPSRTR, abi.QPSReset}: 0, {abi.QPSRTR, abi.QPSErr}: 0, {abi.QPSRTR, abi.QPSRTS}: udRTS,
		{abi.QPSRTS, abi.QPSReset}: 0, {abi.QPSRTS, abi.QPSErr}: 0, {abi.QPSRTS, abi.QPSRTS}: 0, {abi.QPSRTS, abi.QPSSQD}: 0,
		{abi.QPSSQD, abi.QPSReset}: 0, {abi.QPSSQD, abi.QPSErr}: 0, {abi.QPSSQD, abi.QPSRTS}: 0, {abi.QPSSQD, abi.QPSSQD}: 0,
		{abi.QPSSQE, abi.QPSReset}: 0, {abi.QPSSQE, abi.QPSErr}: 0, {abi.QPSSQE, abi.QPSRTS}: 0,
		{abi.QPSErr, abi.QPSReset}: 0, {abi.QPSErr, abi.QPSErr}: 0,
	},
}

var allStates = []abi.QPState{abi.QPSReset, abi.QPSInit, abi.QPSRTR, abi.QPSRTS, abi.QPSSQD, abi.QPSSQE, abi.QPSErr}

// TestQPTransitionsThroughServer performs every legal transition on a
// real QP over the control socket (a UD QP is put in SQE the way the
// transport engine does it), checks the state and attributes QUERY_QP
// reports, and checks that each missing required attribute is refused.
// It then tries every illegal pair and checks the error.
func TestQPTransitionsThroughServer(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	for _, typ := range []abi.QPType{abi.QPTRC, abi.QPTUD} {
		for _, cur := range allStates {
			for _, next := range allStates {
				req, legal := required[typ][[2]abi.QPState{cur, next}]
				path, reachable := pathTo(typ, cur)
				if !reachable {
					continue
				}
				name := fmt.Sprintf("%v/%v-%v", map[abi.QPType]string{abi.QPTRC: "RC", abi.QPTUD: "UD"}[typ], cur, next)
				t.Run(name, func(t *testing.T) {
					qp := e.qp(t, typ)
					defer func() { assert.NoError(t, qp.Destroy()) }()
					for _, st := range path {
						require.NoError(t, modify(qp, st.to, st.mask), "path step to %v", st.to)
					}
					if cur == abi.QPSSQE {
						require.True(t, s.Device.StoreQPState(qp.QPN, abi.QPSSQE))
					}
					if !legal {
						err := modify(qp, next, 0)
						assert.Equal(t, syscall.EINVAL, errno(t, err))
						assert.Contains(t, err.Error(), fmt.Sprintf("illegal QP state transition %v -> %v", cur, next))
						q, qerr := qp.Query()
						require.NoError(t, qerr)
						assert.Equal(t, cur, q.Attr.QPState, "state unchanged after a refused modify")
						return
					}
					// Each required attribute left out is named in the error.
					for m := req; m != 0; m &= m - 1 {
						bit := m & -m
						err := modify(qp, next, req&^bit)
						assert.Equal(t, syscall.EINVAL, errno(t, err))
						assert.Contains(t, err.Error(), "missing required attribute "+device.AttrMask(bit).String())
					}
					require.NoError(t, modify(qp, next, req))
					q, err := qp.Query()
					require.NoError(t, err)
					assert.Equal(t, next, q.Attr.QPState)
					assert.Equal(t, next, q.Attr.CurQPState)
					assert.Equal(t, typ, q.QPType)
					assert.Equal(t, uint32(8), q.Attr.Cap.MaxSendWR)
					want := fullAttr(next)
					if next == abi.QPSReset {
						assert.Zero(t, q.Attr.SQPSN)
						assert.Zero(t, q.Attr.QKey)
						return
					}
					// What was set on the way is reported.
					if typ == abi.QPTRC && (next == abi.QPSRTR || cur == abi.QPSRTR && next == abi.QPSRTS) {
						assert.Equal(t, want.RQPSN, q.Attr.RQPSN)
						assert.Equal(t, want.DestQPNum, q.Attr.DestQPNum)
						assert.Equal(t, want.PathMTU, q.Attr.PathMTU)
						assert.Equal(t, want.AHAttr, q.Attr.AHAttr)
						assert.Equal(t, want.MaxDestRdAtomic, q.Attr.MaxDestRdAtomic)
						assert.Equal(t, want.MinRNRTimer, q.Attr.MinRNRTimer)
						assert.Equal(t, want.QPAccessFlags, q.Attr.QPAccessFlags)
					}
					if cur == abi.QPSRTR && next == abi.QPSRTS {
						assert.Equal(t, want.SQPSN, q.Attr.SQPSN)
						if typ == abi.QPTRC {
							assert.Equal(t, want.Timeout, q.Attr.Timeout)
							assert.Equal(t, want.RetryCnt, q.Attr.RetryCnt)
							assert.Equal(t, want.RNRRetry, q.Attr.RNRRetry)
							assert.Equal(t, want.MaxRdAtomic, q.Attr.MaxRdAtomic)
						}
					}
					if typ == abi.QPTUD && next != abi.QPSErr {
						assert.Equal(t, want.QKey, q.Attr.QKey)
					}
				})
			}
		}
	}
}

func TestModifyQPAttributeValues(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	qp := e.qp(t, abi.QPTRC)
	require.NoError(t, modify(qp, abi.QPSInit, rcInit))
	// Values out of range on INIT→RTR, each with its message.
	cases := []struct {
		name string
		mut  func(a *abi.QPAttr)
		msg  string
	}{
		{"mtu zero", func(a *abi.QPAttr) { a.PathMTU = 0 }, "PATH_MTU 0 out of range"},
		{"mtu 6", func(a *abi.QPAttr) { a.PathMTU = 6 }, "PATH_MTU 6 out of range"},
		{"rq psn", func(a *abi.QPAttr) { a.RQPSN = 1 << 24 }, "RQ_PSN 0x1000000 out of range"},
		{"dest qpn", func(a *abi.QPAttr) { a.DestQPNum = 1 << 24 }, "DEST_QPN 0x1000000 out of range"},
		{"rd atomic", func(a *abi.QPAttr) { a.MaxDestRdAtomic = 17 }, "MAX_DEST_RD_ATOMIC 17 out of range"},
		{"rnr timer", func(a *abi.QPAttr) { a.MinRNRTimer = 32 }, "MIN_RNR_TIMER 32 out of range"},
		{"av port", func(a *abi.QPAttr) { a.AHAttr.PortNum = 2 }, "AV: ah_attr.port_num 2"},
		{"av sgid", func(a *abi.QPAttr) { a.AHAttr.SGIDIndex = 16 }, "AV: ah_attr.sgid_index 16"},
		{"av dgid", func(a *abi.QPAttr) { a.AHAttr.DGID = [16]byte{} }, "AV: ah_attr.dgid is all zero"},
		{"av reserved", func(a *abi.QPAttr) { a.AHAttr.Reserved[3] = 1 }, "AV: ah_attr.reserved must be 0"},
		{"path_mig_state without the mask bit", func(a *abi.QPAttr) { a.PathMigState = abi.MigArmed }, "attr.path_mig_state must be 0 without PATH_MIG_STATE"},
		{"cap reserved", func(a *abi.QPAttr) { a.Cap.Reserved = 1 }, "attr.cap.reserved must be 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := fullAttr(abi.QPSRTR)
			tc.mut(&a)
			err := qp.Modify(&a, abi.QPAttrState|rcRTR)
			assert.Equal(t, syscall.EINVAL, errno(t, err))
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	// RTR→RTS value checks.
	require.NoError(t, modify(qp, abi.QPSRTR, rcRTR))
	for _, tc := range []struct {
		mut func(a *abi.QPAttr)
		msg string
	}{
		{func(a *abi.QPAttr) { a.Timeout = 32 }, "TIMEOUT 32"},
		{func(a *abi.QPAttr) { a.RetryCnt = 8 }, "RETRY_CNT 8"},
		{func(a *abi.QPAttr) { a.RNRRetry = 8 }, "RNR_RETRY 8"},
		{func(a *abi.QPAttr) { a.SQPSN = 1 << 24 }, "SQ_PSN 0x1000000"},
		{func(a *abi.QPAttr) { a.MaxRdAtomic = 200 }, "MAX_QP_RD_ATOMIC 200"},
		{func(a *abi.QPAttr) { a.CurQPState = abi.QPSInit }, "CUR_STATE INIT does not match"},
	} {
		a := fullAttr(abi.QPSRTS)
		a.CurQPState = abi.QPSRTR
		tc.mut(&a)
		err := qp.Modify(&a, abi.QPAttrState|abi.QPAttrCurState|rcRTS)
		assert.Equal(t, syscall.EINVAL, errno(t, err))
		assert.Contains(t, err.Error(), tc.msg)
	}
	a := fullAttr(abi.QPSRTS)
	a.CurQPState = abi.QPSRTR
	require.NoError(t, qp.Modify(&a, abi.QPAttrState|abi.QPAttrCurState|rcRTS))
	// Helpers of the verbs library walk the usual path.
	qp2 := e.qp(t, abi.QPTRC)
	require.NoError(t, qp2.ToInit(abi.AccessRemoteWrite, 0))
	require.NoError(t, qp2.ToRTR(verbs.RTRAttr{AV: testAV(), PathMTU: abi.MTU4096, DestQPN: qp.QPN, RQPSN: 5, MaxDestRdAtomic: 1, MinRNRTimer: 1}))
	require.NoError(t, qp2.ToRTS(verbs.RTSAttr{SQPSN: 9, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}))
	q, err := qp2.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTS, q.Attr.QPState)
	assert.Equal(t, uint32(9), q.Attr.SQPSN)
	assert.Equal(t, uint32(5), q.Attr.RQPSN)
	assert.Equal(t, qp.QPN, q.Attr.DestQPNum)
	assert.Equal(t, abi.MTU4096, q.Attr.PathMTU)
}

// TestModifyQPKernelAccepts: inputs Linux (ib_modify_qp_is_ok and rxe's
// rxe_qp_chk_attr) accepts and vrnic once refused. PATH_MIG_STATE set to
// MIGRATED is optional on RTR→RTS, RTS→RTS, SQD→RTS and SQD→SQD of RC and
// UC QPs; EN_SQD_ASYNC_NOTIFY takes any value (rxe stores the u8). An
// alternate path, which vrnic does not keep, is an unsupported feature
// (EOPNOTSUPP) where the kernel's table allows it and a bad mask (EINVAL)
// where it does not.
func TestModifyQPKernelAccepts(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	for _, typ := range []abi.QPType{abi.QPTRC, abi.QPTUC} {
		t.Run(typ.String(), func(t *testing.T) {
			qp := e.qp(t, typ)
			initMask, rtrMask, rtsMask := rcInit, rcRTR, rcRTS
			if typ == abi.QPTUC {
				rtrMask = abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN
				rtsMask = abi.QPAttrSQPSN
			}
			require.NoError(t, modify(qp, abi.QPSInit, initMask))
			// ALT_PATH on INIT→RTR is allowed by the table: unsupported.
			a := fullAttr(abi.QPSRTR)
			err := qp.Modify(&a, abi.QPAttrState|rtrMask|abi.QPAttrAltPath)
			assert.Equal(t, syscall.EOPNOTSUPP, errno(t, err))
			assert.Contains(t, err.Error(), "ALT_PATH: alternate paths")
			// PATH_MIG_STATE on INIT→RTR is not in the table: EINVAL.
			err = qp.Modify(&a, abi.QPAttrState|rtrMask|abi.QPAttrPathMigState)
			assert.Equal(t, syscall.EINVAL, errno(t, err))
			assert.Contains(t, err.Error(), "attribute PATH_MIG_STATE not allowed")
			a.DestQPNum = 0x100 + uint32(typ) // a peer of its own
			require.NoError(t, qp.Modify(&a, abi.QPAttrState|rtrMask))
			// RTR→RTS with PATH_MIG_STATE = MIGRATED, as some programs
			// pass it.
			a = fullAttr(abi.QPSRTS)
			a.PathMigState = abi.MigMigrated
			require.NoError(t, qp.Modify(&a, abi.QPAttrState|rtsMask|abi.QPAttrPathMigState))
			// ARMED and REARM need an alternate path.
			for _, st := range []uint8{abi.MigRearm, abi.MigArmed} {
				a = fullAttr(abi.QPSRTS)
				a.PathMigState = st
				err = qp.Modify(&a, abi.QPAttrState|abi.QPAttrPathMigState)
				assert.Equal(t, syscall.EOPNOTSUPP, errno(t, err))
				assert.Contains(t, err.Error(), "needs an alternate path")
			}
			a.PathMigState = 3
			err = qp.Modify(&a, abi.QPAttrState|abi.QPAttrPathMigState)
			assert.Equal(t, syscall.EINVAL, errno(t, err))
			// RTS→SQD with EN_SQD_ASYNC_NOTIFY 2 (any non-zero value).
			a = fullAttr(abi.QPSSQD)
			a.EnSQDAsyncNotify = 2
			require.NoError(t, qp.Modify(&a, abi.QPAttrState|abi.QPAttrEnSQDAsyncNotify))
			q, err := qp.Query()
			require.NoError(t, err)
			assert.Equal(t, abi.QPSSQD, q.Attr.QPState)
			assert.Equal(t, uint8(2), q.Attr.EnSQDAsyncNotify)
			assert.Equal(t, abi.MigMigrated, q.Attr.PathMigState)
			// SQD→SQD and SQD→RTS take PATH_MIG_STATE too.
			a = fullAttr(abi.QPSSQD)
			require.NoError(t, qp.Modify(&a, abi.QPAttrState|abi.QPAttrPathMigState))
			a = fullAttr(abi.QPSRTS)
			require.NoError(t, qp.Modify(&a, abi.QPAttrState|abi.QPAttrPathMigState))
		})
	}
	// A UD QP has no path to migrate: the kernel's table has neither
	// attribute for UD.
	ud := e.qp(t, abi.QPTUD)
	require.NoError(t, modify(ud, abi.QPSInit, abi.QPAttrPKeyIndex|abi.QPAttrPort|abi.QPAttrQKey))
	a := fullAttr(abi.QPSRTR)
	err := ud.Modify(&a, abi.QPAttrState|abi.QPAttrAltPath)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
}

func TestCreateQPChecks(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	_, err := e.pd.CreateQP(verbs.QPInitAttr{Type: 9, SendCQ: e.scq, RecvCQ: e.rcq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	_, err = e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.scq, RecvCQ: e.rcq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 33}})
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	_, err = e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.scq, RecvCQ: e.rcq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: 513}})
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	_, err = e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.scq, RecvCQ: e.rcq, Cap: abi.QPCap{MaxSendWR: 1 << 15, MaxRecvWR: 1}})
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	// A CQ of another context is not found.
	c2 := open(t, s)
	e2 := newQPEnv(t, c2)
	_, err = e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e2.scq, RecvCQ: e.rcq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if e2.scq.Handle != e.scq.Handle && e2.scq.Handle != e.rcq.Handle && e2.scq.Handle != e.pd.Handle {
		assert.Equal(t, syscall.ENOENT, errno(t, err))
	}
	// QUERY_QP of another context's QP.
	qp2 := e2.qp(t, abi.QPTRC)
	err = c.Destroy(abi.CmdDestroyQP, qp2.QPN)
	assert.Equal(t, syscall.ENOENT, errno(t, err))
	// QPNs are distinct across contexts.
	qp1 := e.qp(t, abi.QPTUD)
	assert.NotEqual(t, qp1.QPN, qp2.QPN)
	assert.GreaterOrEqual(t, qp1.QPN, uint32(2))
}

func TestSRQAndAH(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	srq, err := e.pd.CreateSRQ(16, 2, 4)
	require.NoError(t, err)
	q, err := srq.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.RespQuerySRQ{MaxWR: 16, MaxSGE: 2, SRQLimit: 4}, q)
	require.NoError(t, srq.Modify(8))
	q, err = srq.Query()
	require.NoError(t, err)
	assert.Equal(t, uint32(8), q.SRQLimit)
	// As rxe (rxe_srq_chk_attr): a limit up to the SRQ's max_wr is taken,
	// one above it refused.
	require.NoError(t, srq.Modify(16))
	assert.Equal(t, syscall.EINVAL, errno(t, srq.Modify(17)))
	// At creation rxe checks no limit (rxe_srq_chk_init) and arms the SRQ
	// with it: so does vrnic, whatever the limit.
	for _, lim := range []uint32{16, 17, 1 << 31} {
		s2, err := e.pd.CreateSRQ(16, 2, lim)
		require.NoError(t, err, "srq_limit %d", lim)
		q, err = s2.Query()
		require.NoError(t, err)
		assert.Equal(t, lim, q.SRQLimit)
		require.NoError(t, s2.Destroy())
	}
	_, err = e.pd.CreateSRQ(16, 33, 0)
	assert.Equal(t, syscall.EINVAL, errno(t, err))

	qp, err := e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.scq, RecvCQ: e.rcq, SRQ: srq, Cap: abi.QPCap{MaxSendWR: 4}})
	require.NoError(t, err)
	qq, err := qp.Query()
	require.NoError(t, err)
	assert.Equal(t, srq.Handle, qq.SRQHandle)
	assert.Equal(t, syscall.EBUSY, errno(t, srq.Destroy()), "SRQ used by a QP")
	assert.ErrorIs(t, qp.PostRecv(&verbs.RecvWR{}), verbs.ErrNoRQ)
	require.NoError(t, qp.Destroy())
	require.NoError(t, srq.Destroy())
	assert.Equal(t, syscall.ENOENT, errno(t, srq.Destroy()))

	ah, err := e.pd.CreateAH(testAV())
	require.NoError(t, err)
	bad := testAV()
	bad.SGIDIndex = 16
	_, err = e.pd.CreateAH(bad)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	assert.Equal(t, syscall.EBUSY, errno(t, e.pd.Dealloc()), "PD with an AH")
	require.NoError(t, ah.Destroy())
	assert.Equal(t, syscall.ENOENT, errno(t, ah.Destroy()))
}

// TestQPTransportError: the transport moves a QP to ERR by storing into
// its state word; QUERY_QP and the operator listing say ERR at once, a
// transition from the old state is refused, and RESET leaves ERR.
func TestQPTransportError(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	rc := e.qp(t, abi.QPTRC)
	for _, st := range []step{{abi.QPSInit, rcInit}, {abi.QPSRTR, rcRTR}, {abi.QPSRTS, rcRTS}} {
		require.NoError(t, modify(rc, st.to, st.mask))
	}
	require.True(t, s.Device.StoreQPState(rc.QPN, abi.QPSErr))
	q, err := rc.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSErr, q.Attr.QPState)
	assert.Equal(t, abi.QPSErr, q.Attr.CurQPState)
	qps := adminList[admin.QPInfo](t, s.SocketPath, admin.QPsCmd)
	require.Len(t, qps, 1)
	assert.Equal(t, "ERR", qps[0].State)
	assert.Equal(t, syscall.EINVAL, errno(t, modify(rc, abi.QPSSQD, 0)), "RTS -> SQD from ERR")
	require.NoError(t, modify(rc, abi.QPSReset, 0))
	q, err = rc.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSReset, q.Attr.QPState)
	assert.False(t, s.Device.StoreQPState(1<<23, abi.QPSErr), "no such QP")
}

// TestConnectionClaim: a remote QP (destination GID and QPN) is claimed by
// one local RC QP from RTR until RESET or destroy; a second QP of the
// device, of another client or the same, cannot connect to it (EADDRINUSE)
// and so cannot inject into the first one's connection.
func TestConnectionClaim(t *testing.T) {
	s := startServer(t, device.Limits{})
	victim := newQPEnv(t, open(t, s))
	attacker := newQPEnv(t, open(t, s))
	toRTR := func(qp *verbs.QP) error {
		if err := modify(qp, abi.QPSInit, rcInit); err != nil {
			return err
		}
		return modify(qp, abi.QPSRTR, rcRTR)
	}
	v := victim.qp(t, abi.QPTRC)
	require.NoError(t, toRTR(v))
	a := attacker.qp(t, abi.QPTRC)
	err := toRTR(a)
	assert.Equal(t, syscall.EADDRINUSE, errno(t, err))
	assert.Contains(t, err.Error(), "is connected to QP")
	q, qerr := a.Query()
	require.NoError(t, qerr)
	assert.Equal(t, abi.QPSInit, q.Attr.QPState, "the refused QP stays in INIT")
	same := victim.qp(t, abi.QPTRC)
	assert.Equal(t, syscall.EADDRINUSE, errno(t, toRTR(same)), "a second QP of the same client neither")

	// Another remote QP is free.
	other := fullAttr(abi.QPSRTR)
	other.DestQPNum++
	require.NoError(t, a.Modify(&other, abi.QPAttrState|rcRTR))
	require.NoError(t, modify(a, abi.QPSReset, 0))

	// The claim goes with RESET of the holder (not with ERR) and with its
	// destruction.
	require.NoError(t, modify(v, abi.QPSErr, 0))
	assert.Equal(t, syscall.EADDRINUSE, errno(t, toRTR(a)), "a QP in ERR keeps its claim")
	require.NoError(t, modify(a, abi.QPSReset, 0))
	require.NoError(t, modify(v, abi.QPSReset, 0))
	require.NoError(t, toRTR(a))
	assert.Equal(t, syscall.EADDRINUSE, errno(t, toRTR(v)))
	require.NoError(t, modify(v, abi.QPSReset, 0))
	require.NoError(t, a.Destroy())
	require.NoError(t, toRTR(v), "free again once the holder is destroyed")
}

// TestQPNsNotPredictable: QP numbers are drawn at random from the 24-bit
// space above the special QPs, so one QPN does not tell the next (an
// off-path injector must guess it) and a destroyed QP's number is not
// handed out again at once.
func TestQPNsNotPredictable(t *testing.T) {
	s := startServer(t, device.Limits{})
	e := newQPEnv(t, open(t, s))
	seen := map[uint32]bool{}
	var prev uint32
	adjacent := 0
	for i := range 64 {
		qp := e.qp(t, abi.QPTRC)
		require.GreaterOrEqual(t, qp.QPN, uint32(2))
		require.LessOrEqual(t, qp.QPN, uint32(roce.QPNMask))
		require.False(t, seen[qp.QPN], "QPN %#x handed out twice", qp.QPN)
		seen[qp.QPN] = true
		if i > 0 && (qp.QPN == prev+1 || qp.QPN+1 == prev) {
			adjacent++
		}
		prev = qp.QPN
		if i%2 == 0 {
			n := qp.QPN
			require.NoError(t, qp.Destroy())
			again := e.qp(t, abi.QPTRC)
			assert.NotEqual(t, n, again.QPN, "a destroyed QP's number handed out at once")
			seen[again.QPN] = true
		}
	}
	assert.Less(t, adjacent, 4, "consecutive QPNs: %d of 63", adjacent)
}
