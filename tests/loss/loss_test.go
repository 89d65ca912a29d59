package loss

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/faults/suite"
	"github.com/vrnic/vrnic/internal/testenv"
)

// The work of the quick tests: a bounded number of operations (no
// duration), small enough for a loaded two-core machine, large enough
// that a 1% drop hits the WRITE stream dozens of times.
// The mix's write_bw keeps 16 WRITEs outstanding and asks for a
// completion every 16 (vrnic-perf: cq-mod = depth up to 64), so that a
// slow machine sees completions well within vrnic-perf's 10 s stall
// limit at the mix's few MB/s.
var (
	quickIters = map[Test]int{WriteBW: 300, SendLat: 300, ReadLat: 300}
	mixIters   = map[Test]int{WriteBW: 60, SendLat: 100, ReadLat: 100}
)

const mixDepth = 16

// maxFramesPerDatagram bounds the frames one datagram the kernel dropped
// on a socket carried: the UDP link packs at most a UDP payload (64 KiB)
// of 4 KiB frames into one segmented datagram.
const maxFramesPerDatagram = 16

// srResentPerLost is the most requests selective repeat may send again
// per request lost: the lost one, and a spare for a timer that fired
// while the repair was on its way. Go-back-N sends again everything
// behind the hole: dozens to thousands.
const srResentPerLost = 2.0

// forModes runs f as a subtest per transport mode: go-back-N, and
// selective repeat when vrnic-perf has SRFlag (skipped, saying so,
// otherwise).
func forModes(t *testing.T, f func(t *testing.T, sr bool)) {
	t.Run("go-back-N", func(t *testing.T) { f(t, false) })
	t.Run("selective-repeat", func(t *testing.T) {
		if !srSupported {
			t.Skipf("vrnic-perf has no %s flag (client and server): the selective repeat runs need it", SRFlag)
		}
		f(t, true)
	})
}

// checkCompleted: the run completed every operation, with every
// completion successful (vrnic-perf fails on any other) and the data
// verified; no fatal NAK either way.
func checkCompleted(t *testing.T, r *Result, iters int) {
	t.Helper()
	t.Log(r.Summary())
	require.NoError(t, r.Err, "%s", r.Output)
	assert.True(t, r.Perf.Verified, "%s: data verified", r.Test)
	assert.EqualValues(t, iters, r.Perf.Ops, "%s: operations completed", r.Test)
	for name, s := range map[string]*Side{"A": &r.Client, "B": &r.Server} {
		d := s.DataPath
		assert.Zero(t, d.InvalidReqNAKsSent+d.RemAccessNAKsSent+d.RemOpNAKsSent+
			d.InvalidReqNAKsReceived+d.RemAccessNAKsReceived+d.RemOpNAKsReceived, "%s %s: fatal NAKs", r.Test, name)
	}
}

// requestsNeeded is what the completed operations needed from A:
// write_bw's packets per WRITE; one per SEND or READ of 8 bytes.
func requestsNeeded(r *Result) uint64 {
	if r.Test == WriteBW {
		return r.Needed()
	}
	return r.Perf.Ops
}

// checkResent: every request of A the injector dropped or corrupted was
// sent again (each packet sent n times, d of them lost, arrived: n ≥ d +
// 1, summed over the packets). lostA is the injector's count of A's
// requests lost.
func checkResent(t *testing.T, r *Result, lostA uint64) {
	t.Helper()
	need := requestsNeeded(r)
	assert.GreaterOrEqual(t, r.Client.DataPath.PacketsSent, need+lostA,
		"%s: A sent %d packets; the operations needed %d requests and the injector lost %d", r.Test, r.Client.DataPath.PacketsSent, need, lostA)
}

// checkSR: selective repeat sends again about what was lost, not what
// followed it. Datagrams the kernel dropped on B's socket (rare; their
// frames are losses the injector did not count) widen the bound.
func checkSR(t *testing.T, r *Result) {
	t.Helper()
	resent, ok1 := r.Resent()
	lost, ok2 := r.Lost()
	require.True(t, ok1 && ok2, "write_bw under daemon rules counts both")
	lost += maxFramesPerDatagram * r.Server.SocketDrops
	require.NotZero(t, lost)
	assert.LessOrEqual(t, float64(resent), srResentPerLost*float64(lost),
		"selective repeat sent %d requests again for %d lost (%.2f each)", resent, lost, float64(resent)/float64(lost))
}

