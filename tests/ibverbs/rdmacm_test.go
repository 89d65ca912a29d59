package ibverbs_test

import (
	"fmt"
	"io"
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
	"github.com/vrnic/vrnic/internal/cmprogs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestRdmaCM runs Debian's rdma_cm programs (rping, ucmatose, udaddy,
// rdma_server/rdma_client, perftest -R) through vrnic-run with vrnic's
// librdmacm.so.1: the server on daemon b, the client on daemon a,
// connecting to b's address. Each must exit 0 with what it prints checked
// (rping's 100 payloads byte for byte), and afterwards neither daemon may
// hold a CM ID, a context or a QP.
func TestRdmaCM(t *testing.T) {
	testenv.NeedTool(t, "cc")
	cases := cmprogs.Cases()
	for _, c := range cases {
		testenv.NeedTool(t, c.Prog)
	}
	testenv.NeedTool(t, "rdma_client")
	p := startPair(t)
	e := pairEnv(t, p)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { cmprogs.Run(t, e, c) })
	}
}

// TestRdmaCMFlood: cmtime opens 1,000 rdma_cm connections at once (a QP
// each), connects, disconnects and destroys them all. Every connection
// must be established (no REJECTED or UNREACHABLE), and once the programs
// exit the daemons hold no CM ID, context or QP and no more descriptors
// than before.
func TestRdmaCMFlood(t *testing.T) {
	testenv.NeedTool(t, "cc")
	testenv.NeedTool(t, "cmtime")
	p := startPair(t)
	socks := []string{admin.SocketPath(p.dir, "a"), admin.SocketPath(p.dir, "b")}
	pids := []int{p.a.Pid(), p.b.Pid()}
	fds := func(pid int) int {
		e, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
		require.NoError(t, err)
		return len(e)
	}
	flood := func(n string) (string, *launch.Proc, *launch.Buffer) {
		port := strconv.Itoa(freeTCPPort(t))
		srv, sout := p.start(t, "cmtime server", "-d", "b", "cmtime", "-p", port, "-c", n)
		require.NoError(t, cmprogs.WaitListen(socks[1], cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
			"server: %s", sout.String())
		cout, err := p.run(t, 240*time.Second, "-d", "a", "cmtime", "-s", p.addr[1].String(), "-p", port, "-c", n)
		require.NoError(t, err, "client: %s\nserver: %s", cout, sout.String())
		return cout, srv, sout
	}
	// A first small run makes what the daemons create once (and keep).
	_, warm, _ := flood("10")
	warm.Stop(0, 5*time.Second)
	for _, s := range socks {
		require.NoError(t, cmprogs.WaitNoCMIDs(s, 30*time.Second))
	}
	// The daemons close a finished program's connections on their own
	// time: take the count once it holds still.
	settled := func(pid int) int {
		n := fds(pid)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			m := fds(pid)
			if m == n {
				break
			}
			n = m
		}
		return n
	}
	before := []int{settled(pids[0]), settled(pids[1])}
	cout, srv, _ := flood("1000")
	for _, step := range []string{"create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"} {
		assert.Regexp(t, `(?m)^`+step+` *: +[0-9.]+`, cout)
	}
	for _, bad := range []string{"REJECTED", "UNREACHABLE", "ERROR", "failed"} {
		assert.NotContains(t, strings.ToUpper(cout), strings.ToUpper(bad), "client: %s", cout)
	}
	// The server is a listener that runs until stopped.
	srv.Stop(0, 5*time.Second)
	require.False(t, srv.Running())
	for i, s := range socks {
		require.NoError(t, cmprogs.WaitNoCMIDs(s, 30*time.Second))
		// Contexts close asynchronously after their programs exit: wait
		// for the count to come back, then compare.
		deadline := time.Now().Add(10 * time.Second)
		for fds(pids[i]) != before[i] && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		assert.Equal(t, before[i], fds(pids[i]), "daemon %d descriptors", i)
	}
	// No event may be lost on the way to either program, however far
	// behind its reading it fell.
	for i, s := range socks {
		a, err := admin.Dial(s)
		require.NoError(t, err)
		di, err := a.Info()
		a.Close()
		require.NoError(t, err)
		assert.Zero(t, di.Counters["async_events_dropped"], "daemon %d events dropped", i)
		assert.GreaterOrEqual(t, di.Counters["async_events"], int64(1000), "daemon %d events", i)
	}
	info, err := cmprogs.CMInfo(socks[1])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, info.MADsReceived, uint64(3000), "REQ, RTU and DREQ/DREP per connection")
	t.Logf("client:\n%s\nserver CM: %d MADs received, %d sent, %d retransmissions, %d duplicates",
		cout, info.MADsReceived, info.MADsSent, info.Retransmissions, info.Duplicates)
}

