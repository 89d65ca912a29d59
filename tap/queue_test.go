package tap

import (
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// seqpacketQueue returns a Queue over one end of a SOCK_SEQPACKET pair
// (message boundaries like a tun fd, no root needed) and the other end.
func seqpacketQueue(t *testing.T) (*Queue, int) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	q, err := newQueue(0, os.NewFile(uintptr(fds[0]), "seqpacket"), 0)
	require.NoError(t, err)
	t.Cleanup(func() {
		q.close()
		unix.Close(fds[1])
	})
	return q, fds[1]
}

func TestReadBatchReadsSeveralFramesPerWakeup(t *testing.T) {
	q, peer := seqpacketQueue(t)
	for i := range 5 {
		_, err := unix.Write(peer, []byte{byte(i), 1, 2, byte(i)})
		require.NoError(t, err)
	}
	bufs := make([][]byte, 3)
	for i := range bufs {
		bufs[i] = make([]byte, 16+64)
	}
	sizes := make([]int, 3)
	n, err := q.ReadBatch(bufs, sizes, 16)
	require.NoError(t, err)
	require.Equal(t, 3, n, "a full batch in one call")
	for i := range n {
		assert.Equal(t, 4, sizes[i])
		assert.Equal(t, []byte{byte(i), 1, 2, byte(i)}, bufs[i][16:20], "frame after the headroom")
		assert.Zero(t, bufs[i][0], "headroom untouched")
	}
	n, err = q.ReadBatch(bufs, sizes, 16)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "what is left, without waiting for a full batch")
}

func TestReadBatchWaitsThenReturnsOnClose(t *testing.T) {
	q, peer := seqpacketQueue(t)
	bufs := [][]byte{make([]byte, 64)}
	sizes := []int{0}
	done := make(chan error)
	go func() {
		_, err := q.ReadBatch(bufs, sizes, 0)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("returned before any frame: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	_, err := unix.Write(peer, []byte("frame"))
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Equal(t, 5, sizes[0])

	go func() {
		_, err := q.ReadBatch(bufs, sizes, 0)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, q.close())
	err = <-done
	assert.True(t, errors.Is(err, os.ErrClosed), "got %v", err)
}

func TestWriteBatch(t *testing.T) {
	q, peer := seqpacketQueue(t)
	bufs := [][]byte{[]byte("hdr-one"), []byte("hdr-two")}
	n, err := q.WriteBatch(bufs, 4)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	buf := make([]byte, 16)
	for _, want := range []string{"one", "two"} {
		m, err := unix.Read(peer, buf)
		require.NoError(t, err)
		assert.Equal(t, want, string(buf[:m]))
	}
	require.NoError(t, q.WriteFrame([]byte("x")))
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		if _, err := q.WriteBatch(bufs, 4); err != nil {
			t.Fatal(err)
		}
		for range bufs {
			if _, err := unix.Read(peer, buf); err != nil && err != unix.EAGAIN {
				t.Fatal(err)
			}
		}
	}))
}

func TestBatchArgumentErrors(t *testing.T) {
	q, _ := seqpacketQueue(t)
	_, err := q.ReadBatch([][]byte{make([]byte, 8)}, nil, 0)
	assert.ErrorIs(t, err, ErrConfig, "sizes shorter than bufs")
	_, err = q.ReadBatch([][]byte{make([]byte, 8)}, []int{0}, 8)
	assert.ErrorIs(t, err, ErrConfig, "no room after the headroom")
	_, err = q.WriteBatch([][]byte{make([]byte, 8)}, 9)
	assert.ErrorIs(t, err, ErrConfig)
	n, err := q.ReadBatch(nil, nil, 0)
	assert.NoError(t, err)
	assert.Zero(t, n)
}

