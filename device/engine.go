package device

import "github.com/vrnic/vrnic/abi"

// Engine is the seam between the control path and the transport engine
// (package device/engine). The device owns QP objects and their state
// machine; it tells the engine about every QP it creates, every accepted
// state change and every QP it destroys, in that order, under the device
// lock (calls must not block for long and must not call back into Device).
//
// Until an engine is wired in (Config.Engine nil), NopEngine is used: QPs
// go through every state, work requests are written by clients into their
// rings, but no data moves and no completion is ever produced.
type Engine interface {
	// CreateQP is called once the QP exists in RESET. An error fails the
	// CREATE_QP command (and the QP is discarded).
	CreateQP(qp *QP) error
	// ModifyQP is called after a MODIFY_QP was validated and applied; prev
	// is the state before. The engine may start/stop processing, flush the
	// QP's queues on ERR, reset its state on RESET.
	ModifyQP(qp *QP, prev QPState, mask AttrMask)
	// DestroyQP is called before the QP's rings are unpinned; after it
	// returns the engine must not touch the QP's memory.
	DestroyQP(qp *QP)
	// Counters returns the QP's traffic counters for QUERY_QP and vrnicctl
	// (a destroyed QP's stay in the device's totals: see counters.go).
	Counters(qp *QP) QPCounters
}

// ModifyChecker is implemented by an Engine that can refuse a validated
// MODIFY_QP before it is applied, e.g. because the peer of an RC QP going
// to RTR cannot be reached (EHOSTUNREACH). It is called under the device
// lock, so it must be bounded in time.
type ModifyChecker interface {
	CheckModifyQP(q *QP, cur, next QPState, mask AttrMask, a *abi.QPAttr) error
}

// QPCounters are per-QP traffic counters kept by the engine (the fields
// of engine.QPCounters); AdminInfo.DataPath holds their device-wide sums.
// QUERY_QP carries the first four it declares (abi.RespQueryQP); the
// operator listings carry all.
type QPCounters struct {
	PacketsSent     uint64 `json:"packets_sent"`
	PacketsReceived uint64 `json:"packets_received"`
	Retransmits     uint64 `json:"retransmits"`       // go-back-N restarts
	RNRNaksReceived uint64 `json:"rnr_naks_received"` // in QUERY_QP
	Timeouts        uint64 `json:"timeouts"`          // local ACK timeouts
	RNRNaksSent     uint64 `json:"rnr_naks_sent"`
	SeqNaksReceived uint64 `json:"seq_naks_received"`
	SeqNaksSent     uint64 `json:"seq_naks_sent"`
	Duplicates      uint64 `json:"duplicates"` // duplicate requests received
	Dropped         uint64 `json:"dropped"`    // packets dropped by a check
	SendCQEs        uint64 `json:"send_cqes"`
	RecvCQEs        uint64 `json:"recv_cqes"`
}

// NopEngine is the engine of a device without a data path: it accepts
// every QP and moves no data.
type NopEngine struct{}

func (NopEngine) CreateQP(*QP) error              { return nil }
func (NopEngine) ModifyQP(*QP, QPState, AttrMask) {}
func (NopEngine) DestroyQP(*QP)                   {}
func (NopEngine) Counters(*QP) QPCounters         { return QPCounters{} }

var _ Engine = NopEngine{}
