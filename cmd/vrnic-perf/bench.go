package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// measurement is what the client's measured loop produced for one size.
type measurement struct {
	ops     uint64 // operations completed, all QPs
	elapsed time.Duration
}

// prepareWRs sets up each QP's reusable send work request for one size.
func (e *endpoint) prepareWRs(size int) {
	o := e.opt
	inline := o.inline(size)
	for _, q := range e.qps {
		q.posted, q.completed, q.received = 0, 0, 0
		w := verbs.SendWR{RemoteAddr: q.peer.Addr, RKey: q.peer.RKey, AH: q.ah, RemoteQPN: q.peer.QPN, RemoteQKey: perfQKey}
		local := uint32(0)
		if o.Test.latency() && o.Test != readLat {
			local = uint32(e.area) // send from [L, 2L)
		}
		q.sge[0] = q.mr.SGE(local, uint32(size))
		w.SGL = q.sge[:]
		switch o.Test {
		case writeBW, writeLat:
			w.Opcode = abi.WRRDMAWrite
		case readBW, readLat:
			w.Opcode = abi.WRRDMARead
		case sendBW, sendLat:
			w.Opcode = abi.WRSend
		case atomicBW:
			w.Opcode = abi.WRAtomicFetchAdd
			if o.Atomic == atomicCmpSwap {
				w.Opcode = abi.WRAtomicCmpAndSwp
			}
			q.sge[0] = q.mr.SGE(0, 8)
		}
		if inline {
			w.Flags |= abi.SendInline
			w.Inline = q.buf.Bytes[local : int(local)+size]
			w.SGL = nil
		}
		q.wr = w
	}
}

// runBW is the measured loop of the bandwidth tests: every QP keeps up to
// depth WRs outstanding, one in cq-mod is signaled (and the last), until
// each QP posted iters WRs or the duration is over.
func (e *endpoint) runBW(size, iters int) (measurement, error) {
	o := e.opt
	depth := uint64(o.Depth)
	mod := uint64(o.CQMod)
	areas := uint64(o.Areas)
	for _, q := range e.qps {
		q.target = uint64(iters)
		if iters == 0 {
			q.target = math.MaxUint64
		}
	}
	// unfinished counts the QPs whose completions have not reached their
	// target and postable those whose posts have not: the loop's checks
	// cost the same with 1 QP and with thousands (a pass over every QP
	// per poll is a cache miss per QP, and spinning that long delays the
	// yield that lets the daemons run on a host short of cores).
	unfinished, postable := e.remaining()
	start := time.Now()
	last := start
	timed := iters == 0
	what := string(o.Test)
	// outstanding counts the WRs posted and not completed over all QPs,
	// bounded by total (-total-depth); rr is the QP whose turn is next.
	total := uint64(o.sendOutstanding())
	var outstanding uint64
	rr := 0
	for {
		first := rr
		for k := range e.qps {
			if outstanding >= total || postable == 0 {
				break
			}
			q := e.qps[(first+k)%len(e.qps)]
			for q.posted < q.target && q.posted-q.completed < depth && outstanding < total {
				n := q.posted + 1
				q.wr.WrID = n
				q.wr.Flags &^= abi.SendSignaled
				if n%mod == 0 || n == q.target {
					q.wr.Flags |= abi.SendSignaled
				}
				if areas > 1 {
					off := uint64(e.area) * ((n - 1) % areas)
					q.sge[0].Addr = q.mr.Addr + off
					q.wr.RemoteAddr = q.peer.Addr + off
				}
				if o.Test == atomicBW {
					slot := (n - 1) % depth
					q.sge[0].Addr = q.mr.Addr + 8*slot
					q.wr.CompareAdd, q.wr.Swap = 1, 0
					if o.Atomic == atomicCmpSwap {
						q.wr.CompareAdd, q.wr.Swap = n-1, n
					}
				}
				if err := q.qp.PostSend(&q.wr); err != nil {
					if err == verbs.ErrQueueFull {
						break // the daemon has not taken the older WQEs yet
					}
					return measurement{}, fmt.Errorf("%s: post: %w", what, err)
				}
				q.posted = n
				if n == q.target {
					postable--
				}
				outstanding++
				rr = (first + k + 1) % len(e.qps)
			}
		}
		n, err := e.pollCQ()
		if err != nil {
			return measurement{}, err
		}
		now := time.Now()
		if n > 0 {
			last = now
		} else if now.Sub(last) > stallTimeout {
			return measurement{}, fmt.Errorf("%s: %w (%s)", what, errStalled, e.progress())
		}
		for i := range n {
			c := &e.wc[i]
			if err := checkCQE(c, what); err != nil {
				return measurement{}, err
			}
			qi := e.qpIndex(c.QPNum)
			if qi < 0 || c.WrID == 0 || c.WrID > e.qps[qi].posted {
				return measurement{}, fmt.Errorf("%w: %s: unexpected completion %+v", errCompletion, what, *c)
			}
			q := e.qps[qi]
			if o.Test == atomicBW && o.Verify {
				got := binary.LittleEndian.Uint64(q.buf.Bytes[8*((c.WrID-1)%depth):])
				if got != c.WrID-1 {
					return measurement{}, fmt.Errorf("%w: %s %s WR %d on QP %#x returned %d, want %d",
						errVerify, what, o.Atomic, c.WrID, c.QPNum, got, c.WrID-1)
				}
			}
			outstanding -= c.WrID - q.completed
			q.completed = c.WrID
			if c.WrID == q.target {
				unfinished--
			}
		}
		if timed && now.Sub(start) >= o.Duration {
			timed = false
			for _, q := range e.qps {
				// Round up to a signaled WR so the end is seen.
				q.target = (q.posted + mod - 1) / mod * mod
			}
			unfinished, postable = e.remaining()
		}
		if unfinished == 0 {
			break
		}
	}
	m := measurement{elapsed: time.Since(start)}
	for _, q := range e.qps {
		m.ops += q.completed
	}
	return m, nil
}

