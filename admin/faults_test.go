package admin

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestVerbRuleValidation: verb-level fault rules are accepted with the
// fields they take and refused, with a message saying what is wrong,
// with any other.
func TestVerbRuleValidation(t *testing.T) {
	q, p := uint32(0x12), 0.5
	verb := func(v string) FaultAction { return FaultAction{Type: "verb", Verb: v} }
	good := []FaultRule{
		{QPN: &q, Count: 3, Action: verb("rnr")},
		{QPN: &q, Probability: &p, After: "1s", Until: "2s", Action: verb("qp_err")},
		{CQ: &q, Action: verb("cq_overflow")},
		{CQ: &q, QPN: &q, Action: FaultAction{Type: "verb", Verb: "cqe_delay", Delay: "5ms"}},
		{Action: verb("bad_wqe")},
		{After: "1s", Action: FaultAction{Type: "verb", Verb: "port_flap", For: "200ms"}},
	}
	for _, r := range good {
		assert.NoError(t, r.Validate(), "%+v", r)
	}
	bad := []struct {
		r    FaultRule
		want string
	}{
		{FaultRule{Action: verb("")}, `verb "none named": want one of rnr, qp_err`},
		{FaultRule{Action: verb("rnr_nak")}, `verb "rnr_nak": want one of`},
		{FaultRule{Dir: "tx", Action: verb("rnr")}, "verb fault rnr does not take dir"},
		{FaultRule{Op: []string{"ack"}, Action: verb("qp_err")}, "verb fault qp_err does not take op"},
		{FaultRule{PSN: "1", Action: verb("bad_wqe")}, "does not take psn"},
		{FaultRule{Message: &FaultMessage{Kind: "send"}, Action: verb("rnr")}, "does not take message"},
		{FaultRule{CQ: &q, Action: verb("rnr")}, "verb fault rnr does not take cq"},
		{FaultRule{CQ: &q, Action: FaultAction{Type: "drop"}}, "cq applies to verb faults only"},
		{FaultRule{Action: verb("cqe_delay")}, "cqe_delay takes delay"},
		{FaultRule{Action: FaultAction{Type: "verb", Verb: "cqe_delay", Delay: "11s"}}, "longer than 10s"},
		{FaultRule{Action: FaultAction{Type: "verb", Verb: "rnr", Delay: "1ms"}}, "verb rnr does not take delay"},
		{FaultRule{Action: verb("port_flap")}, "port_flap takes for"},
		{FaultRule{Action: FaultAction{Type: "verb", Verb: "qp_err", For: "1s"}}, "verb qp_err does not take for"},
		{FaultRule{QPN: &q, Action: FaultAction{Type: "verb", Verb: "port_flap", For: "1s"}}, "port_flap takes after and action for only"},
		{FaultRule{Action: FaultAction{Type: "verb", Verb: "rnr", Copies: 2}}, "action verb does not take copies"},
	}
	for _, c := range bad {
		err := c.r.Validate()
		if assert.Error(t, err, "%+v", c.r) {
			assert.ErrorIs(t, err, ErrFaultRule)
			assert.Contains(t, err.Error(), c.want)
		}
	}
}
