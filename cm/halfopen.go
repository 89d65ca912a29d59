package cm

import (
	"encoding/binary"
	"time"
)

// Half-open connections: what a REQ (or SIDR_REQ) makes this side hold
// before the peer has shown that it is there. Anyone who can send a
// datagram to QP1 can make them, from any source address, so the Manager
// bounds them in number and in time (Linux ib_cm does neither: its
// listeners' backlog is ucma's count of unread events, and a REQ the
// consumer never answers is held until the consumer destroys it).
//
// A passive connection is half open from the REQ until the RTU (or
// NotifyEstablished), in two classes:
//
//	unanswered  REQ_RCVD, MRA_REQ_SENT, SIDR_REQ_RCVD: the owner has
//	            not answered the request yet
//	answered    REP_SENT, MRA_REP_RCVD: the REP waits for the RTU
//
// Each class is a list, oldest first, per listener and per Manager (a
// connection is on both, through hoLinks[hoListener] and
// hoLinks[hoManager]). A listener holds at most its backlog of half-open
// connections, the Manager at most Config.MaxHalfOpen. A new request that
// finds the bound reached sheds one (shed) and is admitted: the oldest
// answered one first (a genuine peer answers a REP with an RTU within a
// round trip; a REQ with a forged source never does, its REP goes
// elsewhere), else the oldest unanswered one. Its owner gets
// EventRejected (RejectNoResources). An answered one's peer gets a REJ (no
// resources): it may have taken the REP and sent its RTU. An unanswered
// one's peer gets nothing, as a TCP listener drops a SYN it has no room
// for: it has heard nothing from this side (at most an MRA), so it sends
// its REQ again after its timeout, and the repeat is a new request; a REJ
// would end a genuine client's connect at once. Turning the newcomer away
// instead would let a flood of forged REQs lock genuine clients out for
// as long as it lasts.
//
// Each half-open connection has a deadline (hoTimer). An unanswered
// request expires when its active side has given up on it: after the
// REQ's Max CM Retries + 1 attempts of its REQ timeout (2 × packet life
// time + remote CM response timeout), or of the MRA's wait once an MRA
// went out (the owner asked for more time), plus a round trip; at most
// Config.MaxHalfOpenTime. It then gets a REJ (no resources; the REJ
// reason "timeout" would name the wrong side: its ARI is the GUID of the
// side that gave up) and its owner EventRejected with RejectTimeout and the
// peer's CA GUID as ARI, as if the active side had given up and said so
// (Linux cm_destroy_id from REQ_SENT; rdma_cm reports it as
// RDMA_CM_EVENT_REJECTED). An answered one is given up on
// (EventUnreachable) at most Config.MaxHalfOpenTime after the REP; its REP
// retransmissions (clamped, timeout.go) end before that unless MRAs
// stretched them.

const (
	// DefaultMaxHalfOpen is Config.MaxHalfOpen's default.
	DefaultMaxHalfOpen = 4096
	// DefaultMaxHalfOpenTime is Config.MaxHalfOpenTime's default.
	DefaultMaxHalfOpenTime = 2 * time.Minute
	// DefaultBacklog is the backlog of a listener made by Listen: Linux
	// ucma's max_backlog, which librdmacm's rdma_listen(id, 0) gets.
	DefaultBacklog = 1024
)

// hoClass says which half-open list a connection is on.
type hoClass uint8

const (
	hoNone       hoClass = iota
	hoUnanswered         // REQ_RCVD, MRA_REQ_SENT, SIDR_REQ_RCVD
	hoAnswered           // REP_SENT, MRA_REP_RCVD
)

func hoClassOf(s State) hoClass {
	switch s {
	case StateREQRcvd, StateMRAREQSent, StateSIDRREQRcvd:
		return hoUnanswered
	case StateREPSent, StateMRAREPRcvd:
		return hoAnswered
	}
	return hoNone
}

// The two lists a half-open connection is on: its listener's and its
// Manager's (indexes of conn.hoLinks).
const (
	hoListener = iota
	hoManager
)

type hoLink struct{ prev, next *conn }

// hoList is a list of connections, oldest first, linked through
// conn.hoLinks[i] for the list's index i.
type hoList struct {
	head, tail *conn
	n          int
}

func (l *hoList) push(c *conn, i int) {
	c.hoLinks[i] = hoLink{prev: l.tail}
	if l.tail != nil {
		l.tail.hoLinks[i].next = c
	} else {
		l.head = c
	}
	l.tail = c
	l.n++
}

func (l *hoList) remove(c *conn, i int) {
	lk := &c.hoLinks[i]
	if lk.prev != nil {
		lk.prev.hoLinks[i].next = lk.next
	} else {
		l.head = lk.next
	}
	if lk.next != nil {
		lk.next.hoLinks[i].prev = lk.prev
	} else {
		l.tail = lk.prev
	}
	*lk = hoLink{}
	l.n--
}

