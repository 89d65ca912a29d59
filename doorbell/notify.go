package doorbell

import (
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// CQNotifier implements CQ arming (vrnic_abi.h, struct vrnic_db_cq): the
// client writes the arm word (bit 0 armed, bit 1 solicited only, bits 8..31
// a sequence one greater than its last); after writing a CQE the daemon
// calls Completed, which writes the completion eventfd once per arm
// sequence, for the first matching CQE after it saw the sequence.
//
// Ordering: the daemon stores the CQE's owner word and then loads the arm
// word; a client stores the arm word and then polls the CQ again. Both are
// sequentially consistent, so either the daemon sees the arm or the client
// sees the CQE: no completion event is lost.
//
// The last notified sequence is kept in private memory; arm_sn_done is only
// written for the client's information.
type CQNotifier struct {
	arm       *atomic.Uint32
	armSNDone *atomic.Uint32
	comp      *EventFD // may be nil: the CQ has no completion channel
	done      uint32   // last sequence notified (private)
	notified  uint64
}

// NewCQNotifier returns the notifier of the CQ whose record is rec. comp is
// the client's completion eventfd (nil if none); the notifier owns it.
func NewCQNotifier(rec CQRecord, comp *EventFD) *CQNotifier {
	return &CQNotifier{arm: rec.Arm, armSNDone: rec.ArmSNDone, comp: comp}
}

// Completed is called after a CQE was written. solicited is true for a
// CQE of a solicited event or with an error status (those also satisfy a
// solicited-only arm). It reports whether the completion eventfd was
// written.
func (n *CQNotifier) Completed(solicited bool) (bool, error) {
	w := n.arm.Load()
	if w&abi.CQArmArmed == 0 {
		return false, nil
	}
	sn := abi.ArmSN(w)
	if sn == n.done {
		return false, nil
	}
	if w&abi.CQArmSolicited != 0 && !solicited {
		return false, nil
	}
	n.done = sn
	n.armSNDone.Store(sn)
	n.notified++
	if n.comp == nil {
		return false, nil
	}
	return true, n.comp.Signal()
}

// Notified is the number of arm sequences consumed.
func (n *CQNotifier) Notified() uint64 { return n.notified }

// Close closes the completion eventfd.
func (n *CQNotifier) Close() error {
	if n.comp == nil {
		return nil
	}
	return n.comp.Close()
}
