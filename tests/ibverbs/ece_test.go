package ibverbs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/cmprogs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// qpECE returns the ECE options the daemon behind sock holds for each of
// its QPs (admin.QPsCmd, "" for none), by QP number.
func qpECE(t *testing.T, sock string) map[uint32]string {
	return qpECEWhere(t, sock, func(admin.QPInfo) bool { return true })
}

// qpECEWhere is qpECE for the QPs keep picks.
func qpECEWhere(t *testing.T, sock string, keep func(admin.QPInfo) bool) map[uint32]string {
	t.Helper()
	a, err := admin.Dial(sock)
	require.NoError(t, err)
	defer a.Close()
	qps, err := admin.ListAs[admin.QPInfo](a, admin.QPsCmd)
	require.NoError(t, err)
	out := map[uint32]string{}
	for _, q := range qps {
		if keep(q) {
			out[q.QPN] = q.ECE
		}
	}
	return out
}

// waitOutput waits until out holds want (the program printed it) or the
// program ended. The bound only ends a hung test: the sanitized programs
// took 25 s to get there on a quiet machine and over 60 s with two CPU
// hogs beside the test.
func waitOutput(t *testing.T, proc *launch.Proc, out *launch.Buffer, want string, p *pair) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
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

// rcInRTS returns the daemon's RC QPs in RTS and the ECE options of each.
func rcInRTS(t *testing.T, sock string) map[uint32]string {
	return qpECEWhere(t, sock, func(q admin.QPInfo) bool { return q.Type == "RC" && q.State == "RTS" })
}

// TestECERdmaCM runs Debian's rping (RC, rdma_create_qp: the library
// moves the QPs) between the two daemons through vrnic-run and looks at
// the QPs while it pings: with ECE on both daemons (their default) the
// CMs agree on every option, and both QPs run them (the daemons'
// operator views of the QPs and of the CM connections); with ECE switched
// off on either daemon (-ece=false) the REQ offers none or the REP takes
// none, and neither QP runs one. rping's pings go through either way.
func TestECERdmaCM(t *testing.T) {
	testenv.NeedTool(t, "rping")
	for _, c := range []struct {
		name         string
		argsA, argsB []string
		want         string
	}{
		{"both", nil, nil, "sr,rto"},
		{"server off", nil, []string{"-ece=false"}, ""},
		{"client off", []string{"-ece=false"}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startPairArgs(t, c.argsA, c.argsB)
			socks := []string{admin.SocketPath(p.dir, "a"), admin.SocketPath(p.dir, "b")}
			port := strconv.Itoa(freeTCPPort(t))
			// -C 0: ping until stopped.
			srv, sout := p.start(t, "rping server", "-d", "b", "rping", "-s", "-a", p.addr[1].String(), "-p", port, "-C", "0")
			require.NoError(t, cmprogs.WaitListen(socks[1], cmprogs.ServiceID(cmprogs.PSTCP, port), srv, 60*time.Second),
				"server: %s", sout.String())
			cli, cout := p.start(t, "rping client", "-d", "a", "rping", "-c", "-a", p.addr[1].String(), "-p", port, "-C", "0")
			var qa, qb map[uint32]string
			deadline := time.Now().Add(60 * time.Second)
			for {
				qa, qb = rcInRTS(t, socks[0]), rcInRTS(t, socks[1])
				if len(qa) > 0 && len(qb) > 0 {
					break
				}
				require.True(t, cli.Running() && srv.Running() && time.Now().Before(deadline),
					"no connection: client: %s\nserver: %s\n%s", cout.String(), sout.String(), p.daemonLogs())
				time.Sleep(20 * time.Millisecond)
			}
			require.Len(t, qa, 1)
			require.Len(t, qb, 1)
			for qpn, ece := range qa {
				assert.Equal(t, c.want, ece, "client QP %#x", qpn)
			}
			for qpn, ece := range qb {
				assert.Equal(t, c.want, ece, "server QP %#x", qpn)
			}
			for i, s := range socks {
				info, err := cmprogs.CMInfo(s)
				require.NoError(t, err)
				conns := 0
				for _, id := range info.IDs {
					if id.Conn != 0 {
						conns++
						assert.Equal(t, c.want, id.ECE, "daemon %d CM ID %d (%s)", i, id.ID, id.Role)
					}
				}
				assert.Equal(t, 1, conns, "daemon %d connections", i)
			}
			// Stopped by their PIDs (SIGTERM): -C 0 pings forever.
			cli.Stop(0, 10*time.Second)
			srv.Stop(0, 10*time.Second)
			require.False(t, cli.Running())
			require.False(t, srv.Running())
			for _, s := range socks {
				require.NoError(t, cmprogs.WaitNoCMIDs(s, 30*time.Second))
			}
			assert.NotContains(t, cout.String(), "error", "client: %s", cout.String())
		})
	}
}

