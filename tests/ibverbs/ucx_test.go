package ibverbs_test

import (
	"testing"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/mwprogs"
)

// mwEnv is the mwprogs environment of p: servers on b, clients on a.
func mwEnv(p *pair) mwprogs.Env {
	return mwprogs.Env{
		VrnicRun: bin + "/vrnic-run", RunArgs: []string{"-runtime-dir", p.dir, "-cache-dir", cache},
		Devs:  [2]string{"b", "a"},
		Addrs: [2]string{p.addr[1].String(), p.addr[0].String()},
		Socks: [2]string{admin.SocketPath(p.dir, "b"), admin.SocketPath(p.dir, "a")},
	}
}

// TestUCX runs Debian's UCX tools unmodified through vrnic-run on two
// daemons over the UDP link: ucx_info -d lists rc_verbs and ud_verbs on
// both devices; ucx_perftest's tag_lat, tag_bw, ucp_put_bw, ucp_get and
// stream_bw run to their last iteration over rc_verbs with ud_verbs and
// over ud_verbs alone, with the daemons carrying the traffic; io_demo
// moves READ and WRITE requests of 1 B to 1 MiB with its data checks,
// connected through UCX's rdma_cm; and UCX's UD transport and its rdma_cm
// see the GIDs ibv_devinfo reports.
func TestUCX(t *testing.T) {
	p := startPair(t)
	e := mwEnv(p)
	mwprogs.UCXSuite(t, e, 2000, 1000)
}

// TestOpenMPI runs a checking MPI program (internal/mwprogs:
// ping-pong, MPI_Allreduce, MPI_Alltoall, MPI_Bcast) as Open MPI jobs of
// 2 and 4 ranks across the two daemons, over pml ucx with UCX limited to
// rc_verbs with ud_verbs (and for 2 ranks, ud_verbs alone), so that
// nothing but vrnic can carry it.
func TestOpenMPI(t *testing.T) {
	p := startPair(t)
	e := mwEnv(p)
	prog := mwprogs.MPIProgram(t, t.TempDir())
	t.Run("2ranks", func(t *testing.T) { mwprogs.MPI(t, e, prog, "rc_verbs,ud_verbs", 1) })
	t.Run("4ranks", func(t *testing.T) { mwprogs.MPI(t, e, prog, "rc_verbs,ud_verbs", 2) })
	t.Run("2ranks_ud", func(t *testing.T) { mwprogs.MPI(t, e, prog, "ud_verbs", 1) })
}
