/* XRC: domains (ibv_open_xrcd, ibv_close_xrcd), XRC SRQs
 * (ibv_create_srq_ex with IBV_SRQT_XRC, ibv_get_srq_num) and XRC target
 * QPs (ibv_create_qp_ex with IBV_QPT_XRC_RECV), over the daemon's XRC
 * commands (vrnic_abi.h, "XRC"). Initiator QPs are CREATE_QP's; their WRs
 * name the target SRQ (post.c, ex.c). */
#include "vrnic_ibv.h"

#include <fcntl.h>
#include <stdlib.h>

struct ibv_xrcd *vr_open_xrcd(struct ibv_context *ctx, struct ibv_xrcd_init_attr *a) {
	if (!a || (a->comp_mask & ~(uint32_t)(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS)))
		VR_FAIL_NULL(EINVAL);
	struct vrnic_cmd_open_xrcd cmd = { 0 };
	int fd = (a->comp_mask & IBV_XRCD_INIT_ATTR_FD) ? a->fd : -1;
	if (a->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) {
		if (a->oflags & ~(O_CREAT | O_EXCL))
			VR_FAIL_NULL(EINVAL);
		cmd.oflags = (a->oflags & O_CREAT ? VRNIC_XRCD_O_CREAT : 0) | (a->oflags & O_EXCL ? VRNIC_XRCD_O_EXCL : 0);
	}
	if (fd < 0)
		cmd.oflags = 0; /* the context's own domain */
	struct vr_ctx *c = vr_ctx(ctx);
	struct vr_xrcd *x = calloc(1, sizeof *x);
	if (!x)
		VR_FAIL_NULL(ENOMEM);
	/* The PD and CQ a target QP's command names. */
	x->pd = ibv_alloc_pd(ctx);
	x->cq = x->pd ? ibv_create_cq(ctx, 1, NULL, NULL, 0) : NULL;
	if (!x->cq) {
		int e = errno;
		if (x->pd)
			ibv_dealloc_pd(x->pd);
		free(x);
		VR_FAIL_NULL(e);
	}
	struct vrnic_resp_open_xrcd r;
	int ret = vr_call(c, VRNIC_CMD_OPEN_XRCD, &cmd, sizeof cmd, NULL, 0, &fd, fd >= 0 ? 1 : 0, &r, sizeof r);
	if (ret) {
		ibv_destroy_cq(x->cq);
		ibv_dealloc_pd(x->pd);
		free(x);
		VR_FAIL_NULL(ret);
	}
	x->handle = r.xrcd_handle;
	x->xrcd.context = ctx;
	return &x->xrcd;
}

int vr_close_xrcd(struct ibv_xrcd *xrcd) {
	struct vr_xrcd *x = (struct vr_xrcd *)xrcd;
	struct vrnic_cmd_handle cmd = { .handle = x->handle };
	int ret = vr_call(vr_ctx(xrcd->context), VRNIC_CMD_CLOSE_XRCD, &cmd, sizeof cmd, NULL, 0, NULL, 0, NULL, 0);
	if (ret) {
		errno = ret;
		return ret;
	}
	ibv_destroy_cq(x->cq);
	ibv_dealloc_pd(x->pd);
	free(x);
	return 0;
}

int vr_get_srq_num(struct ibv_srq *srq, uint32_t *num) {
	struct vr_srq *s = vr_srq(srq);
	if (!s->srq_num) {
		errno = EINVAL;
		return EINVAL;
	}
	*num = s->srq_num;
	return 0;
}

struct ibv_srq *vr_create_xrc_srq(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a) {
	uint32_t need = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
	if ((a->comp_mask & need) != need || !a->pd || !a->xrcd || !a->cq || a->pd->context != ctx ||
	    a->xrcd->context != ctx || a->cq->context != ctx)
		VR_FAIL_NULL(EINVAL);
	struct vr_xrcd *x = (struct vr_xrcd *)a->xrcd;
	return vr_create_srq_xrc(a->pd, a->srq_context, &a->attr, x->handle, a->cq->handle);
}

struct ibv_qp *vr_create_xrc_tgt(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a) {
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a->xrcd || a->xrcd->context != ctx)
		VR_FAIL_NULL(EINVAL);
	if (a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
				       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		VR_FAIL_NULL(EOPNOTSUPP);
	if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
		VR_FAIL_NULL(EOPNOTSUPP);
	struct vr_xrcd *x = (struct vr_xrcd *)a->xrcd;
	/* A target QP has no queues: the command's SQ is one slot that
	 * nothing posts to (the daemon never reads it). */
	struct ibv_qp_init_attr_ex b = *a;
	b.pd = x->pd;
	b.send_cq = x->cq;
	b.recv_cq = NULL;
	b.srq = NULL;
	b.cap = (struct ibv_qp_cap){ .max_send_wr = 1, .max_send_sge = 1 };
	b.comp_mask &= ~(uint32_t)IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_qp *qp = vr_create_qp_xrcd(x->pd, &b, x->handle);
	if (qp)
		a->cap = (struct ibv_qp_cap){ 0 };
	return qp;
}
