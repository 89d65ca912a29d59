package device

import (
	"encoding/binary"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/abi"
)

// Asynchronous events (OPEN_EVENTS, ABI 1.1): what libibverbs delivers
// through ibv_get_async_event. A context that asks gets the client's end
// of a SOCK_SEQPACKET socket pair; the device keeps the other end and
// sends one struct vrnic_async_event per event on it:
//
//   - QP_FATAL: the transport moved a QP to ERR on its own (an error
//     completion, a broken ring, an overflowed CQ, a change it could not
//     apply): StateWord.TransportState, on the engine worker, when the
//     state was not ERR already (a MODIFY_QP to ERR stores ERR first, so a
//     client's own move raises nothing);
//   - QP_LAST_WQE_REACHED: a QP with an SRQ entered ERR, whatever the
//     cause (the SRQ will not give it another WQE);
//   - CQ_ERR: a CQ overflowed (once per CQ);
//   - SRQ_LIMIT_REACHED: an armed SRQ (srq_limit > 0) holds fewer WQEs
//     than its limit; the limit is disarmed (0), as IBTA 11.5.2.3 says.
//
// The device never waits on the socket: a send is MSG_DONTWAIT, and an
// event that does not fit the client's receive buffer is dropped and
// counted (async_events_dropped), so a client that does not read its
// events loses its own events only. The socket is the client's only
// through its own end; the flags of the device's end are the device's.
// End of file on it tells the client the daemon is gone
// (IBV_EVENT_DEVICE_FATAL in libibverbs).
type eventSink struct {
	d  *Device
	mu sync.Mutex // orders sends against close (a closed fd number may be reused)
	fd int        // the device's end; -1 once closed
}

// post sends one event; it never blocks. Safe from any goroutine.
func (s *eventSink) post(t abi.EventType, element uint64) {
	var b [16]byte // struct vrnic_async_event
	binary.LittleEndian.PutUint32(b[0:], uint32(t))
	binary.LittleEndian.PutUint64(b[8:], element)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return
	}
	if err := unix.Send(s.fd, b[:], unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil {
		s.d.counters.AsyncEventsDropped.Add(1)
		return
	}
	s.d.counters.AsyncEvents.Add(1)
}

// postBytes sends one datagram (a CM event); it never blocks.
func (s *eventSink) postBytes(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return
	}
	if err := unix.Send(s.fd, b, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil {
		s.d.counters.AsyncEventsDropped.Add(1)
		return
	}
	s.d.counters.AsyncEvents.Add(1)
}

func (s *eventSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
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
	cx.events.Store(&eventSink{d: d, fd: fds[0]})
	return reply{fds: []int{fds[1]}, handOff: true}, nil
}

// closeEvents closes cx's event socket (the context is going): the client
// reads end of file once it has read what was sent.
func (cx *Context) closeEvents() {
	if s := cx.events.Swap(nil); s != nil {
		s.close()
	}
}

// qpEnteredError raises the events of q's entry into ERR: QP_FATAL when
// the transport moved it (fatal), QP_LAST_WQE_REACHED when it has an SRQ.
func (q *QP) qpEnteredError(fatal bool) {
	if fatal {
		q.ctx.postEvent(abi.EventQPFatal, uint64(q.qpn))
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
