package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// dial connects to the server's control address, retrying for a while
// when nobody listens yet (the server may still be starting).
func dial(server string) (net.Conn, error) {
	network, addr := splitAddr(server)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout(network, addr, 5*time.Second)
		if err == nil {
			return c, nil
		}
		if !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)) || time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to the server at %s: %w", server, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runClientRole runs the client role: connects to the server, runs every
// size and returns one result per size.
func runClientRole(dev, server string, o *options) ([]result, error) {
	nc, err := dial(server)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	cc := newCtrlConn(nc)
	res, err := clientConn(dev, cc, o)
	if err != nil && !errors.Is(err, errPeer) {
		cc.send(message{Kind: "error", Error: err.Error()})
	}
	return res, err
}

func clientConn(dev string, cc *ctrlConn, o *options) ([]result, error) {
	e, err := newEndpoint(dev, o, "vrnic-perf-client")
	if err != nil {
		return nil, err
	}
	defer e.close()
	infos, err := e.infos()
	if err != nil {
		return nil, err
	}
	// The ECE offer: the options asked for that the device supports. The
	// server answers with those it takes of them (ECE negotiation over
	// the control connection, as a REQ and its REP would do it).
	caps, err := e.eceCaps()
	if err != nil {
		return nil, err
	}
	offer := *o
	offer.ECE &= caps
	if err := cc.send(message{Kind: "hello", Options: &offer, QPs: infos}); err != nil {
		return nil, err
	}
	m, err := cc.recv("hello", 60*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errPeer, err)
	}
	if err := e.connect(m.QPs, m.ECE&offer.ECE); err != nil {
		return nil, err
	}
	if err := e.fillRecv(); err != nil {
		return nil, err
	}
	var results []result
	for _, size := range o.sizes() {
		r, err := e.runSize(cc, size)
		if err != nil {
			return results, err
		}
		results = append(results, r)
	}
	return results, cc.send(message{Kind: "bye"})
}

// runSize runs the test for one message size.
func (e *endpoint) runSize(cc *ctrlConn, size int) (result, error) {
	o := e.opt
	iters := o.itersFor(size)
	for i, q := range e.qps {
		b := q.buf.Bytes
		switch o.Test {
		case writeBW, sendBW:
			e.fillAreas(b, size, i)
		case readBW, readLat:
			clear(b[:size])
		case atomicBW:
			clear(b[:8*o.Depth])
		case writeLat, sendLat:
			clear(b[:size])
			fillPattern(b[e.area:e.area+size], size, i)
		}
	}
	e.prepareWRs(size)
	if err := cc.send(message{Kind: "start", Size: size, Iters: iters}); err != nil {
		return result{}, err
	}
	started, err := cc.recv("started", 60*time.Second)
	if err != nil {
		return result{}, fmt.Errorf("%w: %w", errPeer, err)
	}
	base, err := e.queryCounters()
	if err != nil {
		return result{}, err
	}
	allocs0 := loopAllocs()
	var meas measurement
	if o.Test.latency() {
		meas, err = e.runLat(size, iters)
	} else {
		meas, err = e.runBW(size, iters)
	}
	allocs1 := loopAllocs()
	if err != nil {
		return result{}, err
	}
	end, err := e.queryCounters()
	if err != nil {
		return result{}, err
	}
	done := message{Kind: "done", Size: size, Areas: e.areasWritten()}
	done.Checksum = e.checksumAreas(0, size, done.Areas)
	for _, q := range e.qps {
		if o.Test.latency() {
			done.Sent = append(done.Sent, q.posted)
		} else {
			done.Sent = append(done.Sent, q.completed)
		}
	}
	var verifyErr error
	if o.Verify {
		verifyErr = e.verifyClient(size, started.Checksum, done.Areas)
	}
	if err := cc.send(done); err != nil {
		return result{}, err
	}
	v, err := cc.recv("verdict", 60*time.Second)
	if err != nil {
		return result{}, fmt.Errorf("%w: %w", errPeer, err)
	}
	if v.Error != "" {
		return result{}, fmt.Errorf("%w: server: %s", errVerify, v.Error)
	}
	if verifyErr != nil {
		return result{}, verifyErr
	}
	r := e.makeResult(size, meas, end.sub(base))
	r.Lost = v.Lost
	if v.Counters != nil {
		r.Server = *v.Counters
	}
	r.Retransmits = r.Client.Retransmits + r.Server.Retransmits
	r.LoopAllocs = allocs1 - allocs0
	r.Verified = o.Verify
	return r, nil
}

// areasWritten is the number of message areas every QP's WRs used: all
// of them once each QP posted as many WRs as there are areas.
func (e *endpoint) areasWritten() int {
	n := e.opt.Areas
	for _, q := range e.qps {
		n = min(n, int(q.posted))
	}
	return max(n, 1)
}

// verifyClient checks what the test left in this side's memory: READs
// landed the server's data (serverSum: the first area of each QP), in
// each of the first areas areas.
func (e *endpoint) verifyClient(size int, serverSum uint32, areas int) error {
	o := e.opt
	switch o.Test {
	case readBW, readLat:
		if got := e.checksumAll(0, size); got != serverSum {
			return fmt.Errorf("%w: %s %d B: checksum of the data read %#08x, the server's data %#08x", errVerify, o.Test, size, got, serverSum)
		}
		for i, q := range e.qps {
			for a := 1; a < areas; a++ { // the server holds the same message in each
				if !bytes.Equal(q.buf.Bytes[a*e.area:a*e.area+size], q.buf.Bytes[:size]) {
					return fmt.Errorf("%w: %s %d B: QP %d: area %d holds other data than area 0", errVerify, o.Test, size, i, a)
				}
			}
		}
	case writeLat, sendLat:
		q := e.qps[0]
		if q.posted > 0 && checksum(q.buf.Bytes[e.grh:e.grh+size]) != checksum(q.buf.Bytes[e.area:e.area+size]) {
			return fmt.Errorf("%w: %s %d B: last message received differs from the one expected", errVerify, o.Test, size)
		}
	}
	return nil
}
