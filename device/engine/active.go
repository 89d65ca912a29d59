package engine

import "github.com/vrnic/vrnic/abi"

// Activity. A worker services only the QPs that have work, not every QP
// it owns: a host carries thousands of connections, most of them idle,
// and a pass over all of them on every loop round made an idle QP cost
// every active one (BENCHMARKS.md, "Idle QPs").
//
// A QP is on its worker's active list from the moment something may give
// it work until it has none left and has had none for activeLinger:
//
//   - a doorbell: Engine.Kick(qpn) queues the QPN for the worker, which
//     takes the queue at the top of every pass (before it services its
//     QPs, so the service that follows reads the producer index that made
//     the doorbell poller kick);
//   - a frame for the QP (worker.input);
//   - a timer of the QP that fires (onRetryTimer, onRNRTimer);
//   - a control operation that changes it (MODIFY_QP).
//
// An active QP is serviced every pass, as before: its requester reads the
// SQ producer index itself, so a QP in steady use (a ping-pong, a stream)
// never waits for the doorbell poller. It leaves the list when its
// private send ring is empty (head == tail: nothing fetched and not
// completed), its responder owes nothing and nothing happened to it for
// activeLinger. Its timers keep running meanwhile (they are per worker,
// a heap): an idle QP costs no pass and no poll, only memory.
//
// Memory: the private send ring (SQDepth WQE copies with their SGE and
// inline storage, the only per-QP state that grows with the queue depth)
// is taken when the requester first needs it and given back ringLinger
// (at most ringLinger/sweepSpacing more) after the QP's last activity: a QP that leaves the list is parked with
// its ring, and the worker's sweep (parkSweep, due at parkedDue, which
// bounds the worker's sleep) releases the rings of those still idle. A QP
// used in turn with many others (a round robin over hundreds of QPs, a
// worker that sleeps between requests) keeps its ring between turns
// instead of allocating and clearing it each time; one idle for longer
// holds none. A worker keeps a few released rings of recently used
// shapes for the next QP that becomes active.

// activeLinger is how long a QP with nothing to do stays on the active
// list after its last activity: a QP used once per round trip (a
// ping-pong) stays there and is serviced without waiting for a doorbell
// kick.
const activeLinger = 1_000_000 // ns

// ringLinger is how long a QP off the active list keeps its private send
// ring after its last activity.
const ringLinger = 10_000_000 // ns

// ringCacheBytes bounds the private send rings a worker keeps for reuse.
const ringCacheBytes = 4 << 20

// RingCacheBytes is the most a worker keeps of idle QPs' send rings for
// reuse: memory per worker, not per QP.
const RingCacheBytes = ringCacheBytes

// swqeBytes is about the size of one swqe (for the cache's bound).
const swqeBytes = 176

// sqShape identifies a private send ring's layout.
type sqShape struct {
	depth, sges, inline int
}

// sqShape is the shape of qp's send ring.
func (qp *QP) sqShape() sqShape {
	return sqShape{int(qp.cfg.SQDepth), int(qp.cfg.MaxSendSGE), int(qp.cfg.MaxInline)}
}

// bytes is about what a ring of the shape holds.
func (s sqShape) bytes() int {
	return s.depth * (swqeBytes + 16*s.sges + s.inline)
}

// activate puts qp on the active list (once) and notes the activity.
func (w *worker) activate(qp *QP) {
	qp.lastActive = w.now
	if qp.activeIdx >= 0 {
		return
	}
	if qp.parkedIdx >= 0 {
		w.unpark(qp) // its ring goes on serving it
	}
	qp.activeIdx = int32(len(w.active))
	w.active = append(w.active, qp)
	w.Counters.ActiveQPs.Store(int64(len(w.active)))
}

// deactivate takes the QP at position i off the active list (the last
// one takes its place) and parks it with its private send ring, if it
// has one.
func (w *worker) deactivate(i int) {
	qp := w.active[i]
	removeAt(&w.active, i, activePos)
	w.Counters.ActiveQPs.Store(int64(len(w.active)))
	if qp.sr != nil {
		qp.srShrink()
	}
	if qp.sq != nil {
		w.park(qp)
	}
}

// park puts qp, just off the active list with its send ring, on the
// parked list, and brings the next sweep forward to its release time.
func (w *worker) park(qp *QP) {
	qp.parkedIdx = int32(len(w.parked))
	w.parked = append(w.parked, qp)
	if due := qp.lastActive + w.ringLinger; len(w.parked) == 1 || due < w.parkedDue {
		w.parkedDue = due
	}
}

// unpark takes qp off the parked list (the last one takes its place).
func (w *worker) unpark(qp *QP) { removeAt(&w.parked, int(qp.parkedIdx), parkedPos) }

// activePos and parkedPos give the field holding a QP's position on the
// active and the parked list.
func activePos(qp *QP) *int32 { return &qp.activeIdx }
func parkedPos(qp *QP) *int32 { return &qp.parkedIdx }

// removeAt takes the QP at position i off the list l in O(1): the last
// one takes its place (its position, pos, updated) and the QP's own
// position becomes -1.
func removeAt(l *[]*QP, i int, pos func(*QP) *int32) {
	s := *l
	qp, last := s[i], len(s)-1
	if i != last {
		s[i] = s[last]
		*pos(s[i]) = int32(i)
	}
	s[last] = nil
	*l = s[:last]
	*pos(qp) = -1
}

