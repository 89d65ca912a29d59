/* misc.c - helpers of the libibverbs API that need no device: strings,
 * rate conversions, fork support, ECE (ibv_query_ece, ibv_set_ece,
 * VRNIC_ECE), and the verbs this device does not offer (they fail with
 * EOPNOTSUPP or ENOSYS as documented). */
#include "vrnic_ibv.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ------------------------------------------------------------------
 * Enhanced Connection Establishment (ECE): vrnic's transport options of
 * an RC or XRC QP (vrnic_abi.h "Enhanced Connection Establishment"),
 * which both ends must agree on. As rdma-core's mlx5 provider
 * (mlx5_query_ece, mlx5_set_ece):
 *
 *   ibv_query_ece: vendor_id VRNIC_ECE_VENDOR_ID and the QP's options:
 *     before any ibv_set_ece every option the device supports (the
 *     offer librdmacm puts in a REQ; QUERY_DEVICE_EX), after it those
 *     set (the options the device supports among them: what the QP will
 *     run, as mlx5 reports what its firmware took), after the CM set
 *     them the agreed ones. UC and UD QPs have none.
 *   ibv_set_ece: a vendor_id of 0 is EOPNOTSUPP (libibverbs), a
 *     comp_mask bit or another vendor's ID EINVAL, and a device with ECE
 *     switched off (vrnicd -ece=false) or a QP without options (UC, UD)
 *     EOPNOTSUPP, as mlx5 refuses another vendor and a device without
 *     ECE: another vendor's options are never applied. The options are
 *     stored on the QP and sent with its next MODIFY_QP to INIT or RTR
 *     (the transitions that take them), as mlx5 sends them with its next
 *     modify.
 *
 * VRNIC_ECE (sr, rto, all, none; comma-separated) is the operator's
 * statement that the peers of this process's QPs are vrnic devices too,
 * for programs that connect their QPs out of band (perftest without -R,
 * the pingpongs): its options (those the device supports) go to every RC
 * or XRC QP moved to RTR that has no options of its own (none set with
 * ibv_set_ece, and none agreed through librdmacm).
 * ------------------------------------------------------------------ */

static bool ece_qp_type(const struct ibv_qp *qp) {
	return qp->qp_type == IBV_QPT_RC || qp->qp_type == IBV_QPT_XRC_SEND || qp->qp_type == IBV_QPT_XRC_RECV;
}

/* vr_ece_caps returns the ECE options the device supports, asked once
 * per context (QUERY_DEVICE_EX; a daemon that refuses it has none). */
uint32_t vr_ece_caps(struct vr_ctx *c) {
	uint64_t v = __atomic_load_n(&c->ece_caps, __ATOMIC_ACQUIRE);
	if (v == 0) {
		struct vrnic_device_attr_ex a;
		int ret = vr_call(c, VRNIC_CMD_QUERY_DEVICE_EX, NULL, 0, NULL, 0, NULL, 0, &a, sizeof a);
		if (ret == EIO || ret == ENOTCONN || ret == EPIPE)
			return 0;
		v = ret ? 1 : (uint64_t)(a.ece_options & VRNIC_ECE_OPTIONS) + 1; /* + 1: 0 is "not asked yet" */
		__atomic_store_n(&c->ece_caps, v, __ATOMIC_RELEASE);
	}
	return (uint32_t)(v - 1);
}

/* vr_parse_ece reads a list of ECE options (VRNIC_ECE): sr or
 * selective-repeat, rto or adaptive-rto, all, none, separated by commas.
 * It returns the options, and the first word it did not know in *bad
 * (NULL if none). */
