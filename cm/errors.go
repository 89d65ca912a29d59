package cm

import "errors"

// Errors of the MAD codec. Decode wraps one of them with the detail.
var (
	// ErrShortMAD: the datagram is not a whole 256-byte MAD.
	ErrShortMAD = errors.New("cm: MAD is not 256 bytes")
	// ErrBadHeader: base version, management class, class version or
	// method is not the CM's (1, 0x07, 2, Send).
	ErrBadHeader = errors.New("cm: not a CM MAD")
	// ErrUnsupportedAttribute: a CM attribute this package does not
	// implement (LAP, APR, ClassPortInfo) or an unknown one.
	ErrUnsupportedAttribute = errors.New("cm: unsupported attribute")
	// ErrBadField: a field holds a value the protocol does not define
	// (an MTU code of 0, a REJ info length above 72, ...).
	ErrBadField = errors.New("cm: invalid field value")
	// ErrFieldRange: Encode was given a value wider than its field.
	ErrFieldRange = errors.New("cm: value does not fit its field")
)

// Errors of the Manager's API.
var (
	// ErrUnknownConn: no connection has this local communication ID (it
	// never existed, or went back to IDLE and was removed).
	ErrUnknownConn = errors.New("cm: unknown connection")
	// ErrState: the call is not allowed in the connection's state.
	ErrState = errors.New("cm: not allowed in this state")
	// ErrPrivateDataLen: the private data is longer than the message
	// carries.
	ErrPrivateDataLen = errors.New("cm: private data too long")
	// ErrQPNInTimeWait: the local QPN still belongs to a connection in
	// TimeWait and must not be used yet.
	ErrQPNInTimeWait = errors.New("cm: QPN is in TimeWait")
	// ErrListening: a listener already covers this service ID.
	ErrListening = errors.New("cm: service ID already has a listener")
	// ErrInvalidParam: a parameter is out of its range.
	ErrInvalidParam = errors.New("cm: invalid parameter")
	// ErrClosed: the Manager was closed.
	ErrClosed = errors.New("cm: manager closed")
)
