package dataplane_test

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
	"github.com/vrnic/vrnic/verbs"
)

// dpNode is an in-process device with the transport engine, attached to
// an in-memory network, serving a real control socket.
type dpNode struct {
	addr netip.Addr
	gid  [16]byte
	dev  *device.Device
	dp   *dataplane.DataPlane
	sock string
}

func newDPNetwork(t testing.TB) *link.Network {
	nw, err := link.NewNetwork(link.Config{FrameCap: engine.DefaultFrameCap, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	return nw
}

// newDPNode starts a device at addr with workers engine workers.
func newDPNode(t testing.TB, nw *link.Network, addr string, workers int, faults *link.Faults) *dpNode {
	t.Helper()
	return newDPNodeSpin(t, nw, addr, workers, faults, 0)
}

// newDPNodeSpin is newDPNode with the doorbell poller's spin budget.
func newDPNodeSpin(t testing.TB, nw *link.Network, addr string, workers int, faults *link.Faults, spin int) *dpNode {
	t.Helper()
	a := netip.MustParseAddr(addr)
	ports, err := nw.Attach(a, workers, faults)
	require.NoError(t, err)
	links := make([]engine.Link, len(ports))
	for i, p := range ports {
		links[i] = p
	}
	return startNode(t, nodeSpec{addr: a, links: links, linkType: abi.LinkMem, dp: dataplane.Config{SpinBudget: spin}})
}

// nodeSpec describes an in-process device for startNode: its address
// (GID 0, IPv4-mapped for IPv4), one link per engine worker, the link type
// it reports, the engine's and the data plane's settings beyond those
// startNode fills in (links, framing, logger; engine, space, logger), and
// what must happen at clean-up before the device closes.
type nodeSpec struct {
	addr     netip.Addr
	links    []engine.Link
	linkType abi.LinkType
	eng      engine.Config
	dp       dataplane.Config
	before   func()
}

// startNode starts a device with the transport engine over s.links,
// serving a real control socket, and stops it when the test ends.
func startNode(t testing.TB, s nodeSpec) *dpNode {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	s.eng.Links, s.eng.Mode, s.eng.Logger = s.links, roce.ModeEthernet, log
	eng, err := engine.New(s.eng)
	require.NoError(t, err)
	space, err := dma.NewSpace(dma.Config{Logger: log})
	require.NoError(t, err)
	s.dp.Engine, s.dp.Space, s.dp.Logger = eng, space, log
	dp, err := dataplane.New(s.dp)
	require.NoError(t, err)
	n := &dpNode{addr: s.addr, gid: s.addr.As16(), dp: dp}
	n.dev, err = device.New(device.Config{
		Name:      "dp-" + s.addr.String(),
		Link:      device.LinkInfo{Type: s.linkType, MaxMTU: abi.MTU4096, GIDs: [][16]byte{n.gid}, SpeedMbps: 10000},
		Space:     space,
		DataPlane: dp,
		Logger:    log,
	})
	require.NoError(t, err)
	dp.Start()
	n.sock = filepath.Join(t.TempDir(), "dev"+admin.SocketSuffix)
	l, err := admin.Listen(n.sock)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- n.dev.Serve(l) }()
	t.Cleanup(func() {
		if s.before != nil {
			s.before()
		}
		n.dev.Close()
		<-done
		assert.NoError(t, dp.Close())
		space.Close()
	})
	return n
}

// dpClient is one verbs client with a connected RC QP and a registered
// buffer.
type dpClient struct {
	ctx  *verbs.Context
	pd   *verbs.PD
	ch   *verbs.CompChannel
	scq  *verbs.CQ
	rcq  *verbs.CQ
	qp   *verbs.QP
	buf  *verbs.Buffer
	mr   *verbs.MR
	node *dpNode
}

const dpBufSize = 1 << 20

func newDPClient(t testing.TB, n *dpNode, cqe int) *dpClient {
	t.Helper()
	return newDPClientOpts(t, n, cqe)
}

// newDPClientOpts is newDPClient with more options for verbs.Open.
func newDPClientOpts(t testing.TB, n *dpNode, cqe int, opts ...verbs.Option) *dpClient {
	t.Helper()
	ctx, err := verbs.Open(n.sock, append([]verbs.Option{verbs.WithClientName(t.Name())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	c := &dpClient{ctx: ctx, node: n}
	c.pd, err = ctx.AllocPD()
	require.NoError(t, err)
	c.ch, err = verbs.NewCompChannel()
	require.NoError(t, err)
	t.Cleanup(func() { c.ch.Close() })
	c.scq, err = ctx.CreateCQ(cqe, c.ch)
	require.NoError(t, err)
	c.rcq, err = ctx.CreateCQ(cqe, c.ch)
	require.NoError(t, err)
	c.qp, err = c.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.scq, RecvCQ: c.rcq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 128}})
	require.NoError(t, err)
	c.buf, err = ctx.Alloc(dpBufSize, 4096)
	require.NoError(t, err)
	c.mr, err = c.pd.RegMR(c.buf, abi.AccessAll)
	require.NoError(t, err)
	return c
}

// connectRC brings a and b to RTS, connected to each other.
func connectRC(t testing.TB, a, b *dpClient, mtu abi.MTU) {
	t.Helper()
	connectQPs(t, a.qp, a.node.gid, b.qp, b.node.gid, mtu)
}

// connectQPs connects QP a (at GID ga) and QP b (at GID gb).
func connectQPs(t testing.TB, a *verbs.QP, ga [16]byte, b *verbs.QP, gb [16]byte, mtu abi.MTU) {
	t.Helper()
	connectQPsTimeout(t, a, ga, b, gb, mtu, 14)
}

// connectQPsTimeout is connectQPs with a chosen ACK timeout code.
func connectQPsTimeout(t testing.TB, a *verbs.QP, ga [16]byte, b *verbs.QP, gb [16]byte, mtu abi.MTU, timeout uint8) {
	t.Helper()
	type end struct {
		qp  *verbs.QP
		gid [16]byte
	}
	for _, p := range [][2]end{{{a, ga}, {b, gb}}, {{b, gb}, {a, ga}}} {
		l, r := p[0], p[1]
		require.NoError(t, l.qp.ToInit(abi.AccessAll, 0))
		require.NoError(t, l.qp.ToRTR(verbs.RTRAttr{
			AV:      abi.AHAttr{DGID: r.gid, SGIDIndex: 0, HopLimit: 64, PortNum: 1},
			PathMTU: mtu, DestQPN: r.qp.QPN, RQPSN: r.qp.QPN * 7 & 0xffffff, MaxDestRdAtomic: 4, MinRNRTimer: 1,
		}))
		require.NoError(t, l.qp.ToRTS(verbs.RTSAttr{SQPSN: l.qp.QPN * 7 & 0xffffff, Timeout: timeout, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}))
	}
}

// pollN polls cq until n completions arrived (or the deadline passed).
func pollN(t testing.TB, cq *verbs.CQ, n int) []abi.CQE {
	t.Helper()
	out := make([]abi.CQE, 0, n)
	wc := make([]abi.CQE, 16)
	deadline := time.Now().Add(20 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		k := cq.Poll(wc[:min(len(wc), n-len(out))])
		for i := range k {
			wc[i].Owner = 0 // the phase bit, not part of the completion
			out = append(out, wc[i])
		}
		if k == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	require.Len(t, out, n, "completions before the deadline")
	return out
}

// noMore asserts no further completion arrives within a short while.
func noMore(t testing.TB, cqs ...*verbs.CQ) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
	wc := make([]abi.CQE, 1)
	for _, cq := range cqs {
		assert.Zero(t, cq.Poll(wc), "unexpected completion %+v", wc[0])
	}
}

func fillRand(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, ^seed))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// TestDataPlaneRCOperations runs every RC operation between two devices
// joined by the in-memory link, through real control sockets, shared
// memory rings, doorbell records and memory registrations, and checks the
// data moved and every field of every completion.
func TestDataPlaneRCOperations(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.0.1", 2, nil)
	nb := newDPNode(t, nw, "10.0.0.2", 2, nil)
	a := newDPClient(t, na, 64)
	b := newDPClient(t, nb, 64)
	connectRC(t, a, b, abi.MTU1024)
	qa, qb := a.qp.QPN, b.qp.QPN

	type step struct {
		name string
		run  func(t *testing.T)
	}
	steps := []step{
		{"SEND multi-packet, two SGEs each side", func(t *testing.T) {
			src := a.buf.Bytes[0:5000]
			fillRand(src, 1)
			dst := b.buf.Bytes[0:8192]
			clear(dst)
			require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 0xb1, SGL: []abi.SGE{b.mr.SGE(0, 3000), b.mr.SGE(3000, 5192)}}))
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa1, Opcode: abi.WRSend, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(0, 1000), a.mr.SGE(1000, 4000)}}))
			sc := pollN(t, a.scq, 1)
			rc := pollN(t, b.rcq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa1, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: qa}, sc[0])
			assert.Equal(t, abi.CQE{WrID: 0xb1, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: qb, ByteLen: 5000}, rc[0])
			assert.Equal(t, src, dst[:5000])
			assert.Zero(t, sum8(dst[5000:]), "nothing written past the message")
		}},
		{"SEND_WITH_IMM inline", func(t *testing.T) {
			dst := b.buf.Bytes[8192 : 8192+256]
			clear(dst)
			msg := []byte("inline payload carried in the WQE itself")
			require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 0xb2, SGL: []abi.SGE{b.mr.SGE(8192, 256)}}))
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa2, Opcode: abi.WRSendWithImm, Flags: abi.SendSignaled | abi.SendInline,
				Inline: msg, ImmData: 0xfeedf00d}))
			sc := pollN(t, a.scq, 1)
			rc := pollN(t, b.rcq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa2, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: qa}, sc[0])
			assert.Equal(t, abi.CQE{WrID: 0xb2, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: qb, ByteLen: uint32(len(msg)),
				WCFlags: abi.WCWithImm, ImmOrInv: 0xfeedf00d}, rc[0])
			assert.Equal(t, msg, dst[:len(msg)])
		}},
		{"RDMA WRITE, unsignaled then signaled", func(t *testing.T) {
			src := a.buf.Bytes[16384 : 16384+10000]
			fillRand(src, 3)
			dst := b.buf.Bytes[16384 : 16384+10000]
			clear(dst)
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa3, Opcode: abi.WRRDMAWrite,
				SGL: []abi.SGE{a.mr.SGE(16384, 6000)}, RemoteAddr: b.mr.Addr + 16384, RKey: b.mr.RKey}))
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa4, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(16384+6000, 4000)}, RemoteAddr: b.mr.Addr + 16384 + 6000, RKey: b.mr.RKey}))
			sc := pollN(t, a.scq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa4, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, sc[0])
			assert.Equal(t, src, dst, "both writes placed")
		}},
		{"RDMA WRITE_WITH_IMM", func(t *testing.T) {
			src := a.buf.Bytes[32768 : 32768+3000]
			fillRand(src, 4)
			dst := b.buf.Bytes[65536 : 65536+3000]
			clear(dst)
			require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 0xb5}))
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa5, Opcode: abi.WRRDMAWriteWithImm, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(32768, 3000)}, RemoteAddr: b.mr.Addr + 65536, RKey: b.mr.RKey, ImmData: 0x12345678}))
			sc := pollN(t, a.scq, 1)
			rc := pollN(t, b.rcq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa5, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: qa}, sc[0])
			assert.Equal(t, abi.CQE{WrID: 0xb5, Status: abi.WCSuccess, Opcode: abi.WCRecvRDMAWithImm, QPNum: qb, ByteLen: 3000,
				WCFlags: abi.WCWithImm, ImmOrInv: 0x12345678}, rc[0])
			assert.Equal(t, src, dst)
		}},
		{"RDMA READ", func(t *testing.T) {
			src := b.buf.Bytes[131072 : 131072+7000]
			fillRand(src, 5)
			dst := a.buf.Bytes[131072 : 131072+7000]
			clear(dst)
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa6, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(131072, 2000), a.mr.SGE(131072+2000, 5000)}, RemoteAddr: b.mr.Addr + 131072, RKey: b.mr.RKey}))
			sc := pollN(t, a.scq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa6, Status: abi.WCSuccess, Opcode: abi.WCRDMARead, QPNum: qa, ByteLen: 7000}, sc[0])
			assert.Equal(t, src, dst)
		}},
		{"CMP_AND_SWP hit and miss", func(t *testing.T) {
			word := b.buf.Bytes[200000:200008]
			binary.LittleEndian.PutUint64(word, 0x1111)
			res := a.buf.Bytes[200000:200008]
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa7, Opcode: abi.WRAtomicCmpAndSwp, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(200000, 8)}, RemoteAddr: b.mr.Addr + 200000, RKey: b.mr.RKey, CompareAdd: 0x1111, Swap: 0x2222}))
			sc := pollN(t, a.scq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa7, Status: abi.WCSuccess, Opcode: abi.WCCompSwap, QPNum: qa}, sc[0])
			assert.Equal(t, uint64(0x1111), binary.LittleEndian.Uint64(res), "original value returned")
			assert.Equal(t, uint64(0x2222), binary.LittleEndian.Uint64(word), "swapped")
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa8, Opcode: abi.WRAtomicCmpAndSwp, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(200000, 8)}, RemoteAddr: b.mr.Addr + 200000, RKey: b.mr.RKey, CompareAdd: 0x1111, Swap: 0x3333}))
			sc = pollN(t, a.scq, 1)
			assert.Equal(t, abi.CQE{WrID: 0xa8, Status: abi.WCSuccess, Opcode: abi.WCCompSwap, QPNum: qa}, sc[0])
			assert.Equal(t, uint64(0x2222), binary.LittleEndian.Uint64(res))
			assert.Equal(t, uint64(0x2222), binary.LittleEndian.Uint64(word), "compare failed: unchanged")
		}},
		{"FETCH_AND_ADD", func(t *testing.T) {
			word := b.buf.Bytes[200008:200016]
			binary.LittleEndian.PutUint64(word, 1000)
			res := a.buf.Bytes[200008:200016]
			for i := range 3 {
				require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 0xa9 + uint64(i), Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled,
					SGL: []abi.SGE{a.mr.SGE(200008, 8)}, RemoteAddr: b.mr.Addr + 200008, RKey: b.mr.RKey, CompareAdd: 7}))
				sc := pollN(t, a.scq, 1)
				assert.Equal(t, abi.CQE{WrID: 0xa9 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCFetchAdd, QPNum: qa}, sc[0])
				assert.Equal(t, uint64(1000+7*i), binary.LittleEndian.Uint64(res))
			}
			assert.Equal(t, uint64(1021), binary.LittleEndian.Uint64(word))
		}},
		{"SEND from B to A (the other direction)", func(t *testing.T) {
			src := b.buf.Bytes[300000:300100]
			fillRand(src, 9)
			dst := a.buf.Bytes[300000:300100]
			clear(dst)
			require.NoError(t, a.qp.PostRecv(&verbs.RecvWR{WrID: 0xac, SGL: []abi.SGE{a.mr.SGE(300000, 100)}}))
			require.NoError(t, b.qp.PostSend(&verbs.SendWR{WrID: 0xbc, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{b.mr.SGE(300000, 100)}}))
			assert.Equal(t, abi.CQE{WrID: 0xbc, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: qb}, pollN(t, b.scq, 1)[0])
			assert.Equal(t, abi.CQE{WrID: 0xac, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: qa, ByteLen: 100}, pollN(t, a.rcq, 1)[0])
			assert.Equal(t, src, dst)
		}},
	}
	for _, s := range steps {
		if !t.Run(s.name, s.run) {
			break // later steps assume the QPs are healthy
		}
	}
	noMore(t, a.scq, a.rcq, b.scq, b.rcq)

	// The engine's counters reach QUERY_QP.
	qra, err := a.qp.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTS, qra.Attr.QPState)
	assert.NotZero(t, qra.PacketsSent)
	assert.NotZero(t, qra.PacketsReceived)
}

