/* misc.c - helpers of the libibverbs API that need no device: strings,
 * rate conversions, fork support, and the verbs this device does not
 * offer (they fail with EOPNOTSUPP or ENOSYS as documented). */
#include "vrnic_ibv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

VR_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status) {
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if ((unsigned)status < sizeof s / sizeof s[0] && s[status])
		return s[status];
	return "unknown";
}

VR_EXPORT const char *ibv_node_type_str(enum ibv_node_type t) {
	static const char *const s[] = { "unknown", "InfiniBand channel adapter", "InfiniBand switch",
		"InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified" };
	if (t < IBV_NODE_CA || (unsigned)t >= sizeof s / sizeof s[0])
		return "unknown";
	return s[t];
}

VR_EXPORT const char *ibv_port_state_str(enum ibv_port_state s) {
	static const char *const n[] = { "PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
		"PORT_ACTIVE_DEFER" };
	if ((unsigned)s < sizeof n / sizeof n[0])
		return n[s];
	return "(invalid port state)";
}

VR_EXPORT const char *ibv_event_type_str(enum ibv_event_type e) {
	static const char *const s[] = { "CQ error", "local work queue catastrophic error",
		"invalid request local work queue error", "local access violation work queue error",
		"communication established", "send queue drained", "path migrated", "path migration request error",
		"local catastrophic error", "port active", "port error", "LID change", "P_Key change",
		"SM change", "SRQ catastrophic error", "SRQ limit reached", "last WQE reached",
		"client reregistration", "GID table change", "WQ fatal" };
	if ((unsigned)e < sizeof s / sizeof s[0])
		return s[e];
	return "unknown";
}

static const struct {
	enum ibv_rate rate;
	int mult, mbps;
} rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 }, { IBV_RATE_5_GBPS, 2, 5000 }, { IBV_RATE_10_GBPS, 4, 10000 },
	{ IBV_RATE_20_GBPS, 8, 20000 }, { IBV_RATE_30_GBPS, 12, 30000 }, { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 }, { IBV_RATE_80_GBPS, 32, 80000 }, { IBV_RATE_120_GBPS, 48, 120000 },
	{ IBV_RATE_14_GBPS, 0, 14062 }, { IBV_RATE_56_GBPS, 0, 56250 }, { IBV_RATE_112_GBPS, 0, 112500 },
	{ IBV_RATE_168_GBPS, 0, 168750 }, { IBV_RATE_25_GBPS, 10, 25781 }, { IBV_RATE_100_GBPS, 40, 103125 },
	{ IBV_RATE_200_GBPS, 80, 206250 }, { IBV_RATE_300_GBPS, 120, 309375 },
	{ IBV_RATE_28_GBPS, 11, 28125 }, { IBV_RATE_50_GBPS, 20, 53125 }, { IBV_RATE_400_GBPS, 160, 425000 },
	{ IBV_RATE_600_GBPS, 240, 637500 },
};

VR_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
		if (rates[i].rate == rate)
			return rates[i].mult ? rates[i].mult : -1;
	return -1;
}

VR_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
		if (rates[i].mult && rates[i].mult == mult)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

VR_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

VR_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

/* Registered memory is MADV_DONTFORK already (see mem.c): fork support
 * needs nothing more. */
VR_EXPORT int ibv_fork_init(void) { return 0; }

VR_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_ENABLED; }

VR_EXPORT int ibv_dontfork_range(void *base, size_t size) {
	return madvise(base, size, MADV_DONTFORK) ? errno : 0;
}

VR_EXPORT int ibv_dofork_range(void *base, size_t size) {
	return madvise(base, size, MADV_DOFORK) ? errno : 0;
}

VR_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp) {
	if (!qp)
		VR_FAIL_NULL(EINVAL);
	struct vr_qp *q = vr_qp(qp);
	if (!q->ex.wr_start)
		VR_FAIL_NULL(EOPNOTSUPP);
	return &q->ex;
}

VR_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
	(void)qp;
	(void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

VR_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
	(void)qp;
	(void)ece;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

VR_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags) {
	(void)qp;
	(void)op;
	(void)flags;
	return 0;
}

VR_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
	(void)qp;
	(void)gid;
	(void)lid;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

VR_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
	(void)qp;
	(void)gid;
	(void)lid;
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

VR_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					   int access) {
	(void)pd;
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	VR_FAIL_NULL(EOPNOTSUPP);
}

VR_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *ctx, struct ibv_ah_attr *attr, uint8_t eth_mac[6],
					  uint16_t *vid) {
	(void)ctx;
	(void)attr;
	(void)eth_mac;
	(void)vid;
	return EOPNOTSUPP;
}

VR_EXPORT struct ibv_context *ibv_import_device(int cmd_fd) {
	(void)cmd_fd;
	VR_FAIL_NULL(EOPNOTSUPP);
}

VR_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *ctx, uint32_t handle) {
	(void)ctx;
	(void)handle;
	VR_FAIL_NULL(EOPNOTSUPP);
}

VR_EXPORT void ibv_unimport_pd(struct ibv_pd *pd) { (void)pd; }

VR_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t handle) {
	(void)pd;
	(void)handle;
	VR_FAIL_NULL(EOPNOTSUPP);
}

VR_EXPORT void ibv_unimport_mr(struct ibv_mr *mr) { (void)mr; }

VR_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *ctx, uint32_t handle) {
	(void)ctx;
	(void)handle;
	VR_FAIL_NULL(EOPNOTSUPP);
}

VR_EXPORT void ibv_unimport_dm(struct ibv_dm *dm) { (void)dm; }

/* Old-ABI helpers that copy kernel structs: not meaningful without the
 * kernel ABI; they leave the destination zeroed. */
VR_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, void *src) {
	(void)src;
	memset(dst, 0, sizeof *dst);
}

VR_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, void *src) {
	(void)src;
	memset(dst, 0, sizeof *dst);
}

VR_EXPORT void ibv_copy_path_rec_from_kern(void *dst, void *src) {
	(void)dst;
	(void)src;
}

VR_EXPORT void ibv_copy_path_rec_to_kern(void *dst, void *src) {
	(void)dst;
	(void)src;
}
