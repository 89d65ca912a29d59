package controlpath

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/verbs"
)

// TestMain doubles as the client program: with VRNIC_TEST_CLIENT set the
// re-executed test binary runs clientMain instead of the tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("VRNIC_TEST_CLIENT"); mode != "" {
		os.Exit(clientMain(mode, os.Getenv("VRNIC_TEST_SOCKET")))
	}
	rc := m.Run()
	if toolDir != "" {
		os.RemoveAll(toolDir)
	}
	os.Exit(rc)
}

// clientMain opens a context, creates host memory, PDs, MRs, CQs, QPs
// (moved to RTS), an SRQ and an AH, posts work, prints "READY <qpns>" and
// then, in modes "hold" and "idle", waits to be killed; in mode "exit" it
// returns.
//
// The QPs' peer (127.0.0.9) does not exist. In modes "hold" and "exit"
// each QP posts a SEND, which the engine retransmits until the retry
// count runs out and the QP goes to ERR (about 0.6 s with timeout 14,
// retry_cnt 7). In mode "idle" the QPs post receives only: no request
// goes out, no retransmission timer runs, and the QPs stay in RTS for as
// long as the client lives.
func clientMain(mode, sock string) int {
	fail := func(err error) int {
		fmt.Println("ERROR", err)
		return 1
	}
	c, err := verbs.Open(sock, verbs.WithClientName("client-"+strconv.Itoa(os.Getpid())))
	if err != nil {
		return fail(err)
	}
	if mode == "cm" {
		return cmClientMain(c)
	}
	hm, err := c.AddHostMem(2 << 20)
	if err != nil {
		return fail(err)
	}
	pd, err := c.AllocPD()
	if err != nil {
		return fail(err)
	}
	buf, err := hm.Alloc(1<<20, 4096)
	if err != nil {
		return fail(err)
	}
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead)
	if err != nil {
		return fail(err)
	}
	ch, err := verbs.NewCompChannel()
	if err != nil {
		return fail(err)
	}
	cq, err := c.CreateCQ(256, ch)
	if err != nil {
		return fail(err)
	}
	srq, err := pd.CreateSRQ(64, 2, 0)
	if err != nil {
		return fail(err)
	}
	ah, err := pd.CreateAH(abi.AHAttr{DGID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 9}, PortNum: 1})
	if err != nil {
		return fail(err)
	}
	_ = ah
	var qpns []string
	for i := range 4 {
		a := verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}}
		if i == 3 {
			a.SRQ = srq
			a.Cap.MaxRecvWR, a.Cap.MaxRecvSGE = 0, 0
		}
		qp, err := pd.CreateQP(a)
		if err != nil {
			return fail(err)
		}
		if err := qp.ToInit(abi.AccessRemoteWrite, 0); err != nil {
			return fail(err)
		}
		av := abi.AHAttr{DGID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 9}, PortNum: 1}
		// Each client connects to remote QPs of its own (a remote QP is
		// claimed by one local QP of a device): 100+i above a per-process
		// base.
		dest := peerQPNBase() + 100 + uint32(i)
		if err := qp.ToRTR(verbs.RTRAttr{AV: av, PathMTU: abi.MTU1024, DestQPN: dest, RQPSN: 1000, MaxDestRdAtomic: 1, MinRNRTimer: 1}); err != nil {
			return fail(err)
		}
		if err := qp.ToRTS(verbs.RTSAttr{SQPSN: 2000 + uint32(i) + peerQPNBase(), Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}); err != nil {
			return fail(err)
		}
		sge := []abi.SGE{mr.SGE(uint32(64*i), 64)}
		switch {
		case mode != "idle":
			err = qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge})
		case a.SRQ != nil:
			err = srq.PostRecv(&verbs.RecvWR{WrID: 2, SGL: sge})
		default:
			err = qp.PostRecv(&verbs.RecvWR{WrID: 2, SGL: sge})
		}
		if err != nil {
			return fail(err)
		}
		qpns = append(qpns, strconv.Itoa(int(qp.QPN)))
	}
	if err := cq.ReqNotify(false); err != nil {
		return fail(err)
	}
	fmt.Println("READY", strings.Join(qpns, ","))
	if mode == "hold" || mode == "idle" {
		select {} // until killed
	}
	return 0
}

