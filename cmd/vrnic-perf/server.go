package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
)

var errStopped = errors.New("stopped")

// checksumAll chains the checksums of bytes [off, off+size) of every QP's
// buffer, in QP order (both sides compute it the same way).
func (e *endpoint) checksumAll(off, size int) uint32 { return e.checksumAreas(off, size, 1) }

// checksumAreas is checksumAll over the first areas message areas of
// each QP's buffer (-areas), QP by QP, area by area.
func (e *endpoint) checksumAreas(off, size, areas int) uint32 {
	var c uint32
	for _, q := range e.qps {
		for a := range areas {
			c = crc32.Update(c, castagnoli, q.buf.Bytes[a*e.area+off:a*e.area+off+size])
		}
	}
	return c
}

// serve runs the server role: it waits for one client on listen, serves
// every size the client runs and exits when the client says bye. ece are
// the ECE options it takes from the client's offer (-ece,
// -selective-repeat).
func serve(dev, listen string, ece uint32, stdout io.Writer) error {
	network, addr := splitAddr(listen)
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "listening on %s:%s\n", network, ln.Addr())
	nc, err := ln.Accept()
	ln.Close()
	if err != nil {
		return err
	}
	defer nc.Close()
	cc := newCtrlConn(nc)
	err = serveConn(dev, cc, ece)
	if err != nil && !errors.Is(err, errPeer) {
		cc.send(message{Kind: "error", Error: err.Error()})
	}
	return err
}

// errPeer marks errors reported by the other side.
var errPeer = errors.New("from the peer")

func serveConn(dev string, cc *ctrlConn, ece uint32) error {
	hello, err := cc.recv("hello", 30*time.Second)
	if err != nil {
		return err
	}
	if hello.Options == nil {
		return fmt.Errorf("%w: hello without options", errProtocol)
	}
	o := hello.Options
	e, err := newEndpoint(dev, o, "vrnic-perf-server")
	if err != nil {
		return err
	}
	defer e.close()
	// The ECE options agreed: those the client offered that this side
	// asked for and its device supports; the answer tells the client.
	caps, err := e.eceCaps()
	if err != nil {
		return err
	}
	agreed := o.ECE & ece & caps
	if err := e.connect(hello.QPs, agreed); err != nil {
		return err
	}
	if err := e.fillRecv(); err != nil {
		return err
	}
	infos, err := e.infos()
	if err != nil {
		return err
	}
	if err := cc.send(message{Kind: "hello", QPs: infos, ECE: agreed}); err != nil {
		return err
	}
	for {
		m, err := cc.recv("", 0)
		if err != nil {
			return fmt.Errorf("%w: %w", errPeer, err)
		}
		switch m.Kind {
		case "bye":
			return nil
		case "start":
		default:
			return fmt.Errorf("%w: unexpected message %q", errProtocol, m.Kind)
		}
		if m.Size < 1 || m.Size > o.maxMsg() {
			return fmt.Errorf("%w: size %d out of range (1..%d)", errProtocol, m.Size, o.maxMsg())
		}
		if err := e.serveSize(cc, m.Size); err != nil {
			return err
		}
	}
}

// serveSize serves one message size: prepares the memory, answers
// started, serves the test until the client's done, verifies and answers
// the verdict.
func (e *endpoint) serveSize(cc *ctrlConn, size int) error {
	o := e.opt
	for i, q := range e.qps {
		b := q.buf.Bytes
		switch o.Test {
		case writeBW, sendBW:
			clear(b[:size])
		case readBW, readLat:
			e.fillAreas(b, size, i)
		case atomicBW:
			clear(b[:8])
		case writeLat, sendLat:
			clear(b[:size])
			fillPattern(b[e.area:e.area+size], size, i)
		}
	}
	e.prepareWRs(size)
	base, err := e.queryCounters()
	if err != nil {
		return err
	}
	if err := cc.send(message{Kind: "started", Size: size, Checksum: e.checksumAll(0, size)}); err != nil {
		return err
	}
	var stop atomic.Bool
	type got struct {
		m   message
		err error
	}
	doneCh := make(chan got, 1)
	go func() {
		m, err := cc.recv("done", 0)
		stop.Store(true)
		doneCh <- got{m, err}
	}()
	stopped := stop.Load
	var serveErr error
	switch o.Test {
	case sendBW:
		serveErr = e.serveSends(size, stopped)
	case sendLat, writeLat:
		serveErr = e.servePongs(size, stopped)
	}
	d := <-doneCh
	if d.err != nil {
		return fmt.Errorf("%w: %w (server: %s)", errPeer, d.err, e.progress())
	}
	if serveErr != nil {
		return serveErr
	}
	if len(d.m.Sent) != len(e.qps) || d.m.Size != size {
		return fmt.Errorf("%w: done for size %d with %d counts", errProtocol, d.m.Size, len(d.m.Sent))
	}
	if o.Test == sendBW {
		// The client's last SENDs may still be on their way.
		if err := e.drainSends(size, d.m.Sent); err != nil {
			return err
		}
	}
	end, err := e.queryCounters()
	if err != nil {
		return err
	}
	delta := end.sub(base)
	verdict := message{Kind: "verdict", Size: size, Counters: &delta}
	if o.unreliable() && (o.Test == sendBW || o.Test == sendLat) {
		for i, q := range e.qps {
			verdict.Lost += d.m.Sent[i] - min(q.received, d.m.Sent[i])
		}
	}
	if o.Verify {
		if err := e.verifyServer(size, d.m); err != nil {
			verdict.Error = err.Error()
			cc.send(verdict)
			return err
		}
	}
	return cc.send(verdict)
}

