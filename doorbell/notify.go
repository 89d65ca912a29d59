package doorbell

import (
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
)

// CQNotifier implements CQ arming (vrnic_abi.h, struct vrnic_db_cq): the
// client writes the arm word (bit 0 armed, bit 1 solicited only, bits 8..31
// a sequence one greater than its last); after writing a CQE the daemon
// calls Completed, which writes the completion eventfd once per arm
// sequence, for the first matching CQE the client has not consumed yet.
//
// Ordering: the daemon stores the CQE's owner word, then loads the arm
// word, then the client's consumer index (cq_ci). A client consumes CQEs
// (stores cq_ci), then stores the arm word, then polls the CQ once more
// before sleeping. All of these are sequentially consistent, so:
//
//   - either the daemon sees the arm, or the client's last poll sees the
//     CQE: no completion event is lost;
//   - if the daemon sees an arm written after the client consumed this
//     CQE, it also sees that cq_ci and does not spend the arm on it. (A CQE
//     the client already consumed must not use up the arm meant for the
//     next one, or the client would sleep past that one.)
//
// The last notified sequence is kept in private memory; arm_sn_done is only
// written for the client's information. A hostile client can only suppress
// or multiply its own events.
type CQNotifier struct {
	arm       *atomic.Uint32
	ci        *atomic.Uint32 // client's cq_ci
	pi        *atomic.Uint32 // daemon's published cq_pi
	armSNDone *atomic.Uint32
	comp      *EventFD // may be nil: the CQ has no completion channel
	done      uint32   // last sequence notified (private)
	notified  atomic.Uint64
}

// NewCQNotifier returns the notifier of the CQ whose record is rec. comp is
// the client's completion eventfd (nil if none); the notifier owns it.
func NewCQNotifier(rec CQRecord, comp *EventFD) *CQNotifier {
	return &CQNotifier{arm: rec.Arm, ci: rec.CI, pi: rec.PI, armSNDone: rec.ArmSNDone, comp: comp}
}

// Completed is CompletedAt for the last published CQE (cq_pi - 1): call it
// after queues.CQ.Publish.
func (n *CQNotifier) Completed(solicited bool) (bool, error) {
	return n.CompletedAt(n.pi.Load()-1, solicited)
}

// CompletedAt is called after the CQE of free-running index was written.
// solicited is true for a CQE of a solicited event or with an error status
// (those also satisfy a solicited-only arm). It reports whether the
// completion eventfd was written.
func (n *CQNotifier) CompletedAt(index uint32, solicited bool) (bool, error) {
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
	if int32(index-n.ci.Load()) < 0 {
		return false, nil // the client consumed this CQE before arming
	}
	n.done = sn
	n.armSNDone.Store(sn)
	n.notified.Add(1)
	if n.comp == nil {
		return false, nil
	}
	return true, n.comp.Signal()
}

// Notified is the number of arm sequences consumed.
func (n *CQNotifier) Notified() uint64 { return n.notified.Load() }

// Close closes the completion eventfd.
func (n *CQNotifier) Close() error {
	if n.comp == nil {
		return nil
	}
	return n.comp.Close()
}