// peerQPNBase is the client process's share of the (fictitious) remote QP
// numbers: a multiple of 1024 derived from its pid.
func peerQPNBase() uint32 {
	return uint32(os.Getpid()%8192) << 10
}

// buildTools builds vrnicd and vrnicctl once per test run.
var toolDir string

func tools(t *testing.T) (vrnicd, vrnicctl string) {
	t.Helper()
	if toolDir == "" {
		dir, err := os.MkdirTemp("", "vrnic-tools-")
		require.NoError(t, err)
		for _, c := range []string{"vrnicd", "vrnicctl"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(dir, c), "github.com/vrnic/vrnic/cmd/"+c).CombinedOutput()
			require.NoError(t, err, "go build %s: %s", c, out)
		}
		toolDir = dir
	}
	return filepath.Join(toolDir, "vrnicd"), filepath.Join(toolDir, "vrnicctl")
}

// daemon is a running vrnicd process.
type daemon struct {
	cmd    *exec.Cmd
	name   string
	socket string
	stderr *strings.Builder
}

// startDaemon runs vrnicd -name name in runtime dir dir and waits for its
// socket to answer.
func startDaemon(t *testing.T, dir, name string, extra ...string) *daemon {
	t.Helper()
	vrnicd, _ := tools(t)
	args := append([]string{"-name", name, "-runtime-dir", dir, "-log-level", "debug"}, extra...)
	if !slices.ContainsFunc(extra, func(a string) bool { return a == "-config" || a == "-local" || a == "-udp-local" }) {
		// Not the default 127.0.0.1:4791: the packages' tests run in
		// parallel, and another one's daemon may hold it.
		args = append(args, "-local", freeLoopback(t).String()+":4791")
	}
	cmd := exec.Command(vrnicd, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	d := &daemon{cmd: cmd, name: name, socket: admin.SocketPath(dir, name), stderr: &stderr}
	t.Cleanup(func() { d.stop(t) })
	require.Eventually(t, func() bool {
		_, err := admin.Serving(d.socket)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "vrnicd %s did not come up: %s", name, &stderr)
	return d
}

// freeLoopback returns a 127.0.0.0/8 address whose UDP port 4791 is free.
func freeLoopback(t *testing.T) netip.Addr {
	t.Helper()
	a, err := launch.FreeLoopback()
	require.NoError(t, err)
	return a
}

// stop sends SIGTERM and waits; idempotent.
func (d *daemon) stop(t *testing.T) {
	if d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "vrnicd %s exit: %s", d.name, d.stderr)
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-done
		t.Errorf("vrnicd %s did not stop on SIGTERM", d.name)
	}
}

// info returns the daemon's summary.
func (d *daemon) info(t *testing.T) admin.Info {
	t.Helper()
	a, err := admin.Dial(d.socket)
	require.NoError(t, err)
	defer a.Close()
	info, err := a.Info()
	require.NoError(t, err)
	return info
}

// fdCount counts the open fds of process pid: all of them, and those that
// are not sockets (what a client would leave behind in the daemon: memfd
// duplicates, eventfds, doorbell pages).
func fdCount(t *testing.T, pid int) (all, nonSocket int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			all++
			if !strings.HasPrefix(l, "socket:") {
				nonSocket++
			}
		}
	}
	return all, nonSocket
}

// client is a client process.
type client struct {
	cmd  *exec.Cmd
	qpns []uint32
}

