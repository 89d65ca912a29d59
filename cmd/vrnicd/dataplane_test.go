package main

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/verbs"
)

func TestParseConfigLocalAlias(t *testing.T) {
	c, err := parseConfig([]string{"-link", "udp", "-local", "127.0.0.2:4791", "-workers", "2"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.2:4791", c.Link.Local)
	assert.Equal(t, 2, c.Workers)
	c, err = parseConfig([]string{"-config", writeFile(t, `{"name":"f","link":{"type":"udp","local":"10.0.0.9:4791"}}`), "-local", "10.0.0.7:4791"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.7:4791", c.Link.Local, "the flag overrides the file")
}

// TestRunLoopbackTraffic runs the daemon with each link and two worker
// threads; two clients connect an RC QP pair through it (both at the
// daemon's GID: over UDP the frames leave by the daemon's socket and come
// back to it) and move data both ways with SEND and RDMA WRITE.
func TestRunLoopbackTraffic(t *testing.T) {
	for _, link := range []string{"mem", "udp"} {
		t.Run(link, func(t *testing.T) {
			args := []string{"-link", link, "-workers", "2"}
			if link == "udp" {
				args = append(args, "-local", freeLoopback(t).String())
			}
			loopbackTraffic(t, args)
		})
	}
}

func loopbackTraffic(t *testing.T, extra []string) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-name", "m0", "-runtime-dir", dir}, extra...), &syncWriter{w: &logs})
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	defer stop()
	sock := admin.SocketPath(dir, "m0")
	require.Eventually(t, func() bool {
		_, err := admin.Serving(sock)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond)

	a, b := connectedPair(t, sock)
	poll := func(cq *verbs.CQ) abi.CQE { return pollOne(t, cq) }
	copy(a.buf.Bytes, "hello over the daemon")
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{b.mr.SGE(0, 64)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 2, Opcode: abi.WRSend, SGL: []abi.SGE{a.mr.SGE(0, 21)}}))
	assert.Equal(t, abi.CQE{WrID: 2, Opcode: abi.WCSend, QPNum: a.qp.QPN}, poll(a.cq))
	assert.Equal(t, abi.CQE{WrID: 1, Opcode: abi.WCRecv, QPNum: b.qp.QPN, ByteLen: 21}, poll(b.cq))
	assert.Equal(t, "hello over the daemon", string(b.buf.Bytes[:21]))

	copy(b.buf.Bytes[4096:], "written back")
	require.NoError(t, b.qp.PostSend(&verbs.SendWR{WrID: 3, Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{b.mr.SGE(4096, 12)},
		RemoteAddr: a.mr.Addr + 1000, RKey: a.mr.RKey}))
	assert.Equal(t, abi.CQE{WrID: 3, Opcode: abi.WCRDMAWrite, QPNum: b.qp.QPN}, poll(b.cq))
	assert.Equal(t, "written back", string(a.buf.Bytes[1000:1012]))
	q, err := a.qp.Query()
	require.NoError(t, err)
	assert.NotZero(t, q.PacketsSent)
	// The daemon's data-path totals count both QPs' traffic, and keep
	// a destroyed QP's.
	adm, err := admin.Dial(sock)
	require.NoError(t, err)
	defer adm.Close()
	info, err := adm.Info()
	require.NoError(t, err)
	tot := info.DataPath
	assert.GreaterOrEqual(t, tot.PacketsSent, q.PacketsSent+1, "a's SEND and b's WRITE")
	assert.NotZero(t, tot.PacketsReceived)
	assert.Equal(t, uint64(2), tot.SendCQEs)
	assert.Equal(t, uint64(1), tot.RecvCQEs)
	require.NoError(t, a.qp.Destroy())
	info, err = adm.Info()
	require.NoError(t, err)
	assert.Equal(t, uint64(2), info.DataPath.SendCQEs)
	assert.GreaterOrEqual(t, info.DataPath.PacketsSent, tot.PacketsSent)
	stop()
	assert.Contains(t, logs.String(), "data_path=true")
	assert.Contains(t, logs.String(), "engine stopped")
}

// rcSide is one end of connectedPair: a QP with its buffer and GID.
type rcSide struct {
	*rcEnd
	addr abi.RespQueryGID
}

// connectedPair opens two RC ends on the daemon at sock and connects them
// to each other (RTS both ways).
func connectedPair(t *testing.T, sock string) (a, b *rcSide) {
	t.Helper()
	open := func() *rcSide {
		e := openRCEnd(t, sock)
		gid, err := e.c.QueryGID(1, 0)
		require.NoError(t, err)
		return &rcSide{rcEnd: e, addr: gid}
	}
	a, b = open(), open()
	for _, p := range [][2]*rcSide{{a, b}, {b, a}} {
		l, r := p[0], p[1]
		require.NoError(t, l.qp.ToInit(abi.AccessAll, 0))
		require.NoError(t, l.qp.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: r.addr.GID, PortNum: 1, HopLimit: 64},
			PathMTU: abi.MTU1024, DestQPN: r.qp.QPN, RQPSN: 100, MaxDestRdAtomic: 1, MinRNRTimer: 1}))
		require.NoError(t, l.qp.ToRTS(verbs.RTSAttr{SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}))
	}
	return a, b
}