// TestECERdmaCMExternal runs testdata/rdmacm_ece.c through vrnic-run
// (and once built with ASan and UBSan on the libraries built the same
// way):
// three rdma_cm connections from daemon a to daemon b, with QPs of
// librdmacm's (the options agreed automatically), with the program's own
// QPs and rdma_set_local_ece / rdma_get_remote_ece / ibv_set_ece (the
// client offers sr, the server takes it), and with the program's own QPs
// and no ECE calls (nothing offered); the daemons' operator views then
// show each QP's options. With the daemons' ECE switched off nothing is
// offered or taken on any of them.
func TestECERdmaCMExternal(t *testing.T) {
	libs := []string{"-lrdmacm", "-libverbs"}
	for _, c := range []struct {
		name      string
		daemon    []string
		caps      uint32
		want      [6]string // auto, external, plain: client, server
		sanitized bool
	}{
		{"on", nil, abi.ECEOptions, [6]string{"sr,rto", "sr,rto", "sr", "sr", "", ""}, false},
		{"off", []string{"-ece=false"}, 0, [6]string{"", "", "", "", "", ""}, false},
		{"sanitized", nil, abi.ECEOptions, [6]string{"sr,rto", "sr,rto", "sr", "sr", "", ""}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var flags, run, env []string
			if c.sanitized {
				flags, run, env = sanitizers, []string{"-sanitize", "address,undefined"}, sanitizerEnv
			}
			prog := buildCLibs(t, "rdmacm_ece.c", libs, flags...)
			p := startPair(t, c.daemon...)
			gate := filepath.Join(t.TempDir(), "gate")
			proc, out := p.startEnv(t, "rdmacm_ece", env,
				append(run, prog, p.addr[0].String(), p.addr[1].String(), fmt.Sprint(c.caps), gate)...)
			waitOutput(t, proc, out, "READY\n", p)
			var q [6]uint32
			_, err := fmt.Sscanf(out.String()[strings.Index(out.String(), "QPS "):], "QPS %d %d %d %d %d %d",
				&q[0], &q[1], &q[2], &q[3], &q[4], &q[5])
			require.NoError(t, err, "%s", out.String())
			ea, eb := qpECE(t, admin.SocketPath(p.dir, "a")), qpECE(t, admin.SocketPath(p.dir, "b"))
			var got [6]string
			for i := range q {
				m := ea
				if i%2 == 1 {
					m = eb
				}
				require.Contains(t, m, q[i], "QP %d", i)
				got[i] = m[q[i]]
			}
			assert.Equal(t, c.want, got, "auto, external, plain: client, server")
			require.NoError(t, os.WriteFile(gate, nil, 0o644))
			require.True(t, proc.Wait(5*time.Minute), "%s", out.String())
			require.NoError(t, proc.Err(), "%s\n%s", out.String(), p.daemonLogs())
			assert.True(t, strings.HasSuffix(out.String(), "OK auto external plain\n"), "%s", out.String())
		})
	}
}