// TestRdmaCMCapture captures daemon b's frames (vrnicctl capture) while
// udaddy (SIDR_REQ/SIDR_REP), rdma_server/rdma_client (REQ, REP, RTU,
// DREQ, DREP) and then ucmatose's 1,000 messages each way run; the
// capture ends after a count of frames the last program alone exceeds.
// tshark's InfiniBand dissector must decode every frame without a
// malformed packet or an expert error, see each CM message, and read in
// the REQ the rdma_cm header (source and destination IP) and the service
// ID of rdma_server's port.
func TestRdmaCMCapture(t *testing.T) {
	tshark := testenv.NeedTool(t, "tshark")
	for _, tool := range []string{"cc", "udaddy", "rdma_server", "rdma_client", "ucmatose"} {
		testenv.NeedTool(t, tool)
	}
	p := startPair(t)
	e := pairEnv(t, p)
	a, err := admin.Dial(e.Socks[0])
	require.NoError(t, err)
	defer a.Close()
	const frames = 1500
	f, err := a.Capture(admin.CaptureRequest{Count: frames, Seconds: 600})
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	captured := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(f)
		captured <- b
	}()

	const port = "7471"
	for _, c := range cmprogs.Cases() {
		if c.Name == "udaddy" || c.Name == "rdma_server" {
			c.Port = port
			if c.Name == "udaddy" {
				c.Port = "7174"
			}
			t.Run(c.Name, func(t *testing.T) { cmprogs.Run(t, e, c) })
		}
	}
	filler := cmprogs.Case{Name: "ucmatose", Prog: "ucmatose", PS: cmprogs.PSTCP,
		Server: func(a, p string) []string { return []string{"ucmatose", "-p", p, "-C", "1000", "-S", "16"} },
		Client: func(a, p string) []string { return []string{"ucmatose", "-s", a, "-p", p, "-C", "1000", "-S", "16"} },
		Check:  func(s, c string) error { return nil }}
	cmprogs.Run(t, e, filler)
	var pcap []byte
	select {
	case pcap = <-captured:
	case <-time.After(60 * time.Second):
		t.Fatal("the capture did not end")
	}
	file := filepath.Join(t.TempDir(), "cm.pcapng")
	require.NoError(t, os.WriteFile(file, pcap, 0o644))

	bad, err := exec.Command(tshark, "-r", file, "-Y", "_ws.malformed || _ws.expert.severity >= error",
		"-T", "fields", "-e", "frame.number").Output()
	require.NoError(t, err)
	assert.Empty(t, strings.TrimSpace(string(bad)), "malformed frames or expert errors")

	out, err := exec.Command(tshark, "-r", file, "-Y", "infiniband.mad.mgmtclass == 0x07", "-T", "fields",
		"-E", "separator=|", "-e", "infiniband.mad.attributeid", "-e", "infiniband.cm.req.serviceid",
		"-e", "infiniband.cm.req.ip_cm.sip4", "-e", "infiniband.cm.req.ip_cm.dip4").Output()
	require.NoError(t, err)
	seen := map[string]int{}
	var reqs []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		col := strings.Split(l, "|")
		require.Len(t, col, 4, "%q", l)
		seen[col[0]]++
		if col[0] == "0x0010" {
			reqs = append(reqs, strings.Join(col[1:], "|"))
		}
	}
	for id, name := range map[string]string{"0x0010": "REQ", "0x0013": "REP", "0x0014": "RTU", "0x0015": "DREQ",
		"0x0016": "DREP", "0x0017": "SIDR_REQ", "0x0018": "SIDR_REP"} {
		assert.NotZero(t, seen[id], "no %s in the capture: %v", name, seen)
	}
	want := fmt.Sprintf("0x%016x|%s|%s", cmprogs.ServiceID(cmprogs.PSTCP, port), p.addr[0], p.addr[1])
	assert.Contains(t, reqs, want, "rdma_client's REQ")
}

