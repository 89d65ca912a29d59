package cm

import "github.com/vrnic/vrnic/roce"

import "time"

// conn is one connection (or SIDR request) of a Manager.
type conn struct {
	id       uint32 // local communication ID
	remoteID uint32 // the peer's, 0 until known
	state    State
	active   bool
	// destroyed: the owner called Destroy; no more events.
	destroyed bool
	peer      GID
	serviceID uint64
	qpType    TransportType
	tid       uint64 // of the REQ (both sides) or the last DREQ received

	localQPN, remoteQPN uint32
	remoteCAGUID        uint64
	// sqPSN is the first PSN this side sends, rqPSN the first it
	// expects. Each side announces its rqPSN (the REQ's and the REP's
	// Starting PSN) and sends from the peer's, as Linux does.
	sqPSN, rqPSN       uint32
	pathMTU            roce.MTU
	pkey               uint16
	responderResources uint8
	initiatorDepth     uint8
	retryCount         uint8
	rnrRetryCount      uint8
	// path is the primary path seen from this side (SGID local).
	path PathParams
	// ackTimeout is the path's ACK timeout exponent (Linux av.timeout):
	// the QP's RTS timeout, the MRA grace and the TimeWait length.
	ackTimeout uint8
	// ECE (ece.go): the options this side's REQ offered (active), the
	// options agreed (the QP's at RTR), and the ECE of the peer's REQ or
	// REP as it came.
	eceOffer, ece uint32
	peerECE       ECE

	// timeout is the response timeout of this side's requests, and
	// maxRetries how often they are repeated.
	timeout    time.Duration
	maxRetries uint8

	// out is the message awaiting an answer (REQ, REP, DREQ, SIDR_REQ),
	// retransmitted outLeft more times every outTimeout; outGen tells
	// a current timer from a stale one.
	out        []byte
	outLeft    int
	outTimeout time.Duration
	outTimer   Timer
	outGen     uint64

	// The MRA this side sent (or will send on a repeat), and the private
	// data of the last RTU, MRA or DREP, kept to answer repeats.
	mraMsg         MsgType
	serviceTimeout uint8
	privateData    []byte

	twTimer Timer
	// Table memberships.
	inRemote, inRemoteQP bool
	inSIDR               bool
	sidrKey              sidrKey

	// Half-open bookkeeping of a passive connection (halfopen.go): the
	// listener its request came for, its class and links, its deadline;
	// when the request arrived, and the active side's REQ timeout and
	// number of attempts (0 for SIDR); whether an MRA for the REQ went
	// out.
	ln         *listener
	ho         hoClass
	hoLinks    [2]hoLink
	hoTimer    Timer
	hoGen      uint64
	arrived    time.Time
	reqAttempt time.Duration
	reqTries   int
	mraSent    bool
}

// startOut sends mad as c's outstanding request: it is retransmitted
// every timeout until answered, at most c.maxRetries times.
func (m *Manager) startOut(c *conn, mad []byte, timeout time.Duration) {
	m.cancelOut(c)
	if mad == nil {
		return
	}
	c.out = mad
	c.outLeft = int(c.maxRetries)
	c.outTimeout = timeout
	m.armOut(c)
}

func (m *Manager) armOut(c *conn) {
	if c.outTimer != nil {
		c.outTimer.Stop()
	}
	c.outGen++
	gen := c.outGen
	c.outTimer = m.clock.AfterFunc(c.outTimeout, func() { m.outExpired(c, gen) })
}

// cancelOut stops waiting for an answer to c's request.
func (m *Manager) cancelOut(c *conn) {
	if c.outTimer != nil {
		c.outTimer.Stop()
		c.outTimer = nil
	}
	c.outGen++
	c.out = nil
}

// extendOut applies an MRA: the request is next repeated after timeout
// instead (Linux ib_modify_mad).
func (m *Manager) extendOut(c *conn, timeout time.Duration) {
	if c.out == nil {
		return
	}
	c.outTimeout = timeout
	m.armOut(c)
}