func sum8(b []byte) (s byte) {
	for _, v := range b {
		s |= v
	}
	return s
}

// TestDataPlaneCompletionEvent: an armed CQ's completion channel is
// written when a completion arrives, and a QP posted to while the poller
// sleeps is woken through the kick eventfd.
func TestDataPlaneCompletionEvent(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.1.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.1.2", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU4096)
	// Let both sides go idle: the pollers advertise kick_needed and sleep
	// (the re-check after arming takes microseconds; the pause lets it
	// pass, and the second look shows nothing woke them).
	asleep := func() bool { return na.dp.Armed() && nb.dp.Armed() }
	require.Eventually(t, asleep, 10*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.True(t, asleep())
	require.NoError(t, b.rcq.ReqNotify(false))
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{b.mr.SGE(0, 64)}}))
	copy(a.buf.Bytes, "event")
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 2, Opcode: abi.WRSend, SGL: []abi.SGE{a.mr.SGE(0, 5)}}))
	require.Eventually(t, func() bool { return na.dp.PollerStats().Kicks > 0 }, 10*time.Second, time.Millisecond,
		"a post to a sleeping daemon writes the kick eventfd, which wakes the poller")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := b.ch.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n, "one event per arm")
	rc := pollN(t, b.rcq, 1)
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: 5}, rc[0])
	assert.Equal(t, "event", string(b.buf.Bytes[:5]))
	noMore(t, a.scq) // unsignaled send: no completion
}

