package doorbell

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// saturate is what a hostile client does to the completion eventfd it
// shares with the daemon: clear O_NONBLOCK (on the shared open file
// description) and fill the counter to its maximum, 2^64-2.
func saturate(t *testing.T, fd int) {
	t.Helper()
	require.NoError(t, unix.SetNonblock(fd, false))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 0xfffffffffffffffe)
	_, err := unix.Write(fd, b[:])
	require.NoError(t, err)
}

// testCQ is a CQ record in a fresh page with a completion eventfd, the
// notifier over them, and the client's duplicate of the eventfd.
type testCQ struct {
	rec    CQRecord
	comp   *EventFD
	client int
	n      *CQNotifier
}

func newTestCQ(t *testing.T, sig Signaller) *testCQ {
	t.Helper()
	p := newPage(t)
	i, err := p.Alloc()
	require.NoError(t, err)
	c := &testCQ{}
	c.rec, err = p.CQ(i)
	require.NoError(t, err)
	c.comp, err = NewEventFD()
	require.NoError(t, err)
	c.client, err = unix.Dup(c.comp.Fd())
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(c.client) })
	c.n = NewCQNotifier(c.rec, c.comp, sig)
	return c
}

// complete publishes one CQE under a fresh arm and reports whether the
// notifier decided an event.
func (c *testCQ) complete(sn uint32) bool {
	c.rec.Arm.Store(abi.ArmWord(sn, false))
	c.rec.PI.Add(1)
	return c.n.Completed(false)
}

func clientCount(t *testing.T, fd int) uint64 {
	t.Helper()
	require.NoError(t, unix.SetNonblock(fd, true))
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	if err == unix.EAGAIN {
		return 0
	}
	require.NoError(t, err)
	require.Equal(t, 8, n)
	return binary.LittleEndian.Uint64(b[:])
}

// TestEventFDDrainNeverBlocks: Drain reads with RWF_NOWAIT, so a zero
// counter returns 0 at once even after the client cleared O_NONBLOCK on
// the shared description (a plain read(2) would block for good).
func TestEventFDDrainNeverBlocks(t *testing.T) {
	e, err := NewEventFD()
	require.NoError(t, err)
	defer e.Close()
	require.NoError(t, unix.SetNonblock(e.Fd(), false))
	done := make(chan uint64, 1)
	go func() {
		n, err := e.Drain()
		assert.NoError(t, err)
		done <- n
	}()
	select {
	case n := <-done:
		assert.Zero(t, n)
	case <-time.After(5 * time.Second):
		// Unblock the read so the test ends.
		require.NoError(t, e.Signal())
		<-done
		t.Fatal("Drain blocked on a blocking eventfd with a zero counter")
	}
	require.NoError(t, e.Add(41))
	require.NoError(t, e.Signal())
	n, err := e.Drain()
	require.NoError(t, err)
	assert.Equal(t, uint64(42), n)
	assert.False(t, noNowaitRead.Load(), "this kernel honours RWF_NOWAIT on an eventfd read")
}

// TestEventWriterCoalesces: signals decided before the writer runs are
// added up into one write of their sum; nothing on the decision side
// makes a system call or allocates.
func TestEventWriterCoalesces(t *testing.T) {
	w := NewEventWriter()
	c := newTestCQ(t, w)
	defer c.n.Close()
	for sn := uint32(1); sn <= 3; sn++ {
		require.True(t, c.complete(sn))
	}
	assert.Zero(t, clientCount(t, c.client), "nothing written before the writer runs")
	w.flush()
	assert.Equal(t, uint64(3), clientCount(t, c.client), "one write of the three signals owed")
	assert.Equal(t, uint64(1), w.Stats().Writes)

	sn := uint32(10)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		sn++
		if !c.complete(sn) {
			panic("no event decided")
		}
		w.flush()
	}))
}

