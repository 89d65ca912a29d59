package hostile

// The flood of bad control datagrams (issue #12): a client of another uid
// sends thousands of malformed datagrams on the control socket as fast as
// the daemon takes them, opens and closes connections, and sends random
// datagrams to the daemon's UDP link, while a well-behaved victim on the
// same daemon goes on with RC operations whose data it checks.

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// floodRun runs the flood client cfg against d (as uid nobody), waits for
// it and returns its report. It fails t if the client could not run or
// saw a broken connection.
func floodRun(t testing.TB, e *opsEnv, d *opsDaemon, cfg floodConfig) floodReport {
	t.Helper()
	b, err := json.Marshal(&cfg)
	require.NoError(t, err)
	p, err := e.opsStart(t, opsAsNobody, "flood", d.socket, floodEnv+"="+string(b))
	require.NoError(t, err)
	lines, err := p.wait(5 * time.Minute)
	require.NoError(t, err, "flood client: %s", &p.out)
	var rep floodReport
	for _, l := range lines {
		if j, ok := strings.CutPrefix(l, "report "); ok {
			require.NoError(t, json.Unmarshal([]byte(j), &rep))
			return rep
		}
	}
	t.Fatalf("the flood client did not report: %s", &p.out)
	return rep
}

// TestFloodBadControlDatagrams: against a daemon on the UDP link (one
// worker), a client of uid nobody sends, on four connections (two with a
// context, two without), datagrams shorter than a header, lengths that
// lie, unknown opcodes, client commands with payloads of garbage, cut
// short or too long, page lists that are not what they say, flags and
// status set, descriptors of every kind on commands that take none or one,
// more descriptors than a command may carry, datagrams larger than the
// largest message, operator commands, and commands on the victim's QPs;
// on a fifth connection it never reads a reply; meanwhile it opens and
// closes hundreds of connections and sends random datagrams (some shaped
// like RoCE v2 packets to the victim's QPs) to the daemon's UDP port.
//
// Asserted: every datagram gets one reply (an error for each malformed
// one) and no command on the victim's QPs succeeds; the victim completes
// every operation with its bytes checked while the flood runs; the
// daemon's counters show the bad input (bad_messages, commands,
// command_errors, fds_closed, operator_denied); once the client is gone
// the daemon holds only the victim's connection, contexts and resources,
// no more descriptors than before, and about its memory of before; it
// logged no panic.
func TestFloodBadControlDatagrams(t *testing.T) {
	e := opsSetup(t)
	seed := hostileSeed(t)
	addr, err := launch.FreeLoopback()
	require.NoError(t, err)
	local := netip.AddrPortFrom(addr, launch.RoCEPort).String()
	d := e.opsStartDaemon(t, "bad0", "-link", "udp", "-udp-local", local)
	v := memHelperNewVictim(t, d.socket)
	base := loadBaseline(t, d, v)
	opsBefore, _ := v.progress()

	cfg := floodConfig{Seed: seed, Senders: 4, Msgs: 2500, Deaf: 400, Churn: 600, Parallel: 6,
		UDP: local, UDPMsgs: 3000, VictimQPNs: []uint32{v.qpA.QPN, v.qpB.QPN}}
	start := time.Now()
	rep := floodRun(t, e, d, cfg)
	opsDuring, st := v.progress()
	t.Logf("flood: %+v in %v; the victim did %d steps meanwhile, slowest command %v, longest pause %v",
		rep, time.Since(start).Round(time.Millisecond), opsDuring-opsBefore, st.maxCtl, st.maxGap)
	d.requireRunning(t)
	require.NoError(t, st.err, "the victim failed during the flood")
	assert.Empty(t, rep.Errors, "the flood client's connections")
	assert.Equal(t, cfg.Senders*cfg.Msgs, rep.Sent, "datagrams sent")
	assert.Equal(t, rep.Sent, rep.Replies, "one reply to each datagram")
	assert.Equal(t, rep.Bad, rep.ErrReplies-rep.CmdErrReplies, "an error reply to each malformed datagram")
	assert.Positive(t, rep.Foreign)
	assert.Zero(t, rep.ForeignOK, "commands on the victim's QPs that succeeded")
	assert.Positive(t, rep.ChurnOpened)
	assert.Greater(t, opsDuring, opsBefore, "the victim progressed during the flood")

	now, err := d.adm.Info()
	require.NoError(t, err, "the operator is answered after the flood")
	for _, c := range []struct {
		counter string
		min     int
	}{
		{"bad_messages", rep.Bad},
		{"commands", rep.Cmds},
		{"command_errors", rep.CmdErrReplies},
		{"fds_closed", rep.FdsOnNoFd},
		{"operator_denied", rep.Operator},
	} {
		got := base.counterDelta(t, now, c.counter)
		assert.GreaterOrEqual(t, got, int64(c.min), "counter %s: grew by %d, the flood sent %d", c.counter, got, c.min)
	}
	loadCheckRecovered(t, d, v, base)
	v.stopAndWait()
	require.NoError(t, v.c.Close())
	d.opsCheckHealthy(t)
}
