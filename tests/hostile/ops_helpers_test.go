package hostile

// Helpers of the operator-access, accounting and accept probes (ops_test.go,
// uidlimits_test.go, accept_test.go): real vrnicd processes, clients of
// other uids (this test binary re-executed under another uid), the
// daemon's descriptor count.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/verbs"
)

// opsNobody is the unprivileged uid and gid the other-uid clients run as.
const opsNobody = 65534

// opsEnv is a private directory (mode 0755, so that other uids reach what
// is in it) with vrnicd, vrnicctl and a copy of this test binary, and a
// runtime directory for the daemons.
type opsEnv struct {
	dir, vrnicd, vrnicctl, self, rundir string
}

// opsSetup builds the tools. Every probe of these files needs root (to
// run clients under other uids and to lower a daemon's descriptor limit).
func opsSetup(t testing.TB) *opsEnv {
	t.Helper()
	testenv.NeedRoot(t, "needs root: the probes run clients under another uid than the daemon's")
	dir, err := os.MkdirTemp("", "vrnic-hostile-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	e := &opsEnv{dir: dir, rundir: filepath.Join(dir, "rt")}
	require.NoError(t, os.Mkdir(e.rundir, 0o755))
	var out strings.Builder
	e.vrnicd = vrnicdBinary(t)
	e.vrnicctl, err = launch.GoBuild("github.com/vrnic/vrnic/cmd/vrnicctl", dir, "vrnicctl", &out)
	require.NoError(t, err, "%s", &out)
	b, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	e.self = filepath.Join(dir, "client.test")
	require.NoError(t, os.WriteFile(e.self, b, 0o755))
	return e
}

// opsDaemon is a running vrnicd.
type opsDaemon struct {
	proc   *launch.Proc
	socket string
	log    *launch.Buffer
	adm    *admin.Client // an operator connection held for the whole test
	// baseline is the daemon's descriptor count with adm its only
	// connection and nothing allocated.
	baseline int
}

// opsStartDaemon starts vrnicd (in-memory link, one worker) and waits
// until it answers; the socket is made reachable by every uid (the other
// uids' clients are what the probes are about). It takes the descriptor
// baseline with one operator connection open.
func (e *opsEnv) opsStartDaemon(t testing.TB, name string, extra ...string) *opsDaemon {
	t.Helper()
	d := &opsDaemon{socket: admin.SocketPath(e.rundir, name), log: &launch.Buffer{}}
	args := append([]string{"-name", name, "-runtime-dir", e.rundir, "-link", "mem", "-workers", "1"}, extra...)
	p, err := launch.Start(launch.Spec{Name: name, Bin: e.vrnicd, Args: args, Stderr: d.log})
	require.NoError(t, err)
	d.proc = p
	t.Cleanup(func() {
		if d.adm != nil {
			d.adm.Close()
		}
		if err := p.Stop(0, 5*time.Second); err != nil {
			t.Errorf("vrnicd %s: %v\n%s", name, err, d.log)
		}
	})
	require.NoError(t, launch.WaitReady(context.Background(), p, d.socket, 10*time.Second), "%s", d.log)
	require.NoError(t, os.Chmod(d.socket, 0o666))
	d.adm, err = admin.Dial(d.socket)
	require.NoError(t, err)
	d.waitQuiet(t)
	d.baseline = opsFdCount(t, p.Pid())
	return d
}

// waitQuiet waits until adm is the daemon's only connection and nothing
// is allocated.
func (d *opsDaemon) waitQuiet(t testing.TB) {
	t.Helper()
	d.waitHolding(t, 1, admin.ResourceCounts{}, 10*time.Second)
}

// waitHolding waits up to timeout until the daemon has conns connections
// and holds the resources res, and fails t if it does not get there.
func (d *opsDaemon) waitHolding(t testing.TB, conns int64, res admin.ResourceCounts, timeout time.Duration) {
	t.Helper()
	var last admin.Info
	require.Eventually(t, func() bool {
		i, err := d.adm.Info()
		if err != nil {
			return false
		}
		last = i
		return i.Connections == conns && i.Resources == res
	}, timeout, 10*time.Millisecond, "the daemon holds %d connections and %+v, want %d and %+v\n%s",
		last.Connections, last.Resources, conns, res, d.log)
}

// opsCheckHealthy is every probe's end: the daemon runs, answers its
// operator, serves a well-behaved client (a context and a command), and
// once that client is gone holds no more descriptors than at the start.
func (d *opsDaemon) opsCheckHealthy(t *testing.T) {
	t.Helper()
	d.requireRunning(t)
	_, err := d.adm.Info()
	require.NoError(t, err, "the operator connection is served")
	var c *verbs.Context
	require.Eventually(t, func() bool {
		c, err = verbs.Open(d.socket, verbs.WithClientName("well-behaved"))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "a well-behaved client cannot open a context: %v", err)
	_, err = c.AllocPD()
	require.NoError(t, err)
	_, err = c.QueryDevice()
	require.NoError(t, err)
	require.NoError(t, c.Close())
	d.waitQuiet(t)
	var n int
	require.Eventually(t, func() bool {
		n = opsFdCount(t, d.proc.Pid())
		return n <= d.baseline
	}, 10*time.Second, 10*time.Millisecond, "daemon fds: %d, baseline %d", n, d.baseline)
	d.requireRunning(t)
}

// requireRunning fails t if the daemon has exited.
func (d *opsDaemon) requireRunning(t testing.TB) {
	t.Helper()
	if !d.proc.Running() {
		t.Fatalf("vrnicd exited: %v\n%s", d.proc.Err(), d.log)
	}
}

// counter returns one of the daemon's control-path counters (0 when the
// daemon does not have it).
func (d *opsDaemon) counter(t testing.TB, name string) int64 {
	t.Helper()
	i, err := d.adm.Info()
	require.NoError(t, err)
	return i.Counters[name]
}

// infoJSON returns the daemon's Info as generic JSON (fields this build of
// the test may not know).
func (d *opsDaemon) infoJSON(t *testing.T) map[string]any {
	t.Helper()
	b, err := d.adm.Call(admin.InfoCmd, nil)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// opsFdCount counts the open descriptors of process pid.
func opsFdCount(t testing.TB, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// opsAs describes the credentials of a client process.
type opsAs struct {
	uid, gid uint32
	groups   []uint32
}

var opsAsNobody = opsAs{uid: opsNobody, gid: opsNobody}

func (a opsAs) attr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.groups},
		Pdeathsig:  syscall.SIGKILL,
	}
}

// opsRun runs this test binary's helper (TestOpsHelperProcess) in mode
// against socket under the credentials as, and returns its OPS lines.
func (e *opsEnv) opsRun(t *testing.T, as opsAs, mode, socket string) []string {
	t.Helper()
	out, err := e.opsHelperCmd(as, mode, socket).CombinedOutput()
	require.NoError(t, err, "helper %s as uid %d: %s", mode, as.uid, out)
	lines := opsLines(string(out))
	require.NotEmpty(t, lines, "helper %s said nothing: %s", mode, out)
	return lines
}

// opsHelperCmd is the command of this test binary's helper
// (TestOpsHelperProcess) in mode against socket under the credentials
// as, with env added to its environment; the caller starts it.
func (e *opsEnv) opsHelperCmd(as opsAs, mode, socket string, env ...string) *exec.Cmd {
	cmd := exec.Command(e.self, "-test.run=^TestOpsHelperProcess$", "-test.timeout=0")
	cmd.Dir = e.dir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "TMPDIR=" + e.dir, "VRNIC_OPS_HELPER=" + mode, "VRNIC_OPS_SOCKET=" + socket}, env...)
	cmd.SysProcAttr = as.attr()
	return cmd
}

// opsLines returns the OPS lines of a helper's output, without the
// prefix.
func opsLines(out string) []string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l, ok := strings.CutPrefix(sc.Text(), "OPS "); ok {
			lines = append(lines, l)
		}
	}
	return lines
}

// opsCtl runs vrnicctl under the credentials as; it returns the exit
// status and the combined output.
func (e *opsEnv) opsCtl(t *testing.T, as *opsAs, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(e.vrnicctl, args...)
	cmd.Dir = e.dir
	if as != nil {
		cmd.Env = []string{"PATH=/usr/bin:/bin", "TMPDIR=" + e.dir}
		cmd.SysProcAttr = as.attr()
	}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}
