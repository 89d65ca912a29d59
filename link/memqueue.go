package link

import (
	"net/netip"
	"sync"
)

// frameQueue is a bounded FIFO of frame buffers guarded by one mutex: the
// receive queue of a port and the network's pool of empty buffers. Unlike a
// channel, whose every send and receive takes its lock, it moves a whole
// batch under one lock acquisition, so a 64-frame batch costs one lock
// round trip per side instead of 64 (the channels' locks were a third of
// the in-memory link's cost under 4 KiB WRITEs, with both workers
// contending on them).
type frameQueue struct {
	mu   sync.Mutex
	ring []queued // len is the capacity; a power of two is not required
	head int      // index of the oldest entry
	n    int      // entries queued
}

// queued is a buffer in a queue and, for a received UDP payload
// (roce.ModeUDP), its sender.
type queued struct {
	buf  []byte
	from netip.AddrPort
}

func newFrameQueue(capacity int) *frameQueue {
	return &frameQueue{ring: make([]queued, capacity)}
}

// length returns the number of queued buffers.
func (q *frameQueue) length() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// push appends b, received from from (zero in the pool and for Ethernet
// frames); false when the queue is full.
func (q *frameQueue) push(b []byte, from netip.AddrPort) bool {
	q.mu.Lock()
	ok := q.pushLocked(b, from)
	q.mu.Unlock()
	return ok
}

func (q *frameQueue) pushLocked(b []byte, from netip.AddrPort) bool {
	if q.n == len(q.ring) {
		return false
	}
	i := q.head + q.n
	if i >= len(q.ring) {
		i -= len(q.ring)
	}
	q.ring[i] = queued{b, from}
	q.n++
	return true
}

func (q *frameQueue) popLocked() queued {
	e := q.ring[q.head]
	q.ring[q.head] = queued{}
	q.head++
	if q.head == len(q.ring) {
		q.head = 0
	}
	q.n--
	return e
}

// pop removes the oldest buffer; nil when the queue is empty.
func (q *frameQueue) pop() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil
	}
	return q.popLocked().buf
}

// pushAll appends every buffer of bs (the pool: it has room for every
// buffer of the network, so nothing is refused).
func (q *frameQueue) pushAll(bs [][]byte) {
	q.mu.Lock()
	for _, b := range bs {
		if !q.pushLocked(b, netip.AddrPort{}) {
			panic("link: buffer pool overflow") // buffers are conserved: a bug
		}
	}
	q.mu.Unlock()
}

// popInto fills dst[:k] with up to len(dst) of the oldest buffers and
// returns k.
func (q *frameQueue) popInto(dst [][]byte) int {
	q.mu.Lock()
	k := min(len(dst), q.n)
	for i := range k {
		dst[i] = q.popLocked().buf
	}
	q.mu.Unlock()
	return k
}

// exchange is RecvBatch's step: it takes up to len(slots) frames, each
// replacing the buffer in its slot, with its sender in froms[i] unless
// froms is nil, and moves the replaced (empty) buffers to empties[:k]. It
// returns k.
func (q *frameQueue) exchange(slots [][]byte, froms []netip.AddrPort, empties [][]byte) int {
	q.mu.Lock()
	k := min(len(slots), q.n)
	for i := range k {
		empties[i] = slots[i]
		e := q.popLocked()
		slots[i] = e.buf
		if froms != nil {
			froms[i] = e.from
		}
	}
	q.mu.Unlock()
	return k
}
