package tap

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
)

// syncBuf is a bytes.Buffer safe for a process's output goroutine and
// the test reading it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// topo is the test network (see the package doc): namespaces <p>a, <p>b
// for the daemons, <p>br with the bridge br0.
type topo struct {
	t              *testing.T
	pfx            string
	nsA, nsB, nsBr string
	dir            string
}

func ipCmd(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// newTopo creates the namespaces and the bridge; t.Cleanup deletes them,
// then checks that nothing of the test is left.
func newTopo(t testing.TB) *topo {
	requireRoot(t)
	p := fmt.Sprintf("vrt%d", os.Getpid()%100000)
	tp := &topo{pfx: p, nsA: p + "a", nsB: p + "b", nsBr: p + "br", dir: t.TempDir()}
	t.Cleanup(func() { // registered first: runs last
		out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		for _, ns := range []string{tp.nsA, tp.nsB, tp.nsBr} {
			if strings.Contains(string(out), ns) {
				t.Errorf("namespace %s left behind", ns)
			}
		}
		out, _ = exec.Command("ip", "-o", "link").CombinedOutput()
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, p) || strings.Contains(l, ": vta") || strings.Contains(l, ": vtb") {
				t.Errorf("interface left behind: %s", l)
			}
		}
	})
	for _, ns := range []string{tp.nsA, tp.nsB, tp.nsBr} {
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
	}
	ipCmd(t, "-n", tp.nsBr, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", tp.nsBr, "link", "set", "br0", "up")
	return tp
}

// proc is a process the test started and stops by its PID.
type proc struct {
	cmd  *exec.Cmd
	out  *syncBuf
	done chan error
	err  error
}

func start(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, out: &syncBuf{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// No Pdeathsig: it fires when the forking OS thread exits, and
	// tap.Create ends threads it switched into another namespace.
	require.NoError(t, cmd.Start(), name)
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if p.stop(syscall.SIGTERM, 10*time.Second) != nil && t.Failed() {
			t.Logf("%s output:\n%s", name, p.out)
		}
	})
	return p
}

// stop signals the process (if still running) and waits; SIGKILL after
// timeout. It returns the exit error.
func (p *proc) stop(sig syscall.Signal, timeout time.Duration) error {
	if p.done == nil {
		return p.err
	}
	select {
	case p.err = <-p.done:
		p.done = nil
		return p.err
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case p.err = <-p.done:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		p.err = <-p.done
	}
	p.done = nil
	return p.err
}

// wait waits for the process to exit by itself.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case p.err = <-p.done:
		p.done = nil
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("still running after %v", timeout)
	}
}

// daemon is a running vrnicd with the TAP link.
type daemon struct {
	name, sock, ifname string
	proc               *proc
}

// startDaemon runs vrnicd in namespace ns with its TAP ifname created in
// the bridge namespace, waits for its control socket and makes the TAP
// a port of br0.
func (tp *topo) startDaemon(t testing.TB, ns, name, ifname string, workers int, extra []string, addrs ...string) *daemon {
	t.Helper()
	args := []string{"netns", "exec", ns, filepath.Join(bin, "vrnicd"), "-name", name, "-runtime-dir", tp.dir,
		"-link", "tap", "-workers", fmt.Sprint(workers), "-tap-name", ifname, "-tap-netns", tp.nsBr, "-tap-verify-steering"}
	for _, a := range addrs {
		args = append(args, "-tap-addr", a)
	}
	args = append(args, extra...)
	d := &daemon{name: name, sock: admin.SocketPath(tp.dir, name), ifname: ifname}
	d.proc = start(t, "vrnicd "+name, exec.Command("ip", args...))
	// The stats socket is the last thing the daemon creates (the control
	// socket comes before the link).
	stats := strings.TrimSuffix(d.sock, admin.SocketSuffix) + ".stats"
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", stats); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-d.proc.done:
			d.proc.done = nil
			require.FailNow(t, "vrnicd exited", "%v\n%s", err, d.proc.out)
		default:
		}
		require.True(t, time.Now().Before(deadline), "vrnicd %s not up:\n%s", name, d.proc.out)
		time.Sleep(20 * time.Millisecond)
	}
	ipCmd(t, "-n", tp.nsBr, "link", "set", ifname, "master", "br0")
	return d
}