// TestDataPlaneSolicitedEvent: a CQ armed for solicited completions only
// (ibv_req_notify_cq(cq, 1)) gets no event for a message sent without
// IBV_SEND_SOLICITED, and one for the next message sent with it (the SE
// bit travels in the BTH of its last packet); RDMA WRITE with immediate
// too.
func TestDataPlaneSolicitedEvent(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.1.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.1.2", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	wait := func(d time.Duration) (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return b.ch.Wait(ctx)
	}
	for i, wr := range []verbs.SendWR{
		{Opcode: abi.WRSend, SGL: []abi.SGE{a.mr.SGE(0, 3000)}},
		{Opcode: abi.WRRDMAWriteWithImm, ImmData: 9, SGL: []abi.SGE{a.mr.SGE(0, 100)}, RemoteAddr: b.mr.Addr + 8192, RKey: b.mr.RKey},
	} {
		require.NoError(t, b.rcq.ReqNotify(true))
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(10 * i), SGL: []abi.SGE{b.mr.SGE(0, 4096)}}))
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(10*i + 1), SGL: []abi.SGE{b.mr.SGE(0, 4096)}}))
		unsolicited := wr
		unsolicited.WrID = uint64(10 * i)
		require.NoError(t, a.qp.PostSend(&unsolicited))
		assert.Equal(t, uint64(10*i), pollN(t, b.rcq, 1)[0].WrID)
		_, err := wait(100 * time.Millisecond)
		require.ErrorIs(t, err, verbs.ErrTimeout, "%v without SOLICITED: no event under a solicited-only arm", wr.Opcode)
		solicited := wr
		solicited.WrID, solicited.Flags = uint64(10*i+1), abi.SendSolicited
		require.NoError(t, a.qp.PostSend(&solicited))
		n, err := wait(20 * time.Second)
		require.NoError(t, err, "%v with SOLICITED: an event", wr.Opcode)
		assert.Equal(t, uint64(1), n)
		assert.Equal(t, uint64(10*i+1), pollN(t, b.rcq, 1)[0].WrID)
	}
	noMore(t, a.scq, b.scq, b.rcq)
}

