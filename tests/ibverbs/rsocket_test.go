package ibverbs_test

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"regexp"
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
	"github.com/vrnic/vrnic/internal/mwprogs"
	"github.com/vrnic/vrnic/internal/testenv"
)

// rsPreload is Debian's rsockets preload library (package librdmacm1).
const rsPreload = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"

// rstreamRow matches a result row of rstream/riostream: name, bytes,
// transfers, iterations, total, time, Gb/sec, usec/xfer.
var rstreamRow = regexp.MustCompile(`(?m)^(\S+)\s+(\S+)\s+(\S+)\s+(\d+k?)\s+(\S+)\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s*$`)

// streamRun runs prog (rstream or riostream) as a server on daemon b and
// a client on daemon a with the same arguments, and returns both outputs.
// Both must exit 0 within timeout.
func streamRun(t *testing.T, p *pair, prog string, timeout time.Duration, args ...string) (server, client string) {
	t.Helper()
	port := strconv.Itoa(freeTCPPort(t))
	addr := p.addr[1].String()
	srv, sout := p.start(t, prog+" server", append([]string{"-d", "b", prog, "-b", addr, "-p", port}, args...)...)
	require.NoError(t, cmprogs.WaitListen(admin.SocketPath(p.dir, "b"), cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
		"server: %s", sout.String())
	cout, err := p.run(t, timeout, append([]string{"-d", "a", prog, "-s", addr, "-p", port}, args...)...)
	require.NoError(t, err, "client: %s\nserver: %s", cout, sout.String())
	require.True(t, srv.Wait(30*time.Second), "server hangs: %s", sout.String())
	require.NoError(t, srv.Err(), "server: %s", sout.String())
	return sout.String(), cout
}

// checkRows checks that out reports n result rows (at least n when n < 0:
// -n rows) and returns them.
func checkRows(t *testing.T, who, out string, n int) [][]string {
	t.Helper()
	rows := rstreamRow.FindAllStringSubmatch(out, -1)
	if n >= 0 {
		require.Len(t, rows, n, "%s: %s", who, out)
	} else {
		require.GreaterOrEqual(t, len(rows), -n, "%s: %s", who, out)
	}
	assert.NotContains(t, out, "verification failed", who)
	return rows
}

// rstreamCases are the transfer sizes and test options run through
// rstream and riostream: 64 B to 1 MiB, each with data verification, in
// the default (nonblocking calls, spinning), async (rpoll), blocking and
// explicit nonblocking modes; as a stream (-C transfers, one iteration)
// and, like the latency rows of rstream's own default run, as a
// ping-pong (one transfer, -I iterations).
func rstreamCases() [][]string {
	var cases [][]string
	for _, s := range []struct{ size, count, iters string }{{"64", "1000", "500"}, {"4096", "1000", "200"}, {"65536", "200", "50"}, {"1048576", "20", "5"}} {
		for _, mode := range [][]string{nil, {"-T", "a"}, {"-T", "b"}, {"-T", "n"}} {
			cases = append(cases, append([]string{"-S", s.size, "-C", s.count, "-T", "v"}, mode...))
			cases = append(cases, append([]string{"-S", s.size, "-C", "1", "-I", s.iters, "-T", "v"}, mode...))
		}
	}
	return cases
}

// TestRstream runs Debian's unmodified rstream (rdmacm-utils) over
// rsockets between two daemons: a server on b, a client on a, every size
// and mode of rstreamCases with data verification. (rstream's own
// default run, 100,000 ping-pongs at 64 B and more at other sizes, is a
// measurement: minutes on a loaded machine; the cases cover its sizes
// and both of its kinds of rows.)
func TestRstream(t *testing.T) { runStreamCases(t, "rstream") }

// TestRiostream runs Debian's unmodified riostream: the receiver maps its
// buffer with riomap and the sender writes it with riowrite (RDMA WRITE
// into the peer's iomap), verified, in every mode.
func TestRiostream(t *testing.T) { runStreamCases(t, "riostream") }

// runStreamCases runs prog (rstream or riostream) over every case of
// rstreamCases between two daemons; both sides must report one row with
// the case's transfers and iterations.
func runStreamCases(t *testing.T, prog string) {
	testenv.NeedTool(t, prog)
	p := startPair(t)
	for _, c := range rstreamCases() {
		t.Run(strings.Join(c, ""), func(t *testing.T) {
			sout, cout := streamRun(t, p, prog, 120*time.Second, c...)
			for _, o := range []string{sout, cout} {
				rows := checkRows(t, prog, o, 1)
				assert.Equal(t, count(c[3]), rows[0][3], "transfers")
				if c[4] == "-I" {
					assert.Equal(t, count(c[5]), rows[0][4], "iterations")
				}
			}
		})
	}
}

// TestSanitizedRstream runs one verified rstream case in each direction
// with both libraries built with AddressSanitizer and UBSan: no report.
func TestSanitizedRstream(t *testing.T) {
	rstream := testenv.NeedTool(t, "rstream")
	p := startPair(t)
	start := sanitized(t, p, rstream)
	for _, mode := range []string{"a", "b"} {
		port := strconv.Itoa(freeTCPPort(t))
		args := []string{"-p", port, "-S", "65536", "-C", "100", "-T", "v", "-T", mode}
		srv, sout := start("server", []string{"VRNIC_DEVICE=b"}, append([]string{"-b", p.addr[1].String()}, args...)...)
		require.NoError(t, cmprogs.WaitListen(admin.SocketPath(p.dir, "b"), cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
			"%s", sout.String())
		cli, cout := start("client", []string{"VRNIC_DEVICE=a"}, append([]string{"-s", p.addr[1].String()}, args...)...)
		sanitizedExit(t, srv, sout, cli, cout)
		checkRows(t, "server", sout.String(), 1)
		checkRows(t, "client", cout.String(), 1)
	}
}

// packetsSent is daemon dev's count of RoCE packets its QPs sent.
func packetsSent(t *testing.T, p *pair, dev string) int64 {
	t.Helper()
	return int64(mwprogs.ReadCounters(t, admin.SocketPath(p.dir, dev)).Sent)
}

// TestRsocketPreload sends a 4 MiB file between two unmodified TCP
// programs, netcat (netcat-openbsd, the client) and netcat-traditional
// (the server: Debian 12's librspreload does not wrap accept4, which
// netcat-openbsd's listener calls), with LD_PRELOAD=librspreload.so
// through vrnic-run. The file must arrive intact, and because the preload
// library silently falls back to kernel TCP when an rsocket call fails,
// daemon a must have sent at least as many RoCE packets as the file needs
// (4 KiB, the largest RoCE MTU, per packet).
func TestRsocketPreload(t *testing.T) {
	ncOpen := testenv.NeedTool(t, "nc.openbsd")
	ncTrad := testenv.NeedTool(t, "nc.traditional")
	testenv.Need(t, fileExists(rsPreload), "no "+rsPreload+" (librdmacm1)")
	p := startPair(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.bin"), filepath.Join(dir, "out.bin")
	data := make([]byte, 4<<20)
	_, err := rand.Read(data)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(in, data, 0o644))
	env := []string{"LD_PRELOAD=" + rsPreload}
	before := packetsSent(t, p, "a")

	port := strconv.Itoa(freeTCPPort(t))
	addr := p.addr[1].String()
	srv, sout := p.startEnv(t, "nc server", env, "-d", "b", "sh", "-c",
		`exec "$0" -l -s "$1" -p "$2" >"$3" </dev/null`, ncTrad, addr, port, out)
	require.NoError(t, cmprogs.WaitListen(admin.SocketPath(p.dir, "b"), cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
		"the server does not listen on rsockets: %s", sout.String())
	cout, err := p.runEnv(t, 60*time.Second, env, "-d", "a", "sh", "-c", `exec "$0" -N "$1" "$2" <"$3"`, ncOpen, addr, port, in)
	require.NoError(t, err, "client: %s\nserver: %s", cout, sout.String())
	require.True(t, srv.Wait(30*time.Second), "server hangs: %s", sout.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, len(data), len(got), "bytes received; server: %s", sout.String())
	require.True(t, bytes.Equal(data, got), "the file differs")

	sent := packetsSent(t, p, "a") - before
	assert.GreaterOrEqual(t, sent, int64(len(data)/4096), "RoCE packets sent by a: the data did not go over vrnic")
	t.Logf("%d bytes over rsockets, daemon a sent %d RoCE packets", len(data), sent)
}

// count is n as rstream prints a count: 1000 as 1k.
func count(n string) string {
	if v, err := strconv.Atoi(n); err == nil && v >= 1000 && v%1000 == 0 {
		return strconv.Itoa(v/1000) + "k"
	}
	return n
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestRsocketBadFD: rsocket calls on fds that are not rsockets (a pipe,
// -1, a closed number) fail with EBADF and leave the fd alone; rpoll over
// ordinary fds is poll; datagram rsockets and other families fail with
// ENOTSUP.
func TestRsocketBadFD(t *testing.T) {
	prog := buildCLibs(t, "rsocket_badfd.c", []string{"-lrdmacm", "-libverbs"})
	p := startPair(t)
	out, err := p.run(t, 30*time.Second, "-d", "a", prog)
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "OK\n", out)
}

// TestRstreamPeerKilled kills one side of a long rstream transfer with
// SIGKILL: the other side must fail (connection reset or a like error)
// and exit within seconds, not hang. Both directions, blocking and
// nonblocking calls.
func TestRstreamPeerKilled(t *testing.T) {
	testenv.NeedTool(t, "rstream")
	p := startPair(t)
	for _, c := range []struct {
		name       string
		killServer bool
		mode       string
	}{{"server-blocking", true, "b"}, {"server-nonblocking", true, "n"}, {"client-blocking", false, "b"}, {"client-async", false, "a"}} {
		t.Run(c.name, func(t *testing.T) {
			port := strconv.Itoa(freeTCPPort(t))
			addr := p.addr[1].String()
			args := []string{"-p", port, "-S", "1048576", "-C", "1000000", "-T", c.mode}
			srv, sout := p.start(t, "rstream server", append([]string{"-d", "b", "rstream", "-b", addr}, args...)...)
			require.NoError(t, cmprogs.WaitListen(admin.SocketPath(p.dir, "b"), cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
				"server: %s", sout.String())
			cli, cout := p.start(t, "rstream client", append([]string{"-d", "a", "rstream", "-s", addr}, args...)...)
			time.Sleep(1500 * time.Millisecond)
			victim, other, oout := srv, cli, cout
			if !c.killServer {
				victim, other, oout = cli, srv, sout
			}
			require.True(t, victim.Running() && other.Running(), "a side ended early: server %s client %s", sout.String(), cout.String())
			require.NoError(t, killTree(victim))
			start := time.Now()
			require.True(t, other.Wait(30*time.Second), "the peer of a killed rstream hangs: %s", oout.String())
			require.Error(t, other.Err(), "the peer of a killed rstream exits 0: %s", oout.String())
			t.Logf("the peer failed after %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(oout.String()))
		})
	}
}

// killTree sends SIGKILL to the program vrnic-run runs (vrnic-run execs
// it, so the process is the program itself) and waits for it.
func killTree(proc *launch.Proc) error {
	if err := proc.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	proc.Wait(10 * time.Second)
	return nil
}
