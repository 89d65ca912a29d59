package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/queues"
)

// fakeMem is a byte-slice memory with keys: each MR is a slice at an IOVA
// with access flags; lkey == rkey.
type fakeMem struct {
	mu   sync.RWMutex
	mrs  map[uint32]*fakeMR
	next uint32
	// atomicWrites and flushes count the ATOMIC WRITEs and FLUSHes
	// executed (a duplicate must not execute again).
	atomicWrites, flushes int
	// binds records the BIND_MW work requests executed; bindErr, when
	// set, refuses them.
	binds   []abi.BindMW
	bindErr error
}

type fakeMR struct {
	va     uint64
	buf    []byte
	access uint32
	valid  bool
}

func newFakeMem() *fakeMem { return &fakeMem{mrs: map[uint32]*fakeMR{}, next: 0x100} }

// reg registers buf at va and returns its key.
func (m *fakeMem) reg(buf []byte, va uint64, access uint32) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next += 0x100
	m.mrs[m.next] = &fakeMR{va: va, buf: buf, access: access, valid: true}
	return m.next
}

// unreg forgets the MR of key (its memory can be collected).
func (m *fakeMem) unreg(key uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.mrs, key)
}

func (m *fakeMem) valid(key uint32) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	mr := m.mrs[key]
	return mr != nil && mr.valid
}

var errFakeProt = fmt.Errorf("fake: %w", ErrMemProtection)
var errFakeBounds = fmt.Errorf("fake: %w", ErrMemBounds)
var errFakeLen = fmt.Errorf("fake: %w", ErrMemLength)

// rangeOf returns the bytes of [va, va+n) of key; caller holds mu.
func (m *fakeMem) rangeOf(key uint32, va uint64, n uint64, access uint32) ([]byte, error) {
	mr := m.mrs[key]
	if mr == nil || !mr.valid || mr.access&access != access {
		return nil, errFakeProt
	}
	if va < mr.va || va+n < va || va+n > mr.va+uint64(len(mr.buf)) {
		return nil, errFakeBounds
	}
	o := va - mr.va
	return mr.buf[o : o+n], nil
}

func (m *fakeMem) sgeWalk(sges []abi.SGE, off uint64, n int, access uint32, f func(b []byte, i int)) error {
	done := 0
	for _, s := range sges {
		if done == n {
			break
		}
		l := uint64(s.Length)
		if off >= l {
			off -= l
			continue
		}
		k := min(l-off, uint64(n-done))
		b, err := m.rangeOf(s.LKey, s.Addr+off, k, access)
		if err != nil {
			return err
		}
		f(b, done)
		done += int(k)
		off = 0
	}
	if done < n {
		return errFakeLen
	}
	return nil
}

func (m *fakeMem) GatherTo(sges []abi.SGE, off uint64, n int, s Sink) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.sgeWalk(sges, off, n, 0, func(b []byte, _ int) { s.Put(b) })
}

func (m *fakeMem) Scatter(sges []abi.SGE, off uint64, src []byte) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.sgeWalk(sges, off, len(src), abi.AccessLocalWrite, func(b []byte, i int) { copy(b, src[i:]) })
}

func (m *fakeMem) WriteRemote(rkey uint32, va uint64, src []byte) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, err := m.rangeOf(rkey, va, uint64(len(src)), abi.AccessRemoteWrite)
	if err != nil {
		return err
	}
	copy(b, src)
	return nil
}

func (m *fakeMem) ReadRemoteTo(rkey uint32, va uint64, n int, s Sink) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	b, err := m.rangeOf(rkey, va, uint64(n), abi.AccessRemoteRead)
	if err != nil {
		return err
	}
	s.Put(b)
	return nil
}

func (m *fakeMem) CheckRemote(rkey uint32, va uint64, n uint64, access uint32) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, err := m.rangeOf(rkey, va, n, access)
	return err
}

func (m *fakeMem) Atomic(rkey uint32, va uint64, cas bool, compare, swap uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if va&7 != 0 {
		return 0, errFakeBounds
	}
	b, err := m.rangeOf(rkey, va, 8, abi.AccessRemoteAtomic)
	if err != nil {
		return 0, err
	}
	orig := binary.LittleEndian.Uint64(b)
	switch {
	case cas && orig == compare:
		binary.LittleEndian.PutUint64(b, swap)
	case !cas:
		binary.LittleEndian.PutUint64(b, orig+compare)
	}
	return orig, nil
}