// pairEnv is the cmprogs environment of p: servers on b, clients on a.
func pairEnv(t *testing.T, p *pair) cmprogs.Env {
	return cmprogs.Env{
		Start: func(name string, stdout, stderr *launch.Buffer, args ...string) *launch.Proc {
			return p.startTo(t, name, nil, stdout, stderr, args...)
		},
		ServerDev: "b", ClientDev: "a", Addr: p.addr[1].String(),
		Socks:    []string{admin.SocketPath(p.dir, "b"), admin.SocketPath(p.dir, "a")},
		FreePort: func() string { return strconv.Itoa(freeTCPPort(t)) },
	}
}

// TestSanitizedRdmaCM runs rping (RC, 20 pings) and udaddy (UD, SIDR)
// with both libraries built with AddressSanitizer and UBSan: no report,
// and rping's payloads intact.
func TestSanitizedRdmaCM(t *testing.T) {
	testenv.NeedTool(t, "udaddy")
	rping := testenv.NeedTool(t, "rping")
	p := startPair(t)
	sock := admin.SocketPath(p.dir, "b")
	for _, c := range []struct {
		prog, port string
		server     []string
		client     []string
		ps         uint64
	}{
		{rping, "7175", []string{"-s", "-a", p.addr[1].String(), "-p", "7175", "-C", "20", "-v"},
			[]string{"-c", "-a", p.addr[1].String(), "-p", "7175", "-C", "20", "-v"}, cmprogs.PSTCP},
		{testenv.NeedTool(t, "udaddy"), "7174", []string{"-C", "20"}, []string{"-s", p.addr[1].String(), "-C", "20"}, cmprogs.PSUDP},
	} {
		t.Run(filepath.Base(c.prog), func(t *testing.T) {
			start := sanitized(t, p, c.prog)
			srv, sout := start("server", []string{"VRNIC_DEVICE=b"}, c.server...)
			require.NoError(t, cmprogs.WaitListen(sock, cmprogs.ServiceID(c.ps, c.port), srv, 60*time.Second), "%s", sout.String())
			cli, cout := start("client", []string{"VRNIC_DEVICE=a"}, c.client...)
			sanitizedExit(t, srv, sout, cli, cout)
			if c.prog == rping {
				// stdout and stderr share a buffer here: rping's lines are
				// whole as long as no error is printed in between.
				assert.NoError(t, cmprogs.RpingPayload(cout.String(), "ping data: ", 20))
			} else {
				assert.Contains(t, cout.String(), "test complete")
			}
		})
	}
}

