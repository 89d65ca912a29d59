package engine

import (
	"math/bits"

	"github.com/vrnic/vrnic/abi"
)

// Completion latency.
//
// Each worker keeps, per completion opcode, a histogram of the time from
// when the engine took a WQE (the requester fetched the send WQE, the
// responder took the receive WQE for a message's first packet) to when it
// wrote the WQE's successful CQE. Both instants are the worker's pass
// clock (worker.now, read once per pass): recording costs no clock read,
// no atomic and no allocation, one bucket increment and one addition. The
// resolution is one pass of the worker: a WQE taken and completed in the
// same pass (a local operation, a single-packet receive, a UD send) counts
// as 0. Unsignaled send WQEs write no CQE and count nowhere; error
// completions count in the CQE counters and the cause counters, not here.
//
// Only the worker writes its histograms; a reader gets a copy through the
// worker's control queue (Engine.CompletionLatency), so nothing on the
// data path is shared.

// Histogram bounds: bucket i (i < LatencyBuckets) counts completions that
// took more than the previous bound and at most 2^(LatencyMinShift+i)
// nanoseconds (the first from 0, at most about 1 µs); the last bucket
// counts those beyond 2^(LatencyMinShift+LatencyBuckets-1) ns, about 17 s.
const (
	LatencyMinShift = 10
	LatencyBuckets  = 25
)

// LatencyBound returns bucket i's upper bound in nanoseconds (i <
// LatencyBuckets).
func LatencyBound(i int) uint64 { return 1 << (LatencyMinShift + i) }

// LatencyOp is the completion opcode a latency histogram is of.
type LatencyOp uint8

// The completion opcodes of the histograms (abi.WCOpcode, grouped).
const (
	LatSend         LatencyOp = iota // SEND, SEND with immediate or invalidate
	LatWrite                         // RDMA WRITE, with or without immediate
	LatRead                          // RDMA READ
	LatCompSwap                      // atomic compare and swap
	LatFetchAdd                      // atomic fetch and add
	LatAtomicWrite                   // ATOMIC WRITE
	LatFlush                         // FLUSH
	LatLocalInv                      // local invalidate
	LatBindMW                        // bind memory window
	LatRecv                          // a receive WQE taken by a SEND
	LatRecvWriteImm                  // a receive WQE taken by an RDMA WRITE with immediate
	NumLatencyOps
)

var latencyOpNames = [NumLatencyOps]string{"send", "rdma_write", "rdma_read", "comp_swap", "fetch_add", "atomic_write",
	"flush", "local_inv", "bind_mw", "recv", "recv_rdma_with_imm"}

// String returns the opcode's name: send, rdma_write, rdma_read,
// comp_swap, fetch_add, atomic_write, flush, local_inv, bind_mw, recv,
// recv_rdma_with_imm.
func (o LatencyOp) String() string {
	if o < NumLatencyOps {
		return latencyOpNames[o]
	}
	return "unknown"
}

// latencyOf maps a completion opcode to its histogram.
func latencyOf(op abi.WCOpcode) LatencyOp {
	switch op {
	case abi.WCRDMAWrite:
		return LatWrite
	case abi.WCRDMARead:
		return LatRead
	case abi.WCCompSwap:
		return LatCompSwap
	case abi.WCFetchAdd:
		return LatFetchAdd
	case abi.WCAtomicWrite:
		return LatAtomicWrite
	case abi.WCFlush:
		return LatFlush
	case abi.WCLocalInv:
		return LatLocalInv
	case abi.WCBindMW:
		return LatBindMW
	case abi.WCRecv:
		return LatRecv
	case abi.WCRecvRDMAWithImm:
		return LatRecvWriteImm
	}
	return LatSend
}

// LatencyHist is one opcode's histogram: Buckets per bucket (not
// cumulative), SumNanos the sum of the latencies.
type LatencyHist struct {
	Buckets  [LatencyBuckets + 1]uint64
	SumNanos uint64
}

// Count returns the completions the histogram holds.
func (h *LatencyHist) Count() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// record counts one completion that took d nanoseconds.
func (h *LatencyHist) record(d int64) {
	i := 0
	if d > 1<<LatencyMinShift {
		// d <= 2^k exactly when d-1 < 2^k.
		i = min(bits.Len64(uint64(d-1))-LatencyMinShift, LatencyBuckets)
	} else if d < 0 {
		d = 0
	}
	h.Buckets[i]++
	h.SumNanos += uint64(d)
}

// Latencies are the histograms of every completion opcode.
type Latencies [NumLatencyOps]LatencyHist

// Add adds o to l.
func (l *Latencies) Add(o *Latencies) {
	for k := range l {
		for i, b := range o[k].Buckets {
			l[k].Buckets[i] += b
		}
		l[k].SumNanos += o[k].SumNanos
	}
}

// recordLatency counts a successful completion of op whose WQE the worker
// took at taken (its pass clock).
func (w *worker) recordLatency(op abi.WCOpcode, taken int64) {
	w.lat[latencyOf(op)].record(w.now - taken)
}

// CompletionLatency returns the completion-latency histograms of every
// worker added up (see the top of latency.go). It asks each worker for a
// copy through its control queue and waits for the answers: for metrics
// scrapes and tools, not for the data path. ErrClosed: the engine is
// closed (what the workers answered before is still added).
func (e *Engine) CompletionLatency() (Latencies, error) {
	var out Latencies
	msgs := make([]*ctlMsg, len(e.workers))
	for i, w := range e.workers {
		m := &ctlMsg{op: ctlLatency, lat: new(Latencies), applied: make(chan struct{})}
		if !e.post(w, m) {
			return out, ErrClosed
		}
		msgs[i] = m
	}
	for _, m := range msgs {
		select {
		case <-m.applied:
		case <-e.stop:
			return out, ErrClosed
		}
		out.Add(m.lat)
	}
	return out, nil
}