// verifyServer checks what the client's traffic left in this side's
// memory.
func (e *endpoint) verifyServer(size int, d message) error {
	o := e.opt
	switch o.Test {
	case writeBW:
		if d.Areas < 1 || d.Areas > o.Areas {
			return fmt.Errorf("%w: write_bw: the client says %d areas were written, of %d", errProtocol, d.Areas, o.Areas)
		}
		if got := e.checksumAreas(0, size, d.Areas); got != d.Checksum {
			return fmt.Errorf("%w: %s %d B: checksum of the server's memory %#08x, the client's data %#08x", errVerify, o.Test, size, got, d.Checksum)
		}
	case sendBW:
		if got := e.checksumAll(e.grh, size); got != d.Checksum {
			return fmt.Errorf("%w: %s %d B: checksum of the server's memory %#08x, the client's data %#08x", errVerify, o.Test, size, got, d.Checksum)
		}
	case atomicBW:
		for i, q := range e.qps {
			if got := binary.LittleEndian.Uint64(q.buf.Bytes); got != d.Sent[i] {
				return fmt.Errorf("%w: atomic_bw %s: QP %d target word %d after %d operations", errVerify, o.Atomic, i, got, d.Sent[i])
			}
		}
	case writeLat, sendLat:
		q := e.qps[0]
		if got, want := checksum(q.buf.Bytes[e.grh:e.grh+size]), checksum(q.buf.Bytes[e.area:e.area+size]); got != want {
			return fmt.Errorf("%w: %s %d B: last message received differs from the one expected", errVerify, o.Test, size)
		}
	}
	if o.Test == sendBW || o.Test == sendLat {
		for i, q := range e.qps {
			if o.unreliable() && q.received <= d.Sent[i] {
				continue // UC and UD may lose messages (counted in the result)
			}
			if q.received != d.Sent[i] {
				return fmt.Errorf("%w: %s: QP %d received %d messages, the client sent %d", errVerify, o.Test, i, q.received, d.Sent[i])
			}
		}
	}
	return nil
}

// serveSends receives the client's SENDs, reposting each receive, until
// the client says done.
func (e *endpoint) serveSends(size int, stopped func() bool) error {
	for !stopped() {
		n, err := e.pollCQ()
		if err != nil {
			return err
		}
		if err := e.takeRecvs(n, size); err != nil {
			return err
		}
	}
	return nil
}

// drainSends receives until every QP has received what the client sent;
// over UC and UD, where messages may be lost, until nothing arrived for
// lossQuiet.
func (e *endpoint) drainSends(size int, sent []uint64) error {
	last := time.Now()
	for {
		done := true
		for i, q := range e.qps {
			done = done && q.received >= sent[i]
		}
		if done {
			return nil
		}
		n, err := e.pollCQ()
		if err != nil {
			return err
		}
		if n > 0 {
			last = time.Now()
		} else if e.opt.unreliable() && time.Since(last) > lossQuiet {
			return nil
		} else if time.Since(last) > stallTimeout {
			return fmt.Errorf("send_bw: %w (%s)", errStalled, e.progress())
		}
		if err := e.takeRecvs(n, size); err != nil {
			return err
		}
	}
}

// lossQuiet: over UC and UD the server stops waiting for the client's
// SENDs after this long without one.
const lossQuiet = 200 * time.Millisecond

func (e *endpoint) takeRecvs(n, size int) error {
	for i := range n {
		c := &e.wc[i]
		if err := checkCQE(c, "send_bw receive"); err != nil {
			return err
		}
		qi := e.qpIndex(c.QPNum)
		if qi < 0 || c.Opcode != abi.WCRecv {
			return fmt.Errorf("%w: send_bw: unexpected completion %+v", errCompletion, *c)
		}
		if int(c.ByteLen) != e.grh+size {
			return fmt.Errorf("%w: send_bw: received %d bytes, want %d", errVerify, c.ByteLen, e.grh+size)
		}
		q := e.qps[qi]
		q.received++
		if err := q.qp.PostRecv(&q.rwr); err != nil {
			return fmt.Errorf("post receive: %w", err)
		}
	}
	return nil
}

// servePongs answers each ping (a WRITE landing in memory or a SEND) with
// the same operation, until the client says done.
func (e *endpoint) servePongs(size int, stopped func() bool) error {
	q := e.qps[0]
	recv := q.buf.Bytes[:e.area]
	send := q.buf.Bytes[e.area : 2*e.area]
	q.wr.Flags |= abi.SendSignaled
	for k := uint64(1); ; k++ {
		var err error
		if e.opt.Test == writeLat {
			err = e.waitWrite(q, recv, size, k, stopped)
		} else {
			err = e.waitRecv(q, k, stopped)
		}
		if errors.Is(err, errStopped) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s pong %d: %w", e.opt.Test, k, err)
		}
		send[size-1] = byte(k)
		q.wr.WrID = k
		if err := q.qp.PostSend(&q.wr); err != nil {
			return fmt.Errorf("%s: post: %w", e.opt.Test, err)
		}
		q.posted = k
	}
}