// TestRdmaCMReadDepth runs perftest's READ and atomic tests (-R, unmodified)
// between a daemon offering 128 outstanding READs and atomics each way, as
// Soft-RoCE does (-max-rd-atomic 128), and one of the default 16: each
// program offers its own device's depth in its REQ or REP, and the side of
// 16 clamps the 128 it is offered instead of failing MODIFY_QP. Both ways:
// the 128 side as server and as client.
func TestRdmaCMReadDepth(t *testing.T) {
	testenv.NeedTool(t, "cc")
	cases := []cmprogs.Case{
		cmprogs.Perftest("ib_read_bw", "-n", "500", "-s", "65536"),
		cmprogs.Perftest("ib_read_lat", "-n", "500", "-s", "8"),
		cmprogs.Perftest("ib_atomic_bw", "-n", "500"),
	}
	// ib_read_lat's server only answers READs: the client alone reports.
	readLat := cases[1].Check
	cases[1].Check = func(s, c string) error { return readLat(c, c) }
	for _, c := range cases {
		testenv.NeedTool(t, c.Prog)
	}
	p := startPairArgs(t, nil, []string{"-max-rd-atomic", "128"}) // a: 16, b: 128
	env := pairEnv(t, p)
	for _, dir := range []struct {
		name               string
		server, client     string
		addr               string
		socks              []string
		serverRd, clientRd string
	}{
		{"server128", "b", "a", p.addr[1].String(), env.Socks, "128", "16"},
		{"client128", "a", "b", p.addr[0].String(), []string{env.Socks[1], env.Socks[0]}, "16", "128"},
	} {
		e := env
		e.ServerDev, e.ClientDev, e.Addr, e.Socks = dir.server, dir.client, dir.addr, dir.socks
		for _, c := range cases {
			check := c.Check
			c.Check = func(s, cl string) error {
				if err := check(s, cl); err != nil {
					return err
				}
				// perftest reports its own device's depth.
				for _, o := range []struct{ out, rd string }{{s, dir.serverRd}, {cl, dir.clientRd}} {
					if !regexp.MustCompile(`(?m)^ Outstand reads\s+: ` + o.rd + `$`).MatchString(o.out) {
						return fmt.Errorf("no \"Outstand reads : %s\" in:\n%s", o.rd, o.out)
					}
				}
				return nil
			}
			t.Run(dir.name+"/"+c.Name, func(t *testing.T) { cmprogs.Run(t, e, c) })
		}
	}
}

// TestRdmaCMBind builds testdata/rdmacm_bind.c, an rdma_cm program, and
// runs it through vrnic-run (plain, then with ASan and UBSan on the
// sanitized libraries) with both daemons' addresses: binding to the
// wildcard address leaves the ID without a device (and listens), a
// daemon's own loopback address binds to its device and another loopback
// address to the first device (id->verbs set), rdma_getaddrinfo("localhost"
// or no node, RAI_PASSIVE) gives an address that binds and listens, a
// client on the other device connects and one SEND goes each way, a
// client reaches a listener on a loopback address no daemon has through
// that address; bad addresses and port conflicts fail with the kernel's
// errno.
func TestRdmaCMBind(t *testing.T) {
	p := startPair(t)
	const want = "OK errors wildcard loopback passive send loopback-connect\n"
	libs := []string{"-lrdmacm", "-libverbs"}
	args := []string{p.addr[0].String(), p.addr[1].String()}
	t.Run("plain", func(t *testing.T) {
		prog := buildCLibs(t, "rdmacm_bind.c", libs)
		got, err := p.run(t, 60*time.Second, append([]string{prog}, args...)...)
		require.NoError(t, err, "%s\n%s", got, p.daemonLogs())
		assert.Equal(t, want, got)
	})
	t.Run("sanitized", func(t *testing.T) {
		prog := buildCLibs(t, "rdmacm_bind.c", libs, sanitizers...)
		got, err := p.runEnv(t, 120*time.Second, sanitizerEnv, append([]string{"-sanitize", "address,undefined", prog}, args...)...)
		require.NoError(t, err, "%s\n%s", got, p.daemonLogs())
		assert.Equal(t, want, got)
	})
	for _, s := range []string{admin.SocketPath(p.dir, "a"), admin.SocketPath(p.dir, "b")} {
		require.NoError(t, cmprogs.WaitNoCMIDs(s, 30*time.Second))
	}
}
