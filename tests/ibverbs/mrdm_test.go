package ibverbs_test

import "testing"

// TestMRDM builds testdata/mrdm.c and runs it as TestMemOps runs
// mem_ops.c: ibv_rereg_mr with each flag and all three (RDMA through the
// new translation, access and PD with every byte checked, the old ones
// refused with REM_ACCESS_ERR, keys unchanged, bad flags and access
// refused), ibv_resize_cq with completions outstanding across a grow and
// a shrink (a shrink below them EINVAL, then polled in order, every field
// checked), and device memory: memcpy to and from (EFAULT beyond the DM,
// EINVAL unaligned), WRITE from a DM MR into a remote DM MR, READ from it
// into host memory and into DM, FETCH_AND_ADD on it, a DM MR at an
// offset, registration beyond the DM and without ZERO_BASED refused
// (EINVAL), ibv_free_dm EBUSY with an MR, the device's DM exhausted
// (ENOMEM).
func TestMRDM(t *testing.T) {
	runOps(t, startPair(t), "mrdm.c",
		"OK rereg translation access pd all bad_flags, resize grow shrink einval order, dm memcpy write read fetch_add offset bounds free\n")
}
