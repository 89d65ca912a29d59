package faultmatrix

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/faults/suite"
)

func prob(p float64) *float64 { return &p }

// cell is one fault configuration of the matrix.
type cell struct {
	name string
	a, b []admin.FaultRule // rules for the requester's and the responder's daemon
	// qpB: the rules of b target B's QP (its QPN is set when connected).
	qpB  bool
	conn suite.ConnOpts
}

var cells = []cell{
	{name: "no fault"},
	{name: "drop 10% of WRITE packets (at most 6)",
		a: []admin.FaultRule{{Dir: "tx", Op: []string{"write"}, Probability: prob(0.1), Count: 6, Action: admin.FaultAction{Type: "drop"}}}},
	{name: "duplicate 30% of ACKs and READ responses",
		b: []admin.FaultRule{{Dir: "tx", Op: []string{"ack", "read_response"}, Probability: prob(0.3), Action: admin.FaultAction{Type: "duplicate"}}}},
	{name: "reorder 10% of requests behind 2 frames",
		a: []admin.FaultRule{{Dir: "tx", Op: []string{"request"}, Probability: prob(0.1), Action: admin.FaultAction{Type: "reorder", Frames: 2}}}},
	{name: "corrupt 3 request payloads (ICRC left bad)",
		a: []admin.FaultRule{{Dir: "tx", Op: []string{"write", "send"}, Probability: prob(0.2), Count: 3, Action: admin.FaultAction{Type: "corrupt"}}}},
	{name: "delay half the ACKs 0.1-2 ms",
		b: []admin.FaultRule{{Dir: "tx", Op: []string{"ack"}, Probability: prob(0.5), Action: admin.FaultAction{Type: "delay", Dist: "uniform", Min: "100us", Max: "2ms"}}}},
	{name: "RNR NAK for the next 3 receives (verb)", qpB: true,
		b: []admin.FaultRule{{Count: 3, Action: admin.FaultAction{Type: "verb", Verb: "rnr"}}}},
	{name: "port of A down 100 ms (verb)", conn: suite.ConnOpts{Timeout: suite.U8(14)},
		a: []admin.FaultRule{{Action: admin.FaultAction{Type: "verb", Verb: "port_flap", For: "100ms"}}}},
}

// workload: 2 WRITEs of 64 KiB, 2 SENDs of 8 KiB, 2 READs of 32 KiB,
// interleaved.
var workload = suite.Workload{Seed: 7, Ops: []suite.Op{
	{Kind: suite.Write, Size: 64 << 10}, {Kind: suite.Send, Size: 8 << 10}, {Kind: suite.Read, Size: 32 << 10},
	{Kind: suite.Write, Size: 64 << 10}, {Kind: suite.Send, Size: 8 << 10}, {Kind: suite.Read, Size: 32 << 10},
}}

// row is a cell's outcome.
type row struct {
	name, verdict, detail string
	retrans               uint64
	applied               uint64
}

// TestMatrix runs the workload under every cell and prints the matrix.
func TestMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two daemons per cell")
	}
	var rows []row
	for _, c := range cells {
		r := row{name: c.name}
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r.verdict = "PASS"
				if t.Failed() {
					r.verdict = "FAIL"
				}
			}()
			r.retrans, r.applied, r.detail = runCell(t, c)
		})
		rows = append(rows, r)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-44s %-7s %8s %8s  %s\n", "fault", "result", "applied", "retrans", "detail")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-44s %-7s %8d %8d  %s\n", r.name, r.verdict, r.applied, r.retrans, r.detail)
	}
	t.Log(b.String())
}

// runCell runs the workload under c on a fresh pair of daemons and
// checks it; it returns A's retransmissions, the rules' applications and
// a note.
func runCell(t *testing.T, c cell) (retrans, applied uint64, detail string) {
	a, b, err := suite.StartPair(suite.Options{Dir: t.TempDir(), Seed: 1})
	require.NoError(t, err)
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			require.NoError(t, a.Stop())
			require.NoError(t, b.Stop())
		}
	}
	defer stop()
	// An ACK timeout of 67 ms (code 14) rather than the suite's 4 ms: a
	// loaded machine must not run out of retries on late ACKs alone.
	if c.conn.Timeout == nil {
		c.conn.Timeout = suite.U8(14)
	}
	qa, qb, err := suite.Connect(a, b, c.conn)
	require.NoError(t, err)
	defer qa.Close()
	defer qb.Close()
	for _, side := range []struct {
		d     *suite.Daemon
		rules []admin.FaultRule
	}{{a, c.a}, {b, c.b}} {
		for i := range side.rules {
			if c.qpB && side.d == b {
				side.rules[i].QPN = &qb.QP.QPN
			}
		}
		if len(side.rules) > 0 {
			_, err := side.d.AddRules(side.rules...)
			require.NoError(t, err)
		}
	}
	res, err := workload.Run(qa, qb, 30*time.Second)
	require.NoError(t, err)
	require.NoError(t, res.Err)
	for _, d := range []*suite.Daemon{a, b} {
		rs, err := d.Rules()
		require.NoError(t, err)
		for _, r := range rs {
			applied += r.Applied
		}
	}
	stop()
	fa, err := a.Frames()
	require.NoError(t, err)
	fb, err := b.Frames()
	require.NoError(t, err)
	icrcA, icrcB := suite.ICRCErrors(fa, a.Addr), suite.ICRCErrors(fb, b.Addr)
	if err := res.CheckCompletions(suite.AllSucceed); err != nil {
		t.Error(err)
	}
	if err := res.CheckData(icrcA, icrcB); err != nil {
		t.Error(err)
	}
	if err := suite.CheckGoBackN(fa, a.Addr, 1024); err != nil {
		t.Error(err)
	}
	detail = fmt.Sprintf("%d frames captured at A; ICRC errors at B: %d; RNR NAKs at A: %d", len(fa), icrcB, res.A.RNRNAKsReceived)
	return res.A.Retransmits, applied, detail
}
