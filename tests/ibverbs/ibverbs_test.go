// Package ibverbs_test runs unmodified libibverbs programs (Debian's
// ibverbs-utils) on two vrnicd daemons through vrnic-run, which puts
// vrnic's libibverbs.so.1 in front of the system's.
package ibverbs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/cmprogs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// bin holds vrnicd and vrnic-run built once for the package; cache is
// vrnic-run's library cache.
var bin, cache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vrnic-ibverbs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, cache = filepath.Join(dir, "bin"), filepath.Join(dir, "cache")
	var out bytes.Buffer
	for _, c := range []struct{ pkg, name string }{{launch.VrnicdPackage, "vrnicd"}, {"github.com/vrnic/vrnic/cmd/vrnic-run", "vrnic-run"}} {
		if _, err := launch.GoBuild(c.pkg, bin, c.name, &out); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n%s", err, out.String())
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// pair is two daemons, a and b, in one runtime directory, on two loopback
// addresses over the UDP link.
type pair struct {
	dir    string
	a, b   *launch.Proc
	logs   [2]*launch.Buffer
	addr   [2]netip.Addr
	killed [2]bool // by kill: the clean-up expects no clean exit
}

func startPair(t *testing.T, daemonArgs ...string) *pair {
	t.Helper()
	return startPairArgs(t, daemonArgs, daemonArgs)
}

// startPairArgs is startPair with arguments of each daemon's own (a's,
// then b's).
func startPairArgs(t *testing.T, argsA, argsB []string) *pair {
	t.Helper()
	p := &pair{dir: t.TempDir()}
	a, b, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(t, err)
	p.addr = [2]netip.Addr{a, b}
	for i, name := range []string{"a", "b"} {
		p.logs[i] = &launch.Buffer{}
		args := []string{"-name", name, "-runtime-dir", p.dir, "-link", "udp", "-workers", "1",
			"-local", p.addr[i].String() + ":4791"}
		proc, err := launch.Start(launch.Spec{Name: "vrnicd " + name, Bin: filepath.Join(bin, "vrnicd"),
			Args: append(args, [][]string{argsA, argsB}[i]...), Stderr: p.logs[i]})
		require.NoError(t, err)
		t.Cleanup(func() {
			if err := proc.Stop(0, 10*time.Second); !p.killed[i] && (err != nil || proc.Killed()) {
				t.Errorf("vrnicd %s: stop: %v (killed %v); log:\n%s", name, err, proc.Killed(), p.logs[i].String())
			}
		})
		require.NoError(t, launch.WaitReady(context.Background(), proc, admin.SocketPath(p.dir, name), 15*time.Second))
		if i == 0 {
			p.a = proc
		} else {
			p.b = proc
		}
	}
	return p
}

// kill kills daemon i (0: a, 1: b) with SIGKILL and waits until it is gone.
func (p *pair) kill(t *testing.T, i int) {
	t.Helper()
	proc := []*launch.Proc{p.a, p.b}[i]
	p.killed[i] = true
	require.NoError(t, proc.Cmd.Process.Signal(syscall.SIGKILL))
	require.True(t, proc.Wait(10*time.Second), "vrnicd still running after SIGKILL")
}

func (p *pair) daemonLogs() string {
	return "vrnicd a:\n" + p.logs[0].String() + p.counters("a") + "\nvrnicd b:\n" + p.logs[1].String() + p.counters("b")
}

// counters returns daemon name's device counters (retransmissions,
// timeouts, NAKs, drops by reason, link errors) as JSON, for a failure
// report: what a lost completion left behind.
func (p *pair) counters(name string) string {
	info, err := admin.Serving(admin.SocketPath(p.dir, name))
	if err != nil {
		return fmt.Sprintf("counters: %v\n", err)
	}
	b, err := json.Marshal(struct {
		DataPath      admin.QPCounters   `json:"data_path"`
		Wire          admin.WireCounters `json:"wire"`
		LastLinkError string             `json:"last_link_error,omitempty"`
		Counters      map[string]int64   `json:"counters"`
	}{info.DataPath, info.Wire, info.LastLinkError, info.Counters})
	if err != nil {
		return fmt.Sprintf("counters: %v\n", err)
	}
	return "counters: " + string(b) + "\n"
}

// run runs PROGRAM ARGS through vrnic-run on p's daemons and waits up to
// timeout; it returns the combined output and the exit error.
func (p *pair) run(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	return p.runEnv(t, timeout, nil, args...)
}

// runEnv is run with env added to the environment.
func (p *pair) runEnv(t *testing.T, timeout time.Duration, env []string, args ...string) (string, error) {
	t.Helper()
	proc, out := p.startEnv(t, "run", env, args...)
	if !proc.Wait(timeout) {
		proc.Stop(0, 5*time.Second)
		return out.String(), fmt.Errorf("%s: no exit in %v", strings.Join(args, " "), timeout)
	}
	return out.String(), proc.Err()
}

func (p *pair) start(t *testing.T, name string, args ...string) (*launch.Proc, *launch.Buffer) {
	t.Helper()
	return p.startEnv(t, name, nil, args...)
}

func (p *pair) startEnv(t *testing.T, name string, env []string, args ...string) (*launch.Proc, *launch.Buffer) {
	t.Helper()
	out := &launch.Buffer{}
	return p.startTo(t, name, env, out, out, args...), out
}

// startTo starts PROGRAM ARGS through vrnic-run with its standard output
// and error going to stdout and stderr.
func (p *pair) startTo(t *testing.T, name string, env []string, stdout, stderr *launch.Buffer, args ...string) *launch.Proc {
	t.Helper()
	full := append([]string{"-runtime-dir", p.dir, "-cache-dir", cache}, args...)
	proc, err := launch.Start(launch.Spec{Name: name, Bin: filepath.Join(bin, "vrnic-run"), Args: full,
		Env: env, Stdout: stdout, Stderr: stderr})
	require.NoError(t, err)
	t.Cleanup(func() { proc.Stop(0, 5*time.Second) })
	return proc
}

func TestDevices(t *testing.T) {
	testenv.NeedTool(t, "cc")
	testenv.NeedTool(t, "ibv_devices")
	testenv.NeedTool(t, "ibv_devinfo")
	p := startPair(t)

	out, err := p.run(t, 60*time.Second, "ibv_devices")
	require.NoError(t, err, out)
	assert.Regexp(t, `(?m)^\s+a\s+[0-9a-f]{16}$`, out)
	assert.Regexp(t, `(?m)^\s+b\s+[0-9a-f]{16}$`, out)

	out, err = p.run(t, 30*time.Second, "ibv_devinfo", "-v")
	require.NoError(t, err, out)
	assert.Contains(t, out, "hca_id:\ta\n")
	assert.Contains(t, out, "hca_id:\tb\n")
	assert.Equal(t, 2, strings.Count(out, "state:\t\t\tPORT_ACTIVE (4)"), out)
	assert.Equal(t, 2, strings.Count(out, "link_layer:\t\tEthernet"), out)
	assert.Contains(t, out, "::ffff:"+p.addr[0].String()+", RoCE v2")
	assert.Contains(t, out, "::ffff:"+p.addr[1].String()+", RoCE v2")

	// -d restricts the list to one device.
	out, err = p.run(t, 30*time.Second, "-d", "b", "ibv_devinfo")
	require.NoError(t, err, out)
	assert.NotContains(t, out, "hca_id:\ta\n")
	assert.Contains(t, out, "hca_id:\tb\n")

	// A device that does not exist: no devices, the program says so.
	out, err = p.run(t, 30*time.Second, "-d", "nosuch", "ibv_devinfo")
	assert.Error(t, err)
	assert.Contains(t, out, "No IB devices found")
}

// freeTCPPort returns a TCP port nobody listens on now.
func freeTCPPort(t *testing.T) int {
	port, err := launch.FreeTCPPort()
	require.NoError(t, err)
	return port
}

func listening(port int) bool { return launch.TCPListening(port) }

// pingpong runs prog ARGS as server on device a and as client on device
// b (connecting to a's address) and returns both outputs. GID index 0 is
// named with gidFlag (-g for the pingpongs, -x for perftest).
func pingpong(t *testing.T, p *pair, prog, gidFlag string, args ...string) (server, client string) {
	t.Helper()
	// perftest's latency tests time with the CPU's cycle counter and
	// measure its frequency first; on a loaded machine that measurement
	// fails ("Correlation coefficient r^2: ... < 0.9") and the tool
	// reports inf for every figure. That is the tool's clock, not vrnic:
	// run again (a few times at most).
	for try := 1; ; try++ {
		var again bool
		server, client, again = pingpongOnce(t, p, prog, gidFlag, try < 3, args...)
		if !again {
			return server, client
		}
		t.Logf("%s: perftest's cycle-counter calibration failed (try %d), running again", prog, try)
	}
}

// pingpongOnce runs the pair once; with mayRetry, a run in which perftest's
// calibration failed returns again = true instead of failing the test.
func pingpongOnce(t *testing.T, p *pair, prog, gidFlag string, mayRetry bool, args ...string) (server, client string, again bool) {
	t.Helper()
	port := strconv.Itoa(freeTCPPort(t))
	sargs := append([]string{prog, "-d", "a", gidFlag, "0", "-p", port}, args...)
	srv, sout := p.start(t, "server", sargs...)
	deadline := time.Now().Add(60 * time.Second) // the first run may build the library
	for !listening(mustAtoi(port)) {
		if !srv.Running() || time.Now().After(deadline) {
			t.Fatalf("%s server did not listen on port %s:\n%s", prog, port, sout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cargs := append([]string{prog, "-d", "b", gidFlag, "0", "-p", port}, args...)
	cargs = append(cargs, p.addr[0].String())
	cout, err := p.run(t, 60*time.Second, cargs...)
	if mayRetry && (strings.Contains(cout, cmprogs.CalibrationFailed) || strings.Contains(sout.String(), cmprogs.CalibrationFailed)) {
		srv.Stop(0, 5*time.Second)
		return sout.String(), cout, true
	}
	require.NoError(t, err, "client: %s\nserver: %s\n%s", cout, sout.String(), p.daemonLogs())
	require.True(t, srv.Wait(30*time.Second), "server did not exit: %s", sout.String())
	require.NoError(t, srv.Err(), "server: %s", sout.String())
	if mayRetry && strings.Contains(sout.String(), cmprogs.CalibrationFailed) {
		return sout.String(), cout, true
	}
	return sout.String(), cout, false
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

func TestPingpong(t *testing.T) {
	testenv.NeedTool(t, "cc")
	testenv.NeedTool(t, "ibv_rc_pingpong")
	testenv.NeedTool(t, "ibv_srq_pingpong")
	testenv.NeedTool(t, "ibv_ud_pingpong")
	testenv.NeedTool(t, "ibv_uc_pingpong")
	p := startPair(t)
	for _, tc := range []struct {
		prog string
		args []string
	}{
		{"ibv_rc_pingpong", []string{"-s", "1", "-n", "200", "-c"}},
		{"ibv_rc_pingpong", []string{"-s", "4096", "-n", "200", "-c"}},
		{"ibv_rc_pingpong", []string{"-s", "65536", "-n", "100", "-c"}},
		{"ibv_rc_pingpong", []string{"-e", "-n", "200", "-c"}},
		// -N: the ibv_wr_* API of ibv_qp_ex (ibv_create_qp_ex with send_ops_flags).
		{"ibv_rc_pingpong", []string{"-N", "-s", "8192", "-n", "200", "-c"}},
		{"ibv_srq_pingpong", []string{"-n", "200"}},
		{"ibv_srq_pingpong", []string{"-e", "-n", "200"}},
		// UD: one packet per message, at most the MTU (4096); the
		// receive buffers hold the 40-byte GRH first.
		{"ibv_ud_pingpong", []string{"-s", "1", "-n", "200", "-c"}},
		{"ibv_ud_pingpong", []string{"-s", "1000", "-n", "200", "-c"}},
		{"ibv_ud_pingpong", []string{"-s", "4096", "-n", "200", "-c"}},
		{"ibv_ud_pingpong", []string{"-e", "-n", "200", "-c"}},
		{"ibv_uc_pingpong", []string{"-s", "1", "-n", "200", "-c"}},
		{"ibv_uc_pingpong", []string{"-s", "65536", "-n", "100", "-c"}},
		{"ibv_uc_pingpong", []string{"-e", "-n", "200", "-c"}},
	} {
		t.Run(tc.prog+strings.Join(tc.args, "_"), func(t *testing.T) {
			s, c := pingpong(t, p, tc.prog, "-g", tc.args...)
			for _, out := range []string{s, c} {
				assert.Regexp(t, `(?m)^\d+ bytes in [0-9.]+ seconds = `, out)
				assert.Regexp(t, `(?m)^\d+ iters in [0-9.]+ seconds = `, out)
				assert.Contains(t, out, "GID ::ffff:"+p.addr[0].String())
			}
		})
	}
}

// reportRow is one line of a perftest report: message size, iterations
// and the figures (bandwidth: peak MB/s, average MB/s, Mpps; latency:
// min, max, typical, average, stdev, 99 %, 99.9 % in µs).
type reportRow struct {
	size, iters int
	figs        []float64
}

// A latency report's standard deviation may be "-nan": perftest takes the
// square root of a variance that rounding made negative when a run has an
// outlier (a loaded machine); it is a figure nothing here checks.
var reportLine = regexp.MustCompile(`(?m)^ (\d+)[ \t]+(\d+)((?:[ \t]+(?:[0-9.]+|-?nan))+)[ \t]*$`)

// parseReport returns the report lines of perftest output.
func parseReport(out string) []reportRow {
	var rows []reportRow
	for _, m := range reportLine.FindAllStringSubmatch(out, -1) {
		r := reportRow{size: mustAtoi(m[1]), iters: mustAtoi(m[2])}
		for _, f := range strings.Fields(m[3]) {
			v, err := strconv.ParseFloat(strings.TrimPrefix(f, "-"), 64)
			if err != nil {
				panic(err)
			}
			r.figs = append(r.figs, v)
		}
		rows = append(rows, r)
	}
	return rows
}

// checkReport asserts that out holds one report line per size in sizes,
// in order, each with iters iterations and the figures of its kind, all
// positive (a bandwidth test's peak may be 0 when a size's whole run fits
// in one measurement interval, and its average, printed in MB/s with two
// decimals, is 0.00 for tiny messages at a low rate: its message rate is
// what must be positive).
func checkReport(t *testing.T, who, out string, bw bool, iters int, sizes ...int) {
	t.Helper()
	rows := parseReport(out)
	got := make([]int, len(rows))
	for i, r := range rows {
		got[i] = r.size
	}
	if !assert.Equal(t, sizes, got, "%s: report sizes:\n%s", who, out) {
		return
	}
	nfig, positive := 7, []int{0, 1, 2, 3} // min, max, typical, average
	if bw {
		nfig, positive = 3, []int{2} // Mpps
	}
	for _, r := range rows {
		assert.Equal(t, iters, r.iters, "%s: size %d: iterations", who, r.size)
		if assert.Len(t, r.figs, nfig, "%s: size %d: figures", who, r.size) {
			for _, i := range positive {
				assert.Positive(t, r.figs[i], "%s: size %d: figure %d of %v", who, r.size, i, r.figs)
			}
		}
	}
}

// allSizes are the sizes of perftest's -a: 2 .. 2^23.
func allSizes() []int {
	var s []int
	for n := 2; n <= 1<<23; n *= 2 {
		s = append(s, n)
	}
	return s
}

// udSizes are the sizes of perftest's -a over UD: 2 .. the MTU (4096).
func udSizes() []int { return allSizes()[:12] }

// TestPerftest runs perftest's RC tests at several sizes, with -a, with
// completion events (-e, where the tool has it) and with 4 QPs (-q 4),
// and its UD (SEND) and UC (SEND, WRITE) tests.
// perftest uses the ibv_wr_* API only on devices it recognizes, so these
// go through ibv_post_send. Every run must exit 0 on both sides and
// print its report: one line per size with the iterations asked for
// (times the QPs) and positive figures.
func TestPerftest(t *testing.T) {
	testenv.NeedTool(t, "cc")
	p := startPair(t)
	for _, tc := range []struct {
		prog  string
		args  []string
		iters int   // per line of the report
		sizes []int // the report's sizes; nil: the -s given, else the default
	}{
		{"ib_write_bw", []string{"-n", "500", "-s", "8"}, 500, nil},
		{"ib_write_bw", []string{"-n", "300", "-s", "4096"}, 300, nil},
		{"ib_write_bw", []string{"-n", "300"}, 300, []int{65536}},
		{"ib_write_bw", []string{"-n", "40", "-s", "1048576"}, 40, nil},
		{"ib_write_bw", []string{"-n", "20", "-a"}, 20, allSizes()},
		{"ib_write_bw", []string{"-n", "100", "-q", "4", "-s", "16384"}, 400, nil},
		{"ib_read_bw", []string{"-n", "500", "-s", "8"}, 500, nil},
		{"ib_read_bw", []string{"-n", "300", "-s", "4096"}, 300, nil},
		{"ib_read_bw", []string{"-n", "300"}, 300, []int{65536}},
		{"ib_read_bw", []string{"-n", "200", "-e"}, 200, []int{65536}},
		{"ib_send_bw", []string{"-n", "500", "-s", "8"}, 500, nil},
		{"ib_send_bw", []string{"-n", "300", "-s", "4096"}, 300, nil},
		{"ib_send_bw", []string{"-n", "300"}, 300, []int{65536}},
		{"ib_send_bw", []string{"-n", "100", "-q", "4"}, 400, []int{65536}},
		{"ib_send_bw", []string{"-n", "300", "-s", "1048576", "-e"}, 300, nil},
		// Atomics are 8 bytes: no -s; both operations instead.
		{"ib_atomic_bw", []string{"-n", "500"}, 500, []int{8}},
		{"ib_atomic_bw", []string{"-n", "500", "-A", "CMP_AND_SWAP"}, 500, []int{8}},
		{"ib_atomic_bw", []string{"-n", "300", "-e"}, 300, []int{8}},
		{"ib_write_lat", []string{"-n", "300"}, 300, []int{2}},
		{"ib_write_lat", []string{"-n", "300", "-s", "64"}, 300, nil},
		{"ib_write_lat", []string{"-n", "200", "-s", "65536"}, 200, nil},
		{"ib_read_lat", []string{"-n", "300"}, 300, []int{2}},
		{"ib_read_lat", []string{"-n", "300", "-s", "4096"}, 300, nil},
		{"ib_read_lat", []string{"-n", "200", "-s", "65536"}, 200, nil},
		{"ib_read_lat", []string{"-n", "300", "-e"}, 300, []int{2}},
		{"ib_send_lat", []string{"-n", "300"}, 300, []int{2}},
		{"ib_send_lat", []string{"-n", "300", "-s", "4096"}, 300, nil},
		{"ib_send_lat", []string{"-n", "200", "-s", "65536"}, 200, nil},
		// UD (-c UD): SEND only, messages up to the MTU (4096); the
		// passive side of -a reports every size. UC: SEND and WRITE.
		{"ib_send_bw", []string{"-c", "UD", "-n", "500", "-s", "8"}, 500, nil},
		{"ib_send_bw", []string{"-c", "UD", "-n", "300", "-s", "4096", "-e"}, 300, nil},
		{"ib_send_bw", []string{"-c", "UD", "-n", "100", "-a"}, 100, udSizes()},
		{"ib_send_lat", []string{"-c", "UD", "-n", "300"}, 300, []int{2}},
		{"ib_send_lat", []string{"-c", "UD", "-n", "200", "-s", "4096"}, 200, nil},
		{"ib_send_bw", []string{"-c", "UC", "-n", "300", "-s", "4096"}, 300, nil},
		// UC has no recovery: a SEND whose frames the receiving daemon's
		// socket could not hold (the sender is never held back) is gone,
		// and the server waits for it for ever. 20 SENDs of 64 KiB (320
		// frames) fit the receive buffer whole however late the daemon
		// reads; 200 (12.8 MB) did not when the machine was busy.
		{"ib_send_bw", []string{"-c", "UC", "-n", "20", "-s", "65536", "-e"}, 20, nil},
		{"ib_write_bw", []string{"-c", "UC", "-n", "300", "-s", "65536"}, 300, nil},
		{"ib_write_bw", []string{"-c", "UC", "-n", "200", "-q", "2", "-s", "8"}, 400, nil},
		{"ib_write_lat", []string{"-c", "UC", "-n", "300", "-s", "64"}, 300, nil},
		{"ib_write_lat", []string{"-c", "UC", "-n", "200", "-s", "65536"}, 200, nil},
		// Not ib_send_lat -e: after each completion event it polls the CQ
		// it waits on once and reads the work completion even when that
		// poll returned 0. Its send and receive CQs share the channel, so
		// when the peer's reply arrives before the ACK of its own SEND
		// the event is the receive CQ's, and it fails on an uninitialized
		// status (one run in five or so here; "Failed status 976236602").
	} {
		t.Run(tc.prog+strings.Join(tc.args, "_"), func(t *testing.T) {
			testenv.NeedTool(t, tc.prog)
			sizes := tc.sizes
			if sizes == nil {
				sizes = []int{mustAtoi(tc.args[slices.Index(tc.args, "-s")+1])}
			}
			s, c := pingpong(t, p, tc.prog, "-x", tc.args...)
			bw := strings.HasSuffix(tc.prog, "_bw")
			checkReport(t, "client", c, bw, tc.iters, sizes...)
			if bw {
				if slices.Contains(tc.args, "-a") && !slices.Contains(tc.args, "UD") {
					sizes = sizes[len(sizes)-1:] // the passive side of -a reports the last size only
				}
				checkReport(t, "server", s, bw, tc.iters, sizes...)
			}
		})
	}
}

// TestSanitizedPingpong builds the library with AddressSanitizer and
// UBSan and runs ibv_rc_pingpong with it. The programs are not built with
// ASan, so its runtime is preloaded; leak checking is off (the programs
// exit without freeing everything).
func TestSanitizedPingpong(t *testing.T) {
	pp := testenv.NeedTool(t, "ibv_rc_pingpong")
	p := startPair(t)
	start := sanitized(t, p, pp)
	port := strconv.Itoa(freeTCPPort(t))
	srv, sout := start("server", nil, "-d", "a", "-g", "0", "-p", port, "-n", "100", "-s", "8192", "-c")
	deadline := time.Now().Add(30 * time.Second)
	for !listening(mustAtoi(port)) {
		require.True(t, srv.Running() && time.Now().Before(deadline), "server: %s", sout.String())
		time.Sleep(20 * time.Millisecond)
	}
	cli, cout := start("client", nil, "-d", "b", "-g", "0", "-p", port, "-n", "100", "-s", "8192", "-c", p.addr[0].String())
	sanitizedExit(t, srv, sout, cli, cout)
	for _, o := range []string{sout.String(), cout.String()} {
		assert.Regexp(t, `(?m)^\d+ bytes in `, o)
	}
}

// sanitizedExit waits for a sanitized client and server to exit 0 with
// no AddressSanitizer or UBSan report.
func sanitizedExit(t *testing.T, srv *launch.Proc, sout *launch.Buffer, cli *launch.Proc, cout *launch.Buffer) {
	t.Helper()
	require.True(t, cli.Wait(60*time.Second), "client hangs: %s", cout.String())
	require.True(t, srv.Wait(30*time.Second), "server hangs: %s", sout.String())
	require.NoError(t, cli.Err(), "client: %s\nserver: %s", cout.String(), sout.String())
	require.NoError(t, srv.Err(), "server: %s", sout.String())
	for _, o := range []string{sout.String(), cout.String()} {
		assert.NotContains(t, o, "ERROR: AddressSanitizer")
		assert.NotContains(t, o, "runtime error:")
	}
}

// sanitized builds the libraries with AddressSanitizer and UBSan and
// returns a starter of prog (with extra environment) that loads them,
// its ASan runtime preloaded, on p's daemons.
func sanitized(t *testing.T, p *pair, prog string) func(name string, env []string, args ...string) (*launch.Proc, *launch.Buffer) {
	cc := testenv.NeedTool(t, "cc")
	libasan, err := exec.Command(cc, "-print-file-name=libasan.so").Output()
	require.NoError(t, err)
	asan := strings.TrimSpace(string(libasan))
	if _, err := os.Stat(asan); err != nil {
		testenv.Need(t, false, "libasan.so not found: "+asan)
	}
	out, err := exec.Command(filepath.Join(bin, "vrnic-run"), "-cache-dir", cache, "-sanitize", "address,undefined", "-build-only").CombinedOutput()
	require.NoError(t, err, "%s", out)
	libDir := strings.TrimSpace(string(out))
	require.FileExists(t, filepath.Join(libDir, "libibverbs.so.1"))
	base := []string{"LD_LIBRARY_PATH=" + libDir, "LD_PRELOAD=" + asan, "VRNIC_RUNTIME_DIR=" + p.dir,
		"ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:exitcode=99", "UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1"}
	return func(name string, env []string, args ...string) (*launch.Proc, *launch.Buffer) {
		o := &launch.Buffer{}
		proc, err := launch.Start(launch.Spec{Name: name, Bin: prog, Args: args, Env: append(append([]string{}, base...), env...),
			Stdout: o, Stderr: o})
		require.NoError(t, err)
		t.Cleanup(func() { proc.Stop(0, 5*time.Second) })
		return proc, o
	}
}

// buildC compiles testdata/src, a program written against
// <infiniband/verbs.h> only, with -Wall -Wextra -Werror and flags, into
// the test's temporary directory; it skips when libibverbs-dev is missing.
func buildC(t *testing.T, src string, flags ...string) string {
	t.Helper()
	return buildCLibs(t, src, []string{"-libverbs"}, flags...)
}

// buildCLibs is buildC linking libs (e.g. -lrdmacm -libverbs); it skips
// when a header of libibverbs-dev or librdmacm-dev is missing.
func buildCLibs(t *testing.T, src string, libs []string, flags ...string) string {
	t.Helper()
	cc := testenv.NeedTool(t, "cc")
	prog := filepath.Join(t.TempDir(), strings.TrimSuffix(src, ".c"))
	args := append([]string{"-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-o", prog}, flags...)
	args = append(append(args, filepath.Join("testdata", src)), libs...)
	out, err := exec.Command(cc, args...).CombinedOutput()
	testenv.Need(t, err == nil || !strings.Contains(string(out), "infiniband/verbs.h"), "libibverbs-dev not installed")
	testenv.Need(t, err == nil || !strings.Contains(string(out), "rdma/rdma_cma.h"), "librdmacm-dev not installed")
	require.NoError(t, err, "%s", out)
	return prog
}

// sanitizers are the flags of the ASan+UBSan builds of the test programs;
// sanitizerEnv makes a finding fail the run with its own exit code.
var (
	sanitizers   = []string{"-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"}
	sanitizerEnv = []string{"ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=99", "UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1"}
)

// TestMemOps builds testdata/mem_ops.c and runs it through vrnic-run: it
// registers heap, stack and mmap memory in place on two devices and runs
// SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ, CMP_AND_SWP and
// FETCH_AND_ADD between them, checking every byte of the buffers and every
// defined field of every completion. The second run is the program built
// with ASan and UBSan, on the library built the same way.
func TestMemOps(t *testing.T) {
	runOps(t, startPair(t), "mem_ops.c",
		"OK send send_imm write write_imm read cmp_swap fetch_add, 20000 bytes (heap, stack, mmap); async QP_ACCESS_ERR\n")
}

// TestUDOps builds testdata/ud_ops.c and runs it as TestMemOps runs
// mem_ops.c: UD SEND and SEND_WITH_IMM (ibv_post_send and ibv_wr_*) with
// the GRH checked byte for byte against the two daemons' addresses,
// src_qp, wc_flags and byte_len; an answer through
// ibv_create_ah_from_wc; Q_Key mismatches dropped; an AH and an RTR AV
// with flow_label 0xffffffff (the GRH unchanged over IPv4), sgid_index
// errors EINVAL and ENODATA; a send error putting
// the QP in SQE and back to RTS; a UC WRITE_WITH_IMM.
func TestUDOps(t *testing.T) {
	runOps(t, startPair(t), "ud_ops.c", "OK ud send send_imm grh ah_from_wc qkey_drop flow_label sqe, uc write_imm\n")
}

// TestDomains builds testdata/domain.c and runs it as TestMemOps runs
// mem_ops.c: a parent domain with allocators gives the rings of an
// extended CQ, an SRQ and two RC QPs (each allocator call and each free
// checked), SEND and RDMA WRITE run both ways against the other daemon
// with every byte checked; thread and protection domains under a parent
// domain are busy; bad attributes are EINVAL, an empty allocator ENOMEM.
func TestDomains(t *testing.T) {
	runOps(t, startPair(t), "domain.c", "OK parent_domain td allocators traffic busy errors\n")
}

// TestXRC builds testdata/xrc.c and runs it as TestMemOps runs
// mem_ops.c: one XRC initiator QP on daemon a sending to two XRC SRQs
// behind one target QP on daemon b (SEND, SEND_WITH_IMM, WRITE, READ and
// both atomics, every byte and completion field; each receive in its SRQ's
// CQ), REM_INV_REQ_ERR for an SRQ of another domain or none, and the
// domain rules (EBUSY, ENOENT, EEXIST, EINVAL for another context's
// domain, sharing by file).
func TestXRC(t *testing.T) {
	runOps(t, startPair(t), "xrc.c",
		"OK xrc send send_imm write read fetch_add cmp_swap, foreign_srq no_srq, ebusy enoent eexist einval shared\n")
}

// TestTimestamps builds testdata/ts.c and runs it as TestMemOps runs
// mem_ops.c: completion timestamps (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
// and _WALLCLOCK) within the program's own clock readings around an RC
// exchange, the receive's before the send's, carried over a resize;
// ibv_query_rt_values_ex and the clock's attributes.
func TestTimestamps(t *testing.T) {
	runOps(t, startPair(t), "ts.c", "OK caps rt_values send_recv resize\n")
}

// TestAtomicWrite builds testdata/atomic_write.c and runs it as TestMemOps
// runs mem_ops.c: RDMA ATOMIC WRITE through ibv_wr_atomic_write and
// ibv_post_send, the word and its neighbours checked, the device's
// placement capabilities, and the errors (no remote write: REM_ACCESS_ERR;
// misaligned: REM_INV_REQ_ERR; FLUSH_PERSISTENT registration: EOPNOTSUPP).
func TestAtomicWrite(t *testing.T) {
	runOps(t, startPair(t), "atomic_write.c", "OK caps wr_atomic_write post_send rem_access misaligned\n")
}

// runOps builds the test program src and runs it on p's daemons, plain,
// then built with ASan and UBSan on the library built the same way; its
// output must be want.
func runOps(t *testing.T, p *pair, src, want string) {
	t.Run("plain", func(t *testing.T) {
		got, err := p.run(t, 60*time.Second, buildC(t, src))
		require.NoError(t, err, "%s\n%s", got, p.daemonLogs())
		assert.Equal(t, want, got)
	})
	t.Run("sanitized", func(t *testing.T) {
		prog := buildC(t, src, sanitizers...)
		got, err := p.runEnv(t, 120*time.Second, sanitizerEnv, "-sanitize", "address,undefined", prog)
		require.NoError(t, err, "%s\n%s", got, p.daemonLogs())
		assert.Equal(t, want, got)
	})
}

// TestBadInput runs testdata/bad_input.c (plain, then with ASan and UBSan
// on the sanitized library): NULL objects where libibverbs accepts them,
// registrations of unmapped, PROT_NONE and read-only memory, more work
// requests than a queue holds, invalid QP and CQ attributes; each must
// fail with its errno and nothing else. Then the program streams RDMA
// WRITEs and, once it printed READY, daemon a is killed with SIGKILL: the
// program must notice (poll and post fail with EIO, a completion channel
// wait returns, IBV_EVENT_DEVICE_FATAL), destroy everything and exit 0.
func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		run   []string
		env   []string
	}{
		{"plain", nil, nil, nil},
		{"sanitized", sanitizers, []string{"-sanitize", "address,undefined"}, sanitizerEnv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := buildC(t, "bad_input.c", tc.flags...)
			p := startPair(t)
			proc, out := p.startEnv(t, "bad_input", tc.env, append(tc.run, prog, "a", "b")...)
			deadline := time.Now().Add(60 * time.Second)
			for !strings.Contains(out.String(), "READY\n") {
				require.True(t, proc.Running() && time.Now().Before(deadline), "no READY:\n%s\n%s", out.String(), p.daemonLogs())
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond) // mid-run: WRITEs are flowing
			p.kill(t, 0)
			require.True(t, proc.Wait(30*time.Second), "the program hangs after the daemon was killed:\n%s", out.String())
			got := out.String()
			require.NoError(t, proc.Err(), "%s\n%s", got, p.daemonLogs())
			assert.NotContains(t, got, "ERROR")
			assert.True(t, strings.HasSuffix(got, "\nOK\n"), "%s", got)
			for _, want := range []string{
				"ok registration: read-only memory with IBV_ACCESS_LOCAL_WRITE",
				"ok queue overflow: *bad_wr is the first WR not posted",
				"ok QP attributes: the QP stayed in INIT",
				"ok QP attributes: a CQ on completion vector num_comp_vectors",
				"ok QP attributes: phys_port_cnt_ex is the port count",
				"ok QP attributes: ibv_post_recv in RESET",
				"ok QP attributes: ibv_post_send in INIT",
				"ok registration: IBV_ACCESS_HUGETLB is accepted",
				"ok kernel inputs: RTR to RTS with PATH_MIG_STATE MIGRATED",
				"ok kernel inputs: the QP is in SQD, its path MIGRATED",
				"ok kernel inputs: an SRQ with srq_limit above max_wr",
				"ok kernel inputs: a QP with an SRQ and max_recv_wr 2^30",
				"ok kernel inputs: ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS 0",
				"ok daemon killed: ibv_post_send fails",
				"ok daemon killed: ibv_get_async_event: IBV_EVENT_DEVICE_FATAL",
				"ok daemon killed: A's objects destroyed, A closed",
			} {
				assert.Contains(t, got, want)
			}
			t.Logf("%s", regexp.MustCompile(`(?m)^ok daemon killed: \d+ WRITEs.*$`).FindString(got))
		})
	}
}

// TestPostSyscalls counts the system calls of a thread posting 50000 RDMA
// WRITEs through the library (testdata/post_syscalls.c, perf events on
// the raw_syscalls:sys_enter and syscalls:sys_enter_write tracepoints of
// that thread). Posting makes no system call of its own: every call in
// the window is a write(2) of the daemon's kick eventfd, made only when
// the daemon's doorbell page says it sleeps. The daemons keep polling
// for 50 ms after the last traffic (-poll-spin): on this machine two
// daemons and a posting and a polling thread share two cores, and the
// client's pauses between posts reach several milliseconds under the
// scheduler's time slices (with the default 1 ms a third to two thirds
// of the WQEs found the poller asleep). So the count is of a daemon that
// polls, and posting must then cost nothing.
func TestPostSyscalls(t *testing.T) {
	testenv.NeedRoot(t, "per-thread perf events on syscall tracepoints need root (or perf_event_paranoid <= 1 and a readable tracefs)")
	prog := buildC(t, "post_syscalls.c", "-pthread")
	p := startPair(t, "-poll-spin", "50ms")
	before, err := admin.Serving(admin.SocketPath(p.dir, "a"))
	require.NoError(t, err)
	out, err := p.run(t, 120*time.Second, prog, "a", "b", "50000")
	require.NoError(t, err, "%s\n%s", out, p.daemonLogs())
	if strings.HasPrefix(out, "SKIP ") {
		testenv.Need(t, false, strings.TrimSpace(out))
	}
	after, err := admin.Serving(admin.SocketPath(p.dir, "a"))
	require.NoError(t, err)
	m := regexp.MustCompile(`^WQES (\d+) SYSCALLS (\d+) KICKS (\d+)\n$`).FindStringSubmatch(out)
	require.NotNil(t, m, "%s", out)
	wqes, calls, kicks := mustAtoi(m[1]), mustAtoi(m[2]), mustAtoi(m[3])
	assert.Equal(t, kicks, calls, "system calls besides the kicks while posting %d WQEs", wqes)
	// A post kicks only when the poller said it was going to sleep
	// (kick_needed): each sleep, or each re-check before one, allows one
	// kick. How often it slept is the scheduler's doing (a poller kept off
	// the CPU for its whole spin stops spinning: at load 13 one post in 20
	// kicked); that posting costs no system call while it polls is not,
	// and this holds whatever the load.
	sleeps := after.Doorbells.Sleeps - before.Doorbells.Sleeps
	rechecks := after.Doorbells.Rechecks - before.Doorbells.Rechecks
	assert.LessOrEqual(t, uint64(kicks), sleeps+rechecks, "kicks beyond the poller's sleeps (%d) and re-checks (%d)", sleeps, rechecks)
	assert.Less(t, kicks, wqes/10, "a kick per post or so")
	t.Logf("%d WQEs: %d system calls, all kicks (%.3f per WQE); other system calls per WQE: %.4f; the poller slept %d times, re-checked %d",
		wqes, calls, float64(kicks)/float64(wqes), float64(calls-kicks)/float64(wqes), sleeps, rechecks)
}

// TestParseReportNaN: a latency line whose stdev perftest printed as
// -nan is still a report line, its other figures read.
func TestParseReportNaN(t *testing.T) {
	rows := parseReport(" 64       1000          3.21           101.52       4.02                4.51             -nan      12.30     101.52  \n")
	require.Len(t, rows, 1)
	assert.Equal(t, 64, rows[0].size)
	assert.Len(t, rows[0].figs, 7)
	assert.InDelta(t, 3.21, rows[0].figs[0], 1e-9)
	assert.True(t, math.IsNaN(rows[0].figs[4]))
}

// TestODP builds testdata/odp.c and runs it as TestMemOps runs mem_ops.c:
// on-demand paging through the verbs API between two daemons. odp_caps;
// an explicit ODP MR on one side and an implicit one (memory mapped after
// it) on the other, with SEND, WRITE, READ and both atomics byte-checked;
// a page replaced under the MR seen with its new contents; ibv_advise_mr
// and its errnos (another context's MR, a non-ODP MR, bad advice, flags,
// ranges, unmapped memory); an unmapped page completing with
// IBV_WC_REM_ACCESS_ERR (remote) and IBV_WC_LOC_PROT_ERR (local); odd
// registrations EINVAL.
func TestODP(t *testing.T) {
	runOps(t, startPair(t), "odp.c",
		"OK odp caps, explicit+implicit send write read cmp_swap fetch_add, remap, advise, rem_access loc_prot\n")
}
