// Package mwprogs runs the communication middleware applications use,
// unmodified from Debian's packages, through vrnic-run on two daemons:
// UCX (ucx-utils: ucx_info, ucx_perftest, io_demo) and Open MPI
// (openmpi-bin, pml ucx) with a checking MPI program. The test packages of
// the UDP link (tests/ibverbs) and of the TAP link (tests/tap) run the
// same cases.
package mwprogs

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// Env is where the cases run: two daemons, the servers on Devs[0] (whose
// RoCE address is Addrs[0]), the clients on Devs[1].
type Env struct {
	VrnicRun string    // vrnic-run's path
	RunArgs  []string  // vrnic-run's flags before -d: -runtime-dir, -cache-dir
	Devs     [2]string // daemon names
	Addrs    [2]string // the daemons' IPv4 addresses (GID index 0)
	Socks    [2]string // control sockets
	// Netns, when set, is the network namespace (an ip netns name) the
	// programs run in: the TAP link's addresses belong to the daemons,
	// not to the host's interfaces, so programs that also reach the
	// peer's address over TCP (fi_pingpong) run where those addresses
	// are local.
	Netns string
}

// start runs PROGRAM ARGS through vrnic-run on device dev (all devices
// when dev is "") with env added to the environment.
func (e Env) start(t *testing.T, name, dev string, env []string, args ...string) (*launch.Proc, *launch.Buffer) {
	t.Helper()
	full := append([]string{}, e.RunArgs...)
	if dev != "" {
		full = append(full, "-d", dev)
	}
	if e.Netns != "" {
		return startBin(t, name, "ip", env, append(append([]string{"netns", "exec", e.Netns, e.VrnicRun}, full...), args...)...)
	}
	return startBin(t, name, e.VrnicRun, env, append(full, args...)...)
}

func startBin(t *testing.T, name, bin string, env []string, args ...string) (*launch.Proc, *launch.Buffer) {
	t.Helper()
	out := &launch.Buffer{}
	p, err := launch.Start(launch.Spec{Name: name, Bin: bin, Args: args, Env: env, Stdout: out, Stderr: out})
	require.NoError(t, err)
	t.Cleanup(func() { p.Stop(0, 5*time.Second) })
	return p, out
}

// wait waits for p to exit 0 within d.
func wait(t *testing.T, p *launch.Proc, out *launch.Buffer, d time.Duration, what string) {
	t.Helper()
	if !p.Wait(d) {
		p.Stop(0, 5*time.Second)
		require.Failf(t, what+": no exit", "in %v:\n%s", d, out.String())
	}
	require.NoError(t, p.Err(), "%s:\n%s", what, out.String())
}

// ucxEnv is the environment of a UCX program limited to tls on device
// dev's port 1: nothing but vrnic can carry its traffic.
func ucxEnv(tls, dev string, extra ...string) []string {
	return append([]string{"UCX_TLS=" + tls, "UCX_NET_DEVICES=" + dev + ":1", "UCX_WARN_UNUSED_ENV_VARS=n"}, extra...)
}

// Counters are a daemon's packet counts.
type Counters struct{ Sent, Received uint64 }

// ReadCounters reads the data path's packet counters of the daemon on sock.
func ReadCounters(t *testing.T, sock string) Counters {
	t.Helper()
	info, err := admin.Serving(sock)
	require.NoError(t, err)
	return Counters{Sent: info.DataPath.PacketsSent, Received: info.DataPath.PacketsReceived}
}

// packetsSince is how many packets the daemons sent and received since
// before.
func (e Env) packetsSince(t *testing.T, before [2]Counters) (sent, received uint64) {
	for i, s := range e.Socks {
		c := ReadCounters(t, s)
		sent += c.Sent - before[i].Sent
		received += c.Received - before[i].Received
	}
	return sent, received
}

func (e Env) counters(t *testing.T) [2]Counters {
	return [2]Counters{ReadCounters(t, e.Socks[0]), ReadCounters(t, e.Socks[1])}
}

