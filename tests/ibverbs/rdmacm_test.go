package ibverbs_test

import (
	"os"
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
	e := cmprogs.Env{
		Start: func(name string, stdout, stderr *launch.Buffer, args ...string) *launch.Proc {
			return p.startTo(t, name, nil, stdout, stderr, args...)
		},
		ServerDev: "b", ClientDev: "a", Addr: p.addr[1].String(),
		Socks:    []string{admin.SocketPath(p.dir, "b"), admin.SocketPath(p.dir, "a")},
		FreePort: func() string { return strconv.Itoa(freeTCPPort(t)) },
	}
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
	info, err := cmprogs.CMInfo(socks[1])
	require.NoError(t, err)
	assert.GreaterOrEqual(t, info.MADsReceived, uint64(3000), "REQ, RTU and DREQ/DREP per connection")
	t.Logf("client:\n%s\nserver CM: %d MADs received, %d sent, %d retransmissions, %d duplicates",
		cout, info.MADsReceived, info.MADsSent, info.Retransmissions, info.Duplicates)
}
