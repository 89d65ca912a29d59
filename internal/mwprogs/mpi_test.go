package mwprogs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUDWireupCrash: only a segmentation fault in UCX's UD receive path
// inside MPI_Init or in UCX's async thread, UD's assertion on an
// acknowledged PSN, or its assertion on a connection reply's endpoint, is
// taken for a known UCX defect.
func TestUDWireupCrash(t *testing.T) {
	crash := `[vm:8521 :0:8521] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x7fc6e98d5000)
==== backtrace (tid:   8521) ====
 3  /lib/x86_64-linux-gnu/libucp.so.0(+0xbbe57) [0x7f9e699aee57]
 4  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x246) [0x7f9e6987c046]
 6  /lib/x86_64-linux-gnu/libucp.so.0(ucp_worker_progress+0x72) [0x7f9e6993def2]
 8  /lib/x86_64-linux-gnu/libmpi.so.40(ompi_mpi_init+0x93e) [0x7f9e6c43621e]
 9  /lib/x86_64-linux-gnu/libmpi.so.40(MPI_Init+0x6d) [0x7f9e6c3c9b7d]
`
	assert.True(t, udWireupCrash(crash))
	ack := `Caught signal 11 (Segmentation fault)
 2  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_ack+0x30)
 9  /lib/x86_64-linux-gnu/libmpi.so.40(MPI_Init+0x6d)
`
	assert.True(t, udWireupCrash(ack))
	// The same crash in UCX's async thread, which progresses UD while
	// the rank waits: MPI_Init is not on its stack.
	async := `[vm:27343:a:27384] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x7f6244138000)
==== backtrace (tid:  27384) ====
 3  /lib/x86_64-linux-gnu/libucp.so.0(+0xbbe57) [0x7f8f4d5aee57]
 4  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x246) [0x7f8f4d1c7046]
 9  /lib/x86_64-linux-gnu/libucs.so.0(ucs_async_dispatch_handlers+0x3c) [0x7f8f4d4acbcc]
11  /lib/x86_64-linux-gnu/libucs.so.0(ucs_event_set_wait+0xe1) [0x7f8f4d4c89c1]
`
	assert.True(t, udWireupCrash(async))
	// The same defect under load, caught by UD's own assertion (in its
	// async thread: MPI_Init need not be on the stack).
	assertion := `[vm:30123:a:30168]       ud_ep.c:721  Assertion ` + "`" + `((int16_t)((ep->tx.acked_psn) - (ep->tx.psn)) < 0)' failed: ep 0x55b5da68d400: flags=0x198 acked_psn=3 must be smaller than current_psn=3
==== backtrace (tid:  30168) ====
 3  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x502) [0x7fb851129302]
[vm:30123] Signal: Aborted (6)
`
	assert.True(t, udWireupCrash(assertion))
	// UD's assertion on a connection reply from another endpoint of the
	// peer (openucx/ucx#6040), with its message...
	crep := `[vm:26192:0:26192]       ud_ep.c:891  Assertion ` + "`" + `ep->dest_ep_id == ctl->conn_rep.src_ep_id' failed: ep=0x55d0 [id=3 dest_ep_id=4 flags=0x114] crep [neth->dest=3 dst_ep_id=3 src_ep_id=5]
 3  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x1147) [0x7f87eff05f47]
`
	assert.True(t, udWireupCrash(crep))
	// ...and without it (a loaded CI run's second job: the rank's
	// backtrace alone reached mpirun's output).
	crepBare := `==== backtrace (tid:  26192) ====
 0  /lib/x86_64-linux-gnu/libucs.so.0(ucs_handle_error+0x2dc) [0x7f87effcce9c]
 2  /lib/x86_64-linux-gnu/libucs.so.0(ucs_fatal_error_format+0xe1) [0x7f87effcabf1]
 3  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x1147) [0x7f87eff05f47]
 8  /lib/x86_64-linux-gnu/libmpi.so.40(ompi_mpi_init+0x93e) [0x7f87f866021e]
`
	assert.True(t, udWireupCrash(crepBare))
	for name, out := range map[string]string{
		"another frame of process_rx": " 3  /lib/x86_64-linux-gnu/ucx/libuct_ib.so.0(uct_ud_ep_process_rx+0x1148) [0x7f87eff05f47]\n",
		"wrong result":                "mpi_check: allreduce mismatch at rank 2\n",
		"abort, not segv":             "Caught signal 6 (Aborted)\n uct_ud_ep_process_rx\n MPI_Init\n",
		"after init":                  "Caught signal 11 (Segmentation fault)\n uct_ud_ep_process_rx\n MPI_Allreduce\n",
		"elsewhere in ucx":            "Caught signal 11 (Segmentation fault)\n uct_rc_verbs_iface_progress\n MPI_Init\n",
		"async, not ud":               "Caught signal 11 (Segmentation fault)\n uct_rc_verbs_iface_event_arm\n ucs_async_dispatch_handlers\n",
		"other assertion":             "ud_ep.c:300  Assertion `ep->tx.pending' failed\n uct_ud_ep_process_rx\n",
	} {
		assert.False(t, udWireupCrash(out), name)
	}
}
