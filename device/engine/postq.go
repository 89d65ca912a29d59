package engine

import (
	"sync"
	"sync/atomic"
)

// postQueue is what other goroutines hand a worker (control messages,
// doorbell kicks): an unbounded queue, so a poster never waits for the
// worker, with its length readable without the lock for the loop's cheap
// check. The worker takes the whole queue at once and gives the slice
// back for reuse.
type postQueue[T any] struct {
	mu    sync.Mutex
	q     []T
	spare []T // worker only
	n     atomic.Int32
}

// push appends v (any goroutine).
func (p *postQueue[T]) push(v T) {
	p.mu.Lock()
	p.q = append(p.q, v)
	p.n.Store(int32(len(p.q)))
	p.mu.Unlock()
}

// take returns what was queued and empties the queue (worker only); nil
// when nothing was. Hand the slice back with recycle once done with it.
func (p *postQueue[T]) take() []T {
	if p.n.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	q := p.q
	p.q = p.spare[:0]
	p.n.Store(0)
	p.mu.Unlock()
	return q
}

// recycle keeps q's storage for the next take (worker only).
func (p *postQueue[T]) recycle(q []T) {
	clear(q)
	p.spare = q[:0]
}

// drop empties the queue and returns what it held (after the worker
// stopped).
func (p *postQueue[T]) drop() []T {
	p.mu.Lock()
	q := p.q
	p.q = nil
	p.n.Store(0)
	p.mu.Unlock()
	return q
}