// TestDrop1: each daemon drops 1% of the requests it sends (seeded):
// every operation of write_bw, send_lat and read_lat completes, the
// data verifies, no fatal NAK; the drops happened and every dropped
// request was sent again. Go-back-N restarted; selective repeat sent
// again at most srResentPerLost requests per request lost.
func TestDrop1(t *testing.T) {
	forModes(t, func(t *testing.T, sr bool) {
		p := Start(t, Config{Bins: bins, Injector: Rules, SR: sr, Iters: quickIters})
		for _, test := range Tests {
			r := p.Run(t, test, Drop1)
			checkCompleted(t, r, quickIters[test])
			lostA := applied(r.Client.Rules, "drop")
			checkResent(t, r, lostA)
			for name, s := range map[string]*Side{"A": &r.Client, "B": &r.Server} {
				assert.Zero(t, s.Wire.ICRCErrors, "%s %s: nothing corrupts", test, name)
			}
			// A NAK that left B may be lost on the way (a full socket),
			// never made up.
			assert.LessOrEqual(t, r.Client.DataPath.SeqNAKsReceived, r.Server.DataPath.SeqNAKsSent, "%s", test)
			assert.LessOrEqual(t, r.Server.DataPath.SeqNAKsReceived, r.Client.DataPath.SeqNAKsSent, "%s", test)
			if test != WriteBW {
				continue
			}
			// At least Needed draws of A's rule at 1%: dozens of drops.
			assert.NotZero(t, lostA, "the rule dropped WRITE packets")
			resent, ok := r.Resent()
			require.True(t, ok)
			assert.GreaterOrEqual(t, resent, lostA)
			if sr {
				checkSR(t, r)
			} else if lostA > 0 {
				assert.NotZero(t, r.Client.DataPath.Retransmits, "go-back-N restarted")
			}
		}
	})
}

// TestMix: each daemon drops 5% of everything it sends, corrupts 1% of
// the frames with a payload, duplicates 1% and holds back 1% behind
// three later frames: every operation completes and verifies; every
// WRITE packet lost (dropped or corrupted) was sent again; the ICRC
// errors a daemon counted came from the other's corruptions (a corrupted
// frame may also be duplicated: at most two per corruption).
func TestMix(t *testing.T) {
	forModes(t, func(t *testing.T, sr bool) {
		p := Start(t, Config{Bins: bins, Injector: Rules, SR: sr, Iters: mixIters, Depth: mixDepth})
		var icrc, corrupt [2]uint64
		for _, test := range Tests {
			r := p.Run(t, test, Mix)
			checkCompleted(t, r, mixIters[test])
			for i, s := range []*Side{&r.Client, &r.Server} {
				icrc[i] += s.Wire.ICRCErrors
				corrupt[i] += applied(s.Rules, "corrupt")
			}
			if test == WriteBW {
				lost, ok := r.Lost()
				require.True(t, ok)
				assert.NotZero(t, lost)
				checkResent(t, r, lost)
			}
		}
		assert.NotZero(t, corrupt[0]+corrupt[1], "the rules corrupted frames")
		assert.LessOrEqual(t, icrc[1], 2*corrupt[0], "ICRC errors at B, corruptions at A")
		assert.LessOrEqual(t, icrc[0], 2*corrupt[1], "ICRC errors at A, corruptions at B")
	})
}

// TestKernelInjector: the kernel injector (tc on the egress of the daemons'
// namespace's lo) drops 1% of the RC requests: every operation completes
// and verifies. In write_bw every request crossed the hook once per
// transmission (one datagram per frame: matched at least what the WRITEs
// needed, at most what A sent), and every one it dropped was sent again.
// The mix runs too (drop 5%, corrupt and duplicate 1% of all RC frames):
// it completes and verifies.
func TestKernelInjector(t *testing.T) {
	testenv.NeedRoot(t, "the kernel injector needs root (network namespace, tc BPF)")
	testenv.NeedTool(t, "ip")
	forModes(t, func(t *testing.T, sr bool) {
		p := Start(t, Config{Bins: bins, Injector: Kernel, SR: sr, Iters: quickIters})
		for _, test := range Tests {
			r := p.Run(t, test, Drop1)
			checkCompleted(t, r, quickIters[test])
			if test != WriteBW {
				continue
			}
			var matched uint64
			for _, rc := range r.Kernel {
				matched += rc.Matched
			}
			assert.GreaterOrEqual(t, matched, r.Needed(), "every WRITE packet crossed the hook as a frame of its own")
			assert.LessOrEqual(t, matched, r.Client.DataPath.PacketsSent)
			lost, ok := r.Lost()
			require.True(t, ok)
			assert.NotZero(t, lost, "the tc rules dropped WRITE packets")
			checkResent(t, r, lost)
			if sr {
				checkSR(t, r)
			}
		}
		p.cfg.Iters, p.cfg.Depth = mixIters, mixDepth
		for _, test := range Tests {
			checkCompleted(t, p.Run(t, test, Mix), mixIters[test])
		}
	})
}