func (m *fakeMem) AtomicWrite(rkey uint32, va uint64, v uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.rangeOf(rkey, va, 8, abi.AccessRemoteWrite)
	if err != nil {
		return err
	}
	if va&7 != 0 {
		return errFakeBounds
	}
	binary.LittleEndian.PutUint64(b, v)
	m.atomicWrites++
	return nil
}

func (m *fakeMem) Flush(rkey uint32, va, n uint64, whole bool, access uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mr := m.mrs[rkey]; whole && mr != nil {
		va, n = mr.va, uint64(len(mr.buf))
	}
	if _, err := m.rangeOf(rkey, va, n, access); err != nil {
		return err
	}
	m.flushes++
	return nil
}

func (m *fakeMem) Invalidate(key uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mr := m.mrs[key]
	if mr == nil || !mr.valid {
		return errFakeProt
	}
	mr.valid = false
	return nil
}

func (m *fakeMem) BindMW(b abi.BindMW) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bindErr != nil {
		return m.bindErr
	}
	m.binds = append(m.binds, b)
	return nil
}

var _ Memory = (*fakeMem)(nil)

// fakeSQ is a slice-backed send queue. Like the sources of package
// device, it can consume a WQE with an error (postErr: a WQE the view of
// package queues rejected) or report a broken ring once and then nothing
// more (breakRing). Like a ring in shared memory, the engine's side takes
// no lock: posters serialise among themselves (mu), publish a WQE with
// the release of tail, and the one consumer (the QP's worker) reads it
// after loading tail and frees its slot with the release of head. (A
// mutex both sides took on every WQE was a tenth of BenchmarkWrite8B's
// time, spinning as the client and the requester met on it; the engine
// never waits for a lock on a real send queue.)
type fakeSQ struct {
	mu         sync.Mutex // posters
	ring       []SendWork
	errs       []error      // per slot: the error PollSend returns with it
	head, tail atomic.Int64 // consumed, posted
	broken     atomic.Int32 // 1: report ringErr on the next poll; 2: reported
}

// errFakeRing is what a source reports for a client-written producer index
// that is impossible: it wraps queues.ErrIndex, as package device does.
var errFakeRing = fmt.Errorf("fake: work queue index out of range: %w", queues.ErrIndex)

func newFakeSQ(n int) *fakeSQ {
	q := &fakeSQ{ring: make([]SendWork, n), errs: make([]error, n)}
	for i := range q.ring {
		q.ring[i].SGEs = make([]abi.SGE, 0, abi.MaxSGE)
		q.ring[i].Inline = make([]byte, 0, abi.MaxInline)
	}
	return q
}

func (q *fakeSQ) post(w abi.SendWQE, sges []abi.SGE, inline []byte) error {
	return q.postErr(w, sges, inline, nil)
}

// postErr posts a WQE that PollSend consumes with err (SGEs and inline
// data dropped, wr_id kept).
func (q *fakeSQ) postErr(w abi.SendWQE, sges []abi.SGE, inline []byte, err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tail.Load()
	if t-q.head.Load() == int64(len(q.ring)) {
		return errors.New("fake SQ full")
	}
	i := int(t % int64(len(q.ring)))
	e := &q.ring[i]
	e.SendWQE = w
	e.SGEs = append(e.SGEs[:0], sges...)
	e.Inline = append(e.Inline[:0], inline...)
	q.errs[i] = err
	q.tail.Store(t + 1)
	return nil
}

// breakRing makes the next poll report a broken ring; nothing is taken
// from the queue after it.
func (q *fakeSQ) breakRing() { q.broken.CompareAndSwap(0, 1) }

func (q *fakeSQ) PollSend(w *SendWork) (bool, error) {
	switch q.broken.Load() {
	case 1:
		q.broken.Store(2)
		w.SendWQE, w.SGEs, w.Inline = abi.SendWQE{}, w.SGEs[:0], w.Inline[:0]
		return true, errFakeRing
	case 2:
		return false, nil
	}
	h := q.head.Load()
	if h == q.tail.Load() {
		return false, nil
	}
	i := int(h % int64(len(q.ring)))
	e := &q.ring[i]
	err := q.errs[i]
	w.SendWQE = e.SendWQE
	if err != nil {
		w.SGEs, w.Inline = w.SGEs[:0], w.Inline[:0]
		q.head.Store(h + 1)
		return true, err
	}
	if len(e.SGEs) > cap(w.SGEs) || len(e.Inline) > cap(w.Inline) {
		q.head.Store(h + 1)
		return false, fmt.Errorf("%w: too many SGEs or inline bytes", ErrInvalid)
	}
	w.SGEs = append(w.SGEs[:0], e.SGEs...)
	w.Inline = append(w.Inline[:0], e.Inline...)
	q.head.Store(h + 1)
	return true, nil
}

