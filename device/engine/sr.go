package engine

import "github.com/vrnic/vrnic/abi"

// setECE records the ECE options in force on an RC QP (abi.QPAttrECE).
func (qp *QP) setECE(opts uint32) {
	if qp.svc != 0 && qp.unrel {
		return // UC and UD have no retransmission to change
	}
	qp.ece = uint8(opts & abi.ECEOptions)
}

// ECE reports the ECE options in force on the QP.
func (qp *QP) ECE() uint32 { return uint32(qp.ece) }
