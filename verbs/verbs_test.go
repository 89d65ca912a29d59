package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/devicetest"
	"golang.org/x/sys/unix"
)

func startServer(t testing.TB) *devicetest.Server {
	t.Helper()
	s, err := devicetest.Start(devicetest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func openCtx(t testing.TB, s *devicetest.Server) *Context {
	t.Helper()
	c, err := Open(s.SocketPath, WithClientName("verbs-test"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

type fixture struct {
	c      *Context
	pd     *PD
	cq     *CQ
	ch     *CompChannel
	qp     *QP
	mr     *MR
	buf    *Buffer
	remote abi.AHAttr
}

func newFixture(t testing.TB, typ abi.QPType) *fixture {
	t.Helper()
	s := startServer(t)
	c := openCtx(t, s)
	ch, err := NewCompChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() })
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(4, ch)
	require.NoError(t, err)
	qp, err := pd.CreateQP(QPInitAttr{Type: typ, SendCQ: cq, RecvCQ: cq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 5, MaxRecvSGE: 3, MaxInlineData: 100}})
	require.NoError(t, err)
	buf, err := c.Alloc(64<<10, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite)
	require.NoError(t, err)
	return &fixture{c: c, pd: pd, cq: cq, ch: ch, qp: qp, mr: mr, buf: buf}
}

func TestCreateQPGeometry(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	// 5 SGEs need 2 blocks, 100 inline bytes 2 blocks: 1+2 blocks per slot.
	assert.Equal(t, uint32(3*64), f.qp.sq.stride)
	assert.Equal(t, abi.RQWQESize(3), f.qp.rq.stride)
	assert.Equal(t, uint32(4), f.qp.Cap.MaxSendWR)
	assert.Len(t, f.qp.sq.ring.Bytes, 4*3*64)
	assert.Zero(t, f.qp.sq.ring.PA%64)
}

func TestPostSendWritesWQEAndDoorbell(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	qp := f.qp
	sgl := []abi.SGE{f.mr.SGE(0, 100), f.mr.SGE(4096, 200), f.mr.SGE(8192, 300), f.mr.SGE(100, 1), f.mr.SGE(200, 2)}
	wr := SendWR{WrID: 0xabc, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, SGL: sgl, RemoteAddr: 0x1000, RKey: 0x55}
	require.NoError(t, qp.PostSend(&wr))
	var w abi.SendWQE
	w.Decode(qp.sq.ring.Bytes[:64])
	assert.Equal(t, uint64(0xabc), w.WrID)
	assert.Equal(t, abi.WRRDMAWrite, w.Opcode)
	assert.Equal(t, abi.SendSignaled, w.Flags)
	assert.Equal(t, uint8(5), w.NumSGE)
	assert.Equal(t, uint64(0x1000), w.RemoteAddr)
	assert.Equal(t, uint32(0x55), w.RKey)
	for i, want := range sgl {
		var g abi.SGE
		g.Decode(qp.sq.ring.Bytes[64+16*i:])
		assert.Equal(t, want, g)
	}
	assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(qp.rec[abi.OffDBSQPI:]))

	// Inline data lands after the control block.
	msg := []byte("inline payload")
	require.NoError(t, qp.PostSend(&SendWR{WrID: 2, Opcode: abi.WRSend, Flags: abi.SendInline, Inline: msg}))
	slot := qp.sq.ring.Bytes[qp.sq.stride:]
	w.Decode(slot)
	assert.Equal(t, uint32(len(msg)), w.InlineLen)
	assert.Zero(t, w.NumSGE)
	assert.Equal(t, msg, slot[64:64+len(msg)])
	assert.Equal(t, uint32(2), binary.LittleEndian.Uint32(qp.rec[abi.OffDBSQPI:]))

	// Too many SGEs or inline bytes.
	assert.ErrorIs(t, qp.PostSend(&SendWR{SGL: make([]abi.SGE, 6)}), ErrTooMany)
	assert.ErrorIs(t, qp.PostSend(&SendWR{Flags: abi.SendInline, Inline: make([]byte, 101)}), ErrTooMany)

	// The ring holds 4: two more fit, the fifth waits for the daemon's
	// consumer index.
	require.NoError(t, qp.PostSend(&wr))
	require.NoError(t, qp.PostSend(&wr))
	assert.ErrorIs(t, qp.PostSend(&wr), ErrQueueFull)
	binary.LittleEndian.PutUint32(qp.rec[abi.OffDBSQCI:], 1) // as the daemon would
	require.NoError(t, qp.PostSend(&wr))
	var w5 abi.SendWQE
	w5.Decode(qp.sq.ring.Bytes[:64]) // slot 4 & 3 == 0: wrapped
	assert.Equal(t, uint64(0xabc), w5.WrID)
	assert.Equal(t, uint32(5), binary.LittleEndian.Uint32(qp.rec[abi.OffDBSQPI:]))
}

func kickCount(t *testing.T, c *Context) uint64 {
	var b [8]byte
	n, err := unix.Read(c.kickFd, b[:])
	if errors.Is(err, unix.EAGAIN) {
		return 0
	}
	require.NoError(t, err)
	require.Equal(t, 8, n)
	return binary.LittleEndian.Uint64(b[:])
}

func TestKickOnlyWhenDaemonSleeps(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	require.True(t, f.c.kickGen, "the daemon numbers its sleeps (abi.DBDaemonKickGen)")
	setKick := func(v uint32) { binary.LittleEndian.PutUint32(f.c.dbPage[abi.OffDBKickNeeded:], v) }
	wr := SendWR{Opcode: abi.WRSend, SGL: []abi.SGE{f.mr.SGE(0, 8)}}
	rwr := &RecvWR{WrID: 1, SGL: []abi.SGE{f.mr.SGE(0, 8)}}
	require.NoError(t, f.qp.PostSend(&wr))
	assert.Zero(t, kickCount(t, f.c), "daemon polling: no kick")

	// A daemon that does not number its sleeps: every post while it
	// sleeps kicks.
	f.c.kickGen = false
	setKick(1) // the daemon goes to sleep
	require.NoError(t, f.qp.PostSend(&wr))
	require.NoError(t, f.qp.PostRecv(rwr))
	assert.Equal(t, uint64(2), kickCount(t, f.c))

	// One that does: one kick per sleep, whatever the posts.
	f.c.kickGen = true
	require.NoError(t, f.qp.PostSend(&wr))
	require.NoError(t, f.qp.PostRecv(rwr))
	assert.Equal(t, uint64(1), kickCount(t, f.c), "one kick per sleep")
	setKick(2) // woke, and sleeps again
	require.NoError(t, f.qp.PostRecv(rwr))
	require.NoError(t, f.qp.PostSend(&wr))
	assert.Equal(t, uint64(1), kickCount(t, f.c), "one kick for the next sleep")
	setKick(0) // polling: what was kicked for is forgotten
	require.NoError(t, f.qp.PostRecv(rwr))
	assert.Zero(t, kickCount(t, f.c))
	setKick(2) // the same value after a 0 is a new sleep
	ch, err := NewCompChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() })
	cq, err := f.c.CreateCQ(4, ch)
	require.NoError(t, err)
	require.NoError(t, cq.ReqNotify(false))
	assert.Equal(t, uint64(1), kickCount(t, f.c), "arming a CQ kicks too")
}

