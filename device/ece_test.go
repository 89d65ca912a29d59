package device_test

import (
	"fmt"
	"sync"
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

// modifyECE moves qp to `to` with the attributes of fullAttr, mask and
// the ECE options ece (with VRNIC_QP_ECE).
func modifyECE(qp *verbs.QP, to abi.QPState, mask, ece uint32) error {
	a := fullAttr(to)
	return qp.ModifyECE(&a, abi.QPAttrState|abi.QPAttrECE|mask, ece)
}

func queryECE(t *testing.T, qp *verbs.QP) uint32 {
	t.Helper()
	q, err := qp.Query()
	require.NoError(t, err)
	return q.ECEOptions
}

// TestModifyQPECE: MODIFY_QP sets an RC QP's ECE options (VRNIC_QP_ECE,
// ABI 1.5) from RESET to INIT, in INIT and from INIT to RTR, QUERY_QP and
// the operator's view report them, RESET clears them; every other
// transition refuses them with EINVAL and leaves the QP as it was.
func TestModifyQPECE(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)
	x, err := c.QueryDeviceEx()
	require.NoError(t, err)
	assert.Equal(t, abi.ECEOptions, x.ECEOptions, "the device supports every option")

	qp := e.qp(t, abi.QPTRC)
	assert.Zero(t, queryECE(t, qp), "a new QP has none")
	require.NoError(t, modifyECE(qp, abi.QPSInit, rcInit, abi.ECESelectiveRepeat))
	assert.Equal(t, abi.ECESelectiveRepeat, queryECE(t, qp), "RESET -> INIT")
	require.NoError(t, modifyECE(qp, abi.QPSInit, 0, abi.ECEAdaptiveRTO))
	assert.Equal(t, abi.ECEAdaptiveRTO, queryECE(t, qp), "INIT -> INIT")
	// Without VRNIC_QP_ECE the options stay (and ece_options is ignored,
	// as any attribute whose bit is not in the mask).
	a := fullAttr(abi.QPSInit)
	require.NoError(t, qp.ModifyECE(&a, abi.QPAttrState, abi.ECEOptions))
	assert.Equal(t, abi.ECEAdaptiveRTO, queryECE(t, qp))
	require.NoError(t, modifyECE(qp, abi.QPSRTR, rcRTR, abi.ECEOptions))
	assert.Equal(t, abi.ECEOptions, queryECE(t, qp), "INIT -> RTR")
	qps := adminList[admin.QPInfo](t, s.SocketPath, admin.QPsCmd)
	require.Len(t, qps, 1)
	assert.Equal(t, "sr,rto", qps[0].ECE)

	// Past RTR the options are fixed.
	for _, st := range []step{{abi.QPSRTS, rcRTS}, {abi.QPSRTS, 0}, {abi.QPSSQD, 0}, {abi.QPSErr, 0}} {
		cur, err := qp.Query()
		require.NoError(t, err)
		err = modifyECE(qp, st.to, st.mask, 0)
		assert.Equal(t, syscall.EINVAL, errno(t, err), "%v -> %v", cur.Attr.QPState, st.to)
		assert.Contains(t, err.Error(), "ECE options are set in RESET -> INIT, INIT -> INIT or INIT -> RTR only")
		q, err := qp.Query()
		require.NoError(t, err)
		assert.Equal(t, cur.Attr.QPState, q.Attr.QPState, "state unchanged")
		assert.Equal(t, abi.ECEOptions, q.ECEOptions, "options unchanged")
		require.NoError(t, modify(qp, st.to, st.mask))
	}
	require.NoError(t, modify(qp, abi.QPSReset, 0))
	assert.Zero(t, queryECE(t, qp), "RESET clears them")
	qps = adminList[admin.QPInfo](t, s.SocketPath, admin.QPsCmd)
	assert.Empty(t, qps[0].ECE)
	// RESET -> RESET and ERR -> RESET take none either.
	err = modifyECE(qp, abi.QPSReset, 0, abi.ECESelectiveRepeat)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	// Setting none is a setting too: it clears them.
	require.NoError(t, modifyECE(qp, abi.QPSInit, rcInit, abi.ECEOptions))
	require.NoError(t, modifyECE(qp, abi.QPSRTR, rcRTR, 0))
	assert.Zero(t, queryECE(t, qp))
}

