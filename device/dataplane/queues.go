package dataplane

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
)

// The engine's work sources and completion sinks over the client's rings
// (package queues) and doorbell records (package doorbell).
//
// Who calls what:
//
//   - sqSource and an RQ's recvSource belong to one QP and are called only
//     by the QP's owning engine worker.
//   - An SRQ's recvSource is shared by every QP attached to it, whatever
//     worker owns them: a mutex serialises its consumers.
//   - A cqSink is shared by every QP using the CQ (as send or receive CQ),
//     on any worker: a mutex serialises its producers. The engine reaches it
//     through a per-QP qpSink, which knows whether it is the QP's send or
//     receive side (solicited events).
//
// Resetting a QP (MODIFY_QP to RESET) discards the WQEs posted so far
// without completions (IBTA 10.3.1). The client's producer indices are not
// reset by the ABI (they are free-running), so the control path records
// the producer index the client had published when the QP was reset, and
// the worker, on its next poll, consumes the ring up to that index. The
// hand-over is one atomic word (generation << 32 | index): the worker
// alone moves the consumer index.

// errRingBroken is reported once for a ring whose client-written producer
// index was impossible (queues.ErrIndex): the engine moves the QP to ERR.
var errRingBroken = errors.New("dataplane: work queue index out of range")

// resetReq is the hand-over of a RESET to the worker: generation in the
// high half (0: none yet), the producer index to discard up to in the low.
type resetReq struct{ v atomic.Uint64 }