// requireState checks the QP's state as QUERY_QP reports it, once: the
// engine stores a state it enters on its own before it writes the
// completions that follow from it, so no waiting is needed.
func requireState(t testing.TB, qp *verbs.QP, want abi.QPState, msg string) {
	t.Helper()
	q, err := qp.Query()
	require.NoError(t, err)
	require.Equal(t, want, q.Attr.QPState, msg)
}

// TestDataPlaneRemoteAccessError: a WRITE to an rkey the peer never
// granted completes with REM_ACCESS_ERR, both QPs end in ERR (device
// state included, as QUERY_QP shows), and later WRs are flushed.
func TestDataPlaneRemoteAccessError(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.2.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.2.2", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	ro, err := b.ctx.Alloc(4096, 4096)
	require.NoError(t, err)
	roMR, err := b.pd.RegMR(ro, abi.AccessLocalWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 10, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 16)}, RemoteAddr: roMR.Addr, RKey: roMR.RKey}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 11, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 16)}}))
	sc := pollN(t, a.scq, 2)
	assert.Equal(t, abi.CQE{WrID: 10, Status: abi.WCRemAccessErr, Opcode: abi.WCRDMAWrite, QPNum: a.qp.QPN, VendorErr: 1}, sc[0])
	assert.Equal(t, abi.CQE{WrID: 11, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qp.QPN}, sc[1])
	requireState(t, a.qp, abi.QPSErr, "the QP is in ERR as soon as its error completion is visible")
	// The responder's QP went to ERR too (class C error, IBTA 9.9.3.1.3):
	// a receive posted now is flushed.
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 20}))
	rc := pollN(t, b.rcq, 1)
	assert.Equal(t, abi.CQE{WrID: 20, Status: abi.WCWRFlushErr, Opcode: abi.WCRecv, QPNum: b.qp.QPN}, rc[0])
	requireState(t, b.qp, abi.QPSErr, "the responder's QP is in ERR")

	// RESET and reconnect: the QPs work again (nothing stale is replayed).
	for _, c := range []*dpClient{a, b} {
		require.NoError(t, c.qp.Modify(&abi.QPAttr{QPState: abi.QPSReset}, abi.QPAttrState))
	}
	connectRC(t, a, b, abi.MTU1024)
	copy(a.buf.Bytes[:4], "anew")
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 21, SGL: []abi.SGE{b.mr.SGE(100, 4)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 12, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 4)}}))
	assert.Equal(t, abi.CQE{WrID: 12, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: a.qp.QPN}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, abi.CQE{WrID: 21, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: 4}, pollN(t, b.rcq, 1)[0])
	assert.Equal(t, "anew", string(b.buf.Bytes[100:104]))
	q, err := a.qp.Query()
	require.NoError(t, err)
	assert.Equal(t, abi.QPSRTS, q.Attr.QPState)
}

