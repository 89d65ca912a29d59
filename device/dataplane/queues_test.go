package dataplane

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
)

// Unit tests of the ring adapters over plain memory and doorbell words
// (the end-to-end tests in dataplane_test.go run them over shared memory
// with the engine).

type testSQ struct {
	ring   []byte
	stride uint32
	slots  uint32
	rec    doorbell.QPRecord
	pi     uint32
}

func newTestSQ(t testing.TB, slots, maxSGE, maxInline uint32) (*testSQ, *sqSource) {
	c := abi.QPCap{MaxSendWR: slots, MaxSendSGE: maxSGE, MaxInlineData: maxInline}
	stride := abi.SQWQEBlocks(maxSGE, maxInline) * abi.WQEBlock
	q := &testSQ{ring: make([]byte, slots*stride), stride: stride, slots: slots,
		rec: doorbell.QPRecord{SQPI: new(atomic.Uint32), RQPI: new(atomic.Uint32), SQCI: new(atomic.Uint32), RQCI: new(atomic.Uint32)}}
	s, err := newSQSource(q.ring, c, q.rec)
	require.NoError(t, err)
	return q, s
}

// post writes a WQE into the next slot and publishes the producer index.
func (q *testSQ) post(w abi.SendWQE, sges []abi.SGE, inline []byte) {
	slot := q.ring[(q.pi&(q.slots-1))*q.stride:][:q.stride]
	clear(slot)
	w.NumSGE = uint8(len(sges))
	for i := range sges {
		sges[i].Put(slot[abi.WQEBlock+i*abi.SizeofSGE:])
	}
	if inline != nil {
		w.InlineLen = uint32(len(inline))
		copy(slot[abi.WQEBlock:], inline)
	}
	w.Put(slot)
	q.pi++
	q.rec.SQPI.Store(q.pi)
}

func newSendWork(maxSGE, maxInline int) *engine.SendWork {
	return &engine.SendWork{SGEs: make([]abi.SGE, 0, maxSGE), Inline: make([]byte, 0, maxInline)}
}

func TestSQSource(t *testing.T) {
	q, s := newTestSQ(t, 4, 2, 32)
	w := newSendWork(2, 32)

	ok, err := s.PollSend(w)
	require.NoError(t, err)
	assert.False(t, ok, "nothing posted")

	sges := []abi.SGE{{Addr: 0x1000, Length: 10, LKey: 7}, {Addr: 0x2000, Length: 20, LKey: 8}}
	q.post(abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, sges, nil)
	q.post(abi.SendWQE{WrID: 2, Opcode: abi.WRSendWithImm, Flags: abi.SendInline, ImmData: 9}, nil, []byte("inline!"))
	q.post(abi.SendWQE{WrID: 3, Opcode: abi.WROpcode(10)}, nil, nil) // no such opcode

	ok, err = s.PollSend(w)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(1), w.WrID)
	assert.Equal(t, abi.WRSend, w.Opcode)
	assert.Equal(t, sges, w.SGEs)
	assert.Empty(t, w.Inline)
	assert.Zero(t, q.rec.SQCI.Load(), "the engine publishes the consumer index, once per batch")
	s.PublishSend()
	assert.Equal(t, uint32(1), q.rec.SQCI.Load(), "the slot is free once published")

	ok, err = s.PollSend(w)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(2), w.WrID)
	assert.Equal(t, []byte("inline!"), w.Inline)
	assert.Empty(t, w.SGEs)
	assert.Equal(t, uint32(9), w.ImmData)

	ok, err = s.PollSend(w)
	require.True(t, ok, "a malformed WQE is consumed")
	var we *queues.WQEError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, uint64(3), w.WrID, "its wr_id is kept for the error completion")
	assert.Equal(t, uint32(1), q.rec.SQCI.Load(), "not published yet")
	s.PublishSend()
	assert.Equal(t, uint32(3), q.rec.SQCI.Load())

	ok, err = s.PollSend(w)
	assert.False(t, ok)
	assert.NoError(t, err)

	// An impossible producer index is reported once, then the ring is
	// silent (the engine flushes the QP).
	q.rec.SQPI.Store(q.pi + 5)
	ok, err = s.PollSend(w)
	assert.True(t, ok)
	assert.ErrorIs(t, err, errRingBroken)
	assert.ErrorIs(t, err, queues.ErrIndex)
	assert.Zero(t, w.WrID)
	for range 3 {
		ok, err = s.PollSend(w)
		assert.False(t, ok)
		assert.NoError(t, err)
	}
}