// UCXInfo checks that ucx_info -d lists rc_verbs and ud_verbs on port 1 of
// each vrnic device.
func UCXInfo(t *testing.T, e Env) {
	testenv.NeedTool(t, "ucx_info")
	p, out := e.start(t, "ucx_info", "", nil, "ucx_info", "-d")
	wait(t, p, out, 60*time.Second, "ucx_info -d")
	have := map[string]bool{}
	tl := ""
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(strings.TrimPrefix(line, "#"))
		switch {
		case len(f) == 2 && f[0] == "Transport:":
			tl = f[1]
		case len(f) == 2 && f[0] == "Device:" && tl != "":
			have[tl+" "+f[1]] = true
		}
	}
	for _, d := range e.Devs {
		for _, tl := range []string{"rc_verbs", "ud_verbs"} {
			assert.True(t, have[tl+" "+d+":1"], "ucx_info -d lists no %s on %s:1:\n%s", tl, d, out.String())
		}
	}
}

// UCXSuite runs UCXInfo, then UCXPerftest's tests (tag_lat, tag_bw,
// ucp_put_bw, ucp_get, stream_bw: perfIters iterations of 4 KiB) and
// IODemo (ioIters iterations) over rc_verbs with ud_verbs and over
// ud_verbs alone, each a subtest; the first IODemo also checks SameGIDs.
func UCXSuite(t *testing.T, e Env, perfIters, ioIters int) {
	t.Run("ucx_info", func(t *testing.T) { UCXInfo(t, e) })
	for i, tls := range []string{"rc_verbs,ud_verbs", "ud_verbs"} {
		for _, test := range []string{"tag_lat", "tag_bw", "ucp_put_bw", "ucp_get", "stream_bw"} {
			t.Run(tls+"/"+test, func(t *testing.T) { UCXPerftest(t, e, tls, test, perfIters, 4096) })
		}
		t.Run(tls+"/io_demo", func(t *testing.T) {
			seen := IODemo(t, e, tls, ioIters, i == 0)
			if i == 0 {
				SameGIDs(t, e, seen)
			}
		})
	}
}

// waitTCP waits until something listens on TCP port port in srv's
// network namespace, or srv exits.
func waitTCP(t *testing.T, port int, srv *launch.Proc, out *launch.Buffer) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !launch.TCPListeningIn(srv.Pid(), port) {
		require.False(t, !srv.Running(), "server exited before listening:\n%s", out.String())
		require.True(t, time.Now().Before(deadline), "server does not listen on %d:\n%s", port, out.String())
		time.Sleep(20 * time.Millisecond)
	}
}

// finalRow matches ucx_perftest's last row: "Final: ITERS p50 avg overall
// bw_avg bw_overall rate_avg rate_overall". A figure of the last report
// interval is inf or nan when that interval held no iteration (a slow,
// loaded run).
var finalRow = regexp.MustCompile(`(?m)^Final:\s+(\d+)\s+([-\d.]+|-?inf|-?nan)\s+([-\d.]+|-?inf|-?nan)\s+([-\d.]+|-?inf|-?nan)\s+([-\d.]+|-?inf|-?nan)\s+([-\d.]+|-?inf|-?nan)\s+(\d+)\s+(\d+)\s*$`)

// Perf is one ucx_perftest result.
type Perf struct {
	Iters                   int
	LatAvgUsec, BWOverallMB float64
	RateOverall             float64
}

// UCXPerftest runs ucx_perftest test (tag_lat, tag_bw, ucp_put_bw,
// ucp_get, stream_bw, ...) with iters iterations of size bytes over the
// transports tls, the server on Devs[0], the client on Devs[1]; it checks
// that every iteration was reported and that at least one packet per
// iteration crossed the daemons.
func UCXPerftest(t *testing.T, e Env, tls, test string, iters, size int) Perf {
	testenv.NeedTool(t, "ucx_perftest")
	port, err := launch.FreeTCPPort()
	require.NoError(t, err)
	ps := strconv.Itoa(port)
	before := e.counters(t)
	srv, sout := e.start(t, "ucx_perftest server", e.Devs[0], ucxEnv(tls, e.Devs[0]), "ucx_perftest", "-p", ps)
	waitTCP(t, port, srv, sout)
	cli, cout := e.start(t, "ucx_perftest client", e.Devs[1], ucxEnv(tls, e.Devs[1]),
		"ucx_perftest", "-p", ps, "-t", test, "-n", strconv.Itoa(iters), "-s", strconv.Itoa(size), "127.0.0.1")
	wait(t, cli, cout, 180*time.Second, "ucx_perftest client (server: "+sout.String()+")")
	wait(t, srv, sout, 30*time.Second, "ucx_perftest server")
	m := finalRow.FindStringSubmatch(cout.String())
	require.NotNil(t, m, "no Final row:\n%s", cout.String())
	var p Perf
	p.Iters, _ = strconv.Atoi(m[1])
	p.LatAvgUsec, _ = strconv.ParseFloat(m[3], 64)
	p.BWOverallMB, _ = strconv.ParseFloat(m[6], 64)
	p.RateOverall, _ = strconv.ParseFloat(m[8], 64)
	assert.Equal(t, iters, p.Iters, "iterations reported")
	sent, recv := e.packetsSince(t, before)
	assert.GreaterOrEqual(t, sent, uint64(iters), "packets the daemons sent for %d iterations", iters)
	assert.GreaterOrEqual(t, recv, uint64(iters), "packets the daemons received for %d iterations", iters)
	return p
}

