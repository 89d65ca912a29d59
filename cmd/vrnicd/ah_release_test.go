package main

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/verbs"
)

// TestReleaseContextWithManyAHs: a client creates as many address
// handles as its limit allows (4096, beside a UD QP that shares their
// table) and closes its context; meanwhile an operator asks for the
// daemon's info in a loop. Asserted: every info is answered, and the
// daemon ends with no AH and no context. How long the release holds the
// device lock (which info also takes) is logged, not asserted: on a
// loaded machine it is what the scheduler makes it. That the release
// costs O(AHs) (removing an AH once copied the context's table, and a
// release held the lock for about a second) is asserted where no
// scheduler changes it, by counting the table's work
// (engine.TestAHTableLinearWork).
func TestReleaseContextWithManyAHs(t *testing.T) {
	const ahs = 4096 // the default per-client limit
	sock, gid := cmDaemon(t, "ah0")
	adm, err := admin.Dial(sock)
	require.NoError(t, err)
	defer adm.Close()
	info, err := adm.Info()
	require.NoError(t, err)
	require.Equal(t, ahs, info.Limits.PerClient.AH, "the test fills the default per-client limit")

	c, err := verbs.Open(sock, verbs.WithClientName(t.Name()))
	require.NoError(t, err)
	defer c.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(16, nil)
	require.NoError(t, err)
	_, err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: cq, RecvCQ: cq,
		Cap: abi.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	start := time.Now()
	for i := range ahs {
		dgid := gid
		dgid[14], dgid[15] = byte(i>>8), byte(i) // 4096 destinations
		_, err := pd.CreateAH(abi.AHAttr{DGID: dgid, PortNum: 1, HopLimit: 64})
		require.NoError(t, err, "AH %d", i)
	}
	created := time.Since(start)
	_, err = pd.CreateAH(abi.AHAttr{DGID: gid, PortNum: 1})
	require.Error(t, err, "the per-client limit is reached")
	info, err = adm.Info()
	require.NoError(t, err)
	require.Equal(t, ahs, info.Resources.AH)
	require.Equal(t, 1, info.Resources.Contexts)

	// The operator's loop, on a connection of its own, until stop.
	type sample struct {
		took time.Duration
		err  error
	}
	var (
		samples []sample
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	op, err := admin.Dial(sock)
	require.NoError(t, err)
	defer op.Close()
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			_, err := op.Info()
			samples = append(samples, sample{time.Since(t0), err})
		}
	})

	start = time.Now()
	require.NoError(t, c.Close())
	var last admin.Info
	released := false
	for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		if last, err = adm.Info(); err == nil && last.Resources == (admin.ResourceCounts{}) {
			released = true
			break
		}
	}
	took := time.Since(start)
	time.Sleep(20 * time.Millisecond) // a few more answers after the release
	close(stop)
	wg.Wait()

	var slowest time.Duration
	for _, s := range samples {
		require.NoError(t, s.err)
		slowest = max(slowest, s.took)
	}
	t.Logf("%d AHs: created in %v, context released in %v; %d infos meanwhile, slowest %v",
		ahs, created.Round(time.Microsecond), took.Round(time.Microsecond), len(samples), slowest.Round(time.Microsecond))
	require.True(t, released, "the daemon still holds %+v 10 s after the close", last.Resources)
	assert.NotEmpty(t, samples)
}
