package queues_test

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/doorbell"
	"github.com/vrnic/vrnic/queues"
)

// TestCQArmNoLostEvent races CQ arming against completions. Each round the
// daemon writes one CQE at a random moment and then checks the arm word;
// the client arms (a new sequence), polls the CQ once more and, only if it
// is still empty, sleeps on the completion eventfd. Whatever the
// interleaving, the client must never sleep past a CQE it was not told
// about. Which interleavings a run meets depends on the scheduler (on a
// loaded machine all rounds may fall one way); TestCQArmInterleavings
// forces each of them.
func TestCQArmNoLostEvent(t *testing.T) {
	rounds := 20000
	if testing.Short() || raceEnabled {
		rounds = 5000
	}
	a := newArmRig(t)
	rec, ring, cq, comp, notifier := a.rec, a.ring, a.cq, a.comp, a.notifier
	const count = armRigCQEs
	compFd := comp.Fd()

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the daemon
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 1))
		var sink atomic.Uint64
		for r := range rounds {
			for rec.CI.Load() != uint32(r) { // one CQE outstanding at a time
				if stop.Load() {
					return
				}
			}
			for k := rng.IntN(400); k > 0; k-- {
				sink.Add(1)
			}
			e := abi.CQE{WrID: uint64(r)}
			if err := cq.Push(&e); err != nil {
				t.Error(err)
				return
			}
			cq.Publish()
			notifier.Completed(true)
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	var e abi.CQE
	slept, repolled, spurious := 0, 0, 0
	var drain [8]byte
	rng := rand.New(rand.NewPCG(2, 2))
	var sink atomic.Uint64
	for r := range rounds {
		ci := uint32(r)
		for k := rng.IntN(800); k > 0; k-- { // arm before or after the CQE
			sink.Add(1)
		}
		rec.Arm.Store(abi.ArmWord(uint32(r+1), false))
		if queues.ReadCQE(ring, count, ci, &e) {
			repolled++
		} else {
			// Sleep until an event whose CQE is there. An event may be
			// stale: an earlier round's arm can be notified after that
			// round's client had already found the CQE by polling (verbs
			// allow such spurious events; the client just polls). Each
			// earlier round leaves at most one.
			for stale := 0; ; stale++ {
				require.LessOrEqual(t, stale, r, "round %d: more stale events than earlier rounds", r)
				fds := []unix.PollFd{{Fd: int32(compFd), Events: unix.POLLIN}}
				n, err := unix.Poll(fds, 5000)
				for err == unix.EINTR {
					n, err = unix.Poll(fds, 5000)
				}
				require.NoError(t, err)
				require.Equal(t, 1, n, "round %d: no completion event for a CQE (lost event)", r)
				_, err = unix.Read(compFd, drain[:])
				require.NoError(t, err)
				if queues.ReadCQE(ring, count, ci, &e) {
					break
				}
				spurious++
			}
			slept++
		}
		require.Equal(t, uint64(r), e.WrID)
		rec.CI.Store(ci + 1)
	}
	t.Logf("%d rounds: %d slept on the eventfd, %d found the CQE by polling after arming, %d stale events",
		rounds, slept, repolled, spurious)
}

// TestCQArmInterleavings runs the two sides of one completion in each of
// the six orders of their steps, forced one after the other: the daemon
// publishes the CQE (D1) and then checks the arm word (D2, Completed); the
// client arms (C1) and then polls once more (C2). The client finds the
// CQE by polling whenever D1 precedes C2; in the one order where it does
// not (C1 C2 D1 D2) it sleeps, and D2, which sees the arm, must signal
// the eventfd. D2 signals exactly when C1 precedes it (a stale event when
// the client found the CQE anyway, which verbs allow).
func TestCQArmInterleavings(t *testing.T) {
	for _, order := range []string{"D1 D2 C1 C2", "D1 C1 D2 C2", "D1 C1 C2 D2", "C1 D1 D2 C2", "C1 D1 C2 D2", "C1 C2 D1 D2"} {
		t.Run(order, func(t *testing.T) {
			a := newArmRig(t)
			rec, ring, cq, comp, notifier := a.rec, a.ring, a.cq, a.comp, a.notifier
			const count = armRigCQEs

			var e abi.CQE
			signalled, found := false, false
			steps := map[string]func(){
				"D1": func() {
					require.NoError(t, cq.Push(&abi.CQE{WrID: 7}))
					cq.Publish()
				},
				"D2": func() { signalled = notifier.Completed(true) },
				"C1": func() { rec.Arm.Store(abi.ArmWord(1, false)) },
				"C2": func() { found = queues.ReadCQE(ring, count, 0, &e) },
			}
			pos := map[string]int{}
			for i, s := range strings.Fields(order) {
				steps[s]()
				pos[s] = i
			}
			assert.Equal(t, pos["D1"] < pos["C2"], found, "the client's poll after arming finds the CQE")
			assert.Equal(t, pos["C1"] < pos["D2"], signalled, "the daemon signals an armed CQ")
			if !found {
				// The client sleeps: the event must come.
				fds := []unix.PollFd{{Fd: int32(comp.Fd()), Events: unix.POLLIN}}
				n, err := unix.Poll(fds, 5000)
				for err == unix.EINTR {
					n, err = unix.Poll(fds, 5000)
				}
				require.NoError(t, err)
				require.Equal(t, 1, n, "no completion event for a CQE the client did not see (lost event)")
				require.True(t, queues.ReadCQE(ring, count, 0, &e), "woken: the CQE is there")
			}
			assert.Equal(t, uint64(7), e.WrID)
		})
	}
}

// armRigCQEs is the size of an armRig's CQ.
const armRigCQEs = 8

// armRig is a CQ with its doorbell record, a completion eventfd and the
// daemon's notifier and event writer, as the daemon has them. The
// record's words live in Go memory, not in a mapped doorbell page: the
// race detector tracks synchronisation only through atomics on Go memory,
// and the ring is Go memory too.
type armRig struct {
	rec      doorbell.CQRecord
	ring     []byte
	cq       *queues.CQ
	comp     *doorbell.EventFD
	notifier *doorbell.CQNotifier
}

// newArmRig makes one; the test's cleanup stops the notifier and the
// writer's goroutine.
func newArmRig(t *testing.T) *armRig {
	t.Helper()
	var words [5]atomic.Uint32
	a := &armRig{rec: doorbell.CQRecord{CI: &words[0], Arm: &words[1], PI: &words[2], ArmSNDone: &words[3], Overflow: &words[4]},
		ring: make([]byte, armRigCQEs*abi.SizeofCQE)}
	var err error
	a.cq, err = queues.NewCQ(a.ring, armRigCQEs, queues.CQWords{CI: a.rec.CI, PI: a.rec.PI, Overflow: a.rec.Overflow})
	require.NoError(t, err)
	a.comp, err = doorbell.NewEventFD()
	require.NoError(t, err)
	// The events are written by the writer's goroutine, as in the daemon.
	writer := doorbell.NewEventWriter()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		writer.Run()
	}()
	a.notifier = doorbell.NewCQNotifier(a.rec, a.comp, writer)
	t.Cleanup(func() { a.notifier.Close(); writer.Close(); <-writerDone })
	return a
}
