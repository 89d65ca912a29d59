package tap

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/fdwait"
)

// Queue is one queue of a multi-queue TAP device: a non-blocking fd
// registered with the Go poller. Frames the kernel steers to this queue
// are read here; frames written here enter the kernel as if received on
// the interface.
//
// ReadBatch must not run concurrently with itself, nor WriteBatch with
// itself (one worker per queue); a read and a write may run together.
type Queue struct {
	index  int
	file   *os.File
	rc     syscall.RawConn
	closed atomic.Bool

	// Read state, used by readFn (a method value built once so a batch
	// allocates nothing).
	rbufs  [][]byte
	rsizes []int
	roff   int
	rn     int
	rerr   error
	readFn func(fd uintptr) bool
	tryFn  func(fd uintptr)

	wait *fdwait.Waiter // WaitReadable

	// Write state, used by writeFn.
	wbufs   [][]byte
	woff    int
	wn      int
	werr    error
	writeFn func(fd uintptr) bool

	// vnet is the length of the virtio-net header in front of every
	// frame (VnetHdrLen on a device with the offload, else 0).
	vnet int
	rhdr [VnetHdrLen]byte // the header of a frame ReadBatch reads (dropped)
	whdr [VnetHdrLen]byte // the header of a frame WriteBatch writes: zeros
	riov [maxParts]unix.Iovec
	wiov [maxParts]unix.Iovec

	// One-packet read and write state (TryReadPacket, WritePacket).
	pparts   [][]byte
	pn       int
	perr     error
	pktRead  func(fd uintptr)
	pktWrite func(fd uintptr) bool
}

func newQueue(index int, f *os.File, vnet int) (*Queue, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("tap: queue %d: %w", index, err)
	}
	q := &Queue{index: index, file: f, rc: rc, vnet: vnet}
	q.pktRead = q.readPacket
	q.pktWrite = q.writePacket
	q.readFn = q.read
	q.tryFn = func(fd uintptr) { q.read(fd) }
	q.wait = fdwait.New(rc)
	q.writeFn = q.write
	return q, nil
}

// Index returns the queue number.
func (q *Queue) Index() int { return q.index }

// VnetHdrLen returns the length of the virtio-net header that precedes
// every frame on the queue's fd: VnetHdrLen when the device was created
// with the offload (Device.Offload), else 0. ReadBatch, TryReadBatch,
// WriteBatch and WriteFrame add and drop it themselves; TryReadPacket and
// WritePacket leave it to the caller.
func (q *Queue) VnetHdrLen() int { return q.vnet }

// ReadBatch waits until at least one frame is queued, then reads up to
// len(bufs) frames without waiting more: frame i goes to bufs[i][offset:]
// and its length to sizes[i] (len(sizes) >= len(bufs)). A frame longer
// than the buffer is truncated by the kernel; size buffers for
// Device.MaxFrameSize. It returns the number of frames read; after Close
// it returns an error matching os.ErrClosed.
func (q *Queue) ReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	return q.readBatch(bufs, sizes, offset, true)
}

// TryReadBatch reads up to len(bufs) frames that are queued now, like
// ReadBatch, but never waits: it returns 0 and no error when the queue is
// empty. It bypasses the Go poller (the read runs under RawConn.Control),
// so a worker can drain its queue on its own thread between other work
// and sleep on WaitReadable only when it has nothing to do.
func (q *Queue) TryReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	return q.readBatch(bufs, sizes, offset, false)
}

// readBatch is ReadBatch (wait: through the poller) and TryReadBatch.
func (q *Queue) readBatch(bufs [][]byte, sizes []int, offset int, wait bool) (int, error) {
	if len(sizes) < len(bufs) {
		return 0, fmt.Errorf("%w: %d sizes for %d buffers", ErrConfig, len(sizes), len(bufs))
	}
	for _, b := range bufs {
		if offset < 0 || offset >= len(b) {
			return 0, fmt.Errorf("%w: offset %d in a %d-byte buffer", ErrConfig, offset, len(b))
		}
	}
	if len(bufs) == 0 {
		return 0, nil
	}
	q.rbufs, q.rsizes, q.roff, q.rn, q.rerr = bufs, sizes, offset, 0, nil
	var err error
	if wait {
		err = q.rc.Read(q.readFn)
	} else {
		err = q.rc.Control(q.tryFn)
	}
	n, rerr := q.rn, q.rerr
	q.rbufs, q.rsizes = nil, nil
	if err != nil {
		return n, q.wrapErr("read", err)
	}
	if rerr != nil && n == 0 {
		return 0, q.wrapErr("read", rerr)
	}
	return n, nil
}

// WaitReadable blocks until a frame is queued (it reads nothing; the
// frame is left for TryReadBatch or ReadBatch). It may also return when a
// frame that was queued has been read meanwhile, so callers re-check. It
// must not run concurrently with itself or with ReadBatch; TryReadBatch
// and the writes may run meanwhile. After Close it returns an error
// matching os.ErrClosed. No wake-up is lost (package fdwait).
func (q *Queue) WaitReadable() error {
	if err := q.wait.Wait(); err != nil {
		return q.wrapErr("wait", err)
	}
	return nil
}

