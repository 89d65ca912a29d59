package tap

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/cmprogs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestRsocketsOverTAP runs Debian's unmodified rstream and riostream over
// vrnic's rsockets between the two TAP daemons of the package's
// topology, with data verification (-T v), in the blocking and async
// modes: the server binds daemon A's TAP address, the client runs on
// daemon B, and the stream crosses vtb → br0 → vta.
func TestRsocketsOverTAP(t *testing.T) {
	tp := newTopo(t)
	for _, tool := range []string{"rstream", "riostream"} {
		testenv.NeedTool(t, tool)
	}
	a := tp.startDaemon(t, tp.nsA, "sa", "vsa", 1, nil, addrA+"/24")
	tp.startDaemon(t, tp.nsB, "sb", "vsb", 1, nil, addrB+"/24")
	cache := t.TempDir()
	run := func(name string, args ...string) *proc {
		full := append([]string{"-runtime-dir", tp.dir, "-cache-dir", cache}, args...)
		return start(t, name, exec.Command(filepath.Join(bin, "vrnic-run"), full...))
	}
	for _, prog := range []string{"rstream", "riostream"} {
		for _, mode := range []string{"b", "a"} {
			t.Run(prog+"/"+mode, func(t *testing.T) {
				port, err := launch.FreeTCPPort()
				require.NoError(t, err)
				ps := strconv.Itoa(port)
				opts := []string{"-p", ps, "-S", "65536", "-C", "200", "-T", "v", "-T", mode}
				srv := run(prog+" server", append([]string{"-d", "sa", prog, "-b", addrA}, opts...)...)
				want := cmprogs.ServiceID(cmprogs.PSTCP, ps)
				deadline := time.Now().Add(60 * time.Second)
				for {
					if ok, _ := cmprogs.Listening(a.sock, want); ok {
						break
					}
					require.True(t, time.Now().Before(deadline), "%s server does not listen:\n%s", prog, srv.out)
					time.Sleep(20 * time.Millisecond)
				}
				cli := run(prog+" client", append([]string{"-d", "sb", prog, "-s", addrA}, opts...)...)
				require.NoError(t, cli.wait(120*time.Second), "client:\n%s\nserver:\n%s", cli.out, srv.out)
				require.NoError(t, srv.wait(30*time.Second), "server:\n%s", srv.out)
				for _, o := range []string{cli.out.String(), srv.out.String()} {
					assert.Regexp(t, `(?m)^custom\s+64k\s+200\s`, o, "one row: 200 transfers of 64 KiB")
					assert.NotContains(t, o, "verification failed")
				}
			})
		}
	}
}
