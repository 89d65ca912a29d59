package tap

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestIbverbsOverTAP runs unmodified ibverbs programs (ibv_devinfo,
// ibv_rc_pingpong, ibv_ud_pingpong, ibv_uc_pingpong, ib_write_bw, ib_send_lat) through vrnic-run on two
// daemons with the TAP link in their network namespaces (the topology of
// the package doc). The programs need only the daemons' control sockets
// (unix sockets, reachable from any namespace) and a TCP path between
// client and server for their out-of-band exchange: both run in the host
// namespace and meet on 127.0.0.1, while their RDMA traffic goes daemon A
// → vta → br0 → vtb → daemon B, between the TAP addresses (GID 0).
func TestIbverbsOverTAP(t *testing.T) {
	tp := newTopo(t)
	for _, tool := range []string{"cc", "ibv_devinfo", "ibv_rc_pingpong", "ibv_ud_pingpong", "ibv_uc_pingpong", "ib_write_bw", "ib_send_lat"} {
		testenv.NeedTool(t, tool)
	}
	tp.startDaemon(t, tp.nsA, "ia", "via", 1, nil, addrA+"/24")
	tp.startDaemon(t, tp.nsB, "ib", "vib", 1, nil, addrB+"/24")
	cache := t.TempDir()
	run := func(name string, args ...string) *proc {
		full := append([]string{"-runtime-dir", tp.dir, "-cache-dir", cache}, args...)
		return start(t, name, exec.Command(filepath.Join(bin, "vrnic-run"), full...))
	}

	p := run("ibv_devinfo", "ibv_devinfo", "-v")
	require.NoError(t, p.wait(60*time.Second), "%s", p.out)
	assert.Contains(t, p.out.String(), "hca_id:\tia\n")
	assert.Contains(t, p.out.String(), "::ffff:"+addrA+", RoCE v2")
	assert.Contains(t, p.out.String(), "::ffff:"+addrB+", RoCE v2")

	for _, tc := range []struct {
		prog, gid string
		args      []string
		want      string // in the client's output
	}{
		{"ibv_rc_pingpong", "-g", []string{"-s", "4096", "-n", "200", "-c"}, "1638400 bytes in "},
		// UD: ibv_create_ah resolves B's MAC (ARP) in daemon A.
		{"ibv_ud_pingpong", "-g", []string{"-s", "1024", "-n", "200", "-c"}, "409600 bytes in "},
		{"ibv_uc_pingpong", "-g", []string{"-s", "4096", "-n", "200", "-c"}, "1638400 bytes in "},
		{"ib_write_bw", "-x", []string{"-s", "65536", "-n", "300"}, " 65536      300 "},
		{"ib_send_lat", "-x", []string{"-s", "8", "-n", "300"}, " 8       300 "},
	} {
		t.Run(tc.prog, func(t *testing.T) {
			port, err := launch.FreeTCPPort()
			require.NoError(t, err)
			ps := strconv.Itoa(port)
			srv := run(tc.prog+" server", append([]string{tc.prog, "-d", "ia", tc.gid, "0", "-p", ps}, tc.args...)...)
			deadline := time.Now().Add(60 * time.Second)
			for !launch.TCPListening(port) {
				require.True(t, time.Now().Before(deadline), "%s server does not listen:\n%s", tc.prog, srv.out)
				time.Sleep(20 * time.Millisecond)
			}
			cli := run(tc.prog+" client", append(append([]string{tc.prog, "-d", "ib", tc.gid, "0", "-p", ps}, tc.args...), "127.0.0.1")...)
			require.NoError(t, cli.wait(90*time.Second), "client:\n%s\nserver:\n%s", cli.out, srv.out)
			require.NoError(t, srv.wait(30*time.Second), "server:\n%s", srv.out)
			assert.Contains(t, cli.out.String(), tc.want)
		})
	}
}
