package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/osyield"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/verbs"
	"golang.org/x/sys/unix"
)

// endpoint is one side's verbs resources: one context, PD and CQ (send
// and receive completions of every QP), and per QP one buffer registered
// as one MR.
//
// Buffer of each QP (L = max(largest message, 8 × depth), 64-byte aligned):
//
//	[0, L)    bandwidth tests: WRITE/SEND source or READ destination
//	          (client), WRITE target, READ source or receive buffer
//	          (server); atomic_bw: the client's result slots (8 bytes per
//	          outstanding WR), the server's target word at offset 0.
//	          latency tests: where the peer's WRITE or SEND lands.
//	[L, 2L)   latency tests only: what this side sends.
//
// Over UD a received message lands after the 40-byte GRH (grh), and L
// leaves room for it.
type endpoint struct {
	opt   *options
	ctx   *verbs.Context
	pd    *verbs.PD
	ch    *verbs.CompChannel // with -events
	cq    *verbs.CQ
	qps   []*qpRes
	byQPN map[uint32]int // index in qps by QP number
	wc    [64]abi.CQE
	pfd   [1]unix.PollFd
	evbuf [8]byte
	area  int // L
	grh   int // UD: the GRH in front of every received message (abi.GRHLen), else 0
	idle  int // empty polls in a row
	hist  histogram
	// ece are the ECE options in force on the QPs (QUERY_QP after
	// connect): those both sides agreed on.
	ece uint32
}

// qpRes is one QP and its memory, with the work requests the measured
// loops reuse (no allocation per WR).
type qpRes struct {
	qp    *verbs.QP
	buf   *verbs.Buffer
	mr    *verbs.MR
	psn   uint32
	peer  rcpair.Info
	ah    *verbs.AH // UD: to the peer
	wr    verbs.SendWR
	sge   [1]abi.SGE
	rwr   verbs.RecvWR
	rsge  [1]abi.SGE
	start counters

	posted, completed, target uint64
	received                  uint64
}

// stallTimeout: no completion for this long fails the run.
const stallTimeout = 10 * time.Second

var (
	errStalled    = errors.New("no progress for 10 s: the transport is stuck")
	errCompletion = errors.New("completion error")
	errVerify     = errors.New("data verification failed")
)

// newEndpoint opens the device and creates the CQ, QPs and buffers.
func newEndpoint(socket string, o *options, name string) (_ *endpoint, err error) {
	e := &endpoint{opt: o, byQPN: map[uint32]int{}}
	if e.ctx, err = verbs.Open(socket, verbs.WithClientName(name)); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if o.Events {
		if e.ch, err = verbs.NewCompChannel(); err != nil {
			return nil, err
		}
		e.pfd[0] = unix.PollFd{Fd: int32(e.ch.Fd()), Events: unix.POLLIN}
	}
	if e.cq, err = e.ctx.CreateCQ(o.cqEntries(), e.ch); err != nil {
		return nil, err
	}
	if o.Transport == transportUD {
		e.grh = abi.GRHLen
	}
	e.area = (max(o.maxMsg()+e.grh, 8*o.Depth) + 63) &^ 63
	bufLen := e.area * o.Areas
	if o.Test.latency() {
		bufLen *= 2
	}
	for range o.QPs {
		q := &qpRes{psn: rand.Uint32() & 0xffffff}
		if q.qp, err = e.pd.CreateQP(verbs.QPInitAttr{Type: o.qpType(), SendCQ: e.cq, RecvCQ: e.cq,
			Cap: abi.QPCap{MaxSendWR: uint32(max(o.Depth, 16)), MaxRecvWR: uint32(o.recvWR()),
				MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(o.Inline)}}); err != nil {
			return nil, fmt.Errorf("create QP: %w", err)
		}
		if q.buf, err = e.ctx.Alloc(bufLen, 4096); err != nil {
			return nil, err
		}
		if q.mr, err = e.pd.RegMR(q.buf, abi.AccessAll); err != nil {
			return nil, err
		}
		e.byQPN[q.qp.QPN] = len(e.qps)
		e.qps = append(e.qps, q)
	}
	return e, nil
}

// infos returns what the peer needs of this side's QPs.
func (e *endpoint) infos() ([]rcpair.Info, error) {
	gid, err := e.ctx.QueryGID(1, 0)
	if err != nil {
		return nil, err
	}
	var r []rcpair.Info
	for _, q := range e.qps {
		r = append(r, rcpair.Local(q.qp, q.psn, gid.GID, q.mr))
	}
	return r, nil
}

// eceCaps returns the ECE options the device supports (RC QPs only; a
// daemon without ECE has none).
func (e *endpoint) eceCaps() (uint32, error) {
	if e.opt.Transport != transportRC {
		return 0, nil
	}
	x, err := e.ctx.QueryDeviceEx()
	if err != nil {
		return 0, err
	}
	return x.ECEOptions, nil
}

// connect moves every QP to RTS towards its peer, RC QPs with the ECE
// options ece both sides agreed on, and, for tests that receive, fills
// its receive queue.
func (e *endpoint) connect(peers []rcpair.Info, ece uint32) error {
	if len(peers) != len(e.qps) {
		return fmt.Errorf("%w: peer has %d QPs, want %d", errProtocol, len(peers), len(e.qps))
	}
	for i, q := range e.qps {
		q.peer = peers[i]
		if q.peer.Len < uint64(e.area*e.opt.Areas) {
			return fmt.Errorf("%w: peer buffer of %d bytes, want at least %d", errProtocol, q.peer.Len, e.area*e.opt.Areas)
		}
		if e.opt.Transport == transportUD {
			if err := e.connectUD(q); err != nil {
				return err
			}
		} else if err := rcpair.Connect(q.qp, q.psn, q.peer, rcpair.Attr{MTU: rcpair.MTU(e.opt.MTU),
			MaxRdAtomic: abi.MaxRdAtomic, ECE: ece}); err != nil {
			return err
		}
		q.rsge[0] = q.mr.SGE(0, uint32(e.area))
		q.rwr = verbs.RecvWR{SGL: q.rsge[:]}
	}
	// What the QPs run, as the daemon says (the report names it).
	r, err := e.qps[0].qp.Query()
	if err != nil {
		return fmt.Errorf("QUERY_QP %#x: %w", e.qps[0].qp.QPN, err)
	}
	e.ece = r.ECEOptions
	return nil
}