var (
	gidHash    = regexp.MustCompile(`adding gid (\S+) to hash on device (\S+) port (\d+) index (\d+)`)
	ndevUnread = regexp.MustCompile(`failed to read \S*gid_attrs/ndevs/\d+[^\n]*`)
	cmAHAttr   = regexp.MustCompile(`ah_attr dlid=\d+ sl=\d+ port=(\d+) src_path_bits=\d+ dgid=(\S+) sgid_index=(\d+)`)
)

// IODemo runs UCX's io_demo with its data and transaction checks (-q):
// READ and WRITE requests of 1 B to 1 MiB on iters iterations, connected
// through UCX's rdma_cm connection manager (the server listens, the
// client connects to Addrs[0]). With debug it also checks that UCX's UD
// transport and its rdma_cm see the devices' GID 0 on port 1, and returns
// what they saw ("ud DEV GID" and "cm GID" entries).
func IODemo(t *testing.T, e Env, tls string, iters int, debug bool) map[string]bool {
	testenv.NeedTool(t, "io_demo")
	port, err := launch.FreeTCPPort()
	require.NoError(t, err)
	ps := strconv.Itoa(port)
	args := []string{"-q", "-p", ps, "-d", "1:1048576", "-o", "read,write"}
	var extra []string
	if debug {
		extra = append(extra, "UCX_LOG_LEVEL=debug")
	}
	before := e.counters(t)
	srv, sout := e.start(t, "io_demo server", e.Devs[0], ucxEnv(tls, e.Devs[0], extra...), append([]string{"io_demo"}, args...)...)
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(sout.String(), "started listener") {
		require.False(t, !srv.Running(), "io_demo server exited:\n%s", sout.String())
		require.True(t, time.Now().Before(deadline), "io_demo server does not listen:\n%s", sout.String())
		time.Sleep(20 * time.Millisecond)
	}
	cli, cout := e.start(t, "io_demo client", e.Devs[1], ucxEnv(tls, e.Devs[1], extra...),
		append(append([]string{"io_demo"}, args...), "-i", strconv.Itoa(iters), e.Addrs[0])...)
	wait(t, cli, cout, 180*time.Second, "io_demo client (server: "+tail(sout.String())+")")
	out := cout.String()
	assert.Contains(t, out, "Client exit with status 'OK'")
	assert.NotContains(t, out, "ERROR")
	assert.NotContains(t, sout.String(), "ERROR")
	srv.Stop(0, 10*time.Second)
	sent, recv := e.packetsSince(t, before)
	assert.GreaterOrEqual(t, sent, uint64(iters), "packets the daemons sent")
	assert.GreaterOrEqual(t, recv, uint64(iters), "packets the daemons received")
	seen := map[string]bool{}
	if debug {
		for _, m := range gidHash.FindAllStringSubmatch(sout.String()+out, -1) {
			if m[3] == "1" && m[4] == "0" {
				seen["ud "+m[2]+" "+m[1]] = true
			}
		}
		for _, m := range cmAHAttr.FindAllStringSubmatch(out, -1) {
			if m[1] == "1" && m[3] == "0" {
				seen["cm "+m[2]] = true
			}
		}
		// UCX reads the GID's net device from sysfs (ndevs) and says
		// so at DIAG level when it cannot.
		if m := ndevUnread.FindString(sout.String() + out); m != "" {
			seen["ndev unreadable: "+m] = true
		}
	}
	return seen
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

//go:embed testdata/mpi_check.c
var mpiCheck []byte

// MPIProgram builds mpi_check.c (testdata/) with mpicc into dir.
func MPIProgram(t *testing.T, dir string) string {
	mpicc := testenv.NeedTool(t, "mpicc")
	testenv.NeedTool(t, "mpirun")
	src := filepath.Join(dir, "mpi_check.c")
	require.NoError(t, os.WriteFile(src, mpiCheck, 0o644))
	bin := filepath.Join(dir, "mpi_check")
	out, err := exec.Command(mpicc, "-Wall", "-Wextra", "-Werror", "-O2", "-o", bin, src).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

var mpiOK = regexp.MustCompile(`mpi_check: OK ranks=(\d+) bytes=(\d+)`)

// MPI runs prog (MPIProgram) as an Open MPI job of 2*perDev ranks, perDev
// on each daemon, over pml ucx with UCX limited to tls (and self): the
// program checks every result, and the daemons must have carried at least
// a packet per MTU of what its ping-pong moved.
func MPI(t *testing.T, e Env, prog, tls string, perDev int) {
	mpirun := testenv.NeedTool(t, "mpirun")
	args := []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
		"--mca", "pml", "ucx", "--mca", "btl", "self", "--mca", "osc", "ucx",
		"-x", "UCX_TLS=" + tls + ",self", "-x", "UCX_WARN_UNUSED_ENV_VARS=n",
		// UCX before 1.20 takes a stale UD acknowledgement from before an
		// endpoint's reset for the new endpoint's (openucx/ucx#8743 and
		// #11107, fixed by #11092): a 4-rank job's wireup crashed in
		// uct_ud_ep_process_ack or in the wireup handler in about 1 of
		// 12 runs next to two CPU hogs, where verbs calls are slow and
		// UD's 10 ms timer resends; with a 100 ms tick, 25 of 25 ran.
		"-x", "UCX_UD_VERBS_TIMER_TICK=100ms"}
	for i, d := range e.Devs {
		if i > 0 {
			args = append(args, ":")
		}
		args = append(args, "-np", strconv.Itoa(perDev), e.VrnicRun)
		args = append(args, e.RunArgs...)
		args = append(args, "-d", d, prog)
	}
	const limit = 240 * time.Second
	var before [2]Counters
	var out *launch.Buffer
	for attempt := 1; ; attempt++ {
		before = e.counters(t)
		var p *launch.Proc
		p, out = startBin(t, "mpirun", mpirun, []string{"TMPDIR=" + t.TempDir()}, args...)
		if !p.Wait(limit) {
			p.Stop(0, 5*time.Second)
			require.Failf(t, "mpirun: no exit", "in %v:\n%s", limit, out.String())
		}
		if p.Err() == nil || attempt == KnownUCXAttempts || !udWireupCrash(out.String()) {
			require.NoError(t, p.Err(), "mpirun (attempt %d):\n%s", attempt, out.String())
			break
		}
		// One of UCX's UD wire-up defects (udWireupCrash), even with
		// the slower tick (seen with two CPU hogs and other jobs beside
		// the test): the job runs again, at most KnownUCXAttempts in
		// all, and only for these.
		t.Logf("known UCX defect (attempt %d): a rank crashed in UD wireup; running the job again:\n%s", attempt, out)
	}
	m := mpiOK.FindStringSubmatch(out.String())
	require.NotNil(t, m, "mpi_check did not report OK:\n%s", out.String())
	assert.Equal(t, strconv.Itoa(2*perDev), m[1], "ranks")
	moved, _ := strconv.ParseUint(m[2], 10, 64)
	sent, recv := e.packetsSince(t, before)
	assert.GreaterOrEqual(t, sent, moved/4096, "packets the daemons sent for %d bytes of ping-pong", moved)
	assert.GreaterOrEqual(t, recv, moved/4096, "packets the daemons received for %d bytes of ping-pong", moved)
}

// udWireupCrash tells whether mpirun's output out reports the
// stale-acknowledgement defect of UCX before 1.20 that MPI works around
// with its timer tick: a rank's segmentation fault while UCX's UD
// transport processed a received packet (uct_ud_ep_process_rx or
// uct_ud_ep_process_ack) inside MPI_Init, or in UCX's async thread, which
// progresses UD while the rank waits (the same crash: the wireup
// handler's read of a destination endpoint id from before the reset, at
// the same instruction of Debian's libucp; seen once in a loaded CI run),
// or UD's own assertion in
// uct_ud_ep_process_rx that an acknowledged PSN is behind the endpoint's
// current one ("acked_psn=3 must be smaller than current_psn=3": an
// acknowledgement of a packet the endpoint has not sent, that is one for
// the endpoint before its reset). Nothing else (another signal or
// assertion, a crash elsewhere, a wrong result) matches.
//
// Also UD's assertion that a connected endpoint's peer endpoint is the
// one a connection reply names (uct_ud_ep_rx_ctl, "ep->dest_ep_id ==
// ctl->conn_rep.src_ep_id": a CREP from another endpoint of the peer,
// openucx/ucx#6040, open upstream and reported on hardware). A rank can
// die before its message reaches mpirun's output; Debian's UCX 1.13.1
// makes that assertion's call at uct_ud_ep_process_rx+0x1147 (read from
// its libuct_ib.so.0), so that frame counts too.
func udWireupCrash(out string) bool {
	segv := strings.Contains(out, "Caught signal 11") &&
		(strings.Contains(out, "MPI_Init") || strings.Contains(out, "ucs_async_dispatch_handlers")) &&
		(strings.Contains(out, "uct_ud_ep_process_rx") || strings.Contains(out, "uct_ud_ep_process_ack"))
	staleAck := strings.Contains(out, "ud_ep.c") && strings.Contains(out, "acked_psn") &&
		strings.Contains(out, "must be smaller than current_psn") && strings.Contains(out, "uct_ud_ep_process_rx")
	crep := strings.Contains(out, "ep->dest_ep_id == ctl->conn_rep.src_ep_id") && strings.Contains(out, "ud_ep.c") ||
		strings.Contains(out, "libuct_ib.so.0(uct_ud_ep_process_rx+0x1147)")
	return segv || staleAck || crep
}

// KnownUCXDefect tells whether mpirun's output out shows one of the UCX
// defects an MPI job is run again for (udWireupCrash).
func KnownUCXDefect(out string) bool { return udWireupCrash(out) }

// KnownUCXAttempts is how many times in all an MPI job is run while each
// run fails with a known UCX defect (KnownUCXDefect): the third, whatever
// it shows, decides. Two of UCX 1.13's UD races have struck one job's two
// runs in a row on a loaded machine.
const KnownUCXAttempts = 3

// DevinfoGIDs returns "DEV GID" for each device's port 1 GID 0 as
// ibv_devinfo -v reports it through vrnic-run.
func DevinfoGIDs(t *testing.T, e Env) map[string]bool {
	p, out := e.start(t, "ibv_devinfo", "", nil, "ibv_devinfo", "-v")
	wait(t, p, out, 60*time.Second, "ibv_devinfo -v")
	gids := map[string]bool{}
	dev := ""
	gid0 := regexp.MustCompile(`^\s*GID\[\s*0\]:\s*(\S+?),`)
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "hca_id:" {
			dev = f[1]
		}
		if m := gid0.FindStringSubmatch(line); m != nil && dev != "" {
			gids[dev+" "+m[1]] = true
		}
	}
	return gids
}

// SameGIDs checks that UCX's UD transport and its rdma_cm (as IODemo saw
// them with debug) see the GIDs ibv_devinfo reports, and that UCX found
// each GID's net device (sysfs gid_attrs/ndevs).
func SameGIDs(t *testing.T, e Env, seen map[string]bool) {
	devinfo := DevinfoGIDs(t, e)
	for _, d := range e.Devs {
		want := fmt.Sprintf("%s ::ffff:%s", d, addrOf(e, d))
		assert.True(t, devinfo[want], "ibv_devinfo: %s not in %v", want, devinfo)
		assert.True(t, seen["ud "+want], "UCX ud_verbs: %s not in %v", want, seen)
	}
	assert.True(t, seen["cm ::ffff:"+e.Addrs[0]], "UCX's rdma_cm: the server's GID ::ffff:%s not in %v", e.Addrs[0], seen)
	for k := range seen {
		assert.False(t, strings.HasPrefix(k, "ndev unreadable"), "UCX found no net device for a GID: %s", k)
	}
}

func addrOf(e Env, dev string) string {
	for i, d := range e.Devs {
		if d == dev {
			return e.Addrs[i]
		}
	}
	return ""
}
