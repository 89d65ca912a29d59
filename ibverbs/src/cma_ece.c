/* cma_ece.c - Enhanced Connection Establishment (ECE) options of a CM ID,
 * as rdma-core's librdmacm (cma.c) handles them with a kernel whose CM
 * carries no ECE: rdma_set_local_ece checks its arguments and keeps
 * nothing that reaches the wire (vrnic's CM sends no vendor ID or options
 * in its REQ and REP), and rdma_get_remote_ece reports none (vendor_id
 * and options 0). Neither fails with ENOSYS or EOPNOTSUPP: rdma-core's
 * do not, and UCX and others call them unconditionally. The provider
 * side, ibv_query_ece and ibv_set_ece, fails with EOPNOTSUPP as rdma-core
 * does for a provider without ECE (rxe). */
#include "cma.h"

#include <errno.h>

#define ERRNO(e) (errno = (e), -1)

/* rdma_set_local_ece: rdma-core refuses an ID with a QP of its own (ECE
 * is for external QPs), a NULL ece, a zero vendor_id and any comp_mask
 * bit, with EINVAL. */
VR_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece) {
	if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask)
		return ERRNO(EINVAL);
	return 0;
}

/* rdma_get_remote_ece: what the peer's REQ or REP carried; vrnic's CM
 * takes none from it, so none (rdma-core with a kernel without ECE gives
 * the same zeros). */
VR_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece) {
	if (!id || id->qp || !ece)
		return ERRNO(EINVAL);
	ece->vendor_id = 0;
	ece->options = 0;
	ece->comp_mask = 0;
	return 0;
}