// pollOne waits up to 10 s for one completion on cq.
func pollOne(t *testing.T, cq *verbs.CQ) abi.CQE {
	t.Helper()
	wc := make([]abi.CQE, 1)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cq.Poll(wc) == 1 {
			wc[0].Owner = 0
			return wc[0]
		}
		time.Sleep(50 * time.Microsecond)
	}
	require.Fail(t, "no completion")
	return abi.CQE{}
}

// freeLoopback returns a 127.0.0.0/8 address whose UDP port 4791 is free
// (any 127/8 address is loopback on Linux).
func freeLoopback(t testing.TB) netip.AddrPort {
	t.Helper()
	for range 100 {
		ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(250)), byte(rand.IntN(256)), byte(1 + rand.IntN(250))}), 4791)
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(ap))
		if err == nil {
			c.Close()
			return ap
		}
	}
	t.Fatal("no free 127.0.0.0/8 address with UDP port 4791")
	return netip.AddrPort{}
}

// TestRunUDPLink: with -link udp the daemon binds its UDP link (one
// socket per worker on -local) before it serves, releases it when it
// stops, and refuses to start when the address is taken.
func TestRunUDPLink(t *testing.T) {
	local := freeLoopback(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var logs strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-name", "u0", "-runtime-dir", dir, "-link", "udp", "-local", local.String(), "-workers", "2"}, &syncWriter{w: &logs})
	}()
	sock := admin.SocketPath(dir, "u0")
	require.Eventually(t, func() bool {
		_, err := admin.Serving(sock)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "%s", &logs)
	_, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(local))
	assert.True(t, errors.Is(err, syscall.EADDRINUSE), "the link holds %v: %v", local, err)

	// A second daemon on the same address fails cleanly.
	var logs2 strings.Builder
	err = run(context.Background(), []string{"-name", "u1", "-runtime-dir", dir, "-link", "udp", "-local", local.String()}, &syncWriter{w: &logs2})
	assert.ErrorContains(t, err, "in use")
	assert.NoFileExists(t, admin.SocketPath(dir, "u1"))

	cancel()
	require.NoError(t, <-done)
	assert.Contains(t, logs.String(), "UDP link up")
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(local))
	require.NoError(t, err, "released at exit")
	c.Close()
}

// rcEnd is a client context with one RC QP (every WR signaled), its CQ
// and an MR over 8 KiB of its memory.
type rcEnd struct {
	c   *verbs.Context
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

// openRCEnd opens it on the daemon at sock; t's cleanup closes it.
func openRCEnd(t *testing.T, sock string) *rcEnd {
	t.Helper()
	c, err := verbs.Open(sock, verbs.WithClientName(t.Name()))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, SigAll: true,
		Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	buf, err := c.Alloc(8192, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessAll)
	require.NoError(t, err)
	return &rcEnd{c: c, cq: cq, qp: qp, buf: buf, mr: mr}
}