func (m *Manager) stopTimers(c *conn) {
	m.cancelOut(c)
	if c.twTimer != nil {
		c.twTimer.Stop()
		c.twTimer = nil
	}
	if c.hoTimer != nil {
		c.hoTimer.Stop()
		c.hoTimer = nil
	}
}

// outExpired runs when c's request got no answer in time.
func (m *Manager) outExpired(c *conn, gen uint64) {
	if m.closed || gen != c.outGen || c.out == nil || m.conns[c.id] != c {
		return
	}
	defer m.unlock()
	if c.outLeft > 0 {
		c.outLeft--
		m.sendMAD(c.peer, c.out, true)
		m.armOut(c)
		return
	}
	attr := AttrID(uint16(c.out[16])<<8 | uint16(c.out[17]))
	m.cancelOut(c)
	m.log.Debug("cm: no answer", "conn", c.id, "attr", attr, "state", c.state)
	switch c.state {
	case StateREQSent, StateMRAREQRcvd, StateREPSent, StateMRAREPRcvd, StateSIDRREQSent:
		// Linux IB_CM_REQ_ERROR, IB_CM_REP_ERROR, IB_CM_SIDR_REQ_ERROR:
		// rdma_cm reports RDMA_CM_EVENT_UNREACHABLE.
		m.emit(c, Event{Type: EventUnreachable, Attr: attr})
		m.toIdle(c)
	case StateDREQSent:
		m.enterTimeWait(c)
		m.emit(c, Event{Type: EventDisconnected, TimedOut: true})
	}
}

// toIdle forgets c.
func (m *Manager) toIdle(c *conn) {
	m.stopTimers(c)
	c.state = StateIdle
	m.unlink(c)
	delete(m.conns, c.id)
}

func (m *Manager) unlink(c *conn) {
	m.hoUpdate(c)
	if c.inRemote {
		delete(m.byRemote, remoteKey{c.remoteID, c.remoteCAGUID, c.peer})
		c.inRemote = false
	}
	m.unlinkQP(c)
	if c.inSIDR {
		delete(m.sidr, c.sidrKey)
		c.inSIDR = false
	}
}

func (m *Manager) unlinkQP(c *conn) {
	if c.inRemoteQP {
		delete(m.byRemoteQP, qpKey{c.remoteQPN, c.remoteCAGUID, c.peer})
		c.inRemoteQP = false
	}
}

// enterTimeWait moves c to TIMEWAIT for IBADuration(ackTimeout) (Linux
// cm_enter_timewait; the exponent clamped to MaxPeerACKTimeout). The
// peer's QP leaves the stale-connection table at once; c keeps its local
// comm ID, its local QPN and its entry under the peer's comm ID (a
// repeated REQ is answered with a stale connection REJ) until the timer
// fires.
func (m *Manager) enterTimeWait(c *conn) {
	m.cancelOut(c)
	m.unlinkQP(c)
	if c.state == StateTimeWait {
		return
	}
	c.state = StateTimeWait
	m.hoUpdate(c)
	if c.localQPN != 0 {
		m.twQPN[c.localQPN]++
	}
	c.twTimer = m.clock.AfterFunc(IBADuration(min(c.ackTimeout, MaxPeerACKTimeout)), func() { m.timeWaitExpired(c) })
}

func (m *Manager) timeWaitExpired(c *conn) {
	if m.closed || c.state != StateTimeWait || m.conns[c.id] != c {
		return
	}
	defer m.unlock()
	c.twTimer = nil
	if c.localQPN != 0 {
		if m.twQPN[c.localQPN]--; m.twQPN[c.localQPN] <= 0 {
			delete(m.twQPN, c.localQPN)
		}
	}
	m.emit(c, Event{Type: EventTimeWaitExit})
	m.toIdle(c)
}