uint32_t vr_parse_ece(const char *s, const char **bad) {
	static const struct {
		const char *name;
		uint32_t opts;
	} words[] = { { "sr", VRNIC_ECE_SELECTIVE_REPEAT }, { "selective-repeat", VRNIC_ECE_SELECTIVE_REPEAT },
		{ "rto", VRNIC_ECE_ADAPTIVE_RTO }, { "adaptive-rto", VRNIC_ECE_ADAPTIVE_RTO }, { "all", VRNIC_ECE_OPTIONS },
		{ "none", 0 }, { "0", 0 } };
	uint32_t opts = 0;
	*bad = NULL;
	while (s && *s) {
		while (*s == ' ' || *s == '\t' || *s == ',')
			s++;
		size_t n = strcspn(s, ", \t");
		if (!n)
			break;
		bool known = false;
		for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
			if (strlen(words[i].name) == n && !strncmp(s, words[i].name, n)) {
				opts |= words[i].opts;
				known = true;
			}
		}
		if (!known && !*bad)
			*bad = s;
		s += n;
	}
	return opts;
}

static uint32_t env_opts;

static void read_env_ece(void) {
	const char *e = getenv("VRNIC_ECE");
	const char *bad;
	env_opts = vr_parse_ece(e, &bad);
	if (bad)
		fprintf(stderr, "vrnic: VRNIC_ECE=%s: unknown option at \"%s\" (want sr, rto, all or none, comma-separated): ignored\n",
			e, bad);
}

/* env_ece returns VRNIC_ECE's options, read once. */
static uint32_t env_ece(void) {
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, read_env_ece);
	return env_opts;
}

/* qp_ece returns the options the QP reports: until something set them,
 * every option the device supports. */
static uint32_t qp_ece(struct ibv_qp *qp) {
	struct vr_qp *q = vr_qp(qp);
	if (!ece_qp_type(qp))
		return 0;
	if (!q->ece_known) {
		q->ece = vr_ece_caps(vr_ctx(qp->context));
		q->ece_known = true;
	}
	return q->ece;
}

/* vr_modify_ece decides the ECE options a MODIFY_QP of qp (attr, mask)
 * carries (VRNIC_QP_ECE): those ibv_set_ece stored, when the QP moves to
 * INIT or RTR; else, for an RC or XRC QP moving to RTR without options
 * of its own, VRNIC_ECE's (those the device supports). It returns false
 * when the command carries none. */
bool vr_modify_ece(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask, uint32_t *opts) {
	if (!(mask & IBV_QP_STATE) || !ece_qp_type(qp))
		return false;
	if (attr->qp_state != IBV_QPS_INIT && attr->qp_state != IBV_QPS_RTR)
		return false;
	struct vr_qp *q = vr_qp(qp);
	if (q->ece_pending) {
		*opts = q->ece;
		return true;
	}
	if (attr->qp_state == IBV_QPS_RTR && !q->ece_own) {
		uint32_t e = env_ece() & vr_ece_caps(vr_ctx(qp->context));
		if (e) {
			*opts = e;
			return true;
		}
	}
	return false;
}

/* vr_modified_ece records a MODIFY_QP that succeeded: the options it
 * carried (sent) are the QP's; RESET forgets every option, as the daemon
 * does. */
void vr_modified_ece(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask, bool sent, uint32_t opts) {
	struct vr_qp *q = vr_qp(qp);
	if (sent) {
		q->ece = opts;
		q->ece_known = true;
		q->ece_pending = false;
	}
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET)
		q->ece_known = q->ece_pending = q->ece_own = false;
}

VR_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
	if (!qp || !ece) {
		errno = EINVAL;
		return EINVAL;
	}
	ece->vendor_id = VRNIC_ECE_VENDOR_ID;
	ece->options = qp_ece(qp);
	ece->comp_mask = 0;
	return 0;
}

VR_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
	if (!qp || !ece) {
		errno = EINVAL;
		return EINVAL;
	}
	if (!ece->vendor_id) { /* libibverbs' ibv_set_ece */
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	if (ece->comp_mask || ece->vendor_id != VRNIC_ECE_VENDOR_ID) {
		errno = EINVAL;
		return EINVAL;
	}
	uint32_t caps = vr_ece_caps(vr_ctx(qp->context));
	if (!caps || !ece_qp_type(qp)) {
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	struct vr_qp *q = vr_qp(qp);
	q->ece = ece->options & caps;
	q->ece_known = q->ece_pending = q->ece_own = true;
	return 0;
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
