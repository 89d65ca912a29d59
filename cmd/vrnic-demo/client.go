package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
)

// Client roles: "a" is the requester (it runs the traffic), "b" the
// responder (it posts receives, checks every message, and is the target
// of WRITE, READ and the atomics).
//
// Memory of b (one MR, remote read/write/atomic):
//
//	[0, 8)          FETCH_AND_ADD word (a adds 1 each time)
//	[8, 16)         CMP_AND_SWP word (a swaps n for n+1)
//	[recvOff, ...)  recvSlots receive buffers of size bytes
//	[writeOff, ...) WRITE target, read back by READ
//
// Memory of a:
//
//	[0, size)        SEND source and WRITE source
//	[size, 2*size)   READ destination
//	[2*size, +16)    atomic results
const (
	recvSlots = 32
	recvOff   = 4096
)

type clientConfig struct {
	role     string
	socket   string // the daemon's control socket
	ctrl     string // the demo's message socket
	duration time.Duration
	size     int
	mtu      abi.MTU
}

// client is one verbs client process.
type client struct {
	cfg   clientConfig
	ctx   *verbs.Context
	pd    *verbs.PD
	ch    *verbs.CompChannel
	cq    *verbs.CQ
	qp    *verbs.QP
	buf   *verbs.Buffer
	mr    *verbs.MR
	peer  rcpair.Info
	wc    []abi.CQE
	conn  *peerConn
	psn   uint32
	fails []string
}

func (c *client) writeOff() uint64 { return uint64(recvOff + recvSlots*c.cfg.size) }

func (c *client) memSize() int {
	if c.cfg.role == "b" {
		return int(c.writeOff()) + c.cfg.size
	}
	return 2*c.cfg.size + 16
}

func runClient(cfg clientConfig) error {
	nc, err := net.Dial("unix", cfg.ctrl)
	if err != nil {
		return fmt.Errorf("client %s: connect to the demo: %w", cfg.role, err)
	}
	defer nc.Close()
	c := &client{cfg: cfg, conn: newPeerConn(nc), wc: make([]abi.CQE, 16)}
	err = c.run()
	if err != nil {
		c.conn.send(message{Kind: "error", Role: cfg.role, Error: err.Error()})
	}
	if c.ctx != nil {
		c.ctx.Close()
	}
	return err
}

func (c *client) run() error {
	var err error
	if c.ctx, err = verbs.Open(c.cfg.socket, verbs.WithClientName("vrnic-demo-"+c.cfg.role)); err != nil {
		return err
	}
	if c.pd, err = c.ctx.AllocPD(); err != nil {
		return err
	}
	if c.ch, err = verbs.NewCompChannel(); err != nil {
		return err
	}
	defer c.ch.Close()
	if c.cq, err = c.ctx.CreateCQ(256, c.ch); err != nil {
		return err
	}
	if c.qp, err = c.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: recvSlots, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	if c.buf, err = c.ctx.Alloc(c.memSize(), 4096); err != nil {
		return err
	}
	clear(c.buf.Bytes)
	if c.mr, err = c.pd.RegMR(c.buf, abi.AccessAll); err != nil {
		return err
	}
	gid, err := c.ctx.QueryGID(1, 0)
	if err != nil {
		return err
	}
	c.psn = uint32(time.Now().UnixNano()) & 0xffffff
	me := rcpair.Local(c.qp, c.psn, gid.GID, c.mr)
	if err := c.conn.send(message{Kind: "hello", Role: c.cfg.role, QP: &me}); err != nil {
		return err
	}
	m, err := c.conn.recv("peer")
	if err != nil {
		return err
	}
	c.peer = *m.QP
	if c.cfg.role == "b" {
		// A receive queue takes work requests from INIT on (IBTA
		// 10.3.1; the daemon discards what a QP in RESET was given).
		if err := c.qp.ToInit(abi.AccessAll, 0); err != nil {
			return err
		}
		for i := range recvSlots {
			if err := c.postRecv(i); err != nil {
				return err
			}
		}
	}
	if err := rcpair.Connect(c.qp, c.psn, c.peer, rcpair.Attr{MTU: c.cfg.mtu, MaxRdAtomic: 4}); err != nil {
		return err
	}
	if err := c.conn.send(message{Kind: "ready"}); err != nil {
		return err
	}
	if _, err := c.conn.recv("go"); err != nil {
		return err
	}
	var r *result
	if c.cfg.role == "a" {
		r, err = c.requester()
	} else {
		r, err = c.responder()
	}
	if err != nil {
		return err
	}
	q, err := c.qp.Query()
	if err != nil {
		return err
	}
	r.Role = c.cfg.role
	r.PacketsSent, r.PacketsReceived, r.Retransmits, r.RNRNAKs = q.PacketsSent, q.PacketsReceived, q.Retransmits, q.RNRNAKsReceived
	r.Failures = c.fails
	return c.conn.send(message{Kind: "result", Result: r})
}

