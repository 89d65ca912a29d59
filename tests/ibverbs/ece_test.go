package ibverbs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
)

// qpECE returns the ECE options the daemon behind sock holds for each of
// its QPs (admin.QPsCmd, "" for none), by QP number.
func qpECE(t *testing.T, sock string) map[uint32]string {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	qps, err := admin.ListAs[admin.QPInfo](a, admin.QPsCmd)
	require.NoError(t, err)
	out := map[uint32]string{}
	for _, q := range qps {
		out[q.QPN] = q.ECE
	}
	return out
}

// waitOutput waits until out holds want (the program printed it) or the
// program ended.
func waitOutput(t *testing.T, proc *launch.Proc, out *launch.Buffer, want string, p *pair) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), want) {
		require.True(t, proc.Running() && time.Now().Before(deadline), "no %q:\n%s\n%s", want, out.String(), p.daemonLogs())
		time.Sleep(10 * time.Millisecond)
	}
}

// TestECEVerbs runs testdata/ece.c through vrnic-run: ibv_query_ece and
// ibv_set_ece as rdma-core's mlx5 provider answers them, and the options
// the daemons hold for the QPs the program connected by hand (checked in
// their operator view while the program waits): those set on each side
// of pair 1 (A: sr, B: sr,rto), none on pair 2 unless VRNIC_ECE says the
// peer is a vrnic device, never any on the UD QP, none after RESET. With
// the daemons' ECE switched off (-ece=false) the device has no option:
// nothing is set, whatever VRNIC_ECE says.
func TestECEVerbs(t *testing.T) {
	prog := buildC(t, "ece.c")
	for _, c := range []struct {
		name   string
		daemon []string
		env    []string
		caps   uint32
		// what the daemons hold for a1, b1, a2, b2
		want [4]string
	}{
		{"set", nil, nil, abi.ECEOptions, [4]string{"sr", "sr,rto", "", ""}},
		{"VRNIC_ECE", nil, []string{"VRNIC_ECE=sr,rto"}, abi.ECEOptions, [4]string{"sr", "sr,rto", "sr,rto", "sr,rto"}},
		{"VRNIC_ECE=rto", nil, []string{"VRNIC_ECE=rto"}, abi.ECEOptions, [4]string{"sr", "sr,rto", "rto", "rto"}},
		{"off", []string{"-ece=false"}, []string{"VRNIC_ECE=all"}, 0, [4]string{"", "", "", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startPair(t, c.daemon...)
			gate := filepath.Join(t.TempDir(), "gate")
			proc, out := p.startEnv(t, "ece", c.env, prog, fmt.Sprint(c.caps), gate)
			waitOutput(t, proc, out, "READY\n", p)
			var a1, b1, a2, b2, ud uint32
			_, err := fmt.Sscanf(out.String()[strings.Index(out.String(), "QPS "):], "QPS %d %d %d %d %d", &a1, &b1, &a2, &b2, &ud)
			require.NoError(t, err, "%s", out.String())
			ea, eb := qpECE(t, admin.SocketPath(p.dir, "a")), qpECE(t, admin.SocketPath(p.dir, "b"))
			assert.Equal(t, c.want, [4]string{ea[a1], eb[b1], ea[a2], eb[b2]}, "a1 b1 a2 b2")
			assert.Contains(t, ea, ud)
			assert.Empty(t, ea[ud], "UD")
			require.NoError(t, os.WriteFile(gate, nil, 0o644))
			waitOutput(t, proc, out, "QPS_RESET\n", p)
			assert.Empty(t, qpECE(t, admin.SocketPath(p.dir, "a"))[a1], "RESET clears the options")
			require.NoError(t, os.WriteFile(gate+".reset", nil, 0o644))
			require.True(t, proc.Wait(30*time.Second), "%s", out.String())
			require.NoError(t, proc.Err(), "%s\n%s", out.String(), p.daemonLogs())
			assert.True(t, strings.HasSuffix(out.String(), "OK ece query set errors connect reset\n"), "%s", out.String())
		})
	}
}