// fakeRQ is a slice-backed receive queue; postErr and breakRing as for
// fakeSQ.
type fakeRQ struct {
	mu         sync.Mutex
	ring       []RecvWork
	errs       []error
	head, tail int
	broken     int
}

func newFakeRQ(n int) *fakeRQ {
	q := &fakeRQ{ring: make([]RecvWork, n), errs: make([]error, n)}
	for i := range q.ring {
		q.ring[i].SGEs = make([]abi.SGE, 0, abi.MaxSGE)
	}
	return q
}

func (q *fakeRQ) post(wrid uint64, sges ...abi.SGE) error {
	return q.postErr(wrid, nil, sges...)
}

// postErr posts an RQE that PollRecv consumes with err (wr_id kept).
func (q *fakeRQ) postErr(wrid uint64, err error, sges ...abi.SGE) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.tail-q.head == len(q.ring) {
		return errors.New("fake RQ full")
	}
	e := &q.ring[q.tail%len(q.ring)]
	e.WrID = wrid
	e.SGEs = append(e.SGEs[:0], sges...)
	q.errs[q.tail%len(q.ring)] = err
	q.tail++
	return nil
}

// breakRing makes the next poll report a broken ring; nothing is taken
// from the queue after it.
func (q *fakeRQ) breakRing() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.broken = 1
}

func (q *fakeRQ) PollRecv(r *RecvWork) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.broken {
	case 1:
		q.broken = 2
		r.WrID, r.SGEs = 0, r.SGEs[:0]
		return true, errFakeRing
	case 2:
		return false, nil
	}
	if q.head == q.tail {
		return false, nil
	}
	e := &q.ring[q.head%len(q.ring)]
	err := q.errs[q.head%len(q.ring)]
	q.head++
	r.WrID = e.WrID
	if err != nil {
		r.SGEs = r.SGEs[:0]
		return true, err
	}
	if len(e.SGEs) > cap(r.SGEs) {
		return false, fmt.Errorf("%w: too many SGEs", ErrInvalid)
	}
	r.SGEs = append(r.SGEs[:0], e.SGEs...)
	return true, nil
}

// fakeCQ collects completions and, for each, the solicited event flag
// the engine passed with it.
type fakeCQ struct {
	mu    sync.Mutex
	cqes  []abi.CQE
	se    []bool
	count atomic.Int64
	ch    chan struct{}
}

func newFakeCQ(capacity int) *fakeCQ {
	return &fakeCQ{cqes: make([]abi.CQE, 0, capacity), se: make([]bool, 0, capacity), ch: make(chan struct{}, 1)}
}

func (c *fakeCQ) PushCQE(e *abi.CQE, se bool) error {
	c.mu.Lock()
	c.cqes = append(c.cqes, *e)
	c.se = append(c.se, se)
	c.mu.Unlock()
	c.count.Add(1)
	select {
	case c.ch <- struct{}{}:
	default:
	}
	return nil
}

// wait waits until the CQ holds at least n entries or d passes.
func (c *fakeCQ) wait(n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for c.count.Load() < int64(n) {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		select {
		case <-c.ch:
		case <-time.After(min(left, 10*time.Millisecond)):
		}
	}
	return true
}

// spin waits for n entries without allocating (for allocation tests and
// benchmarks): it blocks on the notification channel.
func (c *fakeCQ) spin(n int64) {
	for c.count.Load() < n {
		<-c.ch
	}
}

func (c *fakeCQ) all() []abi.CQE {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]abi.CQE(nil), c.cqes...)
}

// solicited returns the solicited event flags of the completions.
func (c *fakeCQ) solicited() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]bool(nil), c.se...)
}

func (c *fakeCQ) reset() {
	c.mu.Lock()
	c.cqes = c.cqes[:0]
	c.se = c.se[:0]
	c.mu.Unlock()
	c.count.Store(0)
}
