/* cma_ece.c - Enhanced Connection Establishment (ECE) of an rdma_cm_id,
 * as rdma-core's librdmacm (cma.c) handles it with a kernel whose CM
 * carries ECE (struct ucma_abi_ece): the REQ offers the local options,
 * the REP answers with those the passive side took, and each side's QP
 * runs the agreed ones from its move to RTR.
 *
 * With vrnic's CM the daemon computes the agreement (vrnic_abi.h
 * "Enhanced Connection Establishment"): every ID is created with
 * VRNIC_CM_ID_F_ECE, CM_CONNECT offers cma_offer_ece's options,
 * CM_ACCEPT says which the QP took (cma_accept_ece), and the RTR
 * attributes carry the agreed options, which modify_to sets on the QP
 * with ibv_set_ece before the RTR, as librdmacm does (init_ece,
 * ucma_process_conn_resp_ece). For an ID with a QP of its own
 * (rdma_create_qp) that is all automatic. An ID without one (the
 * program's external QP) offers and accepts what rdma_set_local_ece set,
 * and the program applies the agreed options itself (rdma_get_remote_ece,
 * ibv_set_ece), as with rdma-core: without rdma_set_local_ece it offers
 * and accepts none, so that no peer runs an option its QP does not. */
#include "cma.h"

#include <errno.h>

#define ERRNO(e) (errno = (e), -1)

/* rdma_set_local_ece: rdma-core refuses an ID with a QP of its own (ECE
 * is for external QPs), a NULL ece, a zero vendor_id and any comp_mask
 * bit, with EINVAL. Another vendor's options are kept (and reported) but
 * never offered: the REQ and REP carry vrnic's vendor ID only. */
VR_EXPORT int rdma_set_local_ece(struct rdma_cm_id *cid, struct ibv_ece *ece) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || id->id.qp || !ece || !ece->vendor_id || ece->comp_mask)
		return ERRNO(EINVAL);
	id->local_ece.vendor_id = ece->vendor_id;
	id->local_ece.options = ece->options;
	return 0;
}

/* rdma_get_remote_ece: what the peer's REQ (after CONNECT_REQUEST) or
 * REP (after CONNECT_RESPONSE) carried: its vendor ID and options, zero
 * when it carried none (a peer without ECE, Linux with Soft-RoCE). */
VR_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *cid, struct ibv_ece *ece) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || id->id.qp || !ece)
		return ERRNO(EINVAL);
	ece->vendor_id = id->remote_ece.vendor_id;
	ece->options = id->remote_ece.options;
	ece->comp_mask = 0;
	return 0;
}

/* local_options returns the options this side offers or takes: its QP's
 * (ibv_query_ece: every option the device supports, or what the program
 * set, or after RTR those agreed), else rdma_set_local_ece's when they
 * are vrnic's. RC only. */
static uint32_t local_options(struct cma_id *id) {
	if (id->id.qp_type != IBV_QPT_RC)
		return 0;
	if (id->id.qp) {
		struct ibv_ece e;
		if (ibv_query_ece(id->id.qp, &e) || e.vendor_id != VRNIC_ECE_VENDOR_ID)
			return 0;
		return e.options & VRNIC_ECE_OPTIONS;
	}
	if (id->local_ece.vendor_id != VRNIC_ECE_VENDOR_ID)
		return 0;
	return id->local_ece.options & VRNIC_ECE_OPTIONS;
}

/* cma_offer_ece returns the options rdma_connect's REQ offers. */
uint32_t cma_offer_ece(struct cma_id *id) { return local_options(id); }

/* cma_accept_ece returns the options rdma_accept's QP took: with a QP of
 * its own, those modify_to set at RTR. */
uint32_t cma_accept_ece(struct cma_id *id) { return local_options(id); }

/* cma_apply_ece sets the agreed options on the ID's QP for its move to
 * RTR, as librdmacm does with ibv_set_ece; a device with ECE switched off
 * has none to set (EOPNOTSUPP, ignored as librdmacm ignores it). */
void cma_apply_ece(struct cma_id *id, uint32_t agreed) {
	if (!id->id.qp)
		return;
	struct ibv_ece e = { .vendor_id = VRNIC_ECE_VENDOR_ID, .options = agreed };
	(void)ibv_set_ece(id->id.qp, &e);
}