// parkSweep gives back the send rings of the parked QPs idle for
// ringLinger and sets the next sweep for the earliest of the others, but
// no sooner than ringLinger/8 from now (sweepSpacing). Run when parkedDue
// has passed: the parked list holds only QPs active within the last
// ringLinger, so its length is bounded by the activity.
func (w *worker) parkSweep() {
	next := int64(0)
	for i := 0; i < len(w.parked); {
		qp := w.parked[i]
		if due := qp.lastActive + w.ringLinger; due > w.now {
			if next == 0 || due < next {
				next = due
			}
			i++
			continue
		}
		w.unpark(qp) // the last QP moved to i: looked at next
		w.releaseSQ(qp)
	}
	if next != 0 {
		next = max(next, w.now+w.ringLinger/sweepSpacing)
	}
	w.parkedDue = next
}

// sweepSpacing: sweeps of the parked list come at least ringLinger /
// sweepSpacing apart. QPs used in turn (a round robin over hundreds) are
// each due at a time of their own; a sweep at each one's time scanned the
// whole list once per message (0.7-2.1 µs a message with 1,000 QPs).
// Spaced so, a ring is given back at most an eighth of ringLinger late.
const sweepSpacing = 8

// drop takes qp off the active and parked lists and gives its send ring
// back (destroy).
func (w *worker) drop(qp *QP) {
	if qp.activeIdx >= 0 {
		w.deactivate(int(qp.activeIdx))
	}
	if qp.parkedIdx >= 0 {
		w.unpark(qp)
	}
	w.releaseSQ(qp)
	if qp.sq != nil { // WQEs still fetched: the ring goes with the QP
		qp.sq = nil
		w.Counters.RingQPs.Add(-1)
	}
}

// settled reports whether qp may leave the active list: nothing fetched
// and not completed, no response owed, and no activity for activeLinger.
func (qp *QP) settled(now int64) bool {
	if qp.head != qp.tail || now-qp.lastActive < activeLinger {
		return false
	}
	r := &qp.resp
	if r.ackPending || r.nakPending || qp.sr != nil && len(qp.sr.snaks) > 0 {
		return false
	}
	for i := range r.res {
		if r.res[i].active {
			return false
		}
	}
	return true
}

// serviceActive runs the output machines of every active QP and takes
// off the list those that settled.
func (w *worker) serviceActive() {
	for i := 0; i < len(w.active); {
		qp := w.active[i]
		w.service(qp)
		if qp.req.sqTaken {
			qp.publishSQ()
		}
		if qp.activeIdx == int32(i) && qp.settled(w.now) {
			w.deactivate(i) // the last QP moved to i: serviced next
			continue
		}
		i++
	}
}

// settleAll takes off the active list every QP with nothing to do,
// lingering or not: the worker is about to sleep, and a sleeping worker
// polls nothing; a doorbell, a frame or a timer brings a QP back.
func (w *worker) settleAll() {
	for i := 0; i < len(w.active); {
		if qp := w.active[i]; qp.settled(qp.lastActive + activeLinger) {
			w.deactivate(i)
			continue
		}
		i++
	}
}

// drainKicks activates the QPs whose doorbells were rung (Engine.Kick).
func (w *worker) drainKicks() {
	q := w.kicks.take()
	if q == nil {
		return
	}
	for _, qpn := range q {
		if qp := w.qps[qpn]; qp != nil {
			w.activate(qp)
		}
	}
	w.kicks.recycle(q)
}

// ensureSQ gives qp its private send ring if it has none.
func (qp *QP) ensureSQ() {
	if qp.sq != nil {
		return
	}
	s := qp.sqShape()
	w := qp.w
	w.Counters.RingQPs.Add(1)
	if l := w.rings[s]; len(l) > 0 {
		qp.sq = l[len(l)-1]
		l[len(l)-1] = nil
		w.rings[s] = l[:len(l)-1]
		w.ringBytes -= s.bytes()
		w.Counters.RingCacheBytes.Store(int64(w.ringBytes))
		return
	}
	qp.sq = newSQRing(s)
}

// newSQRing allocates a private send ring of shape s, each WQE's SGE and
// inline storage carved from one slab.
func newSQRing(s sqShape) []swqe {
	sq := make([]swqe, s.depth)
	sges := make([]abi.SGE, s.depth*s.sges)
	inl := make([]byte, s.depth*s.inline)
	for i := range sq {
		sq[i].SGEs = sges[i*s.sges : i*s.sges : (i+1)*s.sges]
		sq[i].Inline = inl[i*s.inline : i*s.inline : (i+1)*s.inline]
	}
	return sq
}

// releaseSQ takes qp's private send ring (empty: head == tail) and keeps
// it for reuse while the worker's cache has room.
func (w *worker) releaseSQ(qp *QP) {
	sq := qp.sq
	if sq == nil || qp.head != qp.tail {
		return
	}
	qp.sq = nil
	w.Counters.RingQPs.Add(-1)
	s := qp.sqShape()
	if w.ringBytes+s.bytes() > ringCacheBytes {
		return
	}
	// Clear the slots used since the ring was taken (no pointer into
	// what they named stays reachable; the next QP's ring starts clean):
	// those just before tail, back to the first unused one or round the
	// whole ring, not the whole ring each time (a QP used once between
	// two idle spells, in a round robin over a thousand, used one slot
	// and cleared hundreds).
	for i, j := 0, qp.tail-1; i < len(sq); i, j = i+1, j-1 {
		e := &sq[j&qp.sqMask]
		if !e.used {
			break
		}
		sges, inl := e.SGEs[:0], e.Inline[:0]
		*e = swqe{}
		e.SGEs, e.Inline = sges, inl
	}
	if w.rings == nil {
		w.rings = make(map[sqShape][][]swqe)
	}
	w.rings[s] = append(w.rings[s], sq)
	w.ringBytes += s.bytes()
	w.Counters.RingCacheBytes.Store(int64(w.ringBytes))
}
