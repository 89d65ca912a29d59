package dataplane_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/verbs"
)

// idleCtx is a context with n QPs in RESET (one CQ for all).
func idleCtx(t *testing.T, n *dpNode, qps int, opts ...verbs.Option) (*verbs.Context, *verbs.PD, *verbs.CQ) {
	t.Helper()
	ctx, err := verbs.Open(n.sock, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cq, err := ctx.CreateCQ(256, nil)
	require.NoError(t, err)
	for range qps {
		_, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq,
			Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
	}
	return ctx, pd, cq
}

// waitIdle waits until no QP of n is on an engine worker's active list.
func waitIdle(t *testing.T, n *dpNode) {
	t.Helper()
	eng := n.dp.Engine()
	require.Eventually(t, func() bool {
		for i := range eng.Workers() {
			if eng.WorkerCounters(i).ActiveQPs.Load() != 0 {
				return false
			}
		}
		return true
	}, 20e9, 1e6, "QPs still active")
}

// writeOnce posts one signaled 64-byte WRITE from a to b and waits for
// its completion.
func writeOnce(t *testing.T, a, b *dpClient, id uint64) {
	t.Helper()
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: id, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}))
	c := pollN(t, a.scq, 1)
	require.Equal(t, abi.WCSuccess, c[0].Status)
	require.Equal(t, id, c[0].WrID)
}

// TestDoorbellSummaryReadsOnlyMarked: with the doorbell summary (ABI 1.3)
// the poller reads only the records of the groups a client marked, however
// many idle QPs share the page; a client without it has its records read
// on every pass, up to the bound. Both find every post.
func TestDoorbellSummaryReadsOnlyMarked(t *testing.T) {
	const idle, writes = 500, 200
	for _, tc := range []struct {
		name    string
		summary bool
	}{{"summary", true}, {"without", false}} {
		t.Run(tc.name, func(t *testing.T) {
			nw := newDPNetwork(t)
			na := newDPNode(t, nw, "10.0.0.1", 1, nil)
			nb := newDPNode(t, nw, "10.0.0.2", 1, nil)
			var opts []verbs.Option
			if !tc.summary {
				opts = append(opts, verbs.WithoutDoorbellSummary())
			}
			a := newDPClientOpts(t, na, 64, opts...)
			b := newDPClient(t, nb, 64)
			connectRC(t, a, b, abi.MTU1024)
			// Idle QPs in the same page as a's QP and in a second context.
			pd := a.pd
			for range idle {
				_, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: a.scq, RecvCQ: a.rcq,
					Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
				require.NoError(t, err)
			}
			idleCtx(t, na, idle, opts...)

			reads0, passes0 := na.dp.RecordReads(), na.dp.PollerPasses()
			for i := range writes {
				writeOnce(t, a, b, uint64(i))
			}
			reads, passes := na.dp.RecordReads()-reads0, na.dp.PollerPasses()-passes0
			t.Logf("%d records read in %d poller passes for %d posts", reads, passes, writes)
			// The poller ran (a loaded machine gives it fewer passes:
			// 91 for 200 posts once in CI).
			require.Greater(t, passes, uint64(20), "the poller ran")
			if tc.summary {
				// At most one marked group of abi.DBSummaryGroup records
				// per post, plus the re-checks before the poller slept.
				assert.LessOrEqual(t, reads, uint64(writes*abi.DBSummaryGroup))
			} else {
				assert.Greater(t, reads, uint64(writes*abi.DBSummaryGroup), "records read without a summary")
			}

			// A post to a QP that had no work for a while is found by the
			// poller alone (no worker polls it).
			waitIdle(t, na)
			writeOnce(t, a, b, 1000)
		})
	}
}

