package routed

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/mwprogs"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestMPIUDP runs mpiJob with the daemons on the UDP link.
func TestMPIUDP(t *testing.T) { mpiJob(t, "udp") }

// TestMPITAP runs mpiJob with the daemons on the TAP link (their traffic
// goes NIC → gateway → router(s) → NIC).
func TestMPITAP(t *testing.T) { mpiJob(t, "tap") }

var mpiOK = regexp.MustCompile(`mpi_check: OK ranks=(\d+) bytes=(\d+)`)

// mpiJob runs the checking MPI program of internal/mwprogs (ping-pong
// between ranks 0 and 1, MPI_Allreduce, MPI_Alltoall, MPI_Bcast from the
// last rank, every result checked) as one Open MPI job of four ranks,
// rank i in host i's namespace on host i's daemon, over pml ucx with UCX
// limited to rc_verbs and ud_verbs (and self), so nothing but the
// daemons can carry the job's data.
//
// mpirun runs in h0's namespace with the hosts' kernel addresses as
// host names; its rsh launch agent is a script that starts each remote
// ORTE daemon (orted) in the namespace of its address with ip netns exec
// (as ssh would start it on another machine). The runtime's own TCP
// traffic (orted to mpirun) then crosses the routers too. Each rank runs
// through vrnic-run -d hI. The agent gives each ORTE daemon a TMPDIR of
// its host's: the namespaces share one machine's hostname, so the
// daemons would otherwise share their job family's session directory
// and the hwloc topology file ORTE writes there (rtc hwloc, hwloc.sm),
// and two writing it at once crashed an orted in
// hwloc_shmem_topology_write.
func mpiJob(t *testing.T, kind linkKind) {
	mpirun := testenv.NeedTool(t, "mpirun")
	testenv.NeedTool(t, "mpicc")
	tp := newTopo(t)
	tp.checkPaths(t)
	work := t.TempDir()
	prog := mwprogs.MPIProgram(t, work)
	ds := make([]*daemon, nHosts)
	for i := range nHosts {
		ds[i] = tp.startDaemon(t, i, kind)
	}
	cache := filepath.Join(work, "cache")
	vrnicRun := filepath.Join(bin, "vrnic-run")
	// Build the library once, before four ranks want it.
	out, err := exec.Command(vrnicRun, "-cache-dir", cache, "-build-only").CombinedOutput()
	require.NoError(t, err, "%s", out)

	agent, agentLog := filepath.Join(work, "netns-agent"), filepath.Join(work, "netns-agent.log")
	var cases strings.Builder
	for i, h := range tp.hosts {
		fmt.Fprintf(&cases, "%s) ns=%s ;;\n", hostAddr(i), h)
	}
	require.NoError(t, os.WriteFile(agent, []byte(`#!/bin/sh
# Open MPI's rsh launch agent: "agent HOST COMMAND..." runs COMMAND (a
# shell command line, as ssh runs it) in the network namespace of HOST,
# with a temporary directory of the host's own (on separate machines each
# ORTE daemon has its own: they share its session directory layout).
host=$1
shift
case "$host" in
`+cases.String()+`*) echo "netns-agent: unknown host $host" >&2; exit 1 ;;
esac
echo "$host $ns" >>`+agentLog+`
TMPDIR=`+work+`/tmp-$ns
mkdir -p "$TMPDIR"
export TMPDIR
exec ip netns exec "$ns" /bin/sh -c "$*"
`), 0o755))

	args := []string{"netns", "exec", tp.hosts[0], mpirun, "--allow-run-as-root", "--bind-to", "none",
		"--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", "10.142.0.0/16",
		"--mca", "pml", "ucx", "--mca", "btl", "self", "--mca", "osc", "ucx",
		"-x", "UCX_TLS=rc_verbs,ud_verbs,self", "-x", "UCX_WARN_UNUSED_ENV_VARS=n",
		// As internal/mwprogs.MPI: UCX before 1.20 can take a stale UD
		// acknowledgement for a new endpoint's during wireup.
		"-x", "UCX_UD_VERBS_TIMER_TICK=100ms"}
	for i := range nHosts {
		if i > 0 {
			args = append(args, ":")
		}
		args = append(args, "-np", "1", "--host", hostAddr(i)+":1",
			vrnicRun, "-runtime-dir", tp.dir, "-cache-dir", cache, "-d", ds[i].name, prog)
	}
	run := func() (*launch.Buffer, []mwprogs.Counters, error) {
		// Each run's launches are its own: a second run must not
		// find the first's in the log.
		require.NoError(t, os.WriteFile(agentLog, nil, 0o644))
		before := make([]mwprogs.Counters, nHosts)
		for i, d := range ds {
			before[i] = mwprogs.ReadCounters(t, d.sock)
		}
		buf := &launch.Buffer{}
		p, err := launch.Start(launch.Spec{Name: "mpirun", Bin: "ip", Args: args, Env: []string{"TMPDIR=" + work}, Stdout: buf, Stderr: buf})
		require.NoError(t, err)
		t.Cleanup(func() { p.Stop(0, 10*time.Second) })
		if !p.Wait(4 * time.Minute) {
			state := daemonsState(ds) // while the ranks still hold their QPs
			p.Stop(0, 10*time.Second)
			require.Fail(t, "mpirun: no exit in 4 minutes", "%s\n%s", buf.String(), state)
		}
		return buf, before, p.Err()
	}
	buf, before, err := run()
	for attempt := 1; err != nil && attempt < mwprogs.KnownUCXAttempts && mwprogs.KnownUCXDefect(buf.String()); attempt++ {
		// The UCX defects internal/mwprogs.MPI runs a job again for
		// (UD's wire-up races; README, "UCX and Open MPI"): here too,
		// at most KnownUCXAttempts runs in all.
		t.Logf("known UCX defect (attempt %d, UD wire-up); running the job again:\n%s", attempt, buf.String())
		buf, before, err = run()
	}
	require.NoError(t, err, "mpirun:\n%s", buf.String())
	m := mpiOK.FindStringSubmatch(buf.String())
	require.NotNil(t, m, "mpi_check did not report OK:\n%s", buf.String())
	assert.Equal(t, strconv.Itoa(nHosts), m[1], "ranks")
	// mpirun started the ORTE daemons of h1, h2 and h3 through the
	// agent, each in its host's namespace (h0's ranks are mpirun's own).
	b, err := os.ReadFile(agentLog)
	require.NoError(t, err)
	var want []string
	for i := 1; i < nHosts; i++ {
		want = append(want, hostAddr(i)+" "+tp.hosts[i])
	}
	got := strings.Split(strings.TrimSpace(string(b)), "\n")
	slices.Sort(got)
	assert.Equal(t, want, got, "the agent's launches")
	// Every daemon carried the job: MPI_Alltoall alone sends 16 KiB
	// from each rank to each other (3 × 16 path MTUs of 1 KiB).
	for i, d := range ds {
		c := mwprogs.ReadCounters(t, d.sock)
		assert.GreaterOrEqual(t, c.Sent-before[i].Sent, uint64(48), "packets vrnicd h%d sent", i)
		assert.GreaterOrEqual(t, c.Received-before[i].Received, uint64(48), "packets vrnicd h%d received", i)
	}
	t.Logf("%s", strings.TrimSpace(m[0]))
}

// daemonsState is what each daemon can tell of a hung job: its device
// information (frames that reached no QP by reason, the data path's
// totals, the newest link error) and its QPs (state, PSNs, counters), so
// that a hang seen once can be told apart: a datagram vrnic dropped or
// misplaced, or a job waiting on its own.
func daemonsState(ds []*daemon) string {
	var b strings.Builder
	for i, d := range ds {
		fmt.Fprintf(&b, "vrnicd h%d:\n", i)
		a, err := admin.Dial(d.sock)
		if err != nil {
			fmt.Fprintf(&b, "  dial: %v\n", err)
			continue
		}
		if info, err := a.Info(); err != nil {
			fmt.Fprintf(&b, "  info: %v\n", err)
		} else {
			j, _ := json.Marshal(info)
			fmt.Fprintf(&b, "  info: %s\n", j)
		}
		if qps, err := a.List(admin.QPsCmd); err != nil {
			fmt.Fprintf(&b, "  qps: %v\n", err)
		} else {
			for _, q := range qps {
				fmt.Fprintf(&b, "  qp: %s\n", q)
			}
		}
		a.Close()
	}
	return b.String()
}