// linkStats runs vrnicctl link for d (a separate process, as an operator
// would).
func linkStats(t testing.TB, d *daemon) linkJSON {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "vrnicctl"), "-s", d.sock, "-json", "link").CombinedOutput()
	require.NoError(t, err, "vrnicctl link: %s", out)
	var st linkJSON
	require.NoError(t, json.Unmarshal(out, &st), "%s", out)
	return st
}

// linkJSON is the part of vrnicctl link -json the tests check.
type linkJSON struct {
	Interface string `json:"interface"`
	Queues    []struct {
		Queue       int    `json:"queue"`
		Steered     uint64 `json:"steered"`
		RxFrames    uint64 `json:"rx_frames"`
		RxMisqueued uint64 `json:"rx_misqueued"`
		RxOther     uint64 `json:"rx_other"`
		TxErrors    uint64 `json:"tx_errors"`
		TxFrames    uint64 `json:"tx_frames"`
		Wakeups     uint64 `json:"wakeups"`
		TxGSO       uint64 `json:"tx_gso"`
		TxGSOFrames uint64 `json:"tx_gso_frames"`
		RxGSO       uint64 `json:"rx_gso"`
		RxGSOFrames uint64 `json:"rx_gso_frames"`
		RxBad       uint64 `json:"rx_bad"`
	} `json:"queues"`
	Offload       string            `json:"offload"`
	SteerNonRoCE  uint64            `json:"steer_non_roce"`
	Filter        map[string]uint64 `json:"filter"`
	FilterDropped uint64            `json:"filter_dropped"`
}

// relay pairs the first two connections on a unix socket and copies
// bytes between them (the clients' side channel).
func relay(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		var conns []net.Conn
		for len(conns) < 2 {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
		go func() { <-ctx.Done(); conns[0].Close(); conns[1].Close() }()
		var cw sync.WaitGroup
		for i := range 2 {
			cw.Add(1)
			go func() {
				defer cw.Done()
				io.Copy(conns[i], conns[1-i])
				conns[i].(*net.UnixConn).CloseWrite()
			}()
		}
		cw.Wait()
	}()
}

// startClient runs the test binary in the client role.
func startClient(t *testing.T, a clientArgs) *proc {
	t.Helper()
	b, err := json.Marshal(a)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), clientEnv+"="+string(b))
	return start(t, "client "+a.Role, cmd)
}

// capture runs tshark on iface in the bridge namespace, writing a pcap.
func (tp *topo) capture(t *testing.T, iface, file string) *proc {
	t.Helper()
	p := start(t, "tshark", exec.Command("ip", "netns", "exec", tp.nsBr, "tshark", "-q", "-i", iface, "-F", "pcap", "-w", file))
	require.Eventually(t, func() bool { return strings.Contains(p.out.String(), "Capturing on") }, 20*time.Second, 10*time.Millisecond,
		"tshark did not start: %s", p.out)
	return p
}

// txDropped returns the TX drop counter of ifname in the bridge
// namespace: frames for the daemon dropped at a full TAP queue.
func (tp *topo) txDropped(t testing.TB, ifname string) uint64 {
	t.Helper()
	out := ipCmd(t, "-n", tp.nsBr, "-s", "-j", "link", "show", "dev", ifname)
	var links []struct {
		Stats64 struct {
			TX struct {
				Dropped uint64 `json:"dropped"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &links), out)
	require.Len(t, links, 1)
	return links[0].Stats64.TX.Dropped
}
