package tap

import (
	"path/filepath"
	"testing"

	"github.com/vrnic/vrnic/internal/mwprogs"
)

// TestUCXOverTAP runs UCX's tools and an Open MPI job (the cases of
// internal/mwprogs) through vrnic-run between the two TAP daemons of the
// package's topology. The programs run in the host namespace and meet on
// 127.0.0.1 for their own out-of-band exchange (ucx_perftest, mpirun's
// runtime); io_demo connects through UCX's rdma_cm to daemon A's TAP
// address; their RDMA traffic crosses vtb → br0 → vta, except between
// two ranks of one daemon (and a rank's connection to itself), which the
// daemon's link loops back as an RNIC does (link.TAPPort.SendBatch).
func TestUCXOverTAP(t *testing.T) {
	tp := newTopo(t)
	e := tp.mwEnv(t, "ua", "ub")
	mwprogs.UCXSuite(t, e, 1000, 500)
	prog := mwprogs.MPIProgram(t, t.TempDir())
	t.Run("mpi_2ranks", func(t *testing.T) { mwprogs.MPI(t, e, prog, "rc_verbs,ud_verbs", 1) })
	t.Run("mpi_4ranks", func(t *testing.T) { mwprogs.MPI(t, e, prog, "rc_verbs,ud_verbs", 2) })
}

// mwEnv starts daemons devA (TAP "v"+devA, addrA) and devB in the
// topology's namespaces and returns the mwprogs environment of the two,
// servers on devA.
func (tp *topo) mwEnv(t *testing.T, devA, devB string) mwprogs.Env {
	a := tp.startDaemon(t, tp.nsA, devA, "v"+devA, 1, nil, addrA+"/24")
	b := tp.startDaemon(t, tp.nsB, devB, "v"+devB, 1, nil, addrB+"/24")
	return mwprogs.Env{
		VrnicRun: filepath.Join(bin, "vrnic-run"), RunArgs: []string{"-runtime-dir", tp.dir, "-cache-dir", t.TempDir()},
		Devs:  [2]string{devA, devB},
		Addrs: [2]string{addrA, addrB},
		Socks: [2]string{a.sock, b.sock},
	}
}
