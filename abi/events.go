package abi

import "strconv"

// EventType is enum vrnic_event_type: the asynchronous events of a context
// (OPEN_EVENTS), numbered as enum ibv_event_type.
type EventType uint32

// Asynchronous events. The QP events are the affiliated asynchronous
// errors of IBTA 11.6.3.1 and C9-222.1.1: a QP whose error a completion
// reports (an error completion of the WR that failed) raises none of
// them, as on Linux (rxe, mlx5); one of them tells the client of an error
// no completion reports, and the QP is then in ERR.
const (
	EventCQErr            EventType = 0  // element: CQ handle; the CQ overflowed
	EventQPFatal          EventType = 1  // element: QPN; local work queue catastrophic error: in ERR, no completion can report why
	EventQPReqErr         EventType = 2  // element: QPN; RC responder: an invalid request no receive completion reports, in ERR
	EventQPAccessErr      EventType = 3  // element: QPN; RC responder: an access violation (R_Key, rights) no receive completion reports, in ERR
	EventDeviceFatal      EventType = 8  // never sent: end of file on the event socket
	EventPortActive       EventType = 9  // element: port number
	EventPortErr          EventType = 10 // element: port number
	EventSRQLimitReached  EventType = 15 // element: SRQ handle; the limit is disarmed
	EventQPLastWQEReached EventType = 16 // element: QPN of a QP with an SRQ, now in ERR
)

var eventNames = map[EventType]string{
	EventCQErr: "CQ_ERR", EventQPFatal: "QP_FATAL", EventQPReqErr: "QP_REQ_ERR", EventQPAccessErr: "QP_ACCESS_ERR",
	EventDeviceFatal: "DEVICE_FATAL", EventPortActive: "PORT_ACTIVE", EventPortErr: "PORT_ERR",
	EventQPLastWQEReached: "QP_LAST_WQE_REACHED", EventSRQLimitReached: "SRQ_LIMIT_REACHED",
}

// String returns the event's name without the VRNIC_EVENT_ prefix.
func (e EventType) String() string {
	if n, ok := eventNames[e]; ok {
		return n
	}
	return "EVENT_" + strconv.FormatUint(uint64(e), 10)
}

// AsyncEvent is struct vrnic_async_event: one datagram on a context's
// event socket.
type AsyncEvent struct {
	Type     EventType `c:"event_type"`
	Reserved uint32    `c:"reserved"`
	Element  uint64    `c:"element"`
}