func TestPostRecv(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	sgl := []abi.SGE{f.mr.SGE(0, 10), f.mr.SGE(64, 20), f.mr.SGE(128, 30)}
	require.NoError(t, f.qp.PostRecv(&RecvWR{WrID: 77, SGL: sgl}))
	var r abi.RecvWQE
	r.Decode(f.qp.rq.ring.Bytes)
	assert.Equal(t, abi.RecvWQE{WrID: 77, NumSGE: 3}, r)
	for i, want := range sgl {
		var g abi.SGE
		g.Decode(f.qp.rq.ring.Bytes[16+16*i:])
		assert.Equal(t, want, g)
	}
	assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(f.qp.rec[abi.OffDBRQPI:]))
	assert.ErrorIs(t, f.qp.PostRecv(&RecvWR{SGL: make([]abi.SGE, 4)}), ErrTooMany)

	srq, err := f.pd.CreateSRQ(2, 1, 0)
	require.NoError(t, err)
	require.NoError(t, srq.PostRecv(&RecvWR{WrID: 5, SGL: sgl[:1]}))
	require.NoError(t, srq.PostRecv(&RecvWR{WrID: 6}))
	assert.ErrorIs(t, srq.PostRecv(&RecvWR{WrID: 7}), ErrQueueFull)
	assert.Equal(t, uint32(2), binary.LittleEndian.Uint32(srq.rec[abi.OffDBSRQPI:]))

	qp, err := f.pd.CreateQP(QPInitAttr{Type: abi.QPTRC, SendCQ: f.cq, RecvCQ: f.cq, SRQ: srq, Cap: abi.QPCap{MaxSendWR: 1}})
	require.NoError(t, err)
	assert.ErrorIs(t, qp.PostRecv(&RecvWR{WrID: 8}), ErrNoRQ)
}