// TestDataPlaneMemErrors: every dma error of the hot path maps to the
// engine class that picks the completion status, and keeps the dma cause.
func TestDataPlaneMemErrors(t *testing.T) {
	for _, c := range []struct {
		in   error
		want error
	}{
		{dma.ErrBadKey, engine.ErrMemProtection},
		{dma.ErrWrongPD, engine.ErrMemProtection},
		{dma.ErrAccess, engine.ErrMemProtection},
		{dma.ErrLength, engine.ErrMemLength},
		{dma.ErrBounds, engine.ErrMemBounds},
		{dma.ErrMisaligned, engine.ErrMemBounds},
		{dma.ErrSegments, engine.ErrMemProtection},
	} {
		t.Run(c.in.Error(), func(t *testing.T) {
			err := dataplane.MemErrOf(c.in)
			assert.ErrorIs(t, err, c.want)
			assert.ErrorIs(t, err, c.in)
			for _, other := range []error{engine.ErrMemProtection, engine.ErrMemLength, engine.ErrMemBounds} {
				if other != c.want {
					assert.False(t, errors.Is(err, other), "only one class")
				}
			}
		})
	}
	assert.NoError(t, dataplane.MemErrOf(nil))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = dataplane.MemErrOf(dma.ErrBounds) }))
}

// TestDataPlaneBadWQE: a WQE the daemon cannot accept (an opcode the
// device does not support) completes with LOC_QP_OP_ERR, the QP goes to
// ERR and the WRs behind it are flushed.
func TestDataPlaneBadWQE(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.3.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.3.2", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WROpcode(10), Flags: abi.SendSignaled}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 2, Opcode: abi.WRSend}))
	sc := pollN(t, a.scq, 2)
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCLocQPOpErr, Opcode: abi.WCSend, QPNum: a.qp.QPN, VendorErr: 1}, sc[0])
	assert.Equal(t, abi.CQE{WrID: 2, Status: abi.WCWRFlushErr, Opcode: abi.WCSend, QPNum: a.qp.QPN}, sc[1])
	requireState(t, a.qp, abi.QPSErr, "the QP is in ERR as soon as its error completion is visible")
}