func TestTryReadBatchNeverWaits(t *testing.T) {
	q, peer := seqpacketQueue(t)
	bufs := [][]byte{make([]byte, 64), make([]byte, 64)}
	sizes := make([]int, 2)
	n, err := q.TryReadBatch(bufs, sizes, 0)
	require.NoError(t, err)
	assert.Zero(t, n, "empty queue: nothing, at once")
	for _, m := range []string{"one", "three", "five!"} {
		_, err := unix.Write(peer, []byte(m))
		require.NoError(t, err)
	}
	n, err = q.TryReadBatch(bufs, sizes, 0)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	assert.Equal(t, "one", string(bufs[0][:sizes[0]]))
	assert.Equal(t, "three", string(bufs[1][:sizes[1]]))
	n, err = q.TryReadBatch(bufs, sizes, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, "five!", string(bufs[0][:sizes[0]]))
	_, err = q.TryReadBatch(bufs, sizes[:1], 0)
	assert.ErrorIs(t, err, ErrConfig)
	require.NoError(t, q.close())
	_, err = q.TryReadBatch(bufs, sizes, 0)
	assert.ErrorIs(t, err, os.ErrClosed)
}

// TestWaitReadable: the wait returns at once for a frame queued before it
// began (the poller's forgotten edge), waits for a later one, reads
// nothing, and ends with os.ErrClosed at Close.
func TestWaitReadable(t *testing.T) {
	q, peer := seqpacketQueue(t)
	_, err := unix.Write(peer, []byte("early"))
	require.NoError(t, err)
	// Let the poller see (and keep) the edge, then wait: it must not
	// block even though the edge came before the wait was prepared.
	time.Sleep(10 * time.Millisecond)
	waitWithin(t, q, "a frame queued before the wait")
	waitWithin(t, q, "a frame still queued")
	bufs := [][]byte{make([]byte, 64)}
	sizes := []int{0}
	n, err := q.TryReadBatch(bufs, sizes, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the wait left the frame queued")

	done := make(chan error, 1)
	go func() { done <- q.WaitReadable() }()
	select {
	case err := <-done:
		t.Fatalf("returned with nothing queued: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	_, err = unix.Write(peer, []byte("late"))
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a frame queued during the wait did not end it")
	}
	n, err = q.TryReadBatch(bufs, sizes, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	go func() { done <- q.WaitReadable() }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, q.close())
	assert.ErrorIs(t, <-done, os.ErrClosed)
}

// TestWaitReadableNoLostWakeup: a consumer that drains with TryReadBatch
// and then waits, against a producer writing at arbitrary moments, gets
// every frame and never hangs.
func TestWaitReadableNoLostWakeup(t *testing.T) {
	q, peer := seqpacketQueue(t)
	const total = 20000
	go func() {
		for i := range total {
			for {
				_, err := unix.Write(peer, []byte{byte(i), byte(i >> 8)})
				if err != unix.EAGAIN {
					break
				}
				time.Sleep(10 * time.Microsecond)
			}
			if i%5 == 0 {
				for range i % 200 { // a short, varying pause
					runtimeYield()
				}
			}
		}
	}()
	bufs := make([][]byte, 8)
	for i := range bufs {
		bufs[i] = make([]byte, 16)
	}
	sizes := make([]int, 8)
	got := 0
	for got < total {
		n, err := q.TryReadBatch(bufs, sizes, 0)
		require.NoError(t, err)
		for i := range n {
			require.Equal(t, []byte{byte(got), byte(got >> 8)}, bufs[i][:sizes[i]], "frame %d in order", got)
			got++
		}
		if n > 0 {
			continue
		}
		done := make(chan error, 1)
		go func() { done <- q.WaitReadable() }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("lost wake-up after %d of %d frames", got, total)
		}
	}
}

func runtimeYield() { runtime.Gosched() }

// waitWithin fails unless q.WaitReadable returns without error soon.
func waitWithin(t *testing.T, q *Queue, what string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- q.WaitReadable() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatalf("WaitReadable blocked on %s", what)
	}
}
