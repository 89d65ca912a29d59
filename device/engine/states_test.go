package engine

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestStateNames: the generated String methods print the names the trace
// lines have always used.
func TestStateNames(t *testing.T) {
	for _, c := range []struct {
		s    fmt.Stringer
		want string
	}{
		{reqFetch, "fetch"}, {reqLocal, "local"}, {reqFence, "fence"}, {reqCredits, "credits"},
		{reqWindow, "window"}, {reqSend, "send"}, {reqExit, "exit"}, {reqState(7), "reqState(7)"},
		{respCheckPSN, "check_psn"}, {respDuplicate, "duplicate"}, {respCheckXRC, "check_xrc"}, {respCheckOpSeq, "check_op_seq"},
		{respCheckOpAllowed, "check_op_allowed"}, {respCheckResource, "check_resource"},
		{respCheckLength, "check_length"}, {respCheckRKey, "check_rkey"}, {respExecute, "execute"},
		{respDone, "done"}, {respState(10), "respState(10)"},
		{compCheckPSN, "check_psn"}, {compClassify, "classify"}, {compAck, "ack"}, {compRead, "read"},
		{compAtomic, "atomic"}, {compNAKSeq, "nak_seq"}, {compRNR, "rnr"}, {compNAKErr, "nak_err"},
		{compDrop, "drop"}, {compDone, "done"}, {compState(10), "compState(10)"},
		{wqePosted, "posted"}, {wqeSending, "sending"}, {wqePending, "pending"}, {wqeDone, "done"},
		{wqeState(4), "wqeState(4)"},
	} {
		assert.Equal(t, c.want, c.s.String())
	}
}