// TestDataPlaneCQOverflow: completions the client does not reap overflow
// the CQ; the overflow word is set, the QP goes to ERR in the engine and
// the device, and later completions are not written over unread ones.
func TestDataPlaneCQOverflow(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.4.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.4.2", 1, nil)
	a := newDPClient(t, na, 2) // 2 entries
	b := newDPClient(t, nb, 64)
	connectRC(t, a, b, abi.MTU1024)
	for i := range 4 {
		require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []abi.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}))
	}
	require.Eventually(t, a.scq.Overflowed, 10*time.Second, time.Millisecond, "overflow flagged")
	require.Eventually(t, func() bool {
		q, err := a.qp.Query()
		return err == nil && q.Attr.QPState == abi.QPSErr
	}, 10*time.Second, time.Millisecond, "the QP is moved to ERR")
	sc := pollN(t, a.scq, 2)
	assert.Equal(t, abi.CQE{WrID: 0, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: a.qp.QPN}, sc[0])
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCSuccess, Opcode: abi.WCRDMAWrite, QPNum: a.qp.QPN}, sc[1])
	noMore(t, a.scq)
}

// TestDataPlaneSharedSRQ: two QPs of one device, owned by different
// workers, share an SRQ and a CQ; messages from two peers arrive
// concurrently and every receive WQE is used exactly once.
func TestDataPlaneSharedSRQ(t *testing.T) {
	const perQP = 48
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.5.1", 2, nil)
	nb := newDPNode(t, nw, "10.0.5.2", 2, nil)
	a := newDPClient(t, na, 256)
	b := newDPClient(t, nb, 256)
	srq, err := b.pd.CreateSRQ(2*perQP, 1, 0)
	require.NoError(t, err)
	qcap := abi.QPCap{MaxSendWR: 64, MaxSendSGE: 1}
	var bq []*verbs.QP
	for len(bq) < 2 {
		q, err := b.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: b.scq, RecvCQ: b.rcq, SRQ: srq, Cap: qcap})
		require.NoError(t, err)
		if len(bq) == 1 && roce.SteerQueue(q.QPN, 2) == roce.SteerQueue(bq[0].QPN, 2) {
			continue // want the two QPs on different workers
		}
		bq = append(bq, q)
	}
	aq := []*verbs.QP{a.qp}
	q2, err := a.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: a.scq, RecvCQ: a.rcq, Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	aq = append(aq, q2)
	for i := range 2 {
		connectQPs(t, aq[i], na.gid, bq[i], nb.gid, abi.MTU1024)
	}
	const msg = 64
	for i := range 2 * perQP {
		require.NoError(t, srq.PostRecv(&verbs.RecvWR{WrID: uint64(1000 + i), SGL: []abi.SGE{b.mr.SGE(uint32(i*msg), msg)}}))
	}
	for i := range 2 * perQP {
		binary.LittleEndian.PutUint64(a.buf.Bytes[i*msg:], uint64(i))
	}
	for k := range perQP {
		for i, q := range aq {
			id := 2*k + i
			require.NoError(t, q.PostSend(&verbs.SendWR{WrID: uint64(id), Opcode: abi.WRSend, SGL: []abi.SGE{a.mr.SGE(uint32(id*msg), msg)}}))
		}
	}
	rc := pollN(t, b.rcq, 2*perQP)
	wrs := map[uint64]bool{}
	perQPN := map[uint32]int{}
	got := map[uint64]bool{}
	for _, c := range rc {
		assert.Equal(t, abi.WCSuccess, c.Status)
		assert.Equal(t, abi.WCRecv, c.Opcode)
		assert.Equal(t, uint32(msg), c.ByteLen)
		assert.False(t, wrs[c.WrID], "receive WQE %d used twice", c.WrID)
		wrs[c.WrID] = true
		perQPN[c.QPNum]++
		slot := int(c.WrID - 1000)
		got[binary.LittleEndian.Uint64(b.buf.Bytes[slot*msg:])] = true
	}
	assert.Equal(t, map[uint32]int{bq[0].QPN: perQP, bq[1].QPN: perQP}, perQPN)
	assert.Len(t, got, 2*perQP, "every message landed in its own buffer")
	noMore(t, b.rcq)
}

