package dataplane_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// daemonHeap returns the bytes in use that were allocated by the daemon's
// packages (a stack with a frame of package device or below and none of
// the verbs client), from the heap profile: it needs MemProfileRate 1 from
// before the allocations.
func daemonHeap() int64 {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	var sum int64
	for i := range recs {
		daemon, client := false, false
		frames := runtime.CallersFrames(recs[i].Stack())
		for {
			f, more := frames.Next()
			switch {
			case strings.HasPrefix(f.Function, "github.com/vrnic/vrnic/verbs."),
				strings.HasPrefix(f.Function, "github.com/vrnic/vrnic/device/dataplane_test."):
				client = true
			case strings.HasPrefix(f.Function, "github.com/vrnic/vrnic/device."),
				strings.HasPrefix(f.Function, "github.com/vrnic/vrnic/device/"):
				daemon = true
			}
			if !more {
				break
			}
		}
		if daemon && !client {
			sum += recs[i].InUseBytes()
		}
	}
	return sum
}

// ringCache is what the workers of n keep of idle QPs' send rings for
// reuse (at most engine.RingCacheBytes per worker, whatever the QPs).
func ringCache(n *dpNode) int64 {
	eng := n.dp.Engine()
	var sum int64
	for i := range eng.Workers() {
		sum += eng.WorkerCounters(i).RingCacheBytes.Load()
	}
	return sum
}

// maxIdleQPBytes is the most the daemon may hold for an idle QP (the goal
// of BENCHMARKS.md, "Idle QPs": 2 KiB whatever the queue depth).
const maxIdleQPBytes = 2048

// TestIdleQPMemory: what the daemon holds for a connected QP with nothing
// to do does not grow with the queue depth, and stays within
// maxIdleQPBytes. Both sides of every pair are on the two in-process
// devices; the figure is per QP. The send rings the workers keep for reuse
// are left out: they are per worker and bounded (engine.RingCacheBytes),
// and which QPs were active together decides how many there are.
func TestIdleQPMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("creates a thousand QPs")
	}
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	t.Cleanup(func() { runtime.MemProfileRate = old })
	const pairs = 250
	perQP := map[int]float64{}
	for _, depth := range []int{16, 1024} {
		nw := newDPNetwork(t)
		na := newDPNode(t, nw, "10.0.0.1", 1, nil)
		nb := newDPNode(t, nw, "10.0.0.2", 1, nil)
		_, pa, qa := idleCtx(t, na, 0)
		_, pb, qb := idleCtx(t, nb, 0)
		cp := abi.QPCap{MaxSendWR: uint32(depth), MaxRecvWR: uint32(depth), MaxSendSGE: 1, MaxRecvSGE: 1}
		// The first pair outside the measurement: maps and per-worker
		// state that do not grow with the QPs.
		var qps []*verbs.QP
		mk := func() {
			p, err := pa.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: qa, RecvCQ: qa, Cap: cp})
			require.NoError(t, err)
			q, err := pb.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: qb, RecvCQ: qb, Cap: cp})
			require.NoError(t, err)
			connectQPs(t, p, na.gid, q, nb.gid, abi.MTU4096)
			qps = append(qps, p, q)
		}
		mk()
		waitIdle(t, na)
		waitIdle(t, nb)
		before := daemonHeap() - ringCache(na) - ringCache(nb)
		for range pairs {
			mk()
		}
		waitIdle(t, na)
		waitIdle(t, nb)
		after := daemonHeap() - ringCache(na) - ringCache(nb)
		perQP[depth] = float64(after-before) / (2 * pairs)
		t.Logf("depth %d: %.0f bytes per idle QP", depth, perQP[depth])
		runtime.KeepAlive(qps)
	}
	// A QP that kept its send ring would hold 3 KiB more at depth 16 and
	// 190 KiB more at depth 1024.
	assert.Less(t, perQP[1024], perQP[16]+64, "an idle QP's memory grows with the queue depth")
	for _, depth := range []int{16, 1024} {
		assert.LessOrEqual(t, perQP[depth], float64(maxIdleQPBytes),
			"the daemon holds %.0f bytes per idle QP at depth %d, more than the %d the idle-QP goal allows (BENCHMARKS.md, \"Idle QPs\")",
			perQP[depth], depth, maxIdleQPBytes)
	}
}
