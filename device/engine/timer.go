package engine

import "time"

// Timers. Every worker owns one timerHeap: an indexed binary min-heap of
// deadlines in nanoseconds on the worker's monotonic clock. Each QP embeds
// its timers (retransmission, RNR back-off); arming an armed timer moves it
// in place, so the heap never holds stale entries and never allocates once
// its backing slice has grown to the number of timers in use.

// timerKind says which QP timer fired.
type timerKind uint8

const (
	timerRetry    timerKind = iota // local ACK timeout (IBTA 9.7.6.1.1)
	timerRNR                       // RNR NAK back-off (IBTA 9.7.5.2.8)
	timerCCRate                    // DCQCN rate increase (cc.go)
	timerCCPace                    // pacer: the bucket holds tokens again (cc.go)
	timerLinkPace                  // the worker's link limiter holds tokens again (cc.go; qp nil)
)

// timer is one QP timer. idx is its heap position, -1 when not armed.
type timer struct {
	when int64
	idx  int32
	kind timerKind
	qp   *QP
}

func (t *timer) armed() bool { return t.idx >= 0 }

// timerHeap is a min-heap on when.
type timerHeap struct {
	h []*timer
}

func (th *timerHeap) less(i, j int) bool { return th.h[i].when < th.h[j].when }

func (th *timerHeap) swap(i, j int) {
	th.h[i], th.h[j] = th.h[j], th.h[i]
	th.h[i].idx = int32(i)
	th.h[j].idx = int32(j)
}

func (th *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !th.less(i, p) {
			return
		}
		th.swap(i, p)
		i = p
	}
}

func (th *timerHeap) down(i int) {
	n := len(th.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && th.less(r, l) {
			m = r
		}
		if !th.less(m, i) {
			return
		}
		th.swap(i, m)
		i = m
	}
}

// set arms t to fire at when (or moves it there if armed).
func (th *timerHeap) set(t *timer, when int64) {
	t.when = when
	if t.idx >= 0 {
		th.up(int(t.idx))
		th.down(int(t.idx))
		return
	}
	t.idx = int32(len(th.h))
	th.h = append(th.h, t)
	th.up(int(t.idx))
}

// stop disarms t.
func (th *timerHeap) stop(t *timer) {
	i := int(t.idx)
	if i < 0 {
		return
	}
	last := len(th.h) - 1
	if i != last {
		th.swap(i, last)
	}
	th.h[last] = nil
	th.h = th.h[:last]
	t.idx = -1
	if i != last {
		th.up(i)
		th.down(i)
	}
}

// next returns the earliest deadline; ok is false when no timer is armed.
func (th *timerHeap) next() (int64, bool) {
	if len(th.h) == 0 {
		return 0, false
	}
	return th.h[0].when, true
}

// pop removes and returns the earliest timer if it is due at now.
func (th *timerHeap) pop(now int64) *timer {
	if len(th.h) == 0 || th.h[0].when > now {
		return nil
	}
	t := th.h[0]
	th.stop(t)
	return t
}

// clock is a monotonic nanosecond clock relative to a start instant.
type clock struct{ start time.Time }

func newClock() clock { return clock{start: time.Now()} }

func (c clock) now() int64 { return int64(time.Since(c.start)) }

// ackTimeout is the IBTA local ACK timeout for a 5-bit timeout code:
// 4.096 us * 2^code (IBTA 9.7.6.1.3, Table 77 "Local ACK timeout"); code 0
// means infinite (returns 0).
func ackTimeout(code uint8) int64 {
	code &= 0x1f
	if code == 0 {
		return 0
	}
	return 4096 << code
}