func TestSQSourceReset(t *testing.T) {
	q, s := newTestSQ(t, 8, 1, 0)
	w := newSendWork(1, 0)
	q.post(abi.SendWQE{WrID: 1, Opcode: abi.WRSend}, nil, nil)
	q.post(abi.SendWQE{WrID: 2, Opcode: abi.WRSend}, nil, nil)
	// RESET with two WQEs posted; the client posts a third afterwards.
	s.reset.request(q.rec.SQPI.Load())
	q.post(abi.SendWQE{WrID: 3, Opcode: abi.WRSend}, nil, nil)
	ok, err := s.PollSend(w)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(3), w.WrID, "WQEs posted before the RESET are discarded")
	ok, _ = s.PollSend(w)
	assert.False(t, ok)
	assert.Equal(t, uint32(3), q.rec.SQCI.Load())
	// A second RESET with nothing new posted discards nothing more.
	s.reset.request(q.rec.SQPI.Load())
	q.post(abi.SendWQE{WrID: 4, Opcode: abi.WRSend}, nil, nil)
	ok, _ = s.PollSend(w)
	require.True(t, ok)
	assert.Equal(t, uint64(4), w.WrID)
}

func TestSQSourceNoAlloc(t *testing.T) {
	q, s := newTestSQ(t, 64, 2, 64)
	w := newSendWork(2, 64)
	sges := []abi.SGE{{Addr: 1, Length: 2, LKey: 3}}
	allocs := testing.AllocsPerRun(1000, func() {
		q.post(abi.SendWQE{WrID: 5, Opcode: abi.WRRDMAWrite}, sges, nil)
		if ok, err := s.PollSend(w); !ok || err != nil {
			panic("no WQE")
		}
	})
	assert.Zero(t, allocs)
}

type testRQ struct {
	ring   []byte
	stride uint32
	slots  uint32
	pi     *atomic.Uint32
	ci     *atomic.Uint32
	mu     sync.Mutex
	next   uint32
}

func (q *testRQ) post(wrid uint64, sges ...abi.SGE) {
	q.mu.Lock()
	defer q.mu.Unlock()
	slot := q.ring[(q.next&(q.slots-1))*q.stride:][:q.stride]
	h := abi.RecvWQE{WrID: wrid, NumSGE: uint32(len(sges))}
	h.Put(slot)
	for i := range sges {
		sges[i].Put(slot[abi.SizeofRecvWQE+i*abi.SizeofSGE:])
	}
	q.next++
	q.pi.Store(q.next)
}

func TestRecvSourceRQ(t *testing.T) {
	q := &testRQ{slots: 4, stride: abi.RQWQESize(2), pi: new(atomic.Uint32), ci: new(atomic.Uint32)}
	q.ring = make([]byte, q.slots*q.stride)
	s, err := newRQSource(q.ring, q.slots, 2, doorbell.QPRecord{RQPI: q.pi, RQCI: q.ci})
	require.NoError(t, err)
	r := &engine.RecvWork{SGEs: make([]abi.SGE, 0, 2)}
	q.post(11, abi.SGE{Addr: 1, Length: 100, LKey: 2})
	q.post(12)
	ok, err := s.PollRecv(r)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(11), r.WrID)
	assert.Equal(t, []abi.SGE{{Addr: 1, Length: 100, LKey: 2}}, r.SGEs)
	ok, err = s.PollRecv(r)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint64(12), r.WrID)
	assert.Empty(t, r.SGEs)
	assert.Equal(t, uint32(2), q.ci.Load())
	// Reset discards what was posted before it.
	q.post(13)
	s.reset.request(q.pi.Load())
	q.post(14)
	ok, _ = s.PollRecv(r)
	require.True(t, ok)
	assert.Equal(t, uint64(14), r.WrID)
	assert.Zero(t, testing.AllocsPerRun(500, func() {
		q.post(15)
		if ok, _ := s.PollRecv(r); !ok {
			panic("no RQE")
		}
	}))
}

// TestRecvSourceSRQConcurrent: consumers on several goroutines (the
// workers of the QPs attached to an SRQ) take every posted WQE exactly
// once.
func TestRecvSourceSRQConcurrent(t *testing.T) {
	const total, consumers = 20000, 4
	q := &testRQ{slots: 64, stride: abi.RQWQESize(1), pi: new(atomic.Uint32), ci: new(atomic.Uint32)}
	q.ring = make([]byte, q.slots*q.stride)
	s, err := newSRQSource(q.ring, q.slots, 1, doorbell.SRQRecord{PI: q.pi, CI: q.ci})
	require.NoError(t, err)
	var (
		wg   sync.WaitGroup
		got  [consumers][]uint64
		done atomic.Bool
	)
	for c := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &engine.RecvWork{SGEs: make([]abi.SGE, 0, 1)}
			for {
				ok, err := s.PollRecv(r)
				if err != nil {
					panic(err)
				}
				if ok {
					got[c] = append(got[c], r.WrID)
					continue
				}
				if done.Load() && q.ci.Load() == total {
					return
				}
			}
		}()
	}
	for i := range uint64(total) {
		// Flow control as a client does it: never more than slots ahead.
		for q.next-q.ci.Load() >= q.slots {
			runtime.Gosched()
		}
		q.post(i)
	}
	done.Store(true)
	wg.Wait()
	seen := make([]bool, total)
	n := 0
	for c := range consumers {
		for _, id := range got[c] {
			require.False(t, seen[id], "wr_id %d taken twice", id)
			seen[id] = true
			n++
		}
	}
	assert.Equal(t, total, n, "every WQE taken once")
}

