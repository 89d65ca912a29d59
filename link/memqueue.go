package link

import "sync"

// frameQueue is a bounded FIFO of frame buffers guarded by one mutex: the
// receive queue of a port and the network's pool of empty buffers. Unlike a
// channel, whose every send and receive takes its lock, it moves a whole
// batch under one lock acquisition, so a 64-frame batch costs one lock
// round trip per side instead of 64 (the channels' locks were a third of
// the in-memory link's cost under 4 KiB WRITEs, with both workers
// contending on them).
type frameQueue struct {
	mu   sync.Mutex
	ring [][]byte // len is the capacity; a power of two is not required
	head int      // index of the oldest entry
	n    int      // entries queued
}

func newFrameQueue(capacity int) *frameQueue {
	return &frameQueue{ring: make([][]byte, capacity)}
}

// length returns the number of queued buffers.
func (q *frameQueue) length() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// push appends b; false when the queue is full.
func (q *frameQueue) push(b []byte) bool {
	q.mu.Lock()
	ok := q.pushLocked(b)
	q.mu.Unlock()
	return ok
}

func (q *frameQueue) pushLocked(b []byte) bool {
	if q.n == len(q.ring) {
		return false
	}
	i := q.head + q.n
	if i >= len(q.ring) {
		i -= len(q.ring)
	}
	q.ring[i] = b
	q.n++
	return true
}

func (q *frameQueue) popLocked() []byte {
	b := q.ring[q.head]
	q.ring[q.head] = nil
	q.head++
	if q.head == len(q.ring) {
		q.head = 0
	}
	q.n--
	return b
}

// pop removes the oldest buffer; nil when the queue is empty.
func (q *frameQueue) pop() []byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil
	}
	return q.popLocked()
}

// pushAll appends every buffer of bs (the pool: it has room for every
// buffer of the network, so nothing is refused).
func (q *frameQueue) pushAll(bs [][]byte) {
	q.mu.Lock()
	for _, b := range bs {
		if !q.pushLocked(b) {
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
		dst[i] = q.popLocked()
	}
	q.mu.Unlock()
	return k
}

// exchange is RecvBatch's step: it takes up to len(slots) frames, each
// replacing the buffer in its slot, and moves the replaced (empty)
// buffers to empties[:k]. It returns k.
func (q *frameQueue) exchange(slots, empties [][]byte) int {
	q.mu.Lock()
	k := min(len(slots), q.n)
	for i := range k {
		empties[i] = slots[i]
		slots[i] = q.popLocked()
	}
	q.mu.Unlock()
	return k
}