// remaining counts the QPs whose completions and whose posts have not
// reached their target.
func (e *endpoint) remaining() (unfinished, postable int) {
	for _, q := range e.qps {
		if q.completed != q.target {
			unfinished++
		}
		if q.posted < q.target {
			postable++
		}
	}
	return unfinished, postable
}

// progress describes where each QP stands, for a stall report.
func (e *endpoint) progress() string {
	s := ""
	for _, q := range e.qps {
		s += fmt.Sprintf("QP %#x posted %d completed %d received %d; ", q.qp.QPN, q.posted, q.completed, q.received)
	}
	return s + e.qpStates()
}

// qpStates describes each QP as the daemon sees it (for stall reports).
func (e *endpoint) qpStates() string {
	s := ""
	for _, q := range e.qps {
		r, err := q.qp.Query()
		if err != nil {
			s += fmt.Sprintf("QP %#x: query: %v; ", q.qp.QPN, err)
			continue
		}
		s += fmt.Sprintf("QP %#x %v: %d packets sent, %d received, %d retransmissions, %d RNR NAKs; ", q.qp.QPN,
			r.Attr.QPState, r.PacketsSent, r.PacketsReceived, r.Retransmits, r.RNRNAKsReceived)
	}
	return s + fmt.Sprintf("CQ overflow %v", e.cq.Overflowed())
}

// runLat is the measured loop of the latency tests on the client: one
// operation at a time; write_lat and send_lat are ping-pongs with the
// server and record half the round trip, read_lat records the whole
// READ.
func (e *endpoint) runLat(size, iters int) (measurement, error) {
	o := e.opt
	q := e.qps[0]
	recv := q.buf.Bytes[:e.area]
	send := q.buf.Bytes[e.area : 2*e.area]
	e.hist.reset()
	q.wr.Flags |= abi.SendSignaled
	what := string(o.Test)
	start := time.Now()
	var k uint64
	for k = 1; iters == 0 || k <= uint64(iters); k++ {
		if iters == 0 && time.Since(start) >= o.Duration {
			break
		}
		send[size-1] = byte(k)
		q.wr.WrID = k
		t0 := time.Now()
		if err := q.qp.PostSend(&q.wr); err != nil {
			return measurement{}, fmt.Errorf("%s: post: %w", what, err)
		}
		q.posted = k
		var err error
		switch o.Test {
		case writeLat:
			err = e.waitWrite(q, recv, size, k, nil)
		case sendLat:
			err = e.waitRecv(q, k, nil)
		case readLat:
			err = e.waitSendCompletion(q, k)
		}
		if err != nil {
			return measurement{}, fmt.Errorf("%s %d: %w", what, k, err)
		}
		d := time.Since(t0)
		if o.Test.pingPong() {
			d /= 2
		}
		e.hist.add(d)
	}
	return measurement{ops: k - 1, elapsed: time.Since(start)}, nil
}

