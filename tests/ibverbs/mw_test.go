package ibverbs_test

import "testing"

// TestMW builds testdata/mw.c and runs it as TestMemOps runs mem_ops.c:
// memory windows through the verbs API between two daemons. Type 1
// (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW, ibv_wr_bind_mw) windows over
// an MR without remote rights, RDMA WRITE and READ through their rkeys
// with every byte of both buffers checked, a type 2 window's refused
// through another QP of the same PDs (on the same daemon worker); SEND_WITH_INV of a window's
// rkey (IBV_WC_WITH_INV and invalidated_rkey at the receiver), LOCAL_INV,
// unbind and dealloc each leaving the rkey dead (IBV_WC_REM_ACCESS_ERR);
// accesses past the window or without the right refused; binds refused
// with IBV_WC_MW_BIND_ERR (beyond the MR, an MR without MW_BIND, a type 2
// window bound twice, a window of another PD) and the QP in error; the
// device's MEM_WINDOW caps.
func TestMW(t *testing.T) {
	runOps(t, startPair(t), "mw.c",
		"OK caps; type1 bind write read past_window no_read local_inv_refused dereg_busy unbind; "+
			"type2 post_bind write other_qp bound_twice send_inv local_inv wr_bind_mw dealloc_pd_busy dealloc; "+
			"errors beyond_mr before_mr no_mw_bind other_pd unbound_rkey\n")
}