// halfOpen is the half-open connections of a listener or a Manager, by
// class.
type halfOpen [3]hoList

func (h *halfOpen) len() int { return h[hoUnanswered].n + h[hoAnswered].n }

// victim is the connection to shed first: the oldest answered one, else
// the oldest unanswered one.
func (h *halfOpen) victim() *conn {
	if c := h[hoAnswered].head; c != nil {
		return c
	}
	return h[hoUnanswered].head
}

// admit makes room for one more half-open connection of listener ln,
// shedding as the bounds ask.
func (m *Manager) admit(ln *listener) {
	if ln.ho.len() >= ln.backlog {
		if v := ln.ho.victim(); v != nil {
			m.shed(v)
		}
	}
	if m.ho.len() >= m.maxHalfOpen {
		if v := m.ho.victim(); v != nil {
			m.shed(v)
		}
	}
}

// shed drops half-open connection c to admit a newer request: the owner
// gets EventRejected (RejectNoResources), the peer a REJ if it was sent
// the REP, nothing otherwise.
func (m *Manager) shed(c *conn) {
	m.stats.Shed++
	m.log.Debug("cm: half-open connection shed", "conn", c.id, "state", c.state, "peer", c.peer)
	if c.ho == hoAnswered {
		_ = m.reject(c, RejectNoResources, nil, nil)
	} else {
		m.toIdle(c)
	}
	m.emit(c, Event{Type: EventRejected, Reason: RejectNoResources})
}

// hoUpdate puts passive connection c on the half-open lists its state
// asks for (none once it is established, disconnecting or gone) and arms
// its deadline when it changes class. Call it after every change of
// c.state that may enter or leave a half-open state.
func (m *Manager) hoUpdate(c *conn) {
	if c.ln == nil {
		return
	}
	want := hoClassOf(c.state)
	if want == c.ho {
		return
	}
	if c.ho != hoNone {
		c.ln.ho[c.ho].remove(c, hoListener)
		m.ho[c.ho].remove(c, hoManager)
	}
	c.ho = want
	if want != hoNone {
		c.ln.ho[want].push(c, hoListener)
		m.ho[want].push(c, hoManager)
	}
	m.hoArm(c)
}

// hoArm (re)starts c's half-open deadline for its class and state.
func (m *Manager) hoArm(c *conn) {
	if c.hoTimer != nil {
		c.hoTimer.Stop()
		c.hoTimer = nil
	}
	c.hoGen++
	var d time.Duration
	switch c.ho {
	case hoUnanswered:
		d = c.arrived.Add(m.requestWait(c)).Sub(m.clock.Now())
	case hoAnswered:
		d = m.maxHalfOpenTime
	default:
		return
	}
	gen := c.hoGen
	c.hoTimer = m.clock.AfterFunc(max(d, 0), func() { m.hoExpired(c, gen) })
}

// requestWait is how long after its arrival an unanswered request is
// kept: as long as its active side may still be waiting for the answer.
func (m *Manager) requestWait(c *conn) time.Duration {
	if c.reqTries == 0 {
		// A SIDR_REQ says nothing of its sender's timeout.
		return m.maxHalfOpenTime
	}
	per := c.reqAttempt
	if c.mraSent {
		// The owner asked for more time and the MRA went out: the
		// active side's wait after it (recvMRA's arithmetic).
		per = max(per, mraWait(c.serviceTimeout, c.ackTimeout))
	}
	w := time.Duration(c.reqTries)*per + IBADuration(min(c.ackTimeout, MaxPeerACKTimeout))
	return min(w, m.maxHalfOpenTime)
}

// hoExpired runs at c's half-open deadline.
func (m *Manager) hoExpired(c *conn, gen uint64) {
	if m.closed || gen != c.hoGen || m.conns[c.id] != c {
		return
	}
	defer m.unlock()
	c.hoTimer = nil
	m.stats.Expired++
	m.log.Debug("cm: half-open connection expired", "conn", c.id, "state", c.state, "peer", c.peer)
	switch c.ho {
	case hoUnanswered:
		if c.state == StateSIDRREQRcvd {
			m.sendSIDRRep(c, &SIDRRep{Status: SIDRNoQP})
			m.toIdle(c)
			m.emit(c, Event{Type: EventRejected, Reason: RejectTimeout})
			return
		}
		var ari [8]byte
		binary.BigEndian.PutUint64(ari[:], c.remoteCAGUID)
		m.sendREJ(c, RejectNoResources, nil, nil)
		m.toIdle(c)
		m.emit(c, Event{Type: EventRejected, Reason: RejectTimeout, ARI: ari[:]})
	case hoAnswered:
		m.toIdle(c)
		m.emit(c, Event{Type: EventUnreachable, Attr: AttrREP})
	}
}