// TestModifyQPECERefused: unknown option bits, QP types without
// retransmission, a switched-off device and a non-zero reserved word are
// refused with their errno, and the QP keeps its state and options.
func TestModifyQPECERefused(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	e := newQPEnv(t, c)

	rc := e.qp(t, abi.QPTRC)
	for _, bad := range []uint32{1 << 2, 1 << 31, abi.ECEOptions | 1<<7} {
		err := modifyECE(rc, abi.QPSInit, rcInit, bad)
		assert.Equal(t, syscall.EINVAL, errno(t, err), "%#x", bad)
		assert.Contains(t, err.Error(), "unknown bits")
	}
	q, err := rc.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSReset, q.Attr.QPState)

	for _, typ := range []abi.QPType{abi.QPTUD, abi.QPTUC} {
		qp := e.qp(t, typ)
		mask := uint32(rcInit)
		if typ == abi.QPTUD {
			mask = udInit
		}
		err := modifyECE(qp, abi.QPSInit, mask, abi.ECESelectiveRepeat)
		assert.Equal(t, syscall.EINVAL, errno(t, err), "%v", typ)
		assert.Contains(t, err.Error(), "apply to RC and XRC QPs only")
		err = modifyECE(qp, abi.QPSInit, mask, 0)
		assert.Equal(t, syscall.EINVAL, errno(t, err), "%v: even none", typ)
		require.NoError(t, modify(qp, abi.QPSInit, mask), "%v", typ)
	}

	// The reserved word of the 1.5 command must be 0.
	b := encode(t, &abi.CmdModifyQPReq{QPN: rc.QPN, AttrMask: abi.QPAttrState | rcInit, Attr: fullAttr(abi.QPSInit), Reserved: 1})
	err = c.RawCommand(abi.CmdModifyQP, b)
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	assert.Contains(t, err.Error(), "reserved must be 0")

	// XRC initiators and targets take them.
	xrcd, err := c.OpenXRCD(nil, 0)
	require.NoError(t, err)
	for _, mk := range []func() (*verbs.QP, error){
		func() (*verbs.QP, error) {
			return e.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTXRCSend, SendCQ: e.scq, Cap: abi.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
		},
		xrcd.CreateTargetQP,
	} {
		qp, err := mk()
		require.NoError(t, err)
		require.NoError(t, modifyECE(qp, abi.QPSInit, rcInit, abi.ECESelectiveRepeat), "%v", qp.Type)
		assert.Equal(t, abi.ECESelectiveRepeat, queryECE(t, qp), "%v", qp.Type)
	}
}