// TestDataPlaneLossyLink runs SEND, WRITE, READ and FETCH_AND_ADD through
// the rings and doorbells over a link that drops, duplicates and reorders
// frames (seeded): every WR completes once, successfully, in order, and
// the data and the atomic word are exactly what a perfect link gives.
func TestDataPlaneLossyLink(t *testing.T) {
	const seed = 0x10557
	t.Logf("fault seed %#x", seed)
	f := link.Faults{Seed: seed, Drop: 0.02, Duplicate: 0.01, Reorder: 0.02}
	fb := f
	fb.Seed += 100
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.6.1", 2, &f)
	nb := newDPNode(t, nw, "10.0.6.2", 2, &fb)
	a := newDPClient(t, na, 256)
	b := newDPClient(t, nb, 256)
	connectQPsTimeout(t, a.qp, na.gid, b.qp, nb.gid, abi.MTU1024, 12) // ~17 ms ACK timeout
	const rounds, size = 60, 3000
	for i := range rounds {
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(i), SGL: []abi.SGE{b.mr.SGE(uint32(i*size), size)}}))
	}
	want := make([]byte, rounds*size)
	fillRand(want, seed)
	copy(a.buf.Bytes, want)
	const wordOff = 900000
	binary.LittleEndian.PutUint64(b.buf.Bytes[wordOff:], 0)
	var posted int
	post := func(wr *verbs.SendWR) {
		t.Helper()
		for {
			err := a.qp.PostSend(wr)
			if !errors.Is(err, verbs.ErrQueueFull) {
				require.NoError(t, err)
				posted++
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	var got []abi.CQE
	wc := make([]abi.CQE, 32)
	reap := func() {
		n := a.scq.Poll(wc)
		for i := range n {
			wc[i].Owner = 0
			got = append(got, wc[i])
		}
	}
	for i := range rounds {
		off := uint32(i * size)
		post(&verbs.SendWR{WrID: uint64(4 * i), Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(off, size)}})
		post(&verbs.SendWR{WrID: uint64(4*i + 1), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(off, size)},
			RemoteAddr: b.mr.Addr + 400000 + uint64(off), RKey: b.mr.RKey})
		post(&verbs.SendWR{WrID: uint64(4*i + 2), Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(400000+off, size)},
			RemoteAddr: b.mr.Addr + uint64(off), RKey: b.mr.RKey})
		post(&verbs.SendWR{WrID: uint64(4*i + 3), Opcode: abi.WRAtomicFetchAdd, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(uint32(wordOff+8*(i%8)), 8)},
			RemoteAddr: b.mr.Addr + wordOff, RKey: b.mr.RKey, CompareAdd: 1})
		reap()
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < posted && time.Now().Before(deadline) {
		reap()
		time.Sleep(100 * time.Microsecond)
	}
	require.Len(t, got, posted, "every WR completes")
	ops := []abi.WCOpcode{abi.WCSend, abi.WCRDMAWrite, abi.WCRDMARead, abi.WCFetchAdd}
	for i, c := range got {
		want := abi.CQE{WrID: uint64(i), Status: abi.WCSuccess, Opcode: ops[i%4], QPNum: a.qp.QPN}
		if i%4 == 2 {
			want.ByteLen = size
		}
		require.Equal(t, want, c, "completion %d, in order", i)
	}
	rc := pollN(t, b.rcq, rounds)
	for i, c := range rc {
		assert.Equal(t, abi.CQE{WrID: uint64(i), Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: size}, c)
	}
	assert.Equal(t, want, b.buf.Bytes[:rounds*size], "SEND data")
	assert.Equal(t, want, b.buf.Bytes[400000:400000+rounds*size], "WRITE data")
	// The READs fetched what the SENDs placed at B, i.e. want.
	assert.Equal(t, want, a.buf.Bytes[400000:400000+rounds*size], "READ data")
	assert.Equal(t, uint64(rounds), binary.LittleEndian.Uint64(b.buf.Bytes[wordOff:]), "every FETCH_AND_ADD applied once")
	noMore(t, a.scq, b.rcq)
	qa, err := a.qp.Query()
	require.NoError(t, err)
	qb, err := b.qp.Query()
	require.NoError(t, err)
	t.Logf("retransmissions: a %d, b %d", qa.Retransmits, qb.Retransmits)
}

// TestDataPlaneNoSyscallWhilePolling: while the doorbell poller polls
// (here: a budget it never exhausts), the daemon never advertises
// kick_needed, so clients post without writing the kick eventfd, and the
// work still reaches the engine.
func TestDataPlaneNoSyscallWhilePolling(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNodeSpin(t, nw, "10.0.7.1", 1, nil, 1<<40)
	nb := newDPNodeSpin(t, nw, "10.0.7.2", 1, nil, 1<<40)
	a := newDPClient(t, na, 256)
	b := newDPClient(t, nb, 256)
	connectRC(t, a, b, abi.MTU1024)
	for i := range 100 {
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(i), SGL: []abi.SGE{b.mr.SGE(uint32(64*i), 64)}}))
		require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 64)}}))
		if i%32 == 31 {
			pollN(t, a.scq, 32)
		}
	}
	pollN(t, a.scq, 4)
	pollN(t, b.rcq, 100)
	for _, n := range []*dpNode{na, nb} {
		st := n.dp.PollerStats()
		assert.Zero(t, st.Sleeps, "the poller never slept")
		assert.Zero(t, n.dp.DrainKicks(), "no client wrote the kick eventfd")
		assert.NotZero(t, st.Passes)
	}
}

