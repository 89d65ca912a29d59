package device

import (
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// Asynchronous events (OPEN_EVENTS, ABI 1.1): what libibverbs delivers
// through ibv_get_async_event. A context that asks gets the client's end
// of a SOCK_SEQPACKET socket pair; the device keeps the other end and
// sends one struct vrnic_async_event per event on it:
//
//   - QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR: the affiliated asynchronous
//     errors (IBTA 11.6.3.1) of a QP the transport moved to ERR on an
//     error no completion reports: QP_FATAL for a catastrophic one (a
//     completion its CQ refused, a broken ring, a change it could not
//     apply), QP_REQ_ERR and QP_ACCESS_ERR for an RC responder's class C
//     errors on a request that consumed no receive WQE (C9-222.1.1).
//     StateWord.TransportError, on the engine worker, when the state was
//     not ERR already (a MODIFY_QP to ERR stores ERR first, so a client's
//     own move raises nothing). An error a completion reports (the error
//     completion of the WR that failed) raises none of them, as on Linux
//     (device/engine/status.go, errEvent);
//   - QP_LAST_WQE_REACHED: a QP with an SRQ entered ERR, whatever the
//     cause (the SRQ will not give it another WQE);
//   - CQ_ERR: a CQ overflowed (once per CQ);
//   - SRQ_LIMIT_REACHED: an armed SRQ (srq_limit > 0) holds fewer WQEs
//     than its limit; the limit is disarmed (0), as IBTA 11.5.2.3 says.
//
// The device never waits on the socket. What the socket does not take
// (its buffer holds about 160 CM events) waits in the sink's backlog, in
// order, and a goroutine of the sink's own sends it as the client reads:
// so a listener that reads more slowly than requests arrive still sees
// every connect request (the kernel's ucma and uverbs queue their events
// the same way, in lists of the kernel's memory). The backlog is bounded
// (eventBacklogMax bytes per context): an event beyond it is dropped and
// counted (async_events_dropped), so a client that never reads its events
// loses its own events only and holds a bounded share of the daemon's
// memory. The socket is the client's only through its own end; the flags
// of the device's end are the device's. End of file on it tells the
// client the daemon is gone (IBV_EVENT_DEVICE_FATAL in libibverbs).
type eventSink struct {
	d *Device
	// f is the device's end, non-blocking and in the runtime's poller;
	// rc its raw connection. A send goes through rc, which holds the
	// descriptor open for its duration, so a closed number is never
	// reused under it.
	f  *os.File
	rc syscall.RawConn

	mu       sync.Mutex
	closed   bool
	backlog  [][]byte // events the socket has not taken yet, oldest first
	queued   int      // their bytes
	flushing bool     // the flush goroutine runs
}

// eventAfterSend, if set (tests), runs in a flush goroutine after each
// send, unlocked, with the sink's close. Atomic: flush goroutines of
// closed contexts may still read it when a test sets it.
var eventAfterSend atomic.Pointer[func(closeSink func())]

// eventBacklogMax bounds the bytes of a context's events waiting for room
// in its socket: about 11,900 CM events or 262,144 asynchronous events.
var eventBacklogMax = 4 << 20

func newEventSink(d *Device, fd int) (*eventSink, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "events")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &eventSink{d: d, f: f, rc: rc}, nil
}

// post sends one asynchronous event (struct vrnic_async_event); it never
// blocks. Safe from any goroutine.
func (s *eventSink) post(t abi.EventType, element uint64) {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint32(b[0:], uint32(t))
	binary.LittleEndian.PutUint64(b[8:], element)
	s.postBytes(b)
}

