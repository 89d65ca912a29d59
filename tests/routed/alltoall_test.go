package routed

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
)

// TestAllToAllUDP runs allToAll with the daemons on the UDP link, each
// bound to its host's kernel address: the kernels route the daemons'
// datagrams through the routers.
func TestAllToAllUDP(t *testing.T) { allToAll(t, "udp") }

// TestAllToAllTAP runs allToAll with the daemons on the TAP link: each
// NIC is a port of its host's bridge with addresses of its own on the
// host's segment and the router port as its -tap-gateway; it resolves the
// gateway's MAC by ARP (IPv4) or neighbour discovery (IPv6) and sends its
// frames there with the peer's IP addresses, and the routers forward
// them. Pairs of hosts whose indices add up to an odd number use the
// NICs' IPv6 addresses (GID 1), the others IPv4 (GID 0).
func TestAllToAllTAP(t *testing.T) { allToAll(t, "tap") }

// killed is the host whose daemon is killed and restarted: h3, two
// routers away from h0 and h1.
const killed = 3

// allToAll builds the routed topology, starts a daemon and a helper (the
// host's verbs client) in each host namespace, and connects an RC QP
// pair between every two hosts. Then:
//
//  1. every ordered pair runs rounds of WRITE, SEND and READ (each
//     checked where the data lands), all pairs at once;
//  2. the pairs not involving h3 keep running rounds, and each other
//     host streams WRITEs to h3 (four outstanding); once each pair has
//     completed a round and each stream 20 WRITEs, h3's daemon is killed
//     (SIGKILL by PID). Each stream's WRITEs in flight then fail: the
//     first with RETRY_EXC_ERR after the ACK timeout and its retries,
//     those behind it with WR_FLUSH_ERR; the QP is in ERROR and a SEND
//     posted after it is flushed too; h3's helper gets errors from its
//     dead daemon. The other pairs each complete two more rounds after
//     the kill, checked;
//  3. h3's daemon is restarted with the same address, a new helper opens
//     it, and every other host replaces its QP to h3 with a new one,
//     connected to h3's new QPs; the other pairs keep running meanwhile;
//  4. every ordered pair, h3's included, runs rounds again, checked.
func allToAll(t *testing.T, kind linkKind) {
	tp := newTopo(t)
	// The paths: h0 to h1 through r1; h0 to h3 through r1 and r2.
	tp.checkPaths(t)

	ds := make([]*daemon, nHosts)
	hs := make([]*hostClient, nHosts)
	for i := range nHosts {
		ds[i] = tp.startDaemon(t, i, kind)
	}
	for i := range nHosts {
		hs[i] = startHelper(t, tp, ds[i])
	}
	logs := func() string {
		s := ""
		for _, d := range ds {
			s += "--- vrnicd " + d.name + ":\n" + d.log.String()
		}
		return s
	}
	gid := func(i, j int) int {
		if kind == "tap" && (i+j)%2 == 1 {
			return 1
		}
		return 0
	}
	require.NoError(t, connectAll(hs, gid), logs())

	// 1. All pairs.
	require.NoError(t, runRounds(hs, allPairs(), 0, 2), logs())

	// 2. Kill h3's daemon while the other pairs' rounds run and each
	// other host streams WRITEs to it.
	others := allPairs(killed)
	l := startLoops(hs, others, 100)
	stopped := false
	defer func() {
		if !stopped {
			l.stop()
		}
	}()
	type result struct {
		rep reply
		err error
	}
	streams := make([]chan result, nHosts)
	for i := range nHosts {
		if i != killed {
			streams[i] = make(chan result, 1)
			go func() {
				rep, err := hs[i].call(request{Op: "stream", Peer: killed})
				streams[i] <- result{rep, err}
			}()
		}
	}
	const streamed = 20
	for i := range nHosts {
		if i != killed {
			_, err := hs[i].call(request{Op: "waitstream", Peer: killed, Size: streamed})
			require.NoError(t, err, logs())
		}
	}
	require.NoError(t, l.waitEach(nil, 1), logs())
	ds[killed].kill(t)
	atKill := l.counts()
	// Each stream's WRITEs in flight fail: the first with RETRY_EXC_ERR
	// (no ACK after the timeout and its retries), those behind it
	// flushed (the stream checks that). The QP is in ERROR, and a SEND
	// posted after it is flushed too.
	var wg sync.WaitGroup
	errs := make([]error, nHosts)
	for i := range nHosts {
		if i == killed {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := hs[i]
			r := <-streams[i]
			if errs[i] = r.err; r.err != nil {
				return
			}
			t.Logf("h%d → h%d: %d WRITEs completed, then %v, %d flushed", i, killed, r.rep.OK, r.rep.Status, r.rep.Flushed)
			if r.rep.Status != abi.WCRetryExcErr || r.rep.OK < streamed || r.rep.Flushed >= streamDepth {
				errs[i] = fmt.Errorf("h%d → h%d stream: %d WRITEs, then %v and %d flushed; want at least %d, then RETRY_EXC_ERR and fewer than %d",
					i, killed, r.rep.OK, r.rep.Status, r.rep.Flushed, streamed, streamDepth)
				return
			}
			rep, err := c.call(request{Op: "state", Peer: killed})
			if errs[i] = err; err == nil && rep.State != abi.QPSErr {
				errs[i] = fmt.Errorf("h%d's QP to h%d is in state %v after RETRY_EXC_ERR, want ERR", i, killed, rep.State)
				return
			}
			if errs[i] == nil {
				errs[i] = c.postExpect(killed, abi.WRSend, 64, 8, abi.WCWRFlushErr)
			}
		}()
	}
	// h3's client: its daemon is gone, so are its objects.
	_, err := hs[killed].call(request{Op: "state", Peer: 0})
	assert.Error(t, err, "h%d's helper queried a QP on a killed daemon", killed)
	hs[killed].kill()
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "h%d → h%d after the kill", i, killed)
	}
	require.NoError(t, l.waitEach(atKill, 2), "pairs without h%d after the kill\n%s", killed, logs())

	// 3. Restart h3's daemon at the same address; new QPs to it.
	ds[killed].start(t, kind)
	hs[killed] = startHelper(t, tp, ds[killed])
	for i := range nHosts {
		if i != killed {
			require.NoError(t, connectPair(hs, i, killed, gid(i, killed)), logs())
		}
	}
	require.NoError(t, l.waitEach(l.counts(), 1), logs())
	stopped = true
	require.NoError(t, l.stop(), logs())

	// 4. All pairs again.
	require.NoError(t, runRounds(hs, allPairs(), 1000, 2), logs())
	for i, d := range ds {
		assert.True(t, d.proc.Running(), "vrnicd h%d exited:\n%s", i, d.log.String())
	}
	// The routers carried it: the transit link, both ways (the hosts'
	// namespaces have no other way to each other). Phases 1 and 4 alone
	// ran 2 rounds each on the 8 ordered pairs across it, and a round
	// moves at least 3 packets each way (a WRITE and a SEND and their
	// ACKs, a READ request and its response).
	const least = 2 * 2 * 8 * 3
	rx, tx := linkPackets(t, tp.routers[0], "t1")
	assert.GreaterOrEqual(t, rx, uint64(least), "packets r1 received from r2")
	assert.GreaterOrEqual(t, tx, uint64(least), "packets r1 sent to r2")
	if kind == "tap" {
		// Every NIC resolved its gateway, by ARP and by neighbour
		// discovery (all its peers are off its prefixes), when its
		// QPs went to RTR.
		for _, d := range ds {
			n := d.neighbors(t)
			assert.Positive(t, n["ARPRequestsOut"], "h%d's ARP requests: %v", d.host, n)
			assert.Positive(t, n["ARPRepliesIn"], "h%d's ARP replies: %v", d.host, n)
			assert.Positive(t, n["NSOut"], "h%d's neighbour solicitations: %v", d.host, n)
			assert.Positive(t, n["NAIn"], "h%d's neighbour advertisements: %v", d.host, n)
		}
	}
	t.Logf("rounds of the pairs without h%d while it was killed and restarted: %v", killed, l.counts())
}
