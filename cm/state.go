package cm

//go:generate go tool stringer -type=State,EventType -linecomment -output=state_string.go

// State is the CM state of a connection (IBTA vol. 1, 12.9.6 and 12.11,
// the states of Linux enum ib_cm_state). The active side goes
// IDLE → REQ_SENT [→ MRA_REQ_RCVD] → REP_RCVD [→ MRA_REP_SENT] →
// ESTABLISHED; the passive side IDLE → REQ_RCVD [→ MRA_REQ_SENT] →
// REP_SENT [→ MRA_REP_RCVD] → ESTABLISHED. Either side leaves ESTABLISHED
// through DREQ_SENT or DREQ_RCVD to TIMEWAIT and then IDLE. SIDR uses
// SIDR_REQ_SENT and SIDR_REQ_RCVD. A connection that returns to IDLE is
// forgotten by the Manager.
type State uint8

// Connection states.
const (
	StateIdle        State = iota // IDLE
	StateREQSent                  // REQ_SENT
	StateREQRcvd                  // REQ_RCVD
	StateMRAREQSent               // MRA_REQ_SENT
	StateMRAREQRcvd               // MRA_REQ_RCVD
	StateREPSent                  // REP_SENT
	StateREPRcvd                  // REP_RCVD
	StateMRAREPSent               // MRA_REP_SENT
	StateMRAREPRcvd               // MRA_REP_RCVD
	StateEstablished              // ESTABLISHED
	StateDREQSent                 // DREQ_SENT
	StateDREQRcvd                 // DREQ_RCVD
	StateTimeWait                 // TIMEWAIT
	StateSIDRREQSent              // SIDR_REQ_SENT
	StateSIDRREQRcvd              // SIDR_REQ_RCVD
)

// EventType says what an Event reports.
type EventType uint8

// Events a Manager reports to its owner.
const (
	// EventConnectRequest: a REQ for a listened service ID arrived
	// (passive side, now REQ_RCVD). Event.REQ holds it. Answer with
	// Accept, Reject or MRA.
	EventConnectRequest EventType = iota + 1 // connect request
	// EventREPReceived: the REP arrived (active side, now REP_RCVD).
	// Move the QP to RTR and RTS (QPAttr) and call RTU, or Reject.
	EventREPReceived // REP received
	// EventEstablished: the connection is ESTABLISHED: the RTU arrived
	// (passive side), NotifyEstablished was called, or RTU was sent
	// (active side).
	EventEstablished // established
	// EventRejected: a REJ arrived; Reason, ARI and PrivateData hold
	// it. The connection is IDLE (forgotten) or, after a stale
	// connection reject or a reject of an established connection, in
	// TIMEWAIT.
	EventRejected // rejected
	// EventDisconnectRequest: a DREQ arrived (now DREQ_RCVD). Move the
	// QP to ERROR and call Disconnect to answer with a DREP.
	EventDisconnectRequest // disconnect request
	// EventDisconnected: the DREP answering this side's DREQ arrived,
	// or the DREQ timed out (TimedOut); now TIMEWAIT.
	EventDisconnected // disconnected
	// EventTimeWaitExit: TimeWait is over; the connection is forgotten,
	// its communication ID and QPN may be used again.
	EventTimeWaitExit // timewait exit
	// EventUnreachable: a REQ, REP or SIDR_REQ (Event.Attr) got no
	// answer after all its retries; the connection is forgotten.
	EventUnreachable // unreachable
	// EventSIDRRequest: a SIDR_REQ for a listened service ID arrived
	// (now SIDR_REQ_RCVD); answer with SIDRReply.
	EventSIDRRequest // SIDR request
	// EventSIDRReply: the SIDR_REP arrived; the request is forgotten.
	EventSIDRReply // SIDR reply
)

// ConnID names a connection: its local communication ID.
type ConnID uint32

// Event is what a Manager reports through Config.Handler. The slices and
// pointers belong to the receiver.
type Event struct {
	Type EventType
	Conn ConnID
	// Peer is the GID the connection's MADs come from and go to.
	Peer GID
	// ServiceID of the connection or SIDR request.
	ServiceID uint64
	// PrivateData of the message that caused the event, its whole fixed
	// size as on the wire (the wire carries no length).
	PrivateData []byte
	// REQ is the request (EventConnectRequest).
	REQ *REQ
	// REP is the reply (EventREPReceived).
	REP *REP
	// ECE is the ECE the REQ or REP carried (EventConnectRequest,
	// EventREPReceived; ece.go).
	ECE ECE
	// Reason and ARI (its RejectInfoLen bytes) of a REJ (EventRejected).
	Reason RejectReason
	ARI    []byte
	// TimedOut: the DREQ got no DREP (EventDisconnected).
	TimedOut bool
	// Attr is the message that went unanswered (EventUnreachable).
	Attr AttrID
	// SIDRReq and SIDRRep (EventSIDRRequest, EventSIDRReply).
	SIDRReq *SIDRReq
	SIDRRep *SIDRRep
}