// TestDataPlaneTooManySGE: a send WQE whose num_sge exceeds the QP's
// max_send_sge (written by a client that does not check, straight into
// its ring) completes with LOC_LEN_ERR (IBTA 10.8.3.3: a local length
// error), the QP is in ERR at once, and the WR behind it is flushed.
func TestDataPlaneTooManySGE(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.3.3", 1, nil)
	nb := newDPNode(t, nw, "10.0.3.4", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	rec, ring, ok := na.dp.QPRings(a.qp.QPN)
	require.True(t, ok)
	pi := rec.SQPI.Load()
	stride := len(ring) / int(a.qp.Cap.MaxSendWR)
	slot := ring[(pi&(a.qp.Cap.MaxSendWR-1))*uint32(stride):][:stride]
	w := abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, NumSGE: uint8(a.qp.Cap.MaxSendSGE + 1)}
	w.Put(slot)
	rec.SQPI.Store(pi + 1)
	na.dp.KickQP(a.qp.QPN) // as a client does when the daemon sleeps
	sc := pollN(t, a.scq, 1)
	assert.Equal(t, abi.CQE{WrID: 1, Status: abi.WCLocLenErr, Opcode: abi.WCSend, QPNum: a.qp.QPN, VendorErr: 1}, sc[0])
	requireState(t, a.qp, abi.QPSErr, "the QP is in ERR as soon as its error completion is visible")
	noMore(t, b.rcq) // nothing of it went on the wire
}

// TestDataPlaneResponderRingError: the responder's client publishes an
// impossible RQ producer index; an arriving SEND finds the ring broken.
// The responder's client gets an error completion on its receive CQ
// (LOC_QP_OP_ERR) and its QP is in ERR at once; the requester gets a NAK
// (REM_OP_ERR) and its QP goes to ERR too.
func TestDataPlaneResponderRingError(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.3.5", 1, nil)
	nb := newDPNode(t, nw, "10.0.3.6", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	rec, _, ok := nb.dp.QPRings(b.qp.QPN)
	require.True(t, ok)
	rec.RQPI.Store(rec.RQCI.Load() + 4*b.qp.Cap.MaxRecvWR) // more posted than the ring holds
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 16)}}))
	rc := pollN(t, b.rcq, 1)
	assert.Equal(t, abi.WCLocQPOpErr, rc[0].Status, "%+v", rc[0])
	assert.Equal(t, b.qp.QPN, rc[0].QPNum)
	requireState(t, b.qp, abi.QPSErr, "QUERY_QP agrees with the engine")
	sc := pollN(t, a.scq, 1)
	assert.Equal(t, abi.WCRemOpErr, sc[0].Status)
	requireState(t, a.qp, abi.QPSErr, "the requester's QP is in ERR")
}

// TestDataPlaneStaleRingEntries: work requests published while a queue
// takes none (the RQ in RESET, the SQ before RTS; the verbs library
// refuses such posts, the Go client here does not, as any other writer of
// the ring might not) never run: the daemon discards them when the queue
// starts taking work, and what is posted afterwards runs in order.
func TestDataPlaneStaleRingEntries(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.2.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.2.2", 1, nil)
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	copy(a.buf.Bytes[:8], "stale-aa")
	copy(a.buf.Bytes[8:16], "fresh-bb")
	// In RESET: a receive on b, a send on a.
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{b.mr.SGE(0, 8)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 2, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	// In INIT: a receive on b is legal (it stays); a send on a is not.
	for _, c := range []*dpClient{a, b} {
		require.NoError(t, c.qp.ToInit(abi.AccessAll, 0))
	}
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 3, SGL: []abi.SGE{b.mr.SGE(100, 8)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 4, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	for _, c := range []*dpClient{a, b} {
		require.NoError(t, c.qp.Modify(&abi.QPAttr{QPState: abi.QPSReset}, abi.QPAttrState))
	}
	// Once more in RESET, then connect (INIT, RTR, RTS) and post for real.
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 5, SGL: []abi.SGE{b.mr.SGE(0, 8)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 6, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	connectRC(t, a, b, abi.MTU1024)
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 7, SGL: []abi.SGE{b.mr.SGE(200, 8)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 8, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(8, 8)}}))
	assert.Equal(t, abi.CQE{WrID: 8, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: a.qp.QPN}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, abi.CQE{WrID: 7, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: 8}, pollN(t, b.rcq, 1)[0])
	assert.Equal(t, "fresh-bb", string(b.buf.Bytes[200:208]))
	assert.Equal(t, make([]byte, 8), b.buf.Bytes[0:8], "no stale receive took data")
	// A second exchange proves nothing stale sits ahead in either ring.
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 9, SGL: []abi.SGE{b.mr.SGE(300, 8)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 10, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 8)}}))
	assert.Equal(t, abi.CQE{WrID: 10, Status: abi.WCSuccess, Opcode: abi.WCSend, QPNum: a.qp.QPN}, pollN(t, a.scq, 1)[0])
	assert.Equal(t, abi.CQE{WrID: 9, Status: abi.WCSuccess, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: 8}, pollN(t, b.rcq, 1)[0])
	assert.Equal(t, "stale-aa", string(b.buf.Bytes[300:308]))
	noMore(t, a.scq, b.rcq)
}