// produce writes CQE index i into the ring as the daemon does: body
// first, then the tail word with the owner bit.
func produce(cq *CQ, i uint32, wrID uint64) {
	slot := cq.ring.Bytes[(i&cq.mask)*abi.SizeofCQE:]
	e := abi.CQE{WrID: wrID, ByteLen: uint32(wrID), QPNum: 9, Opcode: abi.WCRecv, Owner: abi.CQEPhase(i, cq.n)}
	e.PutBody(slot)
	store32(slot[abi.OffCQETail:], e.TailWord())
}

func TestPollCQPhaseAndWrap(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	cq := f.cq
	require.Equal(t, 4, cq.Len())
	wc := make([]abi.CQE, 8)
	assert.Zero(t, cq.Poll(wc), "a zeroed ring holds no completion")
	next := uint64(0)
	for pass := range 3 { // three trips around the ring: phases 1, 0, 1
		for range 3 {
			produce(cq, uint32(next), next)
			next++
		}
		n := cq.Poll(wc[:2])
		require.Equal(t, 2, n, "pass %d", pass)
		n += cq.Poll(wc[2:])
		require.Equal(t, 3, n)
		for i := range 3 {
			assert.Equal(t, next-3+uint64(i), wc[i].WrID)
			assert.Equal(t, abi.WCRecv, wc[i].Opcode)
		}
		assert.Equal(t, uint32(next), binary.LittleEndian.Uint32(cq.rec[abi.OffDBCQCI:]))
		assert.Zero(t, cq.Poll(wc))
	}
}

func TestReqNotifyAndWait(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	require.NoError(t, f.cq.ReqNotify(false))
	arm := binary.LittleEndian.Uint32(f.cq.rec[abi.OffDBCQArm:])
	assert.Equal(t, abi.ArmWord(1, false), arm)
	require.NoError(t, f.cq.ReqNotify(true))
	arm = binary.LittleEndian.Uint32(f.cq.rec[abi.OffDBCQArm:])
	assert.Equal(t, abi.ArmWord(2, true), arm)
	assert.Equal(t, uint32(2), abi.ArmSN(arm))

	// No completion: the wait times out (no engine produces any).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := f.ch.Wait(ctx)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	// A completion event (the eventfd written, as the daemon does) wakes it.
	go func() {
		time.Sleep(10 * time.Millisecond)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], 1)
		unix.Write(f.ch.fd, b[:])
	}()
	n, err := f.ch.Wait(context.Background())
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)

	cq2, err := f.c.CreateCQ(2, nil)
	require.NoError(t, err)
	assert.Error(t, cq2.ReqNotify(false), "no channel")
}

