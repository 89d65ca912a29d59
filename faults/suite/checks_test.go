package suite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

// TestCheckCompletionsFails: a missing, a doubled, an unposted and a
// wrong-status completion are each reported.
func TestCheckCompletionsFails(t *testing.T) {
	ops := []Op{{Kind: Write, Size: 1}, {Kind: Send, Size: 1}, {Kind: Write, Size: 1}}
	cqe := func(side string, id uint64, st abi.WCStatus) Completion {
		return Completion{Side: side, CQE: abi.CQE{WrID: id, Status: st}}
	}
	r := &Result{Ops: ops, Completions: []Completion{
		cqe("a", 1, abi.WCSuccess), cqe("a", 1, abi.WCSuccess), cqe("a", 2, abi.WCRemAccessErr),
		cqe("b", 1<<32|2, abi.WCSuccess), cqe("a", 9, abi.WCSuccess),
	}}
	err := r.CheckCompletions(AllSucceed)
	require.ErrorIs(t, err, ErrCheck)
	for _, want := range []string{"wr_id 0x1 completed twice", "SEND 2 completed with", "WRITE 3 (1 bytes) never completed", "wr_id 0x9 that was not posted"} {
		assert.Contains(t, err.Error(), want)
	}
	ok := &Result{Ops: ops[:2], Completions: []Completion{cqe("a", 1, abi.WCSuccess), cqe("b", 1<<32|2, abi.WCSuccess), cqe("a", 2, abi.WCSuccess)}}
	assert.NoError(t, ok.CheckCompletions(AllSucceed))
}

// TestChecksCatchSilentCorruption: a rule that corrupts a WRITE's
// payload and recomputes the ICRC (fix_icrc) makes the receiver accept
// bad data: the WRITE completes with SUCCESS, and CheckData reports
// data changed with no ICRC error. A real run, so that the checks are
// shown to fail on what they are meant to catch.
func TestChecksCatchSilentCorruption(t *testing.T) {
	a, b, ea, eb := pair(t, ConnOpts{})
	off := 0
	_, err := a.AddRules(admin.FaultRule{Dir: "tx", Op: []string{"write"}, Count: 1,
		Action: admin.FaultAction{Type: "corrupt", Offset: &off, Mask: 0xff, FixICRC: true}})
	require.NoError(t, err)
	res, err := Workload{Ops: []Op{{Kind: Write, Size: 4096}}}.Run(ea, eb, 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	require.NoError(t, res.CheckCompletions(AllSucceed), "the corruption is silent to the verbs")
	require.NoError(t, a.Stop())
	require.NoError(t, b.Stop())
	fb, err := b.Frames()
	require.NoError(t, err)
	err = res.CheckData(0, ICRCErrors(fb, b.Addr))
	require.ErrorIs(t, err, ErrCheck)
	assert.Contains(t, err.Error(), "WRITE 1 completed but its data differ, with no ICRC error at the receiver")
}
