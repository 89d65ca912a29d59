package verbs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// CompChannel is a completion channel: an eventfd the daemon writes when an
// armed CQ gets a completion (ibv_comp_channel). One channel may serve
// several CQs.
type CompChannel struct {
	fd  int
	buf [8]byte
}

// NewCompChannel creates a completion channel.
func NewCompChannel() (*CompChannel, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("verbs: eventfd: %w", err)
	}
	return &CompChannel{fd: fd}, nil
}

// Fd returns the eventfd, for use with epoll in an event loop.
func (ch *CompChannel) Fd() int { return ch.fd }

// Close closes the channel's eventfd (the daemon keeps its own reference
// while a CQ uses it).
func (ch *CompChannel) Close() error { return unix.Close(ch.fd) }

// ErrTimeout is returned by Wait when the context ends first.
var ErrTimeout = errors.New("verbs: no completion event before the deadline")

// Wait blocks until the channel is signalled or ctx is done, and consumes
// the event (ibv_get_cq_event). It returns the number of events (eventfd
// counter value).
func (ch *CompChannel) Wait(ctx context.Context) (uint64, error) {
	fds := []unix.PollFd{{Fd: int32(ch.fd), Events: unix.POLLIN}}
	for {
		if n, err := unix.Read(ch.fd, ch.buf[:]); err == nil && n == 8 {
			v := uint64(ch.buf[0]) | uint64(ch.buf[1])<<8 | uint64(ch.buf[2])<<16 | uint64(ch.buf[3])<<24 |
				uint64(ch.buf[4])<<32 | uint64(ch.buf[5])<<40 | uint64(ch.buf[6])<<48 | uint64(ch.buf[7])<<56
			return v, nil
		} else if err != nil && err != unix.EAGAIN {
			return 0, fmt.Errorf("verbs: read eventfd: %w", err)
		}
		// Poll in slices of at most 50 ms so cancellation is noticed.
		timeout := 50
		if dl, ok := ctx.Deadline(); ok {
			if d := time.Until(dl); d < 50*time.Millisecond {
				timeout = max(int(d/time.Millisecond), 0)
			}
		}
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		if _, err := unix.Poll(fds, timeout); err != nil && err != unix.EINTR {
			return 0, fmt.Errorf("verbs: poll: %w", err)
		}
		if fds[0].Revents == 0 {
			if err := ctx.Err(); err != nil {
				return 0, fmt.Errorf("%w: %w", ErrTimeout, err)
			}
		}
	}
}

// CQ is a completion queue. The ring (cqe_count CQEs) lives in host
// memory; the daemon writes CQEs, owner byte last; Poll reads them by the
// owner bit and publishes the consumer index in the CQ's doorbell record.
type CQ struct {
	ctx     *Context
	Handle  uint32
	ring    *Buffer
	n, mask uint32
	rec     []byte
	ci      uint32 // next CQE to read (free-running)
	armSN   uint32
	ch      *CompChannel
	ts      []byte // completion timestamps after the CQEs (CreateCQWithTimestamps), else nil
}

// CreateCQ creates a CQ of at least cqe entries (rounded up to a power of
// two, at least 2). ch may be nil.
func (c *Context) CreateCQ(cqe int, ch *CompChannel) (*CQ, error) { return c.createCQ(cqe, ch, 0) }

// createCQ is CreateCQ with the CREATE_CQ flags (abi.CQFlag*).
func (c *Context) createCQ(cqe int, ch *CompChannel, flags uint32) (*CQ, error) {
	if cqe <= 0 || cqe > abi.MaxCQE {
		return nil, fmt.Errorf("verbs: CreateCQ(%d): 1..%d entries", cqe, abi.MaxCQE)
	}
	n := cqSlots(cqe)
	ts := flags&abi.CQFlagTimestamp != 0
	ring, err := c.Alloc(cqRingBytes(n, ts), 64)
	if err != nil {
		return nil, err
	}
	var fds []int
	if ch != nil {
		fds = []int{ch.fd}
	}
	var r abi.RespCreateCQ
	if _, _, err := c.k.call(abi.CmdCreateCQ, &abi.CmdCreateCQReq{RingPA: ring.PA, CQECount: n, Flags: flags}, nil, fds, &r); err != nil {
		ring.Free()
		return nil, err
	}
	rec, err := c.createdRecord(r.DBIndex, abi.CmdDestroyCQ, r.CQHandle, ring)
	if err != nil {
		return nil, err
	}
	cq := &CQ{ctx: c, Handle: r.CQHandle, rec: rec, ch: ch}
	cq.setRing(ring, n, ts)
	return cq, nil
}

// Len returns the number of CQE slots.
func (cq *CQ) Len() int { return int(cq.n) }

// Destroy destroys the CQ (EBUSY while a QP uses it) and frees its ring.
func (cq *CQ) Destroy() error {
	if err := cq.ctx.destroy(abi.CmdDestroyCQ, cq.Handle); err != nil {
		return err
	}
	cq.ring.Free()
	return nil
}

// Poll reads up to len(wc) completions into wc and returns how many. It
// makes no system call and allocates nothing.
func (cq *CQ) Poll(wc []abi.CQE) int { return cq.poll(wc, nil) }

// poll is Poll that also reads the completion timestamp of each CQE into
// ts (nil: none), stopping at len(ts) entries too.
func (cq *CQ) poll(wc []abi.CQE, ts []uint64) int {
	n := 0
	for n < len(wc) && (ts == nil || n < len(ts)) {
		slot := cq.ring.Bytes[(cq.ci&cq.mask)*abi.SizeofCQE:][:abi.SizeofCQE]
		// Acquire: the owner byte is in the tail word, written last.
		if !abi.CQEReady(load32(slot[abi.OffCQETail:]), cq.ci, cq.n) {
			break
		}
		wc[n].Decode(slot)
		if ts != nil {
			ts[n] = cq.timestamp(cq.ci)
		}
		cq.ci++
		n++
	}
	if n > 0 {
		store32(cq.rec[abi.OffDBCQCI:], cq.ci)
	}
	return n
}

// ReqNotify arms the CQ (ibv_req_notify_cq): the completion channel is
// signalled once for the next completion (only a solicited or error one if
// solicitedOnly) written after the daemon sees the arm.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if cq.ch == nil {
		return fmt.Errorf("verbs: CQ %d has no completion channel", cq.Handle)
	}
	cq.armSN = (cq.armSN + 1) & (1<<24 - 1)
	store32(cq.rec[abi.OffDBCQArm:], abi.ArmWord(cq.armSN, solicitedOnly))
	cq.ctx.kick()
	return nil
}

// Overflowed reports whether the daemon flagged the CQ as overflowed.
func (cq *CQ) Overflowed() bool { return load32(cq.rec[abi.OffDBOverflow:]) != 0 }