// newTestCQ builds a CQ sink over plain memory; with comp, its events go
// through a running doorbell.EventWriter (stopped by the test's cleanup).
func newTestCQ(t testing.TB, count uint32, comp *doorbell.EventFD) (*cqSink, doorbell.CQRecord, []byte) {
	rec := doorbell.CQRecord{CI: new(atomic.Uint32), Arm: new(atomic.Uint32), PI: new(atomic.Uint32),
		ArmSNDone: new(atomic.Uint32), Overflow: new(atomic.Uint32)}
	ring := make([]byte, count*abi.SizeofCQE)
	var sig doorbell.Signaller
	if comp != nil {
		w := doorbell.NewEventWriter()
		sig = w
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run()
		}()
		t.Cleanup(func() {
			w.Close()
			<-done
		})
	}
	s, err := newCQSink(ring, count, false, rec, comp, sig)
	require.NoError(t, err)
	return s, rec, ring
}

// newTestCQKernel is newTestCQ with the completion eventfd signalled by
// the kernel (doorbell.KernelSignaller), as the daemon does by default.
func newTestCQKernel(t testing.TB, count uint32, comp *doorbell.EventFD) (*cqSink, doorbell.CQRecord, []byte) {
	k, err := doorbell.NewKernelSignaller(1)
	require.NoError(t, err)
	t.Cleanup(func() { k.Close() })
	rec := doorbell.CQRecord{CI: new(atomic.Uint32), Arm: new(atomic.Uint32), PI: new(atomic.Uint32),
		ArmSNDone: new(atomic.Uint32), Overflow: new(atomic.Uint32)}
	ring := make([]byte, count*abi.SizeofCQE)
	s, err := newCQSink(ring, count, false, rec, comp, k)
	require.NoError(t, err)
	return s, rec, ring
}

// drainEvents waits until the completion eventfd has counted want events
// in all (the writer writes them on its own goroutine), then checks that
// no more come.
func drainEvents(t testing.TB, ev *doorbell.EventFD, want uint64) {
	t.Helper()
	var got uint64
	deadline := time.Now().Add(10 * time.Second)
	for got < want && time.Now().Before(deadline) {
		n, err := ev.Drain()
		require.NoError(t, err)
		got += n
		if got < want {
			time.Sleep(100 * time.Microsecond)
		}
	}
	time.Sleep(time.Millisecond)
	n, _ := ev.Drain()
	assert.Equal(t, want, got+n, "completion events written")
}

func TestCQSinkOverflowAndArming(t *testing.T) {
	ev, err := doorbell.NewEventFD()
	require.NoError(t, err)
	s, rec, ring := newTestCQ(t, 4, ev)
	defer s.close()

	// Solicited-only arm: a non-solicited CQE does not fire, the next
	// solicited one does, once.
	rec.Arm.Store(abi.ArmWord(1, true))
	require.NoError(t, s.push(&abi.CQE{WrID: 1, QPNum: 5}, false))
	assert.Zero(t, s.events.Load())
	require.NoError(t, s.push(&abi.CQE{WrID: 2, QPNum: 5}, true))
	assert.Equal(t, uint64(1), s.events.Load())
	require.NoError(t, s.push(&abi.CQE{WrID: 3, QPNum: 5}, true))
	assert.Equal(t, uint64(1), s.events.Load(), "one event per arm")
	drainEvents(t, ev, 1)
	assert.Equal(t, uint32(3), rec.PI.Load(), "cq_pi published")

	var e abi.CQE
	require.True(t, queues.ReadCQE(ring, 4, 1, &e))
	assert.Equal(t, uint64(2), e.WrID)

	require.NoError(t, s.push(&abi.CQE{WrID: 4}, false))
	err = s.push(&abi.CQE{WrID: 5}, false)
	assert.ErrorIs(t, err, queues.ErrCQFull)
	assert.Equal(t, uint32(1), rec.Overflow.Load())
	// The client catches up, but the CQ stays in error.
	rec.CI.Store(4)
	assert.ErrorIs(t, s.push(&abi.CQE{WrID: 6}, false), queues.ErrCQFull)
	assert.Equal(t, uint64(2), s.lost.Load())
}

