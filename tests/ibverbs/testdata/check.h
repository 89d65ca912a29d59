/* check.h - what the test programs share: failing with a message, the two
 * devices, and waiting for one completion and comparing it with the one
 * expected.
 * Each program prints "ERROR ..." and exits 1 at the first difference. */
#ifndef CHECK_H
#define CHECK_H

#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline void die(const char *what) {
	perror(what);
	printf("ERROR %s\n", what);
	exit(1);
}

static inline void fail(const char *kind, const char *what, const char *detail) {
	printf("ERROR %s %s: %s\n", kind, what, detail);
	exit(1);
}

static inline int64_t now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* two_devices returns the device list, which has at least two devices
 * (A and B), or exits. */
static inline struct ibv_device **two_devices(void) {
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2) {
		printf("ERROR need two devices, have %d\n", list ? n : -1);
		exit(1);
	}
	return list;
}

/* poll_wc waits up to ms milliseconds for a completion on cq: 1 when wc
 * holds one, 0 when none came. */
static inline int poll_wc(struct ibv_cq *cq, struct ibv_wc *wc, int ms) {
	int64_t end = now_ms() + ms;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n)
			return 1;
		if (now_ms() > end)
			return 0;
	}
}

/* The sl of a UD receive over RoCE v2 and IPv4: bit 3 (UDP header) and L3
 * type 2 (IPv4). */
#define ROCE_V2_IPV4_SL 0xa

/* expect_wc waits for the next completion on cq and compares it with
 * want: wr_id, status, opcode, qp_num and wc_flags always; byte_len if
 * check_len; imm_data when want.wc_flags has IBV_WC_WITH_IMM; and for a UD
 * receive (IBV_WC_GRH) src_qp, the fields a RoCE device leaves zero
 * (slid, pkey_index, dlid_path_bits) and sl, which carries the RoCE packet
 * type as ConnectX reports it (ROCE_V2_IPV4_SL: the tests run over IPv4).
 * wc is the completion, for the
 * caller to look at further (NULL: not wanted). */
static inline void expect_wc_out(const char *kind, const char *what, struct ibv_cq *cq, struct ibv_wc want,
				 int check_len, struct ibv_wc *out) {
	struct ibv_wc wc;
	memset(&wc, 0xa5, sizeof wc); /* fields the library leaves unset show up */
	if (!poll_wc(cq, &wc, 10000))
		fail(kind, what, "no completion in 10 s");
	char d[256];
#define FIELD(f, fmt)                                                                                          \
	if (wc.f != want.f) {                                                                                  \
		snprintf(d, sizeof d, #f " %" fmt ", want %" fmt " (status %s)", wc.f, want.f,                 \
			 ibv_wc_status_str(wc.status));                                                        \
		fail(kind, what, d);                                                                           \
	}
	FIELD(status, "d");
	FIELD(wr_id, PRIu64);
	FIELD(opcode, "d");
	FIELD(qp_num, "u");
	FIELD(wc_flags, "u");
	if (check_len)
		FIELD(byte_len, "u");
	if (want.wc_flags & IBV_WC_WITH_IMM)
		FIELD(imm_data, "u");
	if (want.wc_flags & IBV_WC_GRH) {
		FIELD(src_qp, "u");
		FIELD(slid, "u");
		want.sl = ROCE_V2_IPV4_SL;
		FIELD(sl, "u");
		FIELD(pkey_index, "u");
		FIELD(dlid_path_bits, "u");
	}
#undef FIELD
	/* Exactly one completion. */
	struct ibv_wc extra;
	if (ibv_poll_cq(cq, 1, &extra) != 0)
		fail(kind, what, "a second completion");
	if (out)
		*out = wc;
}

static inline void expect_wc(const char *kind, const char *what, struct ibv_cq *cq, struct ibv_wc want, int check_len) {
	expect_wc_out(kind, what, cq, want, check_len, NULL);
}

/* rc_to_rts takes an RC QP from RESET to RTS, connected to QP dest_qpn at
 * dgid over port 1 with path MTU 1024: access the QP's remote access
 * flags, psn both its send PSN and the PSN it expects, rd_atomic its read
 * and atomic depth both ways. Exits on an error. */
static inline void rc_to_rts(struct ibv_qp *qp, uint32_t dest_qpn, const union ibv_gid *dgid, int access,
			     uint32_t psn, uint8_t rd_atomic) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = (unsigned)access };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = rd_atomic;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					  IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");
}

#endif /* CHECK_H */
