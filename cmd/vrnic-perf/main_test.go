package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
)

// vrnicdBin is the daemon built once for the tests.
var vrnicdBin string

// TestMain runs the program itself when a test re-executes this binary
// as a child (run starts the server and client roles that way); otherwise
// it builds vrnicd and runs the tests.
func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(realMain(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv("GORACE") == "" {
		// Children built with -race would each sleep 1 s at exit.
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	dir, err := os.MkdirTemp("", "vrnic-perf-test-")
	if err == nil {
		err = findVrnicd(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// findVrnicd sets vrnicdBin: the daemon named by VRNIC_PERF_TEST_VRNICD
// (a prebuilt one), or vrnicd built from this tree into dir.
func findVrnicd(dir string) error {
	if vrnicdBin = os.Getenv("VRNIC_PERF_TEST_VRNICD"); vrnicdBin != "" {
		if out, _ := exec.Command(vrnicdBin, "-h").CombinedOutput(); !bytes.Contains(out, []byte("-link")) {
			return fmt.Errorf("VRNIC_PERF_TEST_VRNICD=%s is not a vrnicd:\n%s", vrnicdBin, out)
		}
		return nil
	}
	var out bytes.Buffer
	var err error
	if vrnicdBin, err = launch.GoBuild(launch.VrnicdPackage, dir, "vrnicd", &out); err != nil {
		return fmt.Errorf("%w\n%s", err, out.String())
	}
	return nil
}

// daemon is a vrnicd the test started.
type daemon struct {
	sock string
	pid  int
}

// startDaemon starts vrnicd with a private runtime directory and stops it
// by its PID when the test ends.
func startDaemon(t testing.TB, name string, args ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	log := &launch.Buffer{}
	p, err := launch.Start(launch.Spec{Name: "vrnicd", Bin: vrnicdBin,
		Args:   append([]string{"-name", name, "-runtime-dir", dir, "-workers", "1"}, args...),
		Stdout: log, Stderr: log})
	require.NoError(t, err)
	t.Cleanup(func() {
		p.Stop(0, 10*time.Second)
		assert.ErrorIs(t, syscall.Kill(p.Pid(), 0), syscall.ESRCH, "vrnicd still running")
	})
	d := &daemon{sock: admin.SocketPath(dir, name), pid: p.Pid()}
	require.NoError(t, launch.WaitReady(context.Background(), p, d.sock, 20*time.Second), "%s", log.String())
	return d
}

// perf runs vrnic-perf in this process and returns its exit status and
// output.
func perf(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	code := realMain(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// perfJSON runs vrnic-perf run --json on the given devices and returns
// the parsed results.
func perfJSON(t testing.TB, devA, devB string, args ...string) []result {
	t.Helper()
	code, out, errOut := perf(t, append([]string{"run", "-dev-a", devA, "-dev-b", devB, "-json"}, args...)...)
	require.Equal(t, 0, code, "exit status; stderr:\n%s\nstdout:\n%s", errOut, out)
	var r report
	require.NoError(t, json.Unmarshal([]byte(out), &r), "output:\n%s", out)
	require.NotEmpty(t, r.Results)
	return r.Results
}

// checkResult asserts the figures of one size are sane and consistent.
func checkResult(t *testing.T, r result, test testKind, size int, ops uint64) {
	t.Helper()
	assert.Equal(t, test, r.Test)
	assert.Equal(t, size, r.Size)
	if ops > 0 {
		assert.Equal(t, ops, r.Ops, "operations")
	} else {
		assert.Positive(t, r.Ops, "operations")
	}
	assert.Equal(t, r.Ops*uint64(size), r.Bytes)
	assert.Positive(t, r.Seconds)
	assert.Positive(t, r.Gbps)
	assert.InEpsilon(t, r.Gbps*125, r.MBps, 1e-9, "Gb/s and MB/s agree")
	assert.InEpsilon(t, float64(r.Ops)/r.Seconds/1e6, r.Mops, 1e-9)
	assert.True(t, r.Verified, "data verified")
	assert.Zero(t, r.LoopAllocs, "allocations in the measured loop")
	assert.Positive(t, r.Client.PacketsSent, "client QP counters")
	assert.Positive(t, r.Server.PacketsSent+r.Server.PacketsReceived, "server QP counters")
	assert.Equal(t, r.Client.Retransmits+r.Server.Retransmits, r.Retransmits)
	if test.latency() {
		l := r.Latency
		require.NotNil(t, l, "latency figures")
		assert.Equal(t, r.Ops, l.Samples)
		assert.Positive(t, l.Min)
		assert.LessOrEqual(t, l.Min, l.P50)
		assert.LessOrEqual(t, l.P50, l.P99)
		assert.LessOrEqual(t, l.P99, l.P999)
		assert.LessOrEqual(t, l.P999, l.Max)
		assert.GreaterOrEqual(t, l.Avg, float64(l.Min))
		assert.LessOrEqual(t, l.Avg, float64(l.Max))
	} else {
		assert.Nil(t, r.Latency)
	}
}

// perfCase is one run of the tool and what its result must show.
type perfCase struct {
	name string
	args []string
	test testKind
	size int
	ops  uint64 // 0: duration run, any positive count
}

var perfCases = []perfCase{
	{"write_bw 1B", []string{"-test", "write_bw", "-size", "1", "-iters", "500"}, writeBW, 1, 500},
	{"write_bw 4KiB", []string{"-test", "write_bw", "-size", "4096", "-iters", "300"}, writeBW, 4096, 300},
	{"write_bw 1MiB mtu 1024", []string{"-test", "write_bw", "-size", "1048576", "-iters", "20", "-depth", "8", "-mtu", "1024"}, writeBW, 1 << 20, 20},
	{"write_bw inline", []string{"-test", "write_bw", "-size", "100", "-inline", "128", "-iters", "300"}, writeBW, 100, 300},
	{"write_bw 4 QPs", []string{"-test", "write_bw", "-size", "4096", "-qps", "4", "-iters", "100"}, writeBW, 4096, 400},
	{"write_bw duration", []string{"-test", "write_bw", "-size", "4096", "-duration", "300ms", "-depth", "16", "-cq-mod", "5"}, writeBW, 4096, 0},
	{"write_bw 8 areas", []string{"-test", "write_bw", "-size", "4096", "-areas", "8", "-qps", "2", "-iters", "100", "-depth", "4"}, writeBW, 4096, 200},
	{"read_bw 1B", []string{"-test", "read_bw", "-size", "1", "-iters", "300"}, readBW, 1, 300},
	{"read_bw 4KiB", []string{"-test", "read_bw", "-size", "4096", "-iters", "300"}, readBW, 4096, 300},
	{"read_bw 5 areas", []string{"-test", "read_bw", "-size", "1000", "-areas", "5", "-iters", "100", "-depth", "4"}, readBW, 1000, 100},
	{"read_bw 1MiB", []string{"-test", "read_bw", "-size", "1048576", "-iters", "20", "-depth", "8"}, readBW, 1 << 20, 20},
	{"send_bw 1B", []string{"-test", "send_bw", "-size", "1", "-iters", "500"}, sendBW, 1, 500},
	{"send_bw 4KiB", []string{"-test", "send_bw", "-size", "4096", "-iters", "300"}, sendBW, 4096, 300},
	{"send_bw 1MiB", []string{"-test", "send_bw", "-size", "1048576", "-iters", "20", "-depth", "8"}, sendBW, 1 << 20, 20},
	{"send_bw 3 QPs events", []string{"-test", "send_bw", "-size", "4096", "-qps", "3", "-iters", "100", "-events"}, sendBW, 4096, 300},
	{"atomic fetch_add", []string{"-test", "atomic_bw", "-atomic", "fetch_add", "-iters", "500"}, atomicBW, 8, 500},
	{"atomic cmp_swap 2 QPs", []string{"-test", "atomic_bw", "-atomic", "cmp_swap", "-iters", "300", "-qps", "2", "-cq-mod", "1"}, atomicBW, 8, 600},
	{"write_lat 8B", []string{"-test", "write_lat", "-iters", "300"}, writeLat, 8, 300},
	{"write_lat 1B", []string{"-test", "write_lat", "-size", "1", "-iters", "200"}, writeLat, 1, 200},
	{"write_lat 4KiB duration", []string{"-test", "write_lat", "-size", "4096", "-duration", "200ms"}, writeLat, 4096, 0},
	{"send_lat 8B", []string{"-test", "send_lat", "-iters", "300"}, sendLat, 8, 300},
	{"send_lat 4KiB events", []string{"-test", "send_lat", "-size", "4096", "-iters", "200", "-events"}, sendLat, 4096, 200},
	{"read_lat 8B", []string{"-test", "read_lat", "-iters", "300"}, readLat, 8, 300},
	{"read_lat 1MiB", []string{"-test", "read_lat", "-size", "1048576", "-iters", "10"}, readLat, 1 << 20, 10},
}

// TestTestTypesMemLink runs every test type briefly against one real
// vrnicd (in-memory link: both roles on the same device).
func TestTestTypesMemLink(t *testing.T) {
	d := startDaemon(t, "perf-mem", "-link", "mem")
	for _, c := range perfCases {
		t.Run(c.name, func(t *testing.T) {
			rs := perfJSON(t, d.sock, d.sock, c.args...)
			require.Len(t, rs, 1)
			checkResult(t, rs[0], c.test, c.size, c.ops)
		})
	}
}

// TestSweep runs -a: every power of two from 1 B to 8 MiB.
func TestSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("sweep up to 8 MiB messages: not in -short")
	}
	d := startDaemon(t, "perf-sweep", "-link", "mem")
	rs := perfJSON(t, d.sock, d.sock, "-test", "write_bw", "-a", "-iters", "4", "-depth", "4")
	require.Len(t, rs, 24)
	for i, r := range rs {
		checkResult(t, r, writeBW, 1<<i, 4)
	}
}

// TestRunStartsAndStopsDaemons: run without sockets starts two vrnicd
// over the UDP link itself, uses a TCP control connection, and leaves no
// process behind.
func TestRunStartsAndStopsDaemons(t *testing.T) {
	code, out, errOut := perf(t, "run", "-vrnicd", vrnicdBin, "-ctrl", "tcp", "-v", "-test", "send_lat", "-iters", "100")
	require.Equal(t, 0, code, "stderr:\n%s", errOut)
	assert.Regexp(t, `send_lat: 1 QP\(s\)`, out)
	assert.Regexp(t, `(?m)^\s+8\s+100\s`, out, "table row: 8 bytes, 100 iterations")
	pids := regexp.MustCompile(`--- (\S+) \(pid (\d+), `).FindAllStringSubmatch(errOut, -1)
	names := map[string]bool{}
	for _, m := range pids {
		names[m[1]] = true
		pid, _ := strconv.Atoi(m[2])
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "%s (pid %d) still running", m[1], pid)
	}
	assert.Equal(t, map[string]bool{"vrnicd-perf-a": true, "vrnicd-perf-b": true, "server": true, "client": true}, names)
}

// TestServerClientRoles runs the two roles as separate commands over TCP,
// as a user does on two hosts.
func TestServerClientRoles(t *testing.T) {
	d := startDaemon(t, "perf-roles", "-link", "mem")
	rs := runRoles(t, d.sock, nil, []string{"-test", "read_bw", "-size", "65536", "-iters", "200"})
	checkResult(t, rs[0], readBW, 65536, 200)
}

// TestUDPLink runs bandwidth and latency tests between two daemons over
// the UDP link on two loopback addresses.
func TestUDPLink(t *testing.T) {
	a, b, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(t, err)
	da := startDaemon(t, "perf-udp-a", "-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String())
	db := startDaemon(t, "perf-udp-b", "-link", "udp", "-local", netip.AddrPortFrom(b, launch.RoCEPort).String())
	for _, c := range []perfCase{
		{"write_bw 4KiB", []string{"-test", "write_bw", "-size", "4096", "-iters", "300"}, writeBW, 4096, 300},
		{"write_bw 1MiB", []string{"-test", "write_bw", "-size", "1048576", "-iters", "20", "-depth", "8"}, writeBW, 1 << 20, 20},
		{"send_bw 1B 2 QPs", []string{"-test", "send_bw", "-size", "1", "-iters", "300", "-qps", "2"}, sendBW, 1, 600},
		{"read_bw 4KiB", []string{"-test", "read_bw", "-size", "4096", "-iters", "200"}, readBW, 4096, 200},
		{"atomic cmp_swap", []string{"-test", "atomic_bw", "-atomic", "cmp_swap", "-iters", "300"}, atomicBW, 8, 300},
		{"write_lat", []string{"-test", "write_lat", "-iters", "200"}, writeLat, 8, 200},
		{"send_lat", []string{"-test", "send_lat", "-iters", "200"}, sendLat, 8, 200},
		{"read_lat", []string{"-test", "read_lat", "-iters", "200"}, readLat, 8, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := perfJSON(t, da.sock, db.sock, c.args...)
			require.Len(t, rs, 1)
			checkResult(t, rs[0], c.test, c.size, c.ops)
		})
	}
}

// unreliableCases are the UC and UD tests.
var unreliableCases = []perfCase{
	{"ud send_bw 4KiB", []string{"-transport", "ud", "-test", "send_bw", "-size", "4096", "-iters", "300"}, sendBW, 4096, 300},
	{"ud send_bw 1B 2 QPs", []string{"-transport", "ud", "-test", "send_bw", "-size", "1", "-iters", "300", "-qps", "2"}, sendBW, 1, 600},
	{"ud send_lat", []string{"-transport", "ud", "-test", "send_lat", "-iters", "200"}, sendLat, 8, 200},
	{"uc write_bw 64KiB", []string{"-transport", "uc", "-test", "write_bw", "-size", "65536", "-iters", "200"}, writeBW, 65536, 200},
	{"uc send_bw 10000B", []string{"-transport", "uc", "-test", "send_bw", "-size", "10000", "-iters", "200"}, sendBW, 10000, 200},
	{"uc write_lat", []string{"-transport", "uc", "-test", "write_lat", "-iters", "200"}, writeLat, 8, 200},
	{"uc send_lat", []string{"-transport", "uc", "-test", "send_lat", "-size", "5000", "-iters", "200"}, sendLat, 5000, 200},
}

// TestUnreliableTransports runs the UC and UD tests against one daemon
// (in-memory link) and between two over the UDP link.
func TestUnreliableTransports(t *testing.T) {
	d := startDaemon(t, "perf-unrel", "-link", "mem")
	a, b, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(t, err)
	da := startDaemon(t, "perf-unrel-a", "-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String())
	db := startDaemon(t, "perf-unrel-b", "-link", "udp", "-local", netip.AddrPortFrom(b, launch.RoCEPort).String())
	for _, link := range []struct {
		name   string
		sa, sb string
	}{{"mem", d.sock, d.sock}, {"udp", da.sock, db.sock}} {
		for _, c := range unreliableCases {
			t.Run(link.name+"/"+c.name, func(t *testing.T) {
				rs := perfJSON(t, link.sa, link.sb, c.args...)
				require.Len(t, rs, 1)
				checkResult(t, rs[0], c.test, c.size, c.ops)
				t.Logf("%s: %.3f Gb/s, %d lost", c.name, rs[0].Gbps, rs[0].Lost)
			})
		}
	}
}

// TestUsageErrors: bad options exit with status 2 and a message.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{}, {"bogus"}, {"client", "-dev", "x"}, {"server"},
		{"run", "-test", "nope"}, {"run", "-size", "-5"}, {"run", "-size", "8388609"},
		{"run", "-test", "write_lat", "-qps", "2"}, {"run", "-link", "tap"}, {"run", "-dev-a", "x"},
		{"run", "-iters", "5", "-duration", "1s"}, {"run", "-cq-mod", "200", "-depth", "100"},
		{"run", "-transport", "ud", "-test", "write_bw"}, {"run", "-transport", "uc", "-test", "read_bw"},
		{"run", "-transport", "ud", "-test", "send_bw", "-size", "8192"}, {"run", "-transport", "rd"},
	} {
		t.Run(fmt.Sprint(args), func(t *testing.T) {
			code, _, errOut := perf(t, args...)
			assert.Equal(t, 2, code)
			assert.NotEmpty(t, errOut)
		})
	}
}

// TestLoopAllocsCounts: the allocation counter of the measured loops sees
// allocations made under a loop function (here this test, standing in
// for one) and only those.
func TestLoopAllocsCounts(t *testing.T) {
	enableAllocProfile()
	defer func() { runtime.MemProfileRate = 512 * 1024 }()
	saved := loopFuncs
	loopFuncs = []string{"allocSome"}
	defer func() { loopFuncs = saved }()
	before := loopAllocs()
	allocSome(100)
	assert.GreaterOrEqual(t, loopAllocs()-before, uint64(100))
	before = loopAllocs()
	sink = make([]*[64]byte, 100) // not under the loop function
	assert.Zero(t, loopAllocs()-before)
}

var sink []*[64]byte

//go:noinline
func allocSome(n int) {
	for range n {
		sink = append(sink, new([64]byte))
	}
}