// TestQPSinkOverflow: the sink returns the overflow to the engine (which
// moves the QP to ERR) for every completion after the CQ overran, without
// allocating.
func TestQPSinkOverflow(t *testing.T) {
	s, _, _ := newTestCQ(t, 2, nil)
	sink := &qpSink{cq: s}
	require.NoError(t, sink.PushCQE(&abi.CQE{WrID: 1}, false))
	require.NoError(t, sink.PushCQE(&abi.CQE{WrID: 2, Status: abi.WCRemAccessErr}, false))
	assert.ErrorIs(t, sink.PushCQE(&abi.CQE{WrID: 3}, false), queues.ErrCQFull)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if err := sink.PushCQE(&abi.CQE{WrID: 4}, false); !errors.Is(err, queues.ErrCQFull) {
			panic(err)
		}
	}))
}

// TestQPSinkSolicited: under a solicited-only arm, a receive completion
// fires the completion eventfd only when the engine says the message had
// the Solicited Event bit; an error completion always does; a successful
// send completion never does, SE or not.
func TestQPSinkSolicited(t *testing.T) {
	ev, err := doorbell.NewEventFD()
	require.NoError(t, err)
	s, rec, _ := newTestCQ(t, 16, ev)
	defer s.close()
	recv, send := &qpSink{cq: s, recv: true}, &qpSink{cq: s}
	sn := uint32(0)
	for _, c := range []struct {
		sink  *qpSink
		cqe   abi.CQE
		se    bool
		fires bool
	}{
		{recv, abi.CQE{WrID: 1, Opcode: abi.WCRecv}, false, false},
		{send, abi.CQE{WrID: 2, Opcode: abi.WCSend}, true, false},
		{recv, abi.CQE{WrID: 3, Opcode: abi.WCRecv}, true, true},
		{recv, abi.CQE{WrID: 4, Opcode: abi.WCRecvRDMAWithImm, WCFlags: abi.WCWithImm}, true, true},
		{recv, abi.CQE{WrID: 5, Opcode: abi.WCRecv, Status: abi.WCWRFlushErr}, false, true},
		{send, abi.CQE{WrID: 6, Opcode: abi.WCSend, Status: abi.WCRetryExcErr}, false, true},
	} {
		sn++
		rec.Arm.Store(abi.ArmWord(sn, true))
		before := s.events.Load()
		require.NoError(t, c.sink.PushCQE(&c.cqe, c.se))
		assert.Equal(t, c.fires, s.events.Load() == before+1, "wr %d (se %v): event", c.cqe.WrID, c.se)
		rec.CI.Store(rec.PI.Load())
		if c.fires {
			drainEvents(t, ev, 1)
		}
	}
	drainEvents(t, ev, 0)
}

// TestCQSinkArmedNoAlloc: a completion on an armed CQ with a completion
// channel allocates nothing, whether the kernel signals the eventfd or the
// event is handed to the context's writer (which writes it: nothing
// allocated there either).
func TestCQSinkArmedNoAlloc(t *testing.T) {
	for _, kind := range []struct {
		name string
		new  func(testing.TB, uint32, *doorbell.EventFD) (*cqSink, doorbell.CQRecord, []byte)
	}{{"kernel", newTestCQKernel}, {"writer", newTestCQ}} {
		t.Run(kind.name, func(t *testing.T) {
			ev, err := doorbell.NewEventFD()
			require.NoError(t, err)
			s, rec, _ := kind.new(t, 64, ev)
			defer s.close()
			ci, sn := uint32(0), uint32(0)
			c := &abi.CQE{WrID: 1, Opcode: abi.WCRecv}
			const runs = 1000
			assert.Zero(t, testing.AllocsPerRun(runs, func() {
				sn++
				rec.Arm.Store(abi.ArmWord(sn, false))
				if err := s.push(c, false); err != nil {
					panic(err)
				}
				ci++
				rec.CI.Store(ci)
			}))
			assert.Equal(t, uint64(runs+1), s.events.Load(), "an event per completion (AllocsPerRun runs once more)")
			drainEvents(t, ev, runs+1)
		})
	}
}

func TestCQSinkNoAlloc(t *testing.T) {
	s, rec, _ := newTestCQ(t, 64, nil)
	ci := uint32(0)
	c := &abi.CQE{WrID: 1, Opcode: abi.WCRecv}
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if err := s.push(c, true); err != nil {
			panic(err)
		}
		ci++
		rec.CI.Store(ci)
	}))
}
