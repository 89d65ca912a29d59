package device_test

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/verbs"
)

// recEngine records the engine calls (a fake for testing the seam only).
type recEngine struct {
	devicetest.NopDataPlane
	mu      sync.Mutex
	calls   []string
	failNew bool
}

func (e *recEngine) add(s string) {
	e.mu.Lock()
	e.calls = append(e.calls, s)
	e.mu.Unlock()
}

func (e *recEngine) CreateQP(q *device.QP) error {
	e.mu.Lock()
	fail := e.failNew
	e.mu.Unlock()
	if fail {
		return errors.New("no worker")
	}
	sq, blocks := q.SQ()
	cq, n := q.SendCQ().Ring()
	e.add(fmt.Sprintf("create %d sq=%d blocks=%d cq=%d", q.QPN(), len(sq), blocks, len(cq)/int(n)))
	return nil
}

func (e *recEngine) ModifyQP(q *device.QP, prev device.QPState, mask device.AttrMask) {
	e.add(fmt.Sprintf("modify %d %v->%v %v", q.QPN(), prev, q.State(), mask))
}

func (e *recEngine) DestroyQP(q *device.QP) <-chan device.QPCounters {
	e.add(fmt.Sprintf("destroy %d", q.QPN()))
	final := make(chan device.QPCounters, 1)
	final <- e.Counters(q)
	return final
}

func (e *recEngine) Counters(q *device.QP) device.QPCounters {
	return device.QPCounters{PacketsSent: uint64(q.QPN()), Retransmits: 3}
}

func (e *recEngine) snapshot() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.calls...)
}

// startWithRCQP starts a device over data plane dp, opens a client on it
// and creates an RC QP.
func startWithRCQP(t *testing.T, dp device.DataPlane) (*devicetest.Server, *verbs.Context, *qpEnv, *verbs.QP) {
	s, err := devicetest.Start(devicetest.Options{DataPlane: dp})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c := open(t, s)
	e := newQPEnv(t, c)
	return s, c, e, e.qp(t, abi.QPTRC)
}

func TestEngineSeam(t *testing.T) {
	eng := &recEngine{}
	s, c, e, qp := startWithRCQP(t, eng)
	require.NoError(t, qp.ToInit(0, 0))
	q, err := qp.Query()
	require.NoError(t, err)
	assert.Equal(t, uint64(qp.QPN), q.PacketsSent, "counters come from the engine")
	assert.Equal(t, uint64(3), q.Retransmits)
	qps := adminList[admin.QPInfo](t, s.SocketPath, admin.QPsCmd)
	require.Len(t, qps, 1)
	assert.Equal(t, uint64(3), qps[0].Counters.Retransmits)
	require.NoError(t, modify(qp, abi.QPSErr, 0))
	require.NoError(t, qp.Destroy())
	qp2 := e.qp(t, abi.QPTUD)
	require.NoError(t, c.Close()) // client death destroys through the engine too
	waitIdle(t, s)
	n1, n2 := qp.QPN, qp2.QPN
	assert.Equal(t, []string{
		fmt.Sprintf("create %d sq=%d blocks=2 cq=32", n1, 8*2*64),
		fmt.Sprintf("modify %d RESET->INIT STATE|ACCESS_FLAGS|PKEY_INDEX|PORT", n1),
		fmt.Sprintf("modify %d INIT->ERR STATE", n1),
		fmt.Sprintf("destroy %d", n1),
		fmt.Sprintf("create %d sq=%d blocks=2 cq=32", n2, 8*2*64),
		fmt.Sprintf("destroy %d", n2),
	}, eng.snapshot())

	// An engine refusing a QP fails CREATE_QP and leaks nothing.
	eng.mu.Lock()
	eng.failNew = true
	eng.mu.Unlock()
	c2 := open(t, s)
	e2 := newQPEnv(t, c2)
	_, err = e2.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e2.scq, RecvCQ: e2.rcq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	assert.Equal(t, syscall.ENOMEM, errno(t, err))
	assert.Zero(t, s.Device.Counts().QP)
	require.NoError(t, e2.scq.Destroy(), "the CQ is not held by the failed QP")
}

