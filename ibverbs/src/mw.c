/* mw.c - memory windows (ABI 1.4): ibv_alloc_mw and ibv_dealloc_mw
 * (ALLOC_MW, DEALLOC_MW), ibv_bind_mw, which posts a BIND_MW work request
 * on the QP as rdma-core's rxe provider does, and the BIND_MW WQE that
 * ibv_post_send (type 2 windows) and ibv_wr_bind_mw build. The daemon
 * executes the bind in order with the QP's other work requests and
 * completes it with IBV_WC_BIND_MW, or IBV_WC_MW_BIND_ERR. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <stdlib.h>

struct ibv_mw *vr_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type) {
	if (!pd)
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(pd->context);
	struct ibv_mw *mw = calloc(1, sizeof *mw);
	if (!mw)
		VR_FAIL_NULL(ENOMEM);
	/* The type goes to the daemon as given: a type other than 1 and 2
	 * fails there with EINVAL, as ib_uverbs_alloc_mw does. */
	struct vrnic_cmd_alloc_mw cmd = { .pd_handle = pd->handle, .type = (uint32_t)type };
	struct vrnic_resp_alloc_mw r;
	int ret = vr_call(c, VRNIC_CMD_ALLOC_MW, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		free(mw);
		VR_FAIL_NULL(ret);
	}
	mw->context = pd->context;
	mw->pd = pd;
	mw->rkey = r.rkey;
	mw->handle = r.mw_handle;
	mw->type = type;
	return mw;
}

int vr_dealloc_mw(struct ibv_mw *mw) {
	if (!mw)
		return EINVAL;
	int ret = vr_destroy_handle(vr_ctx(mw->context), VRNIC_CMD_DEALLOC_MW, mw->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	free(mw);
	return 0;
}

/* vr_bind_wqe fills the bind fields of a BIND_MW WQE (vrnic_abi.h). The
 * window is named by its handle; the daemon checks everything else. */
void vr_bind_wqe(struct vrnic_send_wqe *w, const struct ibv_mw *mw, uint32_t rkey,
		 const struct ibv_mw_bind_info *info) {
	w->invalidate_rkey = mw->handle;
	w->rkey = rkey;
	w->imm_data = info->mr ? info->mr->lkey : 0;
	w->remote_addr = info->addr;
	w->compare_add = info->length;
	w->swap = info->mw_access_flags;
}

/* vr_bind_mw is ibv_bind_mw for type 1 windows (verbs.h has checked the
 * type and the MR's PD): a BIND_MW work request with the window's next
 * key (ibv_inc_rkey), which becomes mw->rkey once the request is posted,
 * as rdma-core's rxe provider does. Length 0 unbinds the window. */
int vr_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b) {
	if (!qp || !mw || !b)
		return EINVAL;
	struct ibv_send_wr wr = { .wr_id = b->wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = b->send_flags };
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = b->bind_info;
	struct ibv_send_wr *bad;
	int ret = vr_post_send(qp, &wr, &bad);
	if (!ret)
		mw->rkey = wr.bind_mw.rkey;
	return ret;
}