func (c *client) postRecv(slot int) error {
	return c.qp.PostRecv(&verbs.RecvWR{WrID: uint64(slot), SGL: []abi.SGE{c.mr.SGE(uint32(recvOff+slot*c.cfg.size), uint32(c.cfg.size))}})
}

// errTimeout: no completion for a long time (the transport is stuck).
var errTimeout = errors.New("no completion within 10 s")

// poll returns the next completion: busy-polls for a while, then arms the
// CQ and sleeps on the completion channel (re-polling after arming, so no
// event is missed).
func (c *client) poll(stop <-chan struct{}) (abi.CQE, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		for range 2000 {
			if c.cq.Poll(c.wc[:1]) == 1 {
				return c.wc[0], nil
			}
		}
		if err := c.cq.ReqNotify(false); err != nil {
			return abi.CQE{}, err
		}
		if c.cq.Poll(c.wc[:1]) == 1 {
			return c.wc[0], nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		_, err := c.ch.Wait(ctx)
		cancel()
		if err != nil && !errors.Is(err, verbs.ErrTimeout) {
			return abi.CQE{}, err
		}
		select {
		case <-stop:
			// The stop comes after the requester's last completion, and
			// the daemon writes a receive completion before the ACK
			// that completes the SEND: whatever arrived during the wait
			// is in the CQ. Drain it before stopping (the responder
			// once reported one SEND fewer than the requester made).
			if c.cq.Poll(c.wc[:1]) == 1 {
				return c.wc[0], nil
			}
			return abi.CQE{}, errStopped
		default:
		}
		if time.Now().After(deadline) {
			return abi.CQE{}, errTimeout
		}
	}
}

var errStopped = errors.New("stopped")

// fillSend writes the payload of SEND number seq: the sequence, then a
// pattern derived from it.
func fillSend(b []byte, seq uint64) {
	for i := range b {
		b[i] = byte(uint64(i)*31 + seq*7 + 3)
	}
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, seq)
	}
}

// checkSend verifies a received SEND payload.
func checkSend(b []byte, seq uint64) bool {
	if len(b) >= 8 && binary.LittleEndian.Uint64(b) != seq {
		return false
	}
	for i := 8; i < len(b); i++ {
		if b[i] != byte(uint64(i)*31+seq*7+3) {
			return false
		}
	}
	return true
}

// fillWrite writes the data of WRITE number seq.
func fillWrite(b []byte, seq uint64) {
	for i := range b {
		b[i] = byte(uint64(i)*13 + seq*5 + 1)
	}
}

func (c *client) fail(format string, args ...any) {
	if len(c.fails) < 20 {
		c.fails = append(c.fails, fmt.Sprintf(format, args...))
	}
}

