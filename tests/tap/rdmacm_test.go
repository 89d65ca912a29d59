package tap

import (
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/cmprogs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestRdmaCMOverTAP runs Debian's rdma_cm programs (the cases of
// internal/cmprogs: rping -C 100 -v, ucmatose, udaddy,
// rdma_server/rdma_client, perftest -R) through vrnic-run between the two
// TAP daemons of the package's topology. The programs run in the host
// namespace; their CM MADs and data go daemon B → vtb → br0 → vta →
// daemon A between the TAP addresses, which rdma_cm resolves to the
// daemons through their GIDs.
func TestRdmaCMOverTAP(t *testing.T) {
	tp := newTopo(t)
	cases := cmprogs.Cases()
	testenv.NeedTool(t, "cc")
	for _, c := range cases {
		testenv.NeedTool(t, c.Prog)
	}
	a := tp.startDaemon(t, tp.nsA, "ca", "vca", 1, nil, addrA+"/24")
	b := tp.startDaemon(t, tp.nsB, "cb", "vcb", 1, nil, addrB+"/24")
	cache := t.TempDir()
	e := cmprogs.Env{
		Start: func(name string, stdout, stderr *launch.Buffer, args ...string) *launch.Proc {
			full := append([]string{"-runtime-dir", tp.dir, "-cache-dir", cache}, args...)
			p, err := launch.Start(launch.Spec{Name: name, Bin: filepath.Join(bin, "vrnic-run"), Args: full,
				Stdout: stdout, Stderr: stderr})
			require.NoError(t, err)
			t.Cleanup(func() { p.Stop(0, 5*time.Second) })
			return p
		},
		ServerDev: "ca", ClientDev: "cb", Addr: addrA,
		Socks: []string{a.sock, b.sock},
		FreePort: func() string {
			port, err := launch.FreeTCPPort()
			require.NoError(t, err)
			return strconv.Itoa(port)
		},
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { cmprogs.Run(t, e, c) })
	}
}
