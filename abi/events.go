package abi

import "strconv"

// EventType is enum vrnic_event_type: the asynchronous events of a context
// (OPEN_EVENTS), numbered as enum ibv_event_type.
type EventType uint32

// Asynchronous events.
const (
	EventCQErr            EventType = 0  // element: CQ handle; the CQ overflowed
	EventQPFatal          EventType = 1  // element: QPN; the transport moved the QP to ERR
	EventDeviceFatal      EventType = 8  // never sent: end of file on the event socket
	EventPortActive       EventType = 9  // element: port number
	EventPortErr          EventType = 10 // element: port number
	EventQPLastWQEReached EventType = 16 // element: QPN of a QP with an SRQ, now in ERR
	EventSRQLimitReached  EventType = 18 // element: SRQ handle; the limit is disarmed
)

var eventNames = map[EventType]string{
	EventCQErr: "CQ_ERR", EventQPFatal: "QP_FATAL", EventDeviceFatal: "DEVICE_FATAL",
	EventPortActive: "PORT_ACTIVE", EventPortErr: "PORT_ERR", EventQPLastWQEReached: "QP_LAST_WQE_REACHED",
	EventSRQLimitReached: "SRQ_LIMIT_REACHED",
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