// TestEventWriterBlockedClient: a client that clears O_NONBLOCK on its
// completion eventfd and saturates the counter blocks only its own
// writer: deciding its events never blocks, another client's writer
// keeps delivering, and closing the notifier unsticks the blocked write
// (draining the counter) so the writer's Run returns after Close.
func TestEventWriterBlockedClient(t *testing.T) {
	hw, vw := NewEventWriter(), NewEventWriter()
	hostile, victim := newTestCQ(t, hw), newTestCQ(t, vw)
	ran := make(chan struct{}, 2)
	for _, w := range []*EventWriter{hw, vw} {
		go func() {
			w.Run()
			ran <- struct{}{}
		}()
	}
	saturate(t, hostile.client)

	decided := make(chan bool)
	go func() { decided <- hostile.complete(1) }()
	select {
	case d := <-decided:
		require.True(t, d)
	case <-time.After(5 * time.Second):
		t.Fatal("deciding an event for the saturated, blocking eventfd blocked")
	}
	// The hostile writer is now inside write(2) (or about to be).
	require.Eventually(t, func() bool {
		hostile.n.mu.Lock()
		defer hostile.n.mu.Unlock()
		return hostile.n.writing
	}, 5*time.Second, time.Millisecond, "the hostile client's writer blocks in write(2)")
	// More events of the hostile client: owed, not written, not blocking.
	require.True(t, hostile.complete(2))

	for sn := uint32(1); sn <= 20; sn++ {
		require.True(t, victim.complete(sn))
		require.Eventually(t, func() bool { return clientCount(t, victim.client) == 1 }, 5*time.Second, 100*time.Microsecond,
			"victim event %d", sn)
	}

	closed := make(chan error, 1)
	go func() { closed <- hostile.n.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(time.Second):
		t.Fatal("closing the notifier waited for the blocked write")
	}
	hw.Close()
	vw.Close()
	victim.n.Close()
	for range 2 {
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("a writer's Run did not return after Close")
		}
	}
	assert.Equal(t, uint64(1), hw.Stats().Unstuck)
	assert.Equal(t, uint64(20), vw.Stats().Writes)
	// The blocked write completed (a write, not an error) once a drain
	// emptied the counter. The counter holds its 1, or 0 when the
	// unstick loop drained once more between the write's return and the
	// writer's marking it done (the loop cannot tell the two apart, and
	// a signal after Close is owed to nobody).
	assert.Equal(t, uint64(1), hw.Stats().Writes)
	assert.Zero(t, hw.Stats().Errors)
	assert.LessOrEqual(t, clientCount(t, hostile.client), uint64(1))
	assert.Equal(t, -1, hostile.comp.Fd(), "the daemon's descriptor is closed")
}

// TestKernelSignaller: the kernel signals the eventfd (one io_submit),
// also when the client cleared O_NONBLOCK and saturated the counter: the
// call returns at once (eventfd_signal saturates instead of waiting).
// Concurrent callers are served; nothing allocates.
func TestKernelSignaller(t *testing.T) {
	k, err := NewKernelSignaller(2)
	require.NoError(t, err)
	defer k.Close()
	c := newTestCQ(t, k)
	defer c.n.Close()

	require.True(t, c.complete(1))
	assert.Equal(t, uint64(1), clientCount(t, c.client))

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := NewEventFD()
			if !assert.NoError(t, err) {
				return
			}
			defer e.Close()
			for range 1000 {
				assert.NoError(t, k.Raise(e.Fd()))
			}
			n, err := e.Drain()
			assert.NoError(t, err)
			assert.Equal(t, uint64(1000), n, "goroutine %d", g)
		}()
	}
	wg.Wait()

	sn := uint32(1)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		sn++
		if !c.complete(sn) {
			panic("no event")
		}
	}))
	clientCount(t, c.client)

	saturate(t, c.client)
	done := make(chan bool, 1)
	go func() { done <- c.complete(sn + 1) }()
	select {
	case ok := <-done:
		require.True(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("signalling a saturated eventfd with O_NONBLOCK cleared blocked")
	}
	assert.Equal(t, uint64(0xffffffffffffffff), clientCount(t, c.client), "the kernel saturates the counter")
	assert.Zero(t, k.Stats().Errors)
}