// startClient re-executes the test binary as a client of socket and waits
// until it reports READY.
func startClient(t *testing.T, socket, mode string) *client {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VRNIC_TEST_CLIENT="+mode, "VRNIC_TEST_SOCKET="+socket)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	c := &client{cmd: cmd}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	line = strings.TrimSpace(line)
	require.True(t, strings.HasPrefix(line, "READY "), "client said %q", line)
	for _, s := range strings.Split(strings.TrimPrefix(line, "READY "), ",") {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		c.qpns = append(c.qpns, uint32(n))
	}
	return c
}

func runtimeDir(t *testing.T) string {
	// Short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "vrnic-rt-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestClientSIGKILLReleasesEverything kills a client process holding QPs,
// MRs, CQs, an SRQ, an AH and host memory, and checks through the control
// socket that the daemon's resource counts return to zero, its fd count
// returns to the baseline, and a new client is served.
func TestClientSIGKILLReleasesEverything(t *testing.T) {
	dir := runtimeDir(t)
	d := startDaemon(t, dir, "kill0")
	pid := d.cmd.Process.Pid
	// One operator connection stays open for the whole test; the daemon is
	// quiescent when it is the only connection and nothing is allocated.
	// The fd baseline is taken in that state, so it counts exactly one
	// control connection.
	adm, err := admin.Dial(d.socket)
	require.NoError(t, err)
	defer adm.Close()
	quiescent := func() bool {
		i, err := adm.Info()
		return err == nil && i.Connections == 1 && i.Resources == admin.ResourceCounts{}
	}
	require.Eventually(t, quiescent, 10*time.Second, 10*time.Millisecond)
	// A connection the daemon has accepted but not yet counted (the one
	// that probed its socket at start-up) holds a descriptor while the
	// counts already say quiescent: take the baseline once the fd count
	// holds still.
	baseAll, baseFiles := fdCount(t, pid)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		all, files := fdCount(t, pid)
		if all == baseAll && files == baseFiles {
			break
		}
		baseAll, baseFiles = all, files
	}

	for round := range 3 {
		c := startClient(t, d.socket, "hold")
		info, err := adm.Info()
		require.NoError(t, err)
		require.Equal(t, 1, info.Resources.Contexts)
		require.Equal(t, 4, info.Resources.QP)
		require.Equal(t, 1, info.Resources.MR)
		require.Equal(t, 1, info.Resources.SRQ)
		require.Equal(t, 1, info.Resources.AH)
		require.Greater(t, info.Resources.HostMem, 0)
		_, files := fdCount(t, pid)
		require.Greater(t, files, baseFiles, "the daemon holds the client's memfds, eventfds and doorbell page")
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
		c.cmd.Wait()
		require.Eventually(t, quiescent, 10*time.Second, 10*time.Millisecond, "round %d: not released", round)
		require.Eventually(t, func() bool {
			all, files := fdCount(t, pid)
			return all == baseAll && files == baseFiles
		}, 10*time.Second, 10*time.Millisecond, "round %d: daemon fds differ from the baseline %d (%d non-socket)", round, baseAll, baseFiles)
	}
	// A new client is served and sees a working device.
	c := startClient(t, d.socket, "exit")
	require.NoError(t, c.cmd.Wait())
	assert.Len(t, c.qpns, 4)
	require.Eventually(t, func() bool { return d.info(t).Resources == admin.ResourceCounts{} }, 10*time.Second, 10*time.Millisecond)
	d.stop(t)
	assert.NoFileExists(t, d.socket)
	assert.NoFileExists(t, filepath.Join(dir, "kill0.lock"))
}