func (r *resetReq) request(pi uint32) {
	for {
		old := r.v.Load()
		next := (old>>32+1)<<32 | uint64(pi)
		if r.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// ring is what both work sources need of their ring view (queues.SQ,
// queues.RecvQueue): W is the view's private WQE copy.
type ring[W any] interface {
	Pending() uint32
	Publish()
	Poll() (uint32, error)
	Head() uint32
	Next(w *W) (bool, error)
}

// consumer is the worker-side state of one ring: the RESET hand-over and
// whether the ring's breakage was reported.
type consumer struct {
	reset  resetReq
	seen   uint32 // reset generation applied (worker only)
	broken bool   // errRingBroken reported (worker only)
}

// take makes the next posted WQE of q current in w. It applies a pending
// RESET first (resettable: an RQ or SQ, not a shared SRQ), reads the
// client's producer index when nothing read earlier is left (publishing
// the consumer index first), and, with publishEach, publishes the consumer
// index as soon as the WQE is copied, so the client's flow control sees
// the slot free. Without it (an SQ: engine.SendPublisher) the engine
// publishes once per batch, before any completion of what it took. It returns
// false when nothing is posted; true with errRingBroken, once, for an
// impossible producer index (w is not filled); true with the view's error
// for a malformed WQE (consumed, its wr_id in w).
func take[W any, Q ring[W]](c *consumer, q Q, w *W, resettable, publishEach bool) (bool, error) {
	if resettable {
		if v := c.reset.v.Load(); uint32(v>>32) != c.seen {
			c.seen = uint32(v >> 32)
			discardTo(q, uint32(v), w)
		}
	}
	if q.Pending() == 0 {
		q.Publish()
		n, err := q.Poll()
		if err != nil {
			if c.broken {
				return false, nil
			}
			c.broken = true
			return true, fmt.Errorf("%w: %w", errRingBroken, err)
		}
		if n == 0 {
			return false, nil
		}
	}
	ok, err := q.Next(w)
	if !ok {
		return false, nil
	}
	if publishEach {
		q.Publish()
	}
	return true, err
}

// discardTo consumes the ring up to producer index target (the RESET
// hand-over) and publishes the consumer index. A target the client's
// producer index never reached, or an impossible index, stops early: the
// ring then starts from where it is.
func discardTo[W any, Q ring[W]](q Q, target uint32, w *W) {
	for q.Head() != target {
		n, err := q.Poll()
		if err != nil || n == 0 {
			break
		}
		for q.Head() != target {
			if ok, _ := q.Next(w); !ok {
				break
			}
		}
	}
	q.Publish()
}

// sqSource is a QP's send queue as the engine's SendSource: the queue
// decodes each WQE straight into the engine's entry (queues.SQ.NextInto),
// so a WQE is copied once, from the ring into the engine's private ring.
type sqSource struct {
	q *queues.SQ
	consumer
}

// sqInto is the send queue as take's ring of engine.SendWork.
type sqInto struct{ *queues.SQ }

// Next decodes the next WQE into w (its SGE and inline storage the engine
// sized from the QP's capabilities).
func (q sqInto) Next(w *engine.SendWork) (bool, error) {
	d := queues.SendDest{WQE: &w.SendWQE, SGEs: w.SGEs, Inline: w.Inline}
	ok, err := q.NextInto(&d)
	w.SGEs, w.Inline = d.SGEs, d.Inline
	return ok, err
}

var (
	_ engine.SendSource    = (*sqSource)(nil)
	_ engine.SendPublisher = (*sqSource)(nil)
)

// PublishSend implements engine.SendPublisher: the engine publishes the
// consumer index once per batch (PollSend does not).
func (s *sqSource) PublishSend() { s.q.Publish() }

// newSQSource builds the send source of a QP.
func newSQSource(ring []byte, c abi.QPCap, rec doorbell.QPRecord) (*sqSource, error) {
	q, err := queues.NewSQ(ring, queues.SQConfig{Slots: c.MaxSendWR, MaxSGE: c.MaxSendSGE, MaxInline: c.MaxInlineData}, rec.SQPI, rec.SQCI)
	if err != nil {
		return nil, err
	}
	return &sqSource{q: q}, nil
}

// PollSend implements engine.SendSource. The WQE is read once from the
// ring into w and validated there by package queues (w's SGE and inline
// storage the engine sized from the same capacities).
func (s *sqSource) PollSend(w *engine.SendWork) (bool, error) {
	w.SGEs, w.Inline = w.SGEs[:0], w.Inline[:0]
	ok, err := take(&s.consumer, sqInto{s.q}, w, true, false)
	if !ok {
		return false, nil
	}
	if errors.Is(err, errRingBroken) {
		w.SendWQE = abi.SendWQE{} // nothing was read: no wr_id
	}
	return true, err
}

// recvSource is an RQ or SRQ as the engine's RecvSource: like an SQ, the
// queue decodes each WQE straight into the engine's entry.
type recvSource struct {
	mu  *sync.Mutex // non-nil for an SRQ (shared by workers)
	srq *device.SRQ // the SRQ's limit and its event (nil for an RQ)
	q   *queues.RecvQueue
	consumer
}

var _ engine.RecvSource = (*recvSource)(nil)

// recvInto is a receive queue as take's ring of engine.RecvWork.
type recvInto struct{ *queues.RecvQueue }

// Next decodes the next receive WQE into r (its SGE storage the engine
// sized from the queue's max_sge).
func (q recvInto) Next(r *engine.RecvWork) (bool, error) {
	d := queues.RecvDest{SGEs: r.SGEs}
	ok, err := q.NextInto(&d)
	r.WrID, r.SGEs = d.WrID, d.SGEs
	return ok, err
}

// newRQSource builds the receive source of a QP's own RQ.
func newRQSource(ring []byte, slots, maxSGE uint32, rec doorbell.QPRecord) (*recvSource, error) {
	q, err := queues.NewRQ(ring, queues.RecvConfig{Slots: slots, MaxSGE: maxSGE}, rec.RQPI, rec.RQCI)
	if err != nil {
		return nil, err
	}
	return &recvSource{q: q}, nil
}

func newSRQSource(ring []byte, slots, maxSGE uint32, rec doorbell.SRQRecord) (*recvSource, error) {
	q, err := queues.NewSRQ(ring, queues.RecvConfig{Slots: slots, MaxSGE: maxSGE}, rec.PI, rec.CI)
	if err != nil {
		return nil, err
	}
	return &recvSource{q: q, mu: new(sync.Mutex)}, nil
}

// PollRecv implements engine.RecvSource. An SRQ is not reset with a QP
// (it is shared); its consumers are serialised by its mutex.
func (s *recvSource) PollRecv(r *engine.RecvWork) (bool, error) {
	if s.mu != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
	}
	r.SGEs = r.SGEs[:0]
	ok, err := take(&s.consumer, recvInto{s.q}, r, s.mu == nil, true)
	if !ok {
		return false, nil
	}
	if err != nil {
		if errors.Is(err, errRingBroken) {
			r.WrID = 0
		}
		return true, err
	}
	if s.srq != nil {
		s.checkLimit()
	}
	return true, nil
}

// checkLimit raises SRQ_LIMIT_REACHED when an armed SRQ holds fewer WQEs
// than its limit after a take (IBTA 11.5.2.3). The client may have posted
// since the last look at its producer index: it is read again before the
// event is raised.
func (s *recvSource) checkLimit() {
	lim := s.srq.Limit()
	if lim == 0 || s.q.Pending() >= lim {
		return
	}
	if _, err := s.q.Poll(); err == nil && s.q.Pending() < lim {
		s.srq.LimitReached(lim)
	}
}

// cqSink is a CQ's producer side: the CQE ring (queues.CQ), cq_pi, and
// CQ arming with the client's completion eventfd (doorbell.CQNotifier).
// It lives as long as the CQ (created with the first QP that uses it,
// released when the CQ is destroyed), so its producer index survives the
// QPs.
//
// A completion event is decided here, on the worker, and raised by a
// doorbell.Signaller that never blocks on the client's eventfd (whose
// file status flags the client shares and may change): the kernel
// signals it (doorbell.KernelSignaller, one io_submit on the worker), or,
// where the kernel cannot, the client's own doorbell.EventWriter writes
// it on a goroutine per context, so a client that makes the write block
// delays only its own events.
//
// Overflow (the client did not consume): the CQE is not written, the
// record's overflow word is set (queues), and the CQ stays in error: every
// later completion fails too (IBTA 11.4.2.1: a CQ overrun is a CQ error;
// its QPs go to ERR). The engine moves the QP of each failed completion
// to ERR.
type cqSink struct {
	// overflowed, when set, is told of the CQ's overflow (once).
	overflowed func()

	mu       sync.Mutex
	cq       *queues.CQ
	notify   *doorbell.CQNotifier
	overflow bool
	lost     atomic.Uint64 // completions refused after the overflow
	events   atomic.Uint64 // completion events raised (or handed to the writer)

	page   *doorbell.Page // with a context's EventWriter: its page (the writer's key)
	closed bool           // released (guarded by DataPlane.mu)

	verb cqVerb // verb-level faults of the CQ (verbfaults.go)
}

// newCQSink builds the sink; comp (the completion eventfd, owned by the
// sink from now on) and sig (what raises it) are both nil or both set.
func newCQSink(ring []byte, count uint32, ts bool, rec doorbell.CQRecord, comp *doorbell.EventFD, sig doorbell.Signaller) (*cqSink, error) {
	q, err := queues.NewCQ(ring, count, queues.CQWords{CI: rec.CI, PI: rec.PI, Overflow: rec.Overflow})
	if err != nil {
		return nil, err
	}
	if ts {
		// The timestamps follow the CQEs (abi.CQFlagTimestamp).
		if uint64(len(ring)) < uint64(count)*abi.SizeofCQE {
			return nil, fmt.Errorf("dataplane: CQ ring of %d bytes for %d CQEs", len(ring), count)
		}
		if err := q.SetTimestamps(ring[uint64(count)*abi.SizeofCQE:]); err != nil {
			return nil, err
		}
	}
	return &cqSink{cq: q, notify: doorbell.NewCQNotifier(rec, comp, sig)}, nil
}

// errCQOverflow is returned for every completion of an overflowed CQ.
var errCQOverflow = fmt.Errorf("dataplane: %w (CQ in error)", queues.ErrCQFull)

// push writes c, publishes cq_pi and, if the CQ is armed for it, raises a
// completion event (solicited: the CQE satisfies a solicited-only arm).
// It never blocks on anything the client controls.
func (s *cqSink) push(c *abi.CQE, solicited bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.verbOn() {
		return s.verbPush(c, solicited)
	}
	return s.write(c, solicited)
}

// write is push with s.mu held.
func (s *cqSink) write(c *abi.CQE, solicited bool) error {
	if s.overflow {
		s.lost.Add(1)
		return errCQOverflow
	}
	if err := s.cq.Push(c); err != nil {
		s.overflow = true
		s.lost.Add(1)
		if s.overflowed != nil {
			s.overflowed()
		}
		if errors.Is(err, queues.ErrCQFull) {
			return errCQOverflow
		}
		return err
	}
	s.cq.Publish()
	if s.notify.Completed(solicited) {
		s.events.Add(1)
	}
	return nil
}

// close closes the completion eventfd; it never blocks (a write the
// client made block is unstuck by the notifier).
func (s *cqSink) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.verb.gone = true
	return s.notify.Close()
}

// qpSink is one QP's use of a CQ: the engine's CompletionSink.
type qpSink struct {
	cq   *cqSink
	recv bool
}

var _ engine.CompletionSink = (*qpSink)(nil)

// PushCQE implements engine.CompletionSink. Solicited-only arming (IBTA
// 11.4.2.2; ibv_req_notify_cq): a completion is solicited when it is the
// receive completion of a message whose last packet had the Solicited
// Event bit (se, from the engine), or when its status is an error; a
// successful send-side completion never is. An error (the CQ overflowed)
// makes the engine move the QP to ERR.
func (s *qpSink) PushCQE(c *abi.CQE, se bool) error {
	return s.cq.push(c, c.Status != abi.WCSuccess || s.recv && se)
}
