package suite

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// ConnOpts are the RC connection's parameters; zero values take the
// defaults noted.
type ConnOpts struct {
	// Depth: send and receive WRs of each QP (default 64), CQ size twice.
	Depth int
	// BufSize: each side's registered buffer (default 1 MiB).
	BufSize int
	// Timeout: ACK timeout code (default 10, about 4 ms); RetryCnt
	// (default 7); RNRRetry (default 7, infinite); MinRNRTimer: the RNR
	// timer code this side advertises (default 1, 0.01 ms).
	Timeout, RetryCnt, RNRRetry, MinRNRTimer *uint8
	// MTU: the path MTU (default 1024).
	MTU abi.MTU
}

func u8(p *uint8, def uint8) uint8 {
	if p == nil {
		return def
	}
	return *p
}

// U8 returns a pointer to v, for ConnOpts.
func U8(v uint8) *uint8 { return &v }

// Endpoint is one side of an RC connection: a context on its daemon, a
// PD, one CQ for both queues, the QP, a registered buffer and the
// context's asynchronous events.
type Endpoint struct {
	D      *Daemon
	Ctx    *verbs.Context
	PD     *verbs.PD
	CQ     *verbs.CQ
	QP     *verbs.QP
	Buf    *verbs.Buffer
	MR     *verbs.MR
	Events *verbs.AsyncEvents
}

func open(d *Daemon, o ConnOpts) (*Endpoint, error) {
	c, err := verbs.Open(d.Socket, verbs.WithClientName("faultsuite"))
	if err != nil {
		return nil, err
	}
	e := &Endpoint{D: d, Ctx: c}
	fail := func(err error) (*Endpoint, error) {
		c.Close()
		return nil, err
	}
	if e.Events, err = c.OpenAsyncEvents(); err != nil {
		return fail(err)
	}
	if e.PD, err = c.AllocPD(); err != nil {
		return fail(err)
	}
	if e.CQ, err = c.CreateCQ(2*o.Depth, nil); err != nil {
		return fail(err)
	}
	if e.QP, err = e.PD.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.CQ, RecvCQ: e.CQ,
		Cap: abi.QPCap{MaxSendWR: uint32(o.Depth), MaxRecvWR: uint32(o.Depth), MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail(err)
	}
	if e.Buf, err = c.Alloc(o.BufSize, 4096); err != nil {
		return fail(err)
	}
	if e.MR, err = e.PD.RegMR(e.Buf, abi.AccessAll); err != nil {
		return fail(err)
	}
	return e, nil
}

// Connect opens an Endpoint on each daemon and connects their QPs to
// each other (both sending from PSN 0).
func Connect(a, b *Daemon, o ConnOpts) (*Endpoint, *Endpoint, error) {
	if o.Depth == 0 {
		o.Depth = 64
	}
	if o.BufSize == 0 {
		o.BufSize = 1 << 20
	}
	if o.MTU == 0 {
		o.MTU = abi.MTU1024
	}
	ea, err := open(a, o)
	if err != nil {
		return nil, nil, err
	}
	eb, err := open(b, o)
	if err != nil {
		ea.Close()
		return nil, nil, err
	}
	for _, p := range [][2]*Endpoint{{ea, eb}, {eb, ea}} {
		l, r := p[0], p[1]
		err := l.QP.ToInit(abi.AccessAll, 0)
		if err == nil {
			err = l.QP.ToRTR(verbs.RTRAttr{AV: abi.AHAttr{DGID: r.D.Addr.As16(), PortNum: 1, HopLimit: 64},
				PathMTU: o.MTU, DestQPN: r.QP.QPN, MaxDestRdAtomic: 1, MinRNRTimer: u8(o.MinRNRTimer, 1)})
		}
		if err == nil {
			err = l.QP.ToRTS(verbs.RTSAttr{Timeout: u8(o.Timeout, 10), RetryCnt: u8(o.RetryCnt, 7),
				RNRRetry: u8(o.RNRRetry, 7), MaxRdAtomic: 1})
		}
		if err != nil {
			ea.Close()
			eb.Close()
			return nil, nil, fmt.Errorf("suite: connect QP %#x on %s: %w", l.QP.QPN, l.D.Name, err)
		}
	}
	return ea, eb, nil
}

// Close closes the context (and everything in it).
func (e *Endpoint) Close() error { return e.Ctx.Close() }

// ErrTimeout: what was waited for did not come in time.
var ErrTimeout = errors.New("suite: timed out")

// WaitEvent waits for the next asynchronous event of type t (others are
// returned too, in order, before it).
func (e *Endpoint) WaitEvent(t abi.EventType, timeout time.Duration) ([]abi.AsyncEvent, error) {
	deadline := time.Now().Add(timeout)
	var seen []abi.AsyncEvent
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return seen, fmt.Errorf("%w: no %v event (saw %v)", ErrTimeout, t, seen)
		}
		ev, err := e.Events.Get(left)
		if err != nil {
			return seen, fmt.Errorf("%w: no %v event (saw %v): %v", ErrTimeout, t, seen, err)
		}
		seen = append(seen, ev)
		if ev.Type == t {
			return seen, nil
		}
	}
}

// PollN polls the CQ until n completions came or timeout passed; it
// returns what came.
func (e *Endpoint) PollN(n int, timeout time.Duration) ([]abi.CQE, error) {
	deadline := time.Now().Add(timeout)
	out := make([]abi.CQE, 0, n)
	wc := make([]abi.CQE, 16)
	for len(out) < n {
		k := e.CQ.Poll(wc)
		out = append(out, wc[:k]...)
		if k > 0 {
			continue
		}
		if time.Now().After(deadline) {
			return out, fmt.Errorf("%w: %d of %d completions", ErrTimeout, len(out), n)
		}
		time.Sleep(50 * time.Microsecond)
	}
	return out, nil
}

// Counters returns the QP's counters (QUERY_QP).
func (e *Endpoint) Counters() (abi.RespQueryQP, error) { return e.QP.Query() }
