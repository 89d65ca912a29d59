// Package evmark raises a marker on a context's asynchronous event
// socket, for tests that must show that nothing was raised before it.
//
// The marker is QP_LAST_WQE_REACHED of a new RC QP with an SRQ that the
// client moves to ERR itself: MODIFY_QP raises it before it replies, and
// a client's own move to ERR raises no other event. So if the next event
// read is the marker, no event was waiting when Raise was called.
package evmark

import (
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// Raise creates an SRQ and an RC QP with it on pd (send and receive
// completions to cq), moves the QP to ERR and returns the event that
// must come next.
func Raise(pd *verbs.PD, scq, rcq *verbs.CQ) (abi.AsyncEvent, error) {
	srq, err := pd.CreateSRQ(4, 1, 0)
	if err != nil {
		return abi.AsyncEvent{}, err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: scq, RecvCQ: rcq, SRQ: srq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		return abi.AsyncEvent{}, err
	}
	if err := qp.Modify(&abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState); err != nil {
		return abi.AsyncEvent{}, err
	}
	return abi.AsyncEvent{Type: abi.EventQPLastWQEReached, Element: uint64(qp.QPN)}, nil
}