// TestDoorbellsSharedWithClient: what a client posts through verbs is
// visible to the daemon side in the context's doorbell page, which the
// engine reaches from the QP.
func TestDoorbellsSharedWithClient(t *testing.T) {
	eng := &pageEngine{}
	s, err := devicetest.Start(devicetest.Options{DataPlane: eng})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c := open(t, s)
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	defer ch.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(8, ch)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	eng.mu.Lock()
	page, qpRec, cqRec := eng.page, eng.qpRec, eng.cqRec
	eng.mu.Unlock()
	require.NotNil(t, page)
	rec, err := page.QP(qpRec)
	require.NoError(t, err)
	crec, err := page.CQ(cqRec)
	require.NoError(t, err)
	assert.Zero(t, rec.SQPI.Load())
	for i := range 3 {
		require.NoError(t, qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend}))
	}
	require.NoError(t, qp.PostRecv(&verbs.RecvWR{WrID: 9}))
	assert.Equal(t, uint32(3), rec.SQPI.Load())
	assert.Equal(t, uint32(1), rec.RQPI.Load())
	require.NoError(t, cq.ReqNotify(true))
	assert.Equal(t, abi.ArmWord(1, true), crec.Arm.Load())
	// A sleeping daemon is kicked.
	page.KickNeeded().Store(1)
	require.NoError(t, qp.PostSend(&verbs.SendWR{Opcode: abi.WRSend}))
	n, err := page.Kick().Drain()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)
	// The daemon closes the page when the client goes; its DestroyQP takes
	// eng.mu first, which orders the reads above before that.
	eng.mu.Lock()
	eng.page = nil
	eng.mu.Unlock()
}

// pageEngine remembers the doorbell page and records of the last QP.
type pageEngine struct {
	devicetest.NopDataPlane
	mu    sync.Mutex
	page  *doorbell.Page
	qpRec uint32
	cqRec uint32
}

// DestroyQP runs before the context's doorbell page is closed.
func (e *pageEngine) DestroyQP(*device.QP) <-chan device.QPCounters {
	e.mu.Lock()
	defer e.mu.Unlock()
	return nil
}

func (e *pageEngine) CreateQP(q *device.QP) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.page = q.Doorbells()
	e.qpRec = q.DBIndex()
	e.cqRec = q.SendCQ().DBIndex()
	return nil
}

// gateEngine holds every QP removal until the test releases it.
type gateEngine struct {
	devicetest.NopDataPlane
	release chan struct{}
}

func (e *gateEngine) DestroyQP(q *device.QP) <-chan device.QPCounters {
	final := make(chan device.QPCounters, 1)
	go func() {
		<-e.release
		final <- device.QPCounters{}
	}()
	return final
}

// TestDestroyQPWaitsForDataPlane: DESTROY_QP is answered only once the
// data plane removed the QP, so that no completion of it can be written
// after the client's ibv_destroy_qp returns (as on the kernel's devices;
// libfabric's ofi_rxm frees what a late completion's wr_id names). The
// device stays responsive to other commands meanwhile.
func TestDestroyQPWaitsForDataPlane(t *testing.T) {
	eng := &gateEngine{release: make(chan struct{})}
	s, _, _, qp := startWithRCQP(t, eng)
	done := make(chan error, 1)
	go func() { done <- qp.Destroy() }()
	other := open(t, s) // another client is served while the destroy waits
	_, err := other.QueryDevice()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.Device.Counts().QP == 0 }, 10*time.Second, time.Millisecond,
		"the daemon took the destroy")
	// An answer sent now would arrive well within this (it can only make
	// the test miss an early answer, never fail a correct daemon).
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("DESTROY_QP answered (%v) before the data plane removed the QP", err)
	default:
	}
	close(eng.release)
	require.NoError(t, <-done)
}

// TestCloseWaitsForReleases: Device.Close returns only once what the QPs
// of a departed client pinned is released, which waits for the data
// plane to confirm their removal; before, Close could return first and
// its owner close the DMA space under a late release (a data race seen
// in the data plane tests' cleanup).
func TestCloseWaitsForReleases(t *testing.T) {
	eng := &gateEngine{release: make(chan struct{})}
	s, c, _, _ := startWithRCQP(t, eng)
	held := s.Space.PinnedBytes()
	require.NotZero(t, held, "the QP's rings are pinned")
	require.NoError(t, c.Close()) // the client leaves: its QP is destroyed
	require.Eventually(t, func() bool { return s.Device.Counts().QP == 0 }, 10*time.Second, time.Millisecond,
		"the daemon destroyed the departed client's QP")
	closed := make(chan struct{})
	go func() {
		s.Device.Close()
		close(closed)
	}()
	// A Close that returned now would be seen well within this (it can
	// only make the test miss an early return, never fail a correct
	// daemon).
	select {
	case <-closed:
		t.Fatalf("Device.Close returned before the data plane confirmed the removal (%d bytes still pinned)", s.Space.PinnedBytes())
	case <-time.After(200 * time.Millisecond):
	}
	close(eng.release)
	<-closed
	assert.Zero(t, s.Space.PinnedBytes(), "Close returned with the QP's memory still pinned")
}