func TestPostAndPollAllocateNothing(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	qp, cq := f.qp, f.cq
	sgl := []abi.SGE{f.mr.SGE(0, 64), f.mr.SGE(64, 64)}
	wr := SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sgl}
	binary.LittleEndian.PutUint32(f.c.dbPage[abi.OffDBKickNeeded:], 1) // include the kick
	allocs := testing.AllocsPerRun(1000, func() {
		if err := qp.PostSend(&wr); err != nil {
			panic(err)
		}
		store32(qp.rec[abi.OffDBSQCI:], qp.sq.pi) // consume, as the daemon would
	})
	assert.Zero(t, allocs, "PostSend allocates")
	kickCount(t, f.c)
	rwr := RecvWR{WrID: 1, SGL: sgl}
	allocs = testing.AllocsPerRun(1000, func() {
		if err := qp.PostRecv(&rwr); err != nil {
			panic(err)
		}
		store32(qp.rec[abi.OffDBRQCI:], qp.rq.pi)
	})
	assert.Zero(t, allocs, "PostRecv allocates")
	srq, err := f.pd.CreateSRQ(4, 2, 0)
	require.NoError(t, err)
	allocs = testing.AllocsPerRun(1000, func() {
		if err := srq.PostRecv(&rwr); err != nil {
			panic(err)
		}
		store32(srq.rec[abi.OffDBSRQCI:], srq.rq.pi)
	})
	assert.Zero(t, allocs, "SRQ.PostRecv allocates")
	wc := make([]abi.CQE, 4)
	i := uint32(0)
	allocs = testing.AllocsPerRun(1000, func() {
		produce(cq, i, uint64(i))
		i++
		if cq.Poll(wc) != 1 {
			panic("no completion")
		}
	})
	assert.Zero(t, allocs, "Poll allocates")
}

func TestHostMemAllocator(t *testing.T) {
	s := startServer(t)
	c := openCtx(t, s)
	hm, err := c.AddHostMem(64 << 10)
	require.NoError(t, err)
	assert.Equal(t, 64<<10, hm.Len())
	assert.Zero(t, hm.PA()%(2<<20), "regions are 2 MiB aligned in PA space")
	a, err := hm.Alloc(100, 64)
	require.NoError(t, err)
	b, err := hm.Alloc(5000, 4096)
	require.NoError(t, err)
	assert.Zero(t, b.PA%4096)
	assert.Equal(t, hm.PA(), a.PA)
	assert.Len(t, b.Bytes, 5000)
	// PA and mapping agree: byte x of the memfd is PA base+x.
	b.Bytes[0] = 0x5a
	assert.Equal(t, byte(0x5a), hm.Bytes()[b.PA-hm.PA()])
	_, err = hm.Alloc(64<<10, 64)
	assert.ErrorIs(t, err, ErrNoSpace)
	a.Free()
	b.Free()
	all, err := hm.Alloc(64<<10, 64)
	require.NoError(t, err, "frees coalesce back into one range")
	all.Free()
	_, err = hm.Alloc(0, 64)
	assert.Error(t, err)
	_, err = hm.Alloc(10, 3)
	assert.Error(t, err)
	require.NoError(t, hm.Remove())
}

func TestOpenErrors(t *testing.T) {
	_, err := Open("/nonexistent/vrnic.sock")
	assert.ErrorIs(t, err, syscall.ENOENT)
	s := startServer(t)
	c := openCtx(t, s)
	require.NoError(t, c.Close())
	_, err = c.AllocPD()
	assert.ErrorIs(t, err, ErrClosed)
	_, err = c.Alloc(10, 64)
	assert.ErrorIs(t, err, ErrClosed)
	require.NoError(t, c.Close(), "idempotent")
}

func TestLargeMRUsesPageListInHostMemory(t *testing.T) {
	f := newFixture(t, abi.QPTRC)
	big, err := f.c.Alloc(2<<20, 4096) // 512 pages > 64 inline
	require.NoError(t, err)
	mr, err := f.pd.RegMR(big, abi.AccessLocalWrite|abi.AccessRemoteRead)
	require.NoError(t, err)
	assert.NotZero(t, mr.RKey)
	assert.Equal(t, uint64(2<<20), mr.Length)
	assert.Equal(t, big.Addr(), mr.Addr)
	require.NoError(t, mr.Dereg())
}
