package link

import (
	"net/netip"
	"sync"
	"unsafe"
)

// frameQueue is a bounded FIFO of frame buffers guarded by one mutex: the
// network's pool of empty buffers. Unlike a channel, whose every send and
// receive takes its lock, it moves a whole batch under one lock
// acquisition (the channels' locks were a third of the in-memory link's
// cost under 4 KiB WRITEs, with both workers contending on them).
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

// portQueue is a port's receive queue: a bounded FIFO of frames guarded
// by one mutex, which senders copy their frames into and the receiver
// takes them from, a batch under one lock acquisition. Every entry may
// keep a buffer: a queued frame from head for n entries, an empty buffer
// ("parked") in the others. A sender copies a frame into the empty buffer
// of the entry it fills (one of the pool's while the entry has none); the
// receiver takes a frame's buffer and parks its own empty one in its
// place. So a steady stream between two ports cycles through the
// receiver's buffers and touches neither the pool nor its lock, and the
// two sides write the two ends of the ring, not one shared list.
type portQueue struct {
	mu   sync.Mutex
	ring []portEntry // len is the capacity
	head int         // index of the oldest frame
	n    int         // frames queued
}

// portEntry is an entry of a port's queue, padded to a cache line: the
// sender writes the entries at the tail while the receiver takes those at
// the head, and entries that shared lines made each side wait for the
// other's (the padding gained a tenth of the 8-byte WRITE rate of a
// worker pair on two CPUs).
type portEntry struct {
	queued
	_ [64 - unsafe.Sizeof(queued{})%64]byte
}

func newPortQueue(capacity int) *portQueue {
	return &portQueue{ring: make([]portEntry, capacity)}
}

// length returns the number of queued frames.
func (q *portQueue) length() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// at is the index of the entry k places after the oldest frame (k < len):
// at(q.n) is where the next frame goes, at(q.n) to at(len-1) hold no frame.
func (q *portQueue) at(k int) int {
	i := q.head + k
	if i >= len(q.ring) {
		i -= len(q.ring)
	}
	return i
}

// copyMax is the longest frame a sender's queue copies rather than
// moves. A short frame is copied, as through a socket: the sender keeps
// its buffer, still in its CPU's cache, to build the next frame in. A
// longer one moves, buffer and all, and the sender gets the entry's empty
// buffer in exchange: copying it would double the per-byte work (at 4 KiB
// the copy cost 1 MiB WRITEs 40 % of their rate), and its cache lines
// cost the same whichever side they come from.
const copyMax = 512

// pushLocked appends the frame in *slot, sent by from, using the empty
// buffer parked in the next entry, else one of pool's, else another
// parked buffer of the ring: a frame of up to copyMax bytes (any frame
// unless move) is copied into it; a longer one moves into the entry and
// *slot gets the empty buffer. full: the queue has no room; neither ok
// nor full: no empty buffer to be had.
func (q *portQueue) pushLocked(slot *[]byte, from netip.AddrPort, pool *frameQueue, move bool) (ok, full bool) {
	if q.n == len(q.ring) {
		return false, true
	}
	e := &q.ring[q.at(q.n)]
	b := e.buf
	if b == nil {
		if b = pool.pop(); b == nil {
			if b = q.stealLocked(); b == nil {
				return false, false
			}
		}
	}
	if frame := *slot; move && len(frame) > copyMax {
		e.buf = frame
		*slot = b[:cap(b)]
	} else {
		e.buf = b[:copy(b[:cap(b)], frame)]
	}
	e.from = from
	q.n++
	return true, false
}

// pushOwned appends buf (a frame in a buffer of the network's), sent by
// from. The buffer parked in the entry, if any, is returned (displaced)
// for the caller to give back. false: the queue is full.
func (q *portQueue) pushOwned(buf []byte, from netip.AddrPort) (displaced []byte, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == len(q.ring) {
		return nil, false
	}
	e := &q.ring[q.at(q.n)]
	displaced = e.buf
	e.queued = queued{buf, from}
	q.n++
	return displaced, true
}

// stealLocked takes a parked buffer from an entry that holds no frame, or
// returns nil.
func (q *portQueue) stealLocked() []byte {
	for k := q.n; k < len(q.ring); k++ {
		i := q.at(k)
		if b := q.ring[i].buf; b != nil {
			q.ring[i].buf = nil
			return b[:cap(b)]
		}
	}
	return nil
}

// exchange is RecvBatch's step: it takes up to len(slots) frames, each
// replacing the (empty) buffer in its slot, which is parked in the
// frame's entry, with its sender in froms[i] unless froms is nil. It
// returns the number taken.
func (q *portQueue) exchange(slots [][]byte, froms []netip.AddrPort) int {
	q.mu.Lock()
	k := min(len(slots), q.n)
	for i := range k {
		e := &q.ring[q.head]
		b := slots[i]
		slots[i] = e.buf
		if froms != nil {
			froms[i] = e.from
		}
		e.queued = queued{buf: b[:cap(b)]}
		if q.head++; q.head == len(q.ring) {
			q.head = 0
		}
		q.n--
	}
	q.mu.Unlock()
	return k
}

// drainParked moves the parked buffers to dst and returns dst.
func (q *portQueue) drainParked(dst [][]byte) [][]byte {
	q.mu.Lock()
	for b := q.stealLocked(); b != nil; b = q.stealLocked() {
		dst = append(dst, b)
	}
	q.mu.Unlock()
	return dst
}

// parked returns the number of parked buffers.
func (q *portQueue) parked() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	parked := 0
	for k := q.n; k < len(q.ring); k++ {
		if q.ring[q.at(k)].buf != nil {
			parked++
		}
	}
	return parked
}
