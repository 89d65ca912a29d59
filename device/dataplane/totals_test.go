package dataplane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/dataplane"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/verbs"
)

// sumCounters adds up per-QP counters field by field.
func sumCounters(cs ...device.QPCounters) device.QPCounters {
	var t device.QPCounters
	for _, c := range cs {
		t.Add(c)
	}
	return t
}

func adminInfo(t *testing.T, path string) admin.Info {
	t.Helper()
	a, err := admin.Dial(path)
	require.NoError(t, err)
	defer a.Close()
	info, err := a.Info()
	require.NoError(t, err)
	return info
}

// settled waits until the device's totals equal retired (what destroyed
// QPs counted) plus the sum of the live QPs' counters, both as listed and
// as the engine keeps them (frames still in flight move them between the
// reads), and returns the totals and the listing.
func settled(t *testing.T, n *dpNode, retired device.QPCounters) (device.QPCounters, []admin.QPInfo) {
	t.Helper()
	var tot device.QPCounters
	var qps []admin.QPInfo
	require.Eventually(t, func() bool {
		tot = adminInfo(t, n.sock).DataPath
		qps = listQPs(t, n.sock)
		listed := []device.QPCounters{retired}
		eng := []device.QPCounters{retired}
		for _, q := range qps {
			listed = append(listed, q.Counters)
			c, err := n.dp.Engine().Counters(q.QPN)
			if err != nil {
				return false
			}
			eng = append(eng, dataplane.CountersOf(c))
		}
		return sumCounters(listed...) == tot && sumCounters(eng...) == tot && n.dev.DataPathTotals() == tot
	}, 10*time.Second, 10*time.Millisecond, "device totals never matched the per-QP counters")
	return tot, qps
}

// TestDataPathTotals runs RC traffic over a lossy in-memory link between
// two devices, two QP pairs each, and checks the device-wide data-path
// totals of AdminInfo: non-zero where traffic went, equal to the sum of
// the per-QP counters (the listing's and the engine's), and kept when the
// QPs are destroyed.
func TestDataPathTotals(t *testing.T) {
	const seed = 0xc0ffee
	f := link.Faults{Seed: seed, Drop: 0.03, Duplicate: 0.03}
	fb := f
	fb.Seed += 100
	nw := newDPNetwork(t)
	na := newDPNode(t, nw, "10.0.8.1", 2, &f)
	nb := newDPNode(t, nw, "10.0.8.2", 2, &fb)
	zero := adminInfo(t, na.sock).DataPath
	assert.Equal(t, device.QPCounters{}, zero, "no traffic yet")

	const pairs, rounds, size = 2, 40, 3000
	var as, bs []*dpClient
	for range pairs {
		a := newDPClient(t, na, 256)
		b := newDPClient(t, nb, 256)
		connectQPsTimeout(t, a.qp, na.gid, b.qp, nb.gid, abi.MTU1024, 12) // ~17 ms ACK timeout
		as, bs = append(as, a), append(bs, b)
	}
	for p := range pairs {
		a, b := as[p], bs[p]
		for i := range rounds {
			off := uint32(i * size)
			require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: uint64(i), SGL: []abi.SGE{b.mr.SGE(off, size)}}))
			require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: uint64(i), Opcode: abi.WRSend, Flags: abi.SendSignaled,
				SGL: []abi.SGE{a.mr.SGE(off, size)}}))
			if i%32 == 31 {
				pollN(t, a.scq, 32)
			}
		}
	}
	for p := range pairs {
		pollN(t, as[p].scq, rounds%32)
		for _, c := range pollN(t, bs[p].rcq, rounds) {
			require.Equal(t, abi.WCSuccess, c.Status)
		}
	}

	ta, qpsA := settled(t, na, device.QPCounters{})
	tb, qpsB := settled(t, nb, device.QPCounters{})
	require.Len(t, qpsA, pairs)
	require.Len(t, qpsB, pairs)
	t.Logf("sender totals %+v", ta)
	t.Logf("receiver totals %+v", tb)
	// 3000-byte SENDs at MTU 1024: 3 packets each, at least once.
	assert.GreaterOrEqual(t, ta.PacketsSent, uint64(pairs*rounds*3))
	assert.GreaterOrEqual(t, tb.PacketsReceived, uint64(pairs*rounds*3))
	assert.NotZero(t, ta.PacketsReceived, "ACKs")
	assert.NotZero(t, tb.PacketsSent, "ACKs")
	assert.Equal(t, uint64(pairs*rounds), ta.SendCQEs)
	assert.Equal(t, uint64(pairs*rounds), tb.RecvCQEs)
	assert.Zero(t, ta.RecvCQEs)
	assert.Zero(t, tb.SendCQEs)
	// The link lost frames both ways: the senders went back and the
	// receivers saw repeated requests.
	assert.NotZero(t, ta.Retransmits, "retransmissions after losses")
	assert.NotZero(t, tb.Duplicates+tb.Dropped+tb.SeqNAKsSent, "repeated or out-of-order requests at the receiver")

	// Destroying a QP keeps its share in the totals; so does closing a
	// client, which destroys its QPs.
	require.NoError(t, as[0].qp.Destroy())
	require.NoError(t, as[1].ctx.Close())
	after, qps := settled(t, na, ta)
	assert.Empty(t, qps)
	assert.Equal(t, ta, after, "the totals outlive the QPs")

	// New QPs add to what the destroyed ones left.
	a := newDPClient(t, na, 16)
	b := newDPClient(t, nb, 16)
	connectRC(t, a, b, abi.MTU1024)
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{WrID: 1, SGL: []abi.SGE{b.mr.SGE(0, 64)}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: []abi.SGE{a.mr.SGE(0, 64)}}))
	pollN(t, a.scq, 1)
	pollN(t, b.rcq, 1)
	final, _ := settled(t, na, after)
	assert.Equal(t, after.SendCQEs+1, final.SendCQEs)
	assert.Greater(t, final.PacketsSent, after.PacketsSent)
}

func listQPs(t *testing.T, path string) []admin.QPInfo {
	t.Helper()
	a, err := admin.Dial(path)
	require.NoError(t, err)
	defer a.Close()
	items, err := admin.ListAs[admin.QPInfo](a, admin.QPsCmd)
	require.NoError(t, err)
	return items
}