// reap handles the completions in e.wc for a latency loop: errors fail,
// send completions advance q.completed, receives are counted and
// re-posted.
func (e *endpoint) reap(q *qpRes, n int, size int) error {
	for i := range n {
		c := &e.wc[i]
		if err := checkCQE(c, string(e.opt.Test)); err != nil {
			return err
		}
		if c.Opcode == abi.WCRecv {
			if int(c.ByteLen) != e.grh+size {
				return fmt.Errorf("%w: received %d bytes, want %d", errVerify, c.ByteLen, size)
			}
			q.received++
			if err := q.qp.PostRecv(&q.rwr); err != nil {
				return fmt.Errorf("post receive: %w", err)
			}
			continue
		}
		q.completed = c.WrID
	}
	return nil
}

// waitWrite spins until the peer's WRITE number k has landed in recv (its
// last byte is byte(k)), reaping completions on the way. stop, if not
// nil, ends the wait early (the server's end of the test).
func (e *endpoint) waitWrite(q *qpRes, recv []byte, size int, k uint64, stop func() bool) error {
	last := time.Now()
	// Reap own completions at least once per message, so the CQ never
	// fills when the peer's WRITE arrives before the first periodic poll.
	if err := e.reap(q, e.cq.Poll(e.wc[:]), size); err != nil {
		return err
	}
	for spins := 0; ; spins++ {
		if loadByte(recv, size-1) == byte(k) {
			return nil
		}
		if spins&63 == 63 {
			yield()
		}
		if spins&255 == 255 {
			if err := e.reap(q, e.cq.Poll(e.wc[:]), size); err != nil {
				return err
			}
			if stop != nil && stop() {
				return errStopped
			}
			if spins&0xffff == 0xffff && time.Since(last) > stallTimeout {
				return fmt.Errorf("%w: waiting for the peer's WRITE %d (last byte %#x, want %#x); own WRs posted %d, completed %d; %s",
					errStalled, k, loadByte(recv, size-1), byte(k), q.posted, q.completed, e.qpStates())
			}
		}
	}
}

// waitRecv polls until the receive number k has completed.
func (e *endpoint) waitRecv(q *qpRes, k uint64, stop func() bool) error {
	last := time.Now()
	size := int(q.sge[0].Length)
	if q.wr.Flags&abi.SendInline != 0 {
		size = len(q.wr.Inline)
	}
	for q.received < k {
		n, err := e.pollCQ()
		if err != nil {
			return err
		}
		if err := e.reap(q, n, size); err != nil {
			return err
		}
		if n == 0 {
			if stop != nil && stop() {
				return errStopped
			}
			if time.Since(last) > stallTimeout {
				return fmt.Errorf("%w: waiting for receive %d; received %d, own WRs posted %d, completed %d; %s",
					errStalled, k, q.received, q.posted, q.completed, e.qpStates())
			}
		}
	}
	return nil
}

// waitSendCompletion polls until send WR k has completed.
func (e *endpoint) waitSendCompletion(q *qpRes, k uint64) error {
	last := time.Now()
	for q.completed < k {
		n, err := e.pollCQ()
		if err != nil {
			return err
		}
		if err := e.reap(q, n, 0); err != nil {
			return err
		}
		if n == 0 && time.Since(last) > stallTimeout {
			return fmt.Errorf("%w: waiting for the completion of WR %d; completed %d; %s", errStalled, k, q.completed, e.qpStates())
		}
	}
	return nil
}
