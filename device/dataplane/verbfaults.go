package dataplane

import (
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/engine"
)

// cqVerb is a CQ's share of the verb-level faults (engine.VerbFaults,
// installed on the engine by package faults): cq_overflow and cqe_delay
// strike where a completion is written, in cqSink.push.
//
// cqe_delay holds the completion back for the fault's duration, and with
// it every later completion of the CQ, in order: the IBTA has the
// completions of a work queue returned in the order the work requests
// were posted (and a CQ serves several queues), so a CQE cannot be
// overtaken by a later one of its queue; holding the whole CQ behind it
// keeps that order for every queue with no per-queue bookkeeping. To the
// client the CQ is stalled for the duration, as behind a slow completion
// engine. Held completions are written when the time is up (on a timer
// goroutine, under the sink's lock), and dropped if the CQ is destroyed
// first. At most as many completions as the CQ has slots are held; one
// more overflows the CQ, as it would overflow a CQ nobody polls.
type cqVerb struct {
	eng    *engine.Engine // nil in tests that build a sink alone
	handle uint32         // the CQ's handle (the rules' cq)
	held   []heldCQE
	gone   bool // the sink was closed: nothing more is written
}

type heldCQE struct {
	c  abi.CQE
	se bool
}

// verbOn reports whether push goes through the verb faults: rules are
// installed or completions are held (s.mu held). One atomic load when
// neither.
func (s *cqSink) verbOn() bool {
	return len(s.verb.held) > 0 || s.verb.eng != nil && s.verb.eng.VerbFaultsOn()
}

// verbPush is push through the verb faults (s.mu held).
func (s *cqSink) verbPush(c *abi.CQE, solicited bool) error {
	v := &s.verb
	if s.overflow || v.eng == nil {
		return s.write(c, solicited)
	}
	if _, hit := v.eng.VerbFault(engine.VerbCQOverflow, c.QPNum, v.handle); hit {
		// As a full CQ: the CQ is in error from now on (CQ_ERR), and
		// the engine moves the QP of this completion to ERR.
		s.overflow = true
		s.lost.Add(1)
		if s.overflowed != nil {
			s.overflowed()
		}
		return errCQOverflow
	}
	if len(v.held) > 0 {
		if len(v.held) >= int(s.cq.Count()) {
			v.held = v.held[:0]
			s.overflow = true
			s.lost.Add(1)
			if s.overflowed != nil {
				s.overflowed()
			}
			return errCQOverflow
		}
		v.held = append(v.held, heldCQE{c: *c, se: solicited})
		return nil
	}
	if d, hit := v.eng.VerbFault(engine.VerbCQEDelay, c.QPNum, v.handle); hit {
		v.held = append(v.held, heldCQE{c: *c, se: solicited})
		time.AfterFunc(d, s.releaseHeld)
		return nil
	}
	return s.write(c, solicited)
}

// releaseHeld writes the completions a cqe_delay fault held back, in
// order. One that finds the CQ full overflows it (CQ_ERR); the QP of
// that completion is not told (the engine moved on long ago): its next
// completion fails and moves it to ERR.
func (s *cqSink) releaseHeld() {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := s.verb.held
	s.verb.held = nil
	if s.verb.gone {
		return
	}
	for i := range held {
		s.write(&held[i].c, held[i].se)
	}
}