// send sends one datagram: nil when it went. Without wait it returns
// unix.EAGAIN when the socket is full; with wait it waits for room (in
// the runtime's poller) until the sink closes.
func (s *eventSink) send(b []byte, wait bool) error {
	var serr error
	if err := s.rc.Write(func(fd uintptr) bool {
		serr = unix.Send(int(fd), b, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return !wait || serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// postBytes sends one datagram, b, which it keeps (a CM event or an
// asynchronous event); it never blocks. Safe from any goroutine.
func (s *eventSink) postBytes(b []byte) {
	c := &s.d.counters
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if len(s.backlog) == 0 {
		err := s.send(b, false)
		if err == nil {
			c.AsyncEvents.Add(1)
			return
		}
		if err != unix.EAGAIN {
			c.AsyncEventsDropped.Add(1) // the client closed its end
			return
		}
	}
	if s.queued+len(b) > eventBacklogMax {
		c.AsyncEventsDropped.Add(1)
		return
	}
	s.backlog = append(s.backlog, b)
	s.queued += len(b)
	if !s.flushing {
		s.flushing = true
		go s.flush()
	}
}

// flush sends the backlog as the socket makes room, then ends; it ends
// too when the sink closes or the client's end is gone (what is left is
// counted dropped).
func (s *eventSink) flush() {
	c := &s.d.counters
	for {
		s.mu.Lock()
		if s.closed || len(s.backlog) == 0 {
			s.flushing = false
			s.mu.Unlock()
			return
		}
		// Only this goroutine takes from the backlog; posts only add.
		b := s.backlog[0]
		s.mu.Unlock()
		err := s.send(b, true)
		if f := eventAfterSend.Load(); f != nil {
			(*f)(s.close)
		}
		s.mu.Lock()
		if s.closed {
			// Closed meanwhile (close let go of the backlog).
			s.flushing = false
			s.mu.Unlock()
			return
		}
		if err != nil {
			c.AsyncEventsDropped.Add(uint64(len(s.backlog)))
			s.backlog, s.queued, s.flushing = nil, 0, false
			s.mu.Unlock()
			return
		}
		c.AsyncEvents.Add(1)
		s.backlog[0] = nil
		s.backlog = s.backlog[1:]
		s.queued -= len(b)
		if len(s.backlog) == 0 {
			s.backlog = nil // let go of the array
		}
		s.mu.Unlock()
	}
}

func (s *eventSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.backlog, s.queued = nil, 0
		s.f.Close() // wakes the flush goroutine if it waits for room
	}
}

// postEvent sends an event to cx's event socket, if it has one. Safe
// from any goroutine (the engine's workers included); never blocks.
func (cx *Context) postEvent(t abi.EventType, element uint64) {
	if s := cx.events.Load(); s != nil {
		s.post(t, element)
	}
}

// openEvents is OPEN_EVENTS.
func (cn *conn) openEvents(r *request) (reply, error) {
	d, cx := cn.d, cn.ctx
	if cx.events.Load() != nil {
		return reply{}, errorf(errBusy, "context %d has its event socket already", cx.handle)
	}
	if err := d.fdLimit(cx, "event socket"); err != nil {
		return reply{}, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return reply{}, errorf(errNoMem, "event socket: %v", err)
	}
	// Only the device sends; the client only reads.
	unix.Shutdown(fds[0], unix.SHUT_RD)
	unix.Shutdown(fds[1], unix.SHUT_WR)
	sink, err := newEventSink(d, fds[0])
	if err != nil {
		unix.Close(fds[1])
		return reply{}, errorf(errNoMem, "event socket: %v", err)
	}
	cx.events.Store(sink)
	return reply{fds: []int{fds[1]}, handOff: true}, nil
}

// closeEvents closes cx's event socket (the context is going): the client
// reads end of file once it has read what was sent.
func (cx *Context) closeEvents() {
	if s := cx.events.Swap(nil); s != nil {
		s.close()
	}
}

// qpEnteredError raises the events of q's entry into ERR: ev if
// affiliated (the affiliated asynchronous error of an error no completion
// reports), then QP_LAST_WQE_REACHED when q has an SRQ.
func (q *QP) qpEnteredError(ev abi.EventType, affiliated bool) {
	if affiliated {
		q.ctx.postEvent(ev, uint64(q.qpn))
	}
	if q.srq != nil {
		q.ctx.postEvent(abi.EventQPLastWQEReached, uint64(q.qpn))
	}
}

// Overflowed reports that the CQ could not take a completion (the data
// plane, on an engine worker): the CQ's context gets CQ_ERR, once per CQ.
func (c *CQ) Overflowed() {
	if c.overflowed.CompareAndSwap(false, true) {
		c.cx.postEvent(abi.EventCQErr, uint64(c.handle))
	}
}

// LimitReached reports that the SRQ holds fewer WQEs than limit, the armed
// limit the data plane read: if it is still armed with it, it is disarmed
// and the SRQ's context gets SRQ_LIMIT_REACHED.
func (s *SRQ) LimitReached(limit uint32) {
	if limit != 0 && s.armed.CompareAndSwap(limit, 0) {
		s.cx.postEvent(abi.EventSRQLimitReached, uint64(s.handle))
	}
}

// SetPort moves port 1 down or up (a port_flap fault: package faults
// drops the frames meanwhile) and tells every context with an event
// socket: PORT_ERR when it goes down, PORT_ACTIVE when it comes back
// (IBTA 11.6.3.1, unaffiliated asynchronous events). QUERY_PORT reports
// DOWN meanwhile. A move to the state the port is in raises nothing.
func (d *Device) SetPort(up bool) {
	if d.portDown.Swap(!up) == !up {
		return
	}
	t := abi.EventPortErr
	if up {
		t = abi.EventPortActive
	}
	d.mu.Lock()
	cxs := make([]*Context, 0, len(d.contexts))
	for _, cx := range d.contexts {
		cxs = append(cxs, cx)
	}
	d.mu.Unlock()
	for _, cx := range cxs {
		cx.postEvent(t, 1)
	}
}

// portState is QUERY_PORT's state: IBV_PORT_ACTIVE (4), or
// IBV_PORT_DOWN (1) while a port_flap fault holds the port down.
func (d *Device) portState() uint32 {
	if d.portDown.Load() {
		return 1
	}
	return 4
}