// TestModifyQPECESwitchedOff: a device whose operator switched ECE off
// (vrnicd -ece=false) supports no option: QUERY_DEVICE_EX says so, and
// an option is refused with EOPNOTSUPP while setting none still works.
func TestModifyQPECESwitchedOff(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{NoECE: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	c := open(t, s)
	x, err := c.QueryDeviceEx()
	require.NoError(t, err)
	assert.Zero(t, x.ECEOptions)
	a, err := admin.Dial(s.SocketPath)
	require.NoError(t, err)
	info, err := a.Info()
	a.Close()
	require.NoError(t, err)
	assert.Equal(t, "none", info.ECE)

	qp := newQPEnv(t, c).qp(t, abi.QPTRC)
	for _, opt := range []uint32{abi.ECESelectiveRepeat, abi.ECEAdaptiveRTO} {
		err := modifyECE(qp, abi.QPSInit, rcInit, opt)
		assert.Equal(t, syscall.EOPNOTSUPP, errno(t, err))
		assert.Contains(t, err.Error(), fmt.Sprintf("ECE option %s: switched off", abi.ECEString(opt)))
	}
	require.NoError(t, modifyECE(qp, abi.QPSInit, rcInit, 0))
	assert.Zero(t, queryECE(t, qp))
}

// TestModifyQPABI14: a client of ABI 1.4 sends MODIFY_QP without the
// ECE words (its first abi.OffModifyQPECE bytes), which the daemon takes
// as before; VRNIC_QP_ECE needs the whole command, and any other length
// is EMSGSIZE.
func TestModifyQPABI14(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	qp := newQPEnv(t, c).qp(t, abi.QPTRC)
	v14 := func(to abi.QPState, mask uint32) []byte {
		b := encode(t, &abi.CmdModifyQPReq{QPN: qp.QPN, AttrMask: abi.QPAttrState | mask, Attr: fullAttr(to)})
		return b[:abi.OffModifyQPECE]
	}
	require.NoError(t, c.RawCommand(abi.CmdModifyQP, v14(abi.QPSInit, rcInit)))
	err := c.RawCommand(abi.CmdModifyQP, v14(abi.QPSRTR, rcRTR|abi.QPAttrECE))
	assert.Equal(t, syscall.EINVAL, errno(t, err))
	assert.Contains(t, err.Error(), "VRNIC_QP_ECE needs the ABI 1.5 command")
	for _, n := range []int{abi.OffModifyQPECE - 1, abi.OffModifyQPECE + 4, abi.Sizeof(&abi.CmdModifyQPReq{}) + 1} {
		b := make([]byte, n)
		copy(b, v14(abi.QPSRTR, rcRTR))
		err := c.RawCommand(abi.CmdModifyQP, b)
		assert.Equal(t, syscall.EMSGSIZE, errno(t, err), "%d bytes", n)
	}
	require.NoError(t, c.RawCommand(abi.CmdModifyQP, v14(abi.QPSRTR, rcRTR)))
	q, err := qp.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTR, q.Attr.QPState)
	assert.Equal(t, fullAttr(abi.QPSRTR).RQPSN, q.Attr.RQPSN)
	assert.Zero(t, q.ECEOptions)
}

// eceEngine records, for every MODIFY_QP the data plane is told of, the
// QP's ECE options then.
type eceEngine struct {
	devicetest.NopDataPlane
	mu    sync.Mutex
	calls []string
}

func (e *eceEngine) ModifyQP(q *device.QP, prev device.QPState, mask device.AttrMask) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, fmt.Sprintf("%v->%v ece=%v mask_ece=%v", prev, q.State(), abi.ECEString(q.ECE()), mask&device.AttrECE != 0))
}

// TestECEDataPlaneSeam: the data plane is told of the options with the
// change that set them (device.AttrECE in the mask, QP.ECE), and RESET
// clears them.
func TestECEDataPlaneSeam(t *testing.T) {
	eng := &eceEngine{}
	_, _, _, qp := startWithRCQP(t, eng)
	require.NoError(t, modifyECE(qp, abi.QPSInit, rcInit, abi.ECESelectiveRepeat))
	require.NoError(t, modifyECE(qp, abi.QPSRTR, rcRTR, abi.ECEOptions))
	require.NoError(t, modify(qp, abi.QPSRTS, rcRTS))
	require.NoError(t, modify(qp, abi.QPSReset, 0))
	eng.mu.Lock()
	defer eng.mu.Unlock()
	assert.Equal(t, []string{
		"RESET->INIT ece=sr mask_ece=true",
		"INIT->RTR ece=sr,rto mask_ece=true",
		"RTR->RTS ece=sr,rto mask_ece=false",
		"RTS->RESET ece=none mask_ece=false",
	}, eng.calls)
}