// TestEveryByte: with 1% of the requests and READ responses each daemon
// sends dropped, RC WRITEs of 64 KiB, SENDs of 8 KiB and READs of 64 KiB,
// each to and from a region of its own filled with bytes of its own, all
// complete exactly once with success and every byte arrives where it
// belongs; every request A lost was sent again. (vrnic-perf writes the
// same bytes each time, so its check sees the last copy only.) The QPs
// here are the verbs client's own, with vrnic-perf's ACK timeout and
// retry count; they run go-back-N (the client library has no way to ask
// for selective repeat yet).
func TestEveryByte(t *testing.T) {
	p := Start(t, Config{Bins: bins, Injector: Rules})
	for i := range 2 {
		_, err := p.ctl("-s", p.Socket(i), "fault", "add", "id=1", "name=drop", "dir=tx", "op=request,read_response", "prob=0.01", "action=drop")
		require.NoError(t, err)
	}
	var before [2]snapshot
	for i := range before {
		var err error
		before[i], err = p.snap(i)
		require.NoError(t, err)
	}

	d := func(i int) *suite.Daemon {
		return &suite.Daemon{Name: p.names[i], Socket: p.Socket(i), Addr: p.Addr(i)}
	}
	var ops []suite.Op
	var need uint64
	for i := range 240 {
		switch i % 6 {
		case 0, 1:
			ops = append(ops, suite.Op{Kind: suite.Write, Size: 64 << 10})
			need += 16
		case 2, 3, 4:
			ops = append(ops, suite.Op{Kind: suite.Send, Size: 8 << 10})
			need += 2
		case 5:
			ops = append(ops, suite.Op{Kind: suite.Read, Size: 64 << 10})
			need++
		}
	}
	a, b, err := suite.Connect(d(client), d(server), suite.ConnOpts{Depth: 256, BufSize: 10 << 20, MTU: abi.MTU4096,
		Timeout: suite.U8(14), RetryCnt: suite.U8(7)})
	require.NoError(t, err)
	defer a.Close()
	defer b.Close()
	res, err := suite.Workload{Ops: ops, Seed: 48, Window: 32}.Run(a, b, 5*time.Minute)
	require.NoError(t, err)
	require.NoError(t, res.Err)

	var after [2]snapshot
	sides := [2]Side{}
	for i := range after {
		after[i], err = p.snap(i)
		require.NoError(t, err)
		sides[i], err = side(before[i], after[i])
		require.NoError(t, err)
		sides[i].Rules, err = p.daemonRules(i)
		require.NoError(t, err)
	}
	require.NoError(t, res.CheckCompletions(suite.AllSucceed))
	require.NoError(t, res.CheckData(int(sides[client].Wire.ICRCErrors), int(sides[server].Wire.ICRCErrors)))
	for i, ok := range res.DataOK {
		require.True(t, ok, "op %d (%v, %d bytes): every byte where it belongs", i, ops[i].Kind, ops[i].Size)
	}
	lostA, lostB := applied(sides[client].Rules, "drop"), applied(sides[server].Rules, "drop")
	t.Logf("A: %d requests needed, %d sent, %d dropped (%s); B: %d READ responses dropped (%s)",
		need, res.A.PacketsSent, lostA, counterList(sides[client].All), lostB, counterList(sides[server].All))
	assert.NotZero(t, lostA+lostB, "the rules dropped frames")
	assert.GreaterOrEqual(t, res.A.PacketsSent, need+lostA, "every request A lost was sent again")
	assert.Zero(t, sides[client].Wire.ICRCErrors+sides[server].Wire.ICRCErrors)
}

// TestSRSupported: the flag is found in the usage of both roles, and
// only there.
func TestSRSupported(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, client, server string
		want                 bool
	}{
		{"both", "  -selective-repeat\n    \tuse it\n", "  -selective-repeat\n    \tuse it\n", true},
		{"client only", "  -selective-repeat\n", "  -size int\n", false},
		{"a longer name", "  -selective-repeat-window int\n", "  -selective-repeat-window int\n", false},
		{"neither", "  -size int\n", "  -listen string\n", false},
	} {
		perf := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		script := fmt.Sprintf("#!/bin/sh\ncase \"$1\" in\nclient) printf '%%s' '%s' >&2;;\nserver) printf '%%s' '%s' >&2;;\nesac\nexit 2\n", tc.client, tc.server)
		require.NoError(t, os.WriteFile(perf, []byte(script), 0o755))
		assert.Equal(t, tc.want, SRSupported(perf), tc.name)
	}
	t.Logf("this tree's vrnic-perf: %v", srSupported)
}