// perfQKey is the Q_Key of vrnic-perf's UD QPs.
const perfQKey = 0x11111111

// connectUD moves a UD QP to RTS and creates the AH of its peer.
func (e *endpoint) connectUD(q *qpRes) (err error) {
	if err = q.qp.ToInit(0, perfQKey); err != nil {
		return fmt.Errorf("QP %#x to INIT: %w", q.qp.QPN, err)
	}
	if err = q.qp.ToRTR(verbs.RTRAttr{}); err != nil {
		return fmt.Errorf("QP %#x to RTR: %w", q.qp.QPN, err)
	}
	if err = q.qp.ToRTS(verbs.RTSAttr{SQPSN: q.psn}); err != nil {
		return fmt.Errorf("QP %#x to RTS: %w", q.qp.QPN, err)
	}
	if q.ah, err = e.pd.CreateAH(abi.AHAttr{DGID: q.peer.GID, HopLimit: 64, PortNum: 1}); err != nil {
		return fmt.Errorf("AH to %v: %w", q.peer.GID, err)
	}
	return nil
}

// fillRecv posts receives until each QP's receive queue holds RecvDepth
// (send tests only).
func (e *endpoint) fillRecv() error {
	if e.opt.Test != sendBW && e.opt.Test != sendLat {
		return nil
	}
	for _, q := range e.qps {
		for range e.opt.RecvDepth {
			if err := q.qp.PostRecv(&q.rwr); err != nil {
				return fmt.Errorf("post receive: %w", err)
			}
		}
	}
	return nil
}

func (e *endpoint) close() {
	if e.ctx != nil {
		e.ctx.Close() // the daemon destroys everything the context owned
	}
	if e.ch != nil {
		e.ch.Close()
	}
}

// qpIndex finds the QP of a completion, -1 for none.
func (e *endpoint) qpIndex(qpn uint32) int {
	if i, ok := e.byQPN[qpn]; ok {
		return i
	}
	return -1
}

// pollCQ returns the number of completions in e.wc. Busy polling returns
// at once; with events it arms the CQ, polls again (a completion between
// the first poll and the arm raises no event) and sleeps on the
// completion eventfd for at most 10 ms.
func (e *endpoint) pollCQ() (int, error) {
	n := e.cq.Poll(e.wc[:])
	if n > 0 {
		e.idle = 0
		return n, nil
	}
	if e.ch == nil {
		e.idle++
		if e.idle%yieldEvery == 0 {
			yield()
		}
		return 0, nil
	}
	if err := e.cq.ReqNotify(false); err != nil {
		return 0, err
	}
	if n = e.cq.Poll(e.wc[:]); n > 0 {
		return n, nil
	}
	if _, err := unix.Poll(e.pfd[:], 10); err != nil && err != unix.EINTR {
		return 0, fmt.Errorf("poll completion channel: %w", err)
	}
	if e.pfd[0].Revents&unix.POLLIN != 0 {
		unix.Read(e.ch.Fd(), e.evbuf[:])
	}
	return e.cq.Poll(e.wc[:]), nil
}

// yieldEvery: a busy-polling loop gives its CPU away (sched_yield) after
// this many empty polls in a row. On a host with fewer cores than busy
// threads (the daemon's workers, both roles) pure spinning keeps the
// daemon from running until the scheduler's time slice ends.
const yieldEvery = 64

// yield is osyield.Yield.
func yield() { osyield.Yield() }

// checkCQE turns a failed completion into an error naming the QP, the
// work request and the status.
func checkCQE(c *abi.CQE, what string) error {
	if c.Status == abi.WCSuccess {
		return nil
	}
	return fmt.Errorf("%w: %s: QP %#x WR %d (%v): status %v (vendor error %d)",
		errCompletion, what, c.QPNum, c.WrID, c.Opcode, c.Status, c.VendorErr)
}

// queryCounters reads every QP's transport counters.
func (e *endpoint) queryCounters() (counters, error) {
	var sum counters
	for _, q := range e.qps {
		r, err := q.qp.Query()
		if err != nil {
			return sum, fmt.Errorf("QUERY_QP %#x: %w", q.qp.QPN, err)
		}
		sum.PacketsSent += r.PacketsSent
		sum.PacketsReceived += r.PacketsReceived
		sum.Retransmits += r.Retransmits
		sum.RNRNAKs += r.RNRNAKsReceived
	}
	return sum, nil
}

// fillPattern writes the data of message size n for QP i: the same bytes
// on both sides, different for every size and QP.
func fillPattern(b []byte, size, qp int) {
	seed := uint64(size)*0x9e3779b97f4a7c15 + uint64(qp)*0xbf58476d1ce4e5b9 + 1
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		binary.LittleEndian.PutUint64(w[:], seed)
		copy(b[i:], w[:])
	}
}

// fillAreas writes message size of QP qp (fillPattern) at the start of
// each of the -areas message areas of b, its buffer.
func (e *endpoint) fillAreas(b []byte, size, qp int) {
	for a := range e.opt.Areas {
		fillPattern(b[a*e.area:a*e.area+size], size, qp)
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