// TestDoorbellPollerStaysAwake: a client that posts without pause (every
// 64th WRITE signaled, as the C library's TestPostSyscalls) keeps the
// poller polling, with or without the summary: no kick needed.
//
// The poller may sleep after SpinFor without a doorbell or a completion;
// a client whose thread the machine stalls for that long pauses its
// posting, and then a sleep is right. The client measures its longest
// pause between two posts, and the check holds only when it was well
// under SpinFor (otherwise the run says so and proves nothing).
func TestDoorbellPollerStaysAwake(t *testing.T) {
	const spinFor = 500 * time.Millisecond
	for _, summary := range []bool{true, false} {
		t.Run(map[bool]string{true: "summary", false: "without"}[summary], func(t *testing.T) {
			nw := newDPNetwork(t)
			spec := func(addr string) *dpNode {
				a := netip.MustParseAddr(addr)
				ports, err := nw.Attach(a, 1, nil)
				require.NoError(t, err)
				return startNode(t, nodeSpec{addr: a, links: []engine.Link{ports[0]}, linkType: abi.LinkMem,
					dp: dataplane.Config{SpinFor: spinFor}})
			}
			na, nb := spec("10.0.8.1"), spec("10.0.8.2")
			var opts []verbs.Option
			if !summary {
				opts = append(opts, verbs.WithoutDoorbellSummary())
			}
			a := newDPClientOpts(t, na, 256, opts...)
			b := newDPClient(t, nb, 256)
			connectRC(t, a, b, abi.MTU1024)
			const n = 20000
			wc := make([]abi.CQE, 16)
			done := 0
			var last time.Time
			var maxGap time.Duration
			post := func(i int) {
				defer func() {
					now := time.Now()
					if !last.IsZero() {
						maxGap = max(maxGap, now.Sub(last))
					}
					last = now
				}()
				wr := verbs.SendWR{WrID: uint64(i), Opcode: abi.WRRDMAWrite, SGL: []abi.SGE{a.mr.SGE(0, 8)},
					RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}
				if i%64 == 63 {
					wr.Flags = abi.SendSignaled
				}
				for {
					done += a.scq.Poll(wc)
					err := a.qp.PostSend(&wr)
					if err == nil {
						return
					}
					require.ErrorIs(t, err, verbs.ErrQueueFull)
				}
			}
			for i := range n / 4 {
				post(i)
			}
			na.dp.DrainKicks()
			st0 := na.dp.PollerStats()
			maxGap = 0
			for i := n / 4; i < n; i++ {
				post(i)
			}
			st := na.dp.PollerStats()
			kicks := na.dp.DrainKicks()
			t.Logf("%d WQEs: %d kicks, %d sleeps, %d passes; longest pause between posts %v", 3*n/4, kicks, st.Sleeps-st0.Sleeps, st.Passes-st0.Passes, maxGap)
			if maxGap > spinFor/2 {
				t.Logf("the client was stalled for %v (SpinFor %v): the poller may rightly have slept; not checked", maxGap, spinFor)
				return
			}
			assert.Zero(t, st.Sleeps-st0.Sleeps, "poller sleeps while a client posts")
		})
	}
}

// TestDoorbellIdlePagesCold: a pass reads the pages with recent posts and
// a few of the others, not every page. 40 idle contexts (a page each) and
// an idle connected client c sit beside a client a that writes without
// pause; once their pages have gone cold (hotPasses passes without a
// post), a pass reads a's page and coldBatch of the others, on average
// far fewer than the 42 pages served. A post to c's QP, in a cold page
// and off every worker's active list, is still found by the poller.
func TestDoorbellIdlePagesCold(t *testing.T) {
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.0.1", 1, nil)
	nb := newDPNode(t, nw, "10.0.0.2", 1, nil)
	a, b := newDPClient(t, na, 64), newDPClient(t, nb, 64)
	connectRC(t, a, b, abi.MTU1024)
	c, d := newDPClient(t, na, 64), newDPClient(t, nb, 64)
	connectRC(t, c, d, abi.MTU1024)
	const idle = 40
	for range idle {
		idleCtx(t, na, 4)
	}
	served := idle + 2
	// Write until the poller has made enough passes for every page but
	// a's to go cold (the poller counts passes only while awake, which
	// a's completions keep it).
	start := na.dp.PollerPasses()
	deadline := time.Now().Add(time.Minute)
	id := uint64(0)
	for na.dp.PollerPasses()-start < 3*dataplane.HotPasses {
		require.True(t, time.Now().Before(deadline), "the poller made %d passes in a minute", na.dp.PollerPasses()-start)
		writeOnce(t, a, b, id)
		id++
	}
	pages0, passes0 := na.dp.PageReads(), na.dp.PollerPasses()
	for range 200 {
		writeOnce(t, a, b, id)
		id++
	}
	pages, passes := na.dp.PageReads()-pages0, na.dp.PollerPasses()-passes0
	perPass := float64(pages) / float64(passes)
	t.Logf("%d pages read in %d passes (%.1f a pass, %d pages served)", pages, passes, perPass, served)
	require.Greater(t, passes, uint64(100), "the poller ran")
	assert.Less(t, perPass, float64(served)/2, "a pass reads the cold pages in turn, not all of them")

	// c's QP had no work since it was connected: a post to it is found
	// by the poller, in its cold page.
	waitIdle(t, na)
	writeOnce(t, c, d, 1)
}