// TestTwoDaemonsSeveralClients runs two vrnicd processes on one host with
// clients on each, and checks vrnicctl shows both devices and the QPs of
// each client in their states with their PSNs. The clients' QPs point at
// a peer that does not exist and post receives only ("idle"), so they
// stay in RTS however long the listing takes.
func TestTwoDaemonsSeveralClients(t *testing.T) {
	_, vrnicctl := tools(t)
	dir := runtimeDir(t)
	a1, a2 := freeLoopback(t).String()+":4791", freeLoopback(t).String()+":4791"
	d1 := startDaemon(t, dir, "vr1", "-udp-local", a1, "-udp-peer", a2)
	d2 := startDaemon(t, dir, "vr2", "-udp-local", a2, "-udp-peer", a1)
	// A third daemon with a taken name is refused.
	vrnicd, _ := tools(t)
	out, err := exec.Command(vrnicd, "-name", "vr1", "-runtime-dir", dir).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "already running")

	var clients []*client
	for i := range 3 {
		clients = append(clients, startClient(t, d1.socket, "idle"))
		if i < 2 {
			clients = append(clients, startClient(t, d2.socket, "idle"))
		}
	}
	ctl := func(args ...string) []byte {
		cmd := exec.Command(vrnicctl, append([]string{"-runtime-dir", dir}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "vrnicctl %v: %s", args, out)
		return out
	}
	var devs []struct {
		Name   string      `json:"name"`
		Status string      `json:"status"`
		Info   *admin.Info `json:"info"`
	}
	require.NoError(t, json.Unmarshal(ctl("-json", "devices"), &devs))
	require.Len(t, devs, 2)
	assert.Equal(t, "vr1", devs[0].Name)
	assert.Equal(t, "vr2", devs[1].Name)
	for i, want := range []int{3, 2} {
		assert.Equal(t, "up", devs[i].Status)
		require.NotNil(t, devs[i].Info)
		assert.Equal(t, want, devs[i].Info.Resources.Contexts)
		assert.Equal(t, 4*want, devs[i].Info.Resources.QP)
		assert.Equal(t, "udp", devs[i].Info.LinkType)
	}
	text := string(ctl("devices"))
	assert.Regexp(t, `vr1\s+up\s+udp\s+3\s+12`, text)
	assert.Regexp(t, `vr2\s+up\s+udp\s+2\s+8`, text)

	want := map[uint32]bool{}
	for _, c := range clients {
		for _, q := range c.qpns {
			want[q] = true
		}
	}
	checkQPs := func() {
		t.Helper()
		var qps []admin.QPInfo
		require.NoError(t, json.Unmarshal(ctl("-d", "vr1", "-json", "qps"), &qps))
		require.Len(t, qps, 12)
		seen := map[uint32]bool{}
		for _, q := range qps {
			assert.Equal(t, "RTS", q.State)
			assert.Equal(t, "RC", q.Type)
			assert.Equal(t, uint32(1000), q.RQPSN)
			assert.Equal(t, uint32(2000), q.SQPSN-q.DestQPN+100, "SQ PSN 2000+i for destination QPN 100+i")
			assert.Equal(t, 1024, q.PathMTU)
			assert.Zero(t, q.Counters.PacketsSent, "nothing sent to the absent peer")
			assert.True(t, want[q.QPN], "QPN %d belongs to a client", q.QPN)
			seen[q.QPN] = true
		}
		assert.Len(t, seen, 12, "distinct QPNs")
	}
	checkQPs()
	// Longer than the retries of a QP that had sent would take to run
	// out: these stay in RTS.
	time.Sleep(time.Second)
	checkQPs()
	var ctxs []admin.ContextInfo
	require.NoError(t, json.Unmarshal(ctl("-d", "vr2", "-json", "contexts"), &ctxs))
	require.Len(t, ctxs, 2)
	for _, cx := range ctxs {
		assert.Equal(t, "client-"+strconv.Itoa(int(cx.PID)), cx.Client)
		assert.Equal(t, 4, cx.Resources.QP)
	}
	qtext := string(ctl("-d", "vr2", "qps"))
	assert.Contains(t, qtext, "STATE")
	assert.Contains(t, qtext, "RTS")
	assert.Contains(t, string(ctl("-s", d1.socket, "info")), "contexts=3")
	// The data-path totals are there, and nothing was sent.
	assert.Regexp(t, `(?m)^data_path\.packets_sent\s+0$`, string(ctl("-d", "vr1", "counters")))
	var counters map[string]int64
	require.NoError(t, json.Unmarshal(ctl("-d", "vr2", "-json", "counters"), &counters))
	assert.Contains(t, counters, "data_path.retransmits")
	assert.Zero(t, counters["data_path.packets_sent"])
	assert.Equal(t, int64(8), counters["resources.qp"])
	// Clear errors.
	cmd := exec.Command(vrnicctl, "-runtime-dir", dir, "qps")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "several devices")
	cmd = exec.Command(vrnicctl, "-runtime-dir", dir, "-d", "nope", "qps")
	out, err = cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "nope.sock")

	// Killing one daemon's clients leaves the other's untouched.
	for _, c := range clients {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
	require.Eventually(t, func() bool { return d1.info(t).Resources == admin.ResourceCounts{} }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return d2.info(t).Resources == admin.ResourceCounts{} }, 10*time.Second, 10*time.Millisecond)
	d1.stop(t)
	d2.stop(t)
	text = string(ctl("devices"))
	assert.Contains(t, text, "DEVICE", "empty listing still has its header")
	assert.NotContains(t, text, "vr1")
}

