package dataplane

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// demoRun is one run of vrnic-demo.
type demoRun struct {
	cmd    *exec.Cmd
	tmp    string // the demo's TMPDIR
	lines  chan string
	stdout []string
	stderr launch.Buffer
}

// startDemo starts vrnic-demo (it finds vrnicd beside itself) with its
// own TMPDIR and streams its output lines.
func startDemo(t *testing.T, args ...string) *demoRun {
	t.Helper()
	r := &demoRun{tmp: t.TempDir(), lines: make(chan string, 1024)}
	r.cmd = exec.Command(filepath.Join(bin, "vrnic-demo"), args...)
	r.cmd.Env = append(os.Environ(), "TMPDIR="+r.tmp)
	r.cmd.Stderr = &r.stderr
	out, err := r.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, r.cmd.Start())
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
		}
	})
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			r.lines <- s.Text()
		}
		close(r.lines)
	}()
	return r
}

// next returns the next output line matching re, collecting every line.
func (r *demoRun) next(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("demo output ended before %v; stderr:\n%s", re, r.stderr.String())
			}
			r.stdout = append(r.stdout, l)
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-timeout:
			t.Fatalf("no line matching %v", re)
		}
	}
}

// wait drains the output and returns the exit code.
func (r *demoRun) wait(t *testing.T) int {
	t.Helper()
	for l := range r.lines {
		r.stdout = append(r.stdout, l)
	}
	err := r.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

var pidRe = regexp.MustCompile(`\(pid (\d+)`)

// pids returns every PID the demo said it started.
func (r *demoRun) pids(t *testing.T) []int {
	var ps []int
	for _, l := range r.stdout {
		if m := pidRe.FindStringSubmatch(l); m != nil {
			p, err := strconv.Atoi(m[1])
			require.NoError(t, err)
			ps = append(ps, p)
		}
	}
	return ps
}

// assertCleanedUp checks the demo left no process and no file behind.
func (r *demoRun) assertCleanedUp(t *testing.T, wantPIDs int) {
	t.Helper()
	ps := r.pids(t)
	assert.Len(t, ps, wantPIDs, "daemons and clients started")
	for _, p := range ps {
		assert.ErrorIs(t, syscall.Kill(p, 0), syscall.ESRCH, "process %d still exists", p)
	}
	left, err := os.ReadDir(r.tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "the demo's private directory is removed")
}

var (
	progressRe = regexp.MustCompile(`^\s+\[\s*[\d.]+s\]\s+(\d+) ops\s+(\d+) bytes\s+([\d.]+) MB/s$`)
	rowRe      = regexp.MustCompile(`^\s+(SEND|RDMA_WRITE|RDMA_READ|FETCH_AND_ADD|CMP_AND_SWP|all)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\S+)\s+(\S+)\s+(\S+)$`)
	verifiedRe = regexp.MustCompile(`verified: (\d+) SENDs \((\d+) bytes\).*FETCH_AND_ADD word (\d+) \(want (\d+)\), CMP_AND_SWP word (\d+) \(want (\d+)\)`)
	retransRe  = regexp.MustCompile(`QP ([ab]): (\d+) packets sent, (\d+) received, (\d+) retransmissions`)
)

func atof(t *testing.T, s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	require.NoError(t, err)
	return v
}

func dur(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}

func atoi(t *testing.T, s string) uint64 {
	v, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return v
}

// checkSummary checks the progress and the figures of a successful run
// (longer than a second): a progress line with operations, bytes and
// bandwidth; then the summary: a row per operation (SEND, RDMA_WRITE,
// RDMA_READ, FETCH_AND_ADD, CMP_AND_SWP) and one for all of them with
// operations, bytes, MB/s and latency percentiles p50 <= p99 <= p99.9,
// each QP's packets and retransmissions, and what the responder verified.
func checkSummary(t *testing.T, r *demoRun, size uint64) {
	t.Helper()
	p := r.next(t, progressRe)
	assert.NotZero(t, atoi(t, p[1]), "progress: operations")
	assert.NotZero(t, atoi(t, p[2]), "progress: bytes")
	assert.Positive(t, atof(t, p[3]), "progress: MB/s")
	r.next(t, regexp.MustCompile(`^summary`))
	r.next(t, regexp.MustCompile(`^\s+operation\s+ops\s+bytes\s+MB/s\s+p50\s+p99\s+p99\.9$`))
	var sum uint64
	for _, name := range []string{"SEND", "RDMA_WRITE", "RDMA_READ", "FETCH_AND_ADD", "CMP_AND_SWP", "all"} {
		row := r.next(t, rowRe)
		require.Equal(t, name, row[1], "summary rows in order")
		n, b := atoi(t, row[2]), atoi(t, row[3])
		assert.NotZero(t, n, "%s: operations", name)
		if mbps := atof(t, row[4]); strings.HasSuffix(name, "_SWP") || strings.HasSuffix(name, "_ADD") {
			assert.GreaterOrEqual(t, mbps, 0.0, "%s: MB/s (8 bytes each: may round to 0.0)", name)
		} else {
			assert.Positive(t, mbps, "%s: MB/s", name)
		}
		p50, p99, p999 := dur(t, row[5]), dur(t, row[6]), dur(t, row[7])
		assert.Positive(t, p50, "%s: p50", name)
		assert.LessOrEqual(t, p50, p99, "%s: p50 <= p99", name)
		assert.LessOrEqual(t, p99, p999, "%s: p99 <= p99.9", name)
		switch name {
		case "SEND", "RDMA_WRITE", "RDMA_READ":
			assert.Equal(t, n*size, b, "%s: bytes", name)
		case "FETCH_AND_ADD", "CMP_AND_SWP":
			assert.Equal(t, n*8, b, "%s: bytes", name)
		case "all":
			assert.Equal(t, sum, n, "all: the sum of the rows")
		}
		sum += n
	}
	all := rowRe.FindStringSubmatch(r.stdout[len(r.stdout)-1])
	ops, bytes := atoi(t, all[2]), atoi(t, all[3])
	assert.Greater(t, ops, uint64(10), "operations completed")
	assert.Greater(t, bytes, 3*size, "bytes moved")
	for range 2 {
		m := r.next(t, retransRe)
		assert.NotZero(t, atoi(t, m[2]), "QP %s sent packets", m[1])
		assert.NotZero(t, atoi(t, m[3]), "QP %s received packets", m[1])
	}
	v := r.next(t, verifiedRe)
	sends := atoi(t, v[1])
	assert.NotZero(t, sends)
	assert.Equal(t, sends*size, atoi(t, v[2]), "every SEND has the full size")
	assert.Equal(t, v[4], v[3], "FETCH_AND_ADD word")
	assert.Equal(t, v[6], v[5], "CMP_AND_SWP word")
	// One operation of each kind in turn: SENDs are a fifth of them.
	assert.InDelta(t, float64(ops)/5, float64(sends), 1)
	r.next(t, regexp.MustCompile(`^PASS$`))
}

// TestDemoMemLink runs the main job with the in-memory link (one daemon,
// both clients on it): it must pass, report real figures, and leave no
// process or file behind.
func TestDemoMemLink(t *testing.T) {
	r := startDemo(t, "-link", "mem", "-duration", "1500ms", "-size", "5000", "-mtu", "1024")
	checkSummary(t, r, 5000)
	assert.Zero(t, r.wait(t), "exit status; stderr:\n%s", r.stderr.String())
	r.assertCleanedUp(t, 3)
}

// TestDemoFailsWhenAClientDies kills the responder client in the middle
// of the traffic: the requester's operations fail (retries exhausted),
// the demo exits 1, and still stops every process it started and removes
// its directory.
func TestDemoFailsWhenAClientDies(t *testing.T) {
	r := startDemo(t, "-link", "mem", "-duration", "20s")
	m := r.next(t, regexp.MustCompile(`^started client b \(pid (\d+)\)`))
	pid := int(atoi(t, m[1]))
	r.next(t, regexp.MustCompile(`^\s+\[\s*1\.\d+s\]`)) // traffic flows
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	code := r.wait(t)
	assert.Equal(t, 1, code)
	assert.Contains(t, r.stderr.String(), "FAIL")
	assert.NotContains(t, strings.Join(r.stdout, "\n"), "PASS")
	r.assertCleanedUp(t, 3)
}

// TestDemoUDPLink is the main job as a new user runs it: two daemons on
// two loopback addresses joined by the UDP link.
func TestDemoUDPLink(t *testing.T) {
	a, b := freeLoopback(t), freeLoopback(t)
	r := startDemo(t, "-addr-a", a.String(), "-addr-b", b.String(), "-duration", "1500ms", "-size", "5000") // udp: the default
	checkSummary(t, r, 5000)
	assert.Zero(t, r.wait(t), "exit status; stderr:\n%s", r.stderr.String())
	r.assertCleanedUp(t, 4)
	assert.Contains(t, strings.Join(r.stdout, "\n"), "udp link "+a.String()+":4791")
}

// TestDemoInterrupted: SIGINT in the middle of the traffic stops the
// demo with status 1, and it still stops every process and removes its
// directory.
func TestDemoInterrupted(t *testing.T) {
	r := startDemo(t, "-link", "mem", "-duration", "30s")
	r.next(t, regexp.MustCompile(`^\s+\[\s*1\.\d+s\]`))
	require.NoError(t, r.cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, 1, r.wait(t))
	assert.NotContains(t, strings.Join(r.stdout, "\n"), "PASS")
	r.assertCleanedUp(t, 3)
}

// TestDemoFailsWhenADaemonDies SIGKILLs the responder's daemon in the
// middle of UDP traffic: the requester's operations fail, the demo exits
// 1 without hanging, and stops every remaining process.
func TestDemoFailsWhenADaemonDies(t *testing.T) {
	a, b := freeLoopback(t), freeLoopback(t)
	r := startDemo(t, "-addr-a", a.String(), "-addr-b", b.String(), "-duration", "30s")
	m := r.next(t, regexp.MustCompile(`^started vrnicd demo-b \(pid (\d+)`))
	pid := int(atoi(t, m[1]))
	r.next(t, regexp.MustCompile(`^\s+\[\s*1\.\d+s\]`))
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	assert.Equal(t, 1, r.wait(t))
	assert.Contains(t, r.stderr.String(), "FAIL")
	r.assertCleanedUp(t, 4)
}
