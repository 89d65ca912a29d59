/* ex.c - the extended verbs: ibv_qp_ex (ibv_wr_*), ibv_cq_ex
 * (start/next/end_poll, ibv_wc_read_*), ibv_query_device_ex. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <string.h>

void vr_qp_ex_init(struct vr_qp *qp, uint64_t send_ops_flags) {
	(void)qp;
	(void)send_ops_flags;
}

void vr_cq_ex_init(struct vr_cq *cq, uint64_t wc_flags) { cq->wc_flags = wc_flags; }

struct ibv_cq_ex *vr_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a) {
	(void)ctx;
	(void)a;
	VR_FAIL_NULL(EOPNOTSUPP);
}

struct ibv_qp *vr_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a) {
	if (!a || !(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
		VR_FAIL_NULL(EINVAL);
	if (a->comp_mask & ~(uint32_t)IBV_QP_INIT_ATTR_PD)
		VR_FAIL_NULL(EOPNOTSUPP);
	return vr_create_qp(a->pd, a);
}

int vr_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
		       struct ibv_device_attr_ex *attr, size_t size) {
	(void)ctx;
	(void)in;
	(void)attr;
	(void)size;
	return EOPNOTSUPP;
}