// requester runs SEND, WRITE, READ (of what was written), FETCH_AND_ADD
// and CMP_AND_SWP in turn, one at a time, until the duration is over,
// checking every completion and every byte read back.
func (c *client) requester() (*result, error) {
	size := c.cfg.size
	src := c.buf.Bytes[:size]
	dst := c.buf.Bytes[size : 2*size]
	atom := c.buf.Bytes[2*size : 2*size+8]
	kinds := []*latencies{{name: "SEND"}, {name: "RDMA_WRITE"}, {name: "RDMA_READ"}, {name: "FETCH_AND_ADD"}, {name: "CMP_AND_SWP"}}
	r := &result{}
	start := time.Now()
	nextReport := start.Add(time.Second)
	var ops, bytes, writes uint64
	want := make([]byte, size)
	wr := verbs.SendWR{Flags: abi.SendSignaled}
	for seq := uint64(0); ; seq++ {
		now := time.Now()
		if now.Sub(start) >= c.cfg.duration {
			break
		}
		if now.After(nextReport) {
			nextReport = nextReport.Add(time.Second)
			c.conn.send(message{Kind: "progress", Progress: &progress{Elapsed: now.Sub(start), Ops: ops, Bytes: bytes}})
		}
		k := int(seq % uint64(len(kinds)))
		wr = verbs.SendWR{WrID: seq, Flags: abi.SendSignaled}
		n := 0
		switch k {
		case 0:
			fillSend(src, r.Sends)
			wr.Opcode, wr.SGL, n = abi.WRSend, []abi.SGE{c.mr.SGE(0, uint32(size))}, size
		case 1:
			writes++
			fillWrite(src, writes)
			wr.Opcode, wr.SGL, n = abi.WRRDMAWrite, []abi.SGE{c.mr.SGE(0, uint32(size))}, size
			wr.RemoteAddr, wr.RKey = c.peer.Addr+c.writeOff(), c.peer.RKey
		case 2:
			clear(dst)
			wr.Opcode, wr.SGL, n = abi.WRRDMARead, []abi.SGE{c.mr.SGE(uint32(size), uint32(size))}, size
			wr.RemoteAddr, wr.RKey = c.peer.Addr+c.writeOff(), c.peer.RKey
		case 3:
			wr.Opcode, wr.SGL, n = abi.WRAtomicFetchAdd, []abi.SGE{c.mr.SGE(uint32(2*size), 8)}, 8
			wr.RemoteAddr, wr.RKey, wr.CompareAdd = c.peer.Addr, c.peer.RKey, 1
		case 4:
			wr.Opcode, wr.SGL, n = abi.WRAtomicCmpAndSwp, []abi.SGE{c.mr.SGE(uint32(2*size), 8)}, 8
			wr.RemoteAddr, wr.RKey, wr.CompareAdd, wr.Swap = c.peer.Addr+8, c.peer.RKey, r.CmpSwaps, r.CmpSwaps+1
		}
		t0 := time.Now()
		if err := c.qp.PostSend(&wr); err != nil {
			return nil, fmt.Errorf("post %s: %w", kinds[k].name, err)
		}
		e, err := c.poll(nil)
		if err != nil {
			return nil, fmt.Errorf("%s %d: %w", kinds[k].name, seq, err)
		}
		lat := time.Since(t0)
		if e.Status != abi.WCSuccess || e.WrID != seq || e.QPNum != c.qp.QPN {
			return nil, fmt.Errorf("%s %d: completion %+v (status %v)", kinds[k].name, seq, e, e.Status)
		}
		kinds[k].add(lat, n)
		ops++
		bytes += uint64(n)
		switch k {
		case 0:
			r.Sends++
			r.SendBytes += uint64(n)
		case 2:
			fillWrite(want, writes)
			if string(dst) != string(want) {
				c.fail("READ %d: data differs from WRITE %d", seq, writes)
			}
		case 3:
			if got := binary.LittleEndian.Uint64(atom); got != r.FetchAdds {
				c.fail("FETCH_AND_ADD %d returned %d, want %d", r.FetchAdds, got, r.FetchAdds)
			}
			r.FetchAdds++
		case 4:
			if got := binary.LittleEndian.Uint64(atom); got != r.CmpSwaps {
				c.fail("CMP_AND_SWP %d returned %d, want %d", r.CmpSwaps, got, r.CmpSwaps)
			}
			r.CmpSwaps++
		}
	}
	r.Elapsed = time.Since(start)
	for _, k := range kinds {
		r.Ops = append(r.Ops, k.stats())
	}
	r.All = merge("all", kinds...)
	return r, nil
}

// responder checks every SEND it receives and reposts the buffer until
// the demo says stop; then it reports its atomic words.
func (c *client) responder() (*result, error) {
	stop := make(chan struct{})
	go func() {
		c.conn.recv("stop")
		close(stop)
	}()
	r := &result{}
	start := time.Now()
	for {
		e, err := c.poll(stop)
		if errors.Is(err, errStopped) {
			break
		}
		if errors.Is(err, errTimeout) {
			continue // idle: the requester may be doing READs and atomics
		}
		if err != nil {
			return nil, err
		}
		if e.Status != abi.WCSuccess || e.Opcode != abi.WCRecv || e.WrID >= recvSlots {
			return nil, fmt.Errorf("receive completion %+v (status %v)", e, e.Status)
		}
		slot := int(e.WrID)
		b := c.buf.Bytes[recvOff+slot*c.cfg.size:][:e.ByteLen]
		if int(e.ByteLen) != c.cfg.size || !checkSend(b, r.RecvVerified) {
			c.fail("SEND %d: %d bytes, content does not match", r.RecvVerified, e.ByteLen)
		}
		r.RecvVerified++
		r.RecvBytes += uint64(e.ByteLen)
		if err := c.postRecv(slot); err != nil {
			return nil, err
		}
	}
	r.Elapsed = time.Since(start)
	r.AddWord = binary.LittleEndian.Uint64(c.buf.Bytes[0:8])
	r.SwapWord = binary.LittleEndian.Uint64(c.buf.Bytes[8:16])
	return r, nil
}