// read runs under the poller: it drains up to len(rbufs) frames and asks
// to wait (returns false) only when none was there.
func (q *Queue) read(fd uintptr) bool {
	for q.rn < len(q.rbufs) {
		var (
			n   int
			err error
		)
		if q.vnet == 0 {
			n, err = unix.Read(int(fd), q.rbufs[q.rn][q.roff:])
		} else {
			q.riov[0].Base, q.riov[1].Base = &q.rhdr[0], &q.rbufs[q.rn][q.roff]
			q.riov[0].SetLen(q.vnet)
			q.riov[1].SetLen(len(q.rbufs[q.rn]) - q.roff)
			n, err = readv(fd, &q.riov, 2)
			n -= q.vnet
		}
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return q.rn > 0
		}
		if err != nil {
			q.rerr = err
			return true
		}
		if n < 0 { // shorter than the virtio-net header: not a frame
			continue
		}
		q.rsizes[q.rn] = n
		q.rn++
	}
	return true
}

// WriteBatch writes bufs[i][offset:] as one frame each, waiting while the
// queue cannot take more. It returns the number of frames written.
func (q *Queue) WriteBatch(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		if offset < 0 || offset > len(b) {
			return 0, fmt.Errorf("%w: offset %d in a %d-byte buffer", ErrConfig, offset, len(b))
		}
	}
	if len(bufs) == 0 {
		return 0, nil
	}
	q.wbufs, q.woff, q.wn, q.werr = bufs, offset, 0, nil
	err := q.rc.Write(q.writeFn)
	n, werr := q.wn, q.werr
	q.wbufs = nil
	if err != nil {
		return n, q.wrapErr("write", err)
	}
	if werr != nil {
		return n, q.wrapErr("write", werr)
	}
	return n, nil
}

func (q *Queue) write(fd uintptr) bool {
	for q.wn < len(q.wbufs) {
		var err error
		if b := q.wbufs[q.wn][q.woff:]; q.vnet == 0 {
			_, err = unix.Write(int(fd), b)
		} else {
			q.wiov[0].Base = &q.whdr[0]
			q.wiov[0].SetLen(q.vnet)
			n := 1
			if len(b) > 0 {
				q.wiov[1].Base = &b[0]
				q.wiov[1].SetLen(len(b))
				n++
			}
			_, err = writev(fd, &q.wiov, n)
		}
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return false
		}
		if err != nil {
			q.werr = err
			return true
		}
		q.wn++
	}
	return true
}

// WriteFrame writes one frame. It is meant for control traffic (ARP and
// ND replies) and, unlike WriteBatch, may run concurrently with any other
// call; it allocates.
func (q *Queue) WriteFrame(frame []byte) error {
	var werr error
	var hdr [VnetHdrLen]byte
	parts := [][]byte{hdr[:q.vnet], frame}
	err := q.rc.Write(func(fd uintptr) bool {
		for {
			if q.vnet == 0 {
				_, werr = unix.Write(int(fd), frame)
			} else {
				_, werr = unix.Writev(int(fd), parts)
			}
			if werr != unix.EINTR {
				return werr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return q.wrapErr("write", err)
	}
	return nil
}

// TryReadPacket reads one packet that is queued now into parts (scattered
// in order: readv(2)) and returns its length, the virtio-net header
// included (VnetHdrLen), or 0 and no error when the queue is empty. It
// never waits and never allocates. A packet longer than the parts is
// truncated by the kernel. It must not run concurrently with the other
// reads; len(parts) is at most 258.
func (q *Queue) TryReadPacket(parts [][]byte) (int, error) {
	if len(parts) > maxParts {
		return 0, fmt.Errorf("%w: %d parts", ErrConfig, len(parts))
	}
	q.pparts, q.pn, q.perr = parts, 0, nil
	err := q.rc.Control(q.pktRead)
	n, perr := q.pn, q.perr
	q.pparts = nil
	if err != nil {
		return 0, q.wrapErr("read", err)
	}
	if perr != nil {
		return 0, q.wrapErr("read", perr)
	}
	return n, nil
}

func (q *Queue) readPacket(fd uintptr) {
	k := iovecs(&q.riov, q.pparts)
	if k == 0 {
		return
	}
	for {
		n, err := readv(fd, &q.riov, k)
		switch err {
		case nil:
			q.pn = n
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			q.perr = err
		}
		return
	}
}

// WritePacket writes one packet gathered from parts (writev(2)), waiting
// while the queue cannot take it. On a device with a virtio-net header
// the packet starts with it (parts[0]). It must not run concurrently with
// WriteBatch or itself; it never allocates. len(parts) is at most 258.
func (q *Queue) WritePacket(parts [][]byte) error {
	if len(parts) > maxParts {
		return fmt.Errorf("%w: %d parts", ErrConfig, len(parts))
	}
	q.pparts, q.perr = parts, nil
	err := q.rc.Write(q.pktWrite)
	perr := q.perr
	q.pparts = nil
	if err != nil {
		return q.wrapErr("write", err)
	}
	if perr != nil {
		return q.wrapErr("write", perr)
	}
	return nil
}

func (q *Queue) writePacket(fd uintptr) bool {
	k := iovecs(&q.wiov, q.pparts)
	for {
		_, err := writev(fd, &q.wiov, k)
		switch err {
		case nil:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		default:
			q.perr = err
		}
		return true
	}
}

func (q *Queue) wrapErr(op string, err error) error {
	if q.closed.Load() && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("tap: queue %d %s: %w", q.index, op, os.ErrClosed)
	}
	return fmt.Errorf("tap: queue %d %s: %w", q.index, op, err)
}

func (q *Queue) close() error {
	q.closed.Store(true)
	return q.file.Close()
}