// TestStaleSocketReplaced SIGKILLs a daemon (leaving its socket) and checks
// a new daemon of the same name replaces it.
func TestStaleSocketReplaced(t *testing.T) {
	dir := runtimeDir(t)
	d := startDaemon(t, dir, "stale0")
	require.NoError(t, d.cmd.Process.Kill())
	d.cmd.Wait()
	require.FileExists(t, d.socket, "a killed daemon leaves its socket")
	d2 := startDaemon(t, dir, "stale0")
	assert.Equal(t, "stale0", d2.info(t).Device)
	// A non-socket file in the way is not touched.
	other := filepath.Join(dir, "file0.sock")
	require.NoError(t, os.WriteFile(other, []byte("x"), 0o600))
	vrnicd, _ := tools(t)
	out, err := exec.Command(vrnicd, "-name", "file0", "-runtime-dir", dir).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "not a socket")
}

// TestConfigFile starts vrnicd from a JSON config with limits and checks
// they apply; a config with an unknown field is refused.
func TestConfigFile(t *testing.T) {
	dir := runtimeDir(t)
	cfg := filepath.Join(dir, "c.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"name":"cfg0","link":{"type":"mem"},"workers":3,
		"limits":{"per_client":{"qp":2},"per_device":{"contexts":4}}}`), 0o600))
	d := startDaemon(t, dir, "cfg0", "-config", cfg)
	info := d.info(t)
	assert.Equal(t, 3, info.Workers)
	assert.Equal(t, "mem", info.LinkType)
	assert.Equal(t, 2, info.Limits.PerClient.QP)
	assert.Equal(t, 4, info.Limits.PerDevice.Contexts)
	assert.Equal(t, device.DefaultLimits.PerClient.CQ, info.Limits.PerClient.CQ)

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"name":"x","link":{"type":"udp"},"bogus":1}`), 0o600))
	vrnicd, _ := tools(t)
	out, err := exec.Command(vrnicd, "-config", bad, "-runtime-dir", dir).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), `unknown field "bogus"`)
}

// cmClientMain (mode "cm") creates three CM IDs, tries to listen on a
// privileged port and then on an unprivileged one, prints what each got
// ("PRIV <error>", "READY") and waits to be killed.
func cmClientMain(c *verbs.Context) int {
	if _, err := c.OpenAsyncEvents(); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	var ids []*verbs.CMID
	for range 3 {
		id, err := c.CreateCMID(abi.QPTRC)
		if err != nil {
			fmt.Println("ERROR", err)
			return 1
		}
		ids = append(ids, id)
	}
	const psTCP = 0x0106
	fmt.Println("PRIV", ids[0].Listen(psTCP<<16|80, 8))
	if err := ids[1].Listen(psTCP<<16|18999, 8); err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Println("READY")
	select {} // until killed
}
