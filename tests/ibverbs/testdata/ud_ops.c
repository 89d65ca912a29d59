/* ud_ops: a libibverbs program (only <infiniband/verbs.h>) that checks the
 * UD and UC services between QPs on two devices (A and B, the first two
 * devices listed, each with an IPv4-mapped RoCE v2 GID at index 0):
 *
 *   UD  A -> B SEND through ibv_post_send and SEND_WITH_IMM through
 *       ibv_wr_send_imm/ibv_wr_set_ud_addr: the receive buffer holds the
 *       40-byte GRH (20 zero bytes, then the IPv4 header with A's and B's
 *       addresses, as Linux writes it) and then the data, byte-exact;
 *       byte_len counts both; wc_flags, src_qp and the zero RoCE fields.
 *       SENDs with a wrong Q_Key (another value; bit 31 set, meaning the
 *       sender's own, different Q_Key) are dropped: no completion within
 *       300 ms, and the receive WR is still there for the next SEND.
 *       An AH with flow_label 0xffffffff and SL 255 (as UCX makes them)
 *       works, its GRH unchanged (IPv4 has no flow label); sgid_index
 *       past the GID table fails with EINVAL, an empty entry ENODATA.
 *       B answers with an AH from ibv_create_ah_from_wc (the attributes
 *       of ibv_init_ah_from_wc checked), A receives it with B's GRH.
 *       ibv_query_qp gives the Q_Key; an RDMA WRITE on a UD QP fails to
 *       post (EINVAL); a SEND with a bad lkey completes in error and moves
 *       the QP to SQE, where the next SEND is flushed, until SQE -> RTS.
 *   UC  The AV of RTR with flow_label 0xffffffff, given back by
 *       ibv_query_qp. A -> B RDMA WRITE_WITH_IMM: B's memory byte-exact, a
 *       RECV_RDMA_WITH_IMM completion with the length and the immediate.
 *
 * Prints "OK ..." and exits 0, or "ERROR ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/ip.h>

#include "check.h"

#define GRH 40      /* the Global Route Header ahead of UD receive data */
#define LEN 3000    /* UD payload: at most the MTU (4096) */
#define UCLEN 20000 /* UC WRITE: several packets */
#define GUARD 64
#define QKEY_A 0x11111111u
#define QKEY_B 0x22222222u
#define UD_HDRS (8 + 12 + 8 + 4) /* UDP, BTH, DETH, ICRC: in the IPv4 total length */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
	unsigned char *buf; /* BUF bytes */
	struct ibv_mr *mr;
};

#define BUF (GUARD + GRH + UCLEN + GUARD)

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0)))
		die("open");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
	static const unsigned char v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	if (memcmp(s->gid.raw, v4mapped, 12))
		fail("setup", "GID 0", "not an IPv4-mapped GID");
	if (!(s->buf = malloc(BUF)))
		die("malloc");
	if (!(s->mr = ibv_reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
		die("ibv_reg_mr");
}

/* ud_qp makes a UD QP of s in RTS with Q_Key qkey; A's goes through
 * ibv_create_qp_ex with the ibv_wr_* send operations of UD. */
static void ud_qp(struct side *s, uint32_t qkey, int ex) {
	struct ibv_qp_init_attr_ex a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 2 },
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = s->pd };
	if (ex) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		/* RDMA WRITE is not a UD operation. */
		a.send_ops_flags |= IBV_QP_EX_WITH_RDMA_WRITE;
		if (ibv_create_qp_ex(s->ctx, &a) || errno != EOPNOTSUPP)
			fail("ud", "ibv_create_qp_ex with RDMA_WRITE in send_ops_flags", "not EOPNOTSUPP");
		a.send_ops_flags &= ~(uint64_t)IBV_QP_EX_WITH_RDMA_WRITE;
	}
	struct ibv_qp_init_attr b = { .send_cq = a.send_cq, .recv_cq = a.recv_cq, .qp_type = a.qp_type, .cap = a.cap };
	if (!(s->qp = ex ? ibv_create_qp_ex(s->ctx, &a) : ibv_create_qp(s->pd, &b)))
		die("create UD QP");
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey };
	if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("modify UD INIT");
	m.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE))
		die("modify UD RTR");
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 0x123;
	if (ibv_modify_qp(s->qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify UD RTS");
}

/* uc_connect moves s's UC QP to RTS towards peer's. */
static void uc_connect(struct side *s, struct side *peer) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify UC INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 5;
	/* The flow label is a u32 in the AV; the kernel stores it as given. */
	a.ah_attr = (struct ibv_ah_attr){ .is_global = 1,
		.grh = { .dgid = peer->gid, .hop_limit = 64, .flow_label = 0xffffffffu }, .port_num = 1 };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
		die("modify UC RTR");
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(s->qp, &q, IBV_QP_AV, &qi))
		die("ibv_query_qp UC");
	if (q.ah_attr.grh.flow_label != 0xffffffffu || memcmp(&q.ah_attr.grh.dgid, &peer->gid, 16))
		fail("uc", "ibv_query_qp", "the AV differs from the one set");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 5;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify UC RTS");
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 7 + seed + (i >> 8));
}

static void check_bytes(const char *kind, const char *what, const unsigned char *got, const unsigned char *want,
			size_t n) {
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			char d[128];
			snprintf(d, sizeof d, "byte %zu of %zu is 0x%02x, want 0x%02x", i, n, got[i], want[i]);
			fail(kind, what, d);
		}
}

/* want_grh is the GRH area of a UD packet from src to dst carrying n
 * bytes (immediate data included): 20 zero bytes, then the IPv4 header
 * the daemon writes (TTL 64, don't fragment, identification 0, TOS 0). */
static void want_grh(unsigned char *g, const union ibv_gid *src, const union ibv_gid *dst, unsigned n) {
	memset(g, 0, GRH);
	struct iphdr ip = { .version = 4, .ihl = 5, .tot_len = htons((uint16_t)(20 + UD_HDRS + n)),
		.frag_off = htons(IP_DF), .ttl = 64, .protocol = IPPROTO_UDP };
	memcpy(&ip.saddr, src->raw + 12, 4);
	memcpy(&ip.daddr, dst->raw + 12, 4);
	uint16_t w[10];
	memcpy(w, &ip, sizeof w);
	uint32_t sum = 0;
	for (int i = 0; i < 10; i++)
		sum += w[i];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	ip.check = (uint16_t)~sum;
	memcpy(g + 20, &ip, sizeof ip);
}

static void post_recv(struct side *s, uint64_t wr_id, struct ibv_sge *sg, int n) {
	struct ibv_recv_wr r = { .wr_id = wr_id, .sg_list = sg, .num_sge = n }, *bad;
	if (ibv_post_recv(s->qp, &r, &bad))
		die("ibv_post_recv");
}

/* ud_send posts a SEND of the LEN bytes at s's buf + GUARD + GRH to qpn
 * with qkey through ibv_post_send. */
static void ud_send(struct side *s, uint64_t wr_id, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey, uint32_t lkey) {
	struct ibv_sge sg = { .addr = (uintptr_t)s->buf + GUARD + GRH, .length = LEN, .lkey = lkey };
	struct ibv_send_wr w = { .wr_id = wr_id, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED, .wr.ud = { .ah = ah, .remote_qpn = qpn, .remote_qkey = qkey } }, *bad;
	if (ibv_post_send(s->qp, &w, &bad))
		die("ibv_post_send UD");
}

/* ud_recv_sg posts one receive on s: the GRH and the data in two SGEs
 * split inside the data, the guards around them. */
static void ud_recv(struct side *s, uint64_t wr_id) {
	memset(s->buf, 0x5c, BUF);
	unsigned char *p = s->buf + GUARD;
	struct ibv_sge sg[2] = { { .addr = (uintptr_t)p, .length = GRH + 777, .lkey = s->mr->lkey },
		{ .addr = (uintptr_t)p + GRH + 777, .length = LEN - 777, .lkey = s->mr->lkey } };
	post_recv(s, wr_id, sg, 2);
}

/* check_ud_buf checks what a UD receive on dst left in its buffer: the
 * GRH of a packet from src of n bytes, the data (seed), the guards. */
static void check_ud_buf(const char *what, struct side *dst, struct side *src, unsigned n, int seed) {
	unsigned char want[BUF];
	memset(want, 0x5c, BUF);
	want_grh(want + GUARD, &src->gid, &dst->gid, n);
	fill(want + GUARD + GRH, LEN, seed);
	check_bytes("ud", what, dst->buf, want, GUARD + GRH + LEN + GUARD);
}

/* expect_err waits for an error completion of s's QP (its opcode is
 * undefined). */
static void expect_err(const char *what, struct side *s, uint64_t wr_id, enum ibv_wc_status status) {
	struct ibv_wc wc;
	if (!poll_wc(s->cq, &wc, 10000))
		fail("ud", what, "no completion in 10 s");
	if (wc.wr_id != wr_id || wc.status != status || wc.qp_num != s->qp->qp_num) {
		char d[128];
		snprintf(d, sizeof d, "wr_id %" PRIu64 " status %s qp_num %u, want %" PRIu64 " %s %u", wc.wr_id,
			 ibv_wc_status_str(wc.status), wc.qp_num, wr_id, ibv_wc_status_str(status), s->qp->qp_num);
		fail("ud", what, d);
	}
}

static void ud(struct side *a, struct side *b) {
	ud_qp(a, QKEY_A, 1);
	ud_qp(b, QKEY_B, 0);
	uint32_t aq = a->qp->qp_num, bq = b->qp->qp_num;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (ibv_query_qp(b->qp, &qa, IBV_QP_STATE | IBV_QP_QKEY, &qi))
		die("ibv_query_qp");
	if (qa.qkey != QKEY_B || qa.qp_state != IBV_QPS_RTS || qi.qp_type != IBV_QPT_UD)
		fail("ud", "ibv_query_qp", "Q_Key, state or type differ");
	struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = b->gid, .hop_limit = 64 }, .port_num = 1 };
	struct ibv_ah *ab = ibv_create_ah(a->pd, &aa);
	if (!ab)
		die("ibv_create_ah");

	/* SEND through ibv_post_send. */
	ud_recv(b, 10);
	fill(a->buf + GUARD + GRH, LEN, 1);
	ud_send(a, 1, ab, bq, QKEY_B, a->mr->lkey);
	expect_wc("ud", "SEND", a->cq, (struct ibv_wc){ .wr_id = 1, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	struct ibv_wc wc;
	expect_wc_out("ud", "SEND receive", b->cq,
		      (struct ibv_wc){ .wr_id = 10, .opcode = IBV_WC_RECV, .qp_num = bq, .src_qp = aq,
			      .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		      1, &wc);
	check_ud_buf("SEND data", b, a, LEN, 1);

	/* SEND_WITH_IMM through ibv_wr_*: the immediate is in the IP length. */
	ud_recv(b, 11);
	fill(a->buf + GUARD + GRH, LEN, 2);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a->qp);
	ibv_wr_start(x);
	x->wr_id = 2;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(x, htonl(0xfeedf00d));
	ibv_wr_set_ud_addr(x, ab, bq, QKEY_B);
	ibv_wr_set_sge(x, a->mr->lkey, (uintptr_t)a->buf + GUARD + GRH, LEN);
	if (ibv_wr_complete(x))
		die("ibv_wr_complete");
	expect_wc("ud", "SEND_WITH_IMM", a->cq, (struct ibv_wc){ .wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	expect_wc_out("ud", "SEND_WITH_IMM receive", b->cq,
		      (struct ibv_wc){ .wr_id = 11, .opcode = IBV_WC_RECV, .qp_num = bq, .src_qp = aq,
			      .wc_flags = IBV_WC_GRH | IBV_WC_WITH_IMM, .imm_data = htonl(0xfeedf00d),
			      .byte_len = GRH + LEN },
		      1, &wc);
	check_ud_buf("SEND_WITH_IMM data", b, a, LEN + 4, 2);

	/* B answers: the AH from the completion and the GRH. */
	struct ibv_ah_attr got;
	if (ibv_init_ah_from_wc(b->ctx, 1, &wc, (struct ibv_grh *)(b->buf + GUARD), &got))
		die("ibv_init_ah_from_wc");
	if (!got.is_global || memcmp(&got.grh.dgid, &a->gid, 16) || got.grh.sgid_index != 0 ||
	    got.grh.hop_limit != 64 || got.grh.traffic_class != 0 || got.port_num != 1 || got.dlid != 0)
		fail("ud", "ibv_init_ah_from_wc", "attributes differ");
	struct ibv_ah *ba = ibv_create_ah_from_wc(b->pd, &wc, (struct ibv_grh *)(b->buf + GUARD), 1);
	if (!ba)
		die("ibv_create_ah_from_wc");
	ud_recv(a, 20);
	fill(b->buf + GUARD + GRH, LEN, 3);
	ud_send(b, 3, ba, wc.src_qp, QKEY_A, b->mr->lkey);
	expect_wc("ud", "reply", b->cq, (struct ibv_wc){ .wr_id = 3, .opcode = IBV_WC_SEND, .qp_num = bq }, 0);
	expect_wc("ud", "reply receive", a->cq,
		  (struct ibv_wc){ .wr_id = 20, .opcode = IBV_WC_RECV, .qp_num = aq, .src_qp = bq,
			  .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		  1);
	check_ud_buf("reply data", a, b, LEN, 3);

	/* Q_Key mismatches: sent, never received; the receive WR stays. */
	ud_recv(b, 12);
	fill(a->buf + GUARD + GRH, LEN, 4);
	ud_send(a, 4, ab, bq, 0x12345678, a->mr->lkey);
	expect_wc("ud", "SEND with a wrong Q_Key", a->cq,
		  (struct ibv_wc){ .wr_id = 4, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	ud_send(a, 5, ab, bq, 0x80000000u, a->mr->lkey); /* bit 31: A's own Q_Key, not B's */
	expect_wc("ud", "SEND with the sender's Q_Key", a->cq,
		  (struct ibv_wc){ .wr_id = 5, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	if (poll_wc(b->cq, &wc, 300))
		fail("ud", "Q_Key mismatch", "B completed a receive");
	ud_send(a, 6, ab, bq, QKEY_B, a->mr->lkey);
	expect_wc("ud", "SEND after the drops", a->cq, (struct ibv_wc){ .wr_id = 6, .opcode = IBV_WC_SEND, .qp_num = aq },
		  0);
	expect_wc("ud", "receive after the drops", b->cq,
		  (struct ibv_wc){ .wr_id = 12, .opcode = IBV_WC_RECV, .qp_num = bq, .src_qp = aq,
			  .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		  1);
	check_ud_buf("data after the drops", b, a, LEN, 4);

	/* Address vectors as the kernel takes them: a flow label of all ones
	 * (UCX's ud_verbs) and an SL past 4 bits are accepted; only the low
	 * 20 bits of the label would go into an IPv6 header, and over IPv4
	 * there is none: the GRH is the same as above. */
	struct ibv_ah_attr fa = aa;
	fa.grh.flow_label = 0xffffffffu;
	fa.sl = 0xff;
	struct ibv_ah *af = ibv_create_ah(a->pd, &fa);
	if (!af)
		die("ibv_create_ah with flow_label 0xffffffff");
	ud_recv(b, 15);
	fill(a->buf + GUARD + GRH, LEN, 6);
	ud_send(a, 11, af, bq, QKEY_B, a->mr->lkey);
	expect_wc("ud", "SEND through an AH with flow_label 0xffffffff", a->cq,
		  (struct ibv_wc){ .wr_id = 11, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	expect_wc("ud", "receive through an AH with flow_label 0xffffffff", b->cq,
		  (struct ibv_wc){ .wr_id = 15, .opcode = IBV_WC_RECV, .qp_num = bq, .src_qp = aq,
			  .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		  1);
	check_ud_buf("data through an AH with flow_label 0xffffffff", b, a, LEN, 6);
	if (ibv_destroy_ah(af))
		die("ibv_destroy_ah");
	/* The source GID index: past the table EINVAL, an empty entry
	 * ENODATA (rdma_get_gid_attr). */
	struct ibv_port_attr pa;
	if (ibv_query_port(a->ctx, 1, &pa))
		die("ibv_query_port");
	fa = aa;
	fa.grh.sgid_index = (uint8_t)pa.gid_tbl_len;
	errno = 0;
	if (ibv_create_ah(a->pd, &fa) || errno != EINVAL)
		fail("ud", "ibv_create_ah with sgid_index gid_tbl_len", "not EINVAL");
	for (int i = 1; i < pa.gid_tbl_len; i++) {
		union ibv_gid g;
		static const union ibv_gid zero;
		if (ibv_query_gid(a->ctx, 1, i, &g))
			die("ibv_query_gid");
		if (memcmp(&g, &zero, sizeof g))
			continue;
		fa.grh.sgid_index = (uint8_t)i;
		errno = 0;
		if (ibv_create_ah(a->pd, &fa) || errno != ENODATA)
			fail("ud", "ibv_create_ah with an empty sgid_index", "not ENODATA");
		break;
	}

	/* Not a UD operation: fails to post. */
	struct ibv_sge sg = { .addr = (uintptr_t)a->buf, .length = 8, .lkey = a->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE }, *bad = NULL;
	if (ibv_post_send(a->qp, &w, &bad) != EINVAL || bad != &w)
		fail("ud", "RDMA WRITE", "posted, or not EINVAL");

	/* A send error moves the UD QP to SQE: later sends are flushed,
	 * receives go on; SQE -> RTS resumes sending. */
	ud_send(a, 8, ab, bq, QKEY_B, a->mr->lkey ^ 0x5a00);
	expect_err("SEND with a bad lkey", a, 8, IBV_WC_LOC_PROT_ERR);
	ud_send(a, 9, ab, bq, QKEY_B, a->mr->lkey);
	expect_err("SEND in SQE", a, 9, IBV_WC_WR_FLUSH_ERR);
	if (ibv_query_qp(a->qp, &qa, IBV_QP_STATE, &qi))
		die("ibv_query_qp");
	if (qa.qp_state != IBV_QPS_SQE)
		fail("ud", "after a send error", "the QP is not in SQE");
	ud_recv(a, 21);
	ud_send(b, 13, ba, aq, QKEY_A, b->mr->lkey);
	expect_wc("ud", "send to a QP in SQE", b->cq, (struct ibv_wc){ .wr_id = 13, .opcode = IBV_WC_SEND, .qp_num = bq },
		  0);
	expect_wc("ud", "receive in SQE", a->cq,
		  (struct ibv_wc){ .wr_id = 21, .opcode = IBV_WC_RECV, .qp_num = aq, .src_qp = bq,
			  .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		  1);
	qa.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(a->qp, &qa, IBV_QP_STATE))
		die("modify SQE -> RTS");
	ud_recv(b, 14);
	ud_send(a, 10, ab, bq, QKEY_B, a->mr->lkey);
	expect_wc("ud", "SEND after SQE", a->cq, (struct ibv_wc){ .wr_id = 10, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	expect_wc("ud", "receive after SQE", b->cq,
		  (struct ibv_wc){ .wr_id = 14, .opcode = IBV_WC_RECV, .qp_num = bq, .src_qp = aq,
			  .wc_flags = IBV_WC_GRH, .byte_len = GRH + LEN },
		  1);

	if (ibv_destroy_ah(ab) || ibv_destroy_ah(ba) || ibv_destroy_qp(a->qp) || ibv_destroy_qp(b->qp))
		die("destroy UD");
}

static void uc(struct side *a, struct side *b) {
	struct side *s[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr qi = { .send_cq = s[i]->cq, .recv_cq = s[i]->cq, .qp_type = IBV_QPT_UC,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
		if (!(s[i]->qp = ibv_create_qp(s[i]->pd, &qi)))
			die("create UC QP");
	}
	uc_connect(a, b);
	uc_connect(b, a);
	unsigned char *want = malloc(BUF);
	if (!want)
		die("malloc");
	memset(b->buf, 0x5d, BUF);
	memcpy(want, b->buf, BUF);
	fill(a->buf, BUF, 5);
	memcpy(want + GUARD + 3, a->buf + 1, UCLEN);
	post_recv(b, 30, NULL, 0);
	struct ibv_sge sg = { .addr = (uintptr_t)a->buf + 1, .length = UCLEN, .lkey = a->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 31, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x01020304),
		.wr.rdma = { .remote_addr = (uintptr_t)b->buf + GUARD + 3, .rkey = b->mr->rkey } }, *bad;
	if (ibv_post_send(a->qp, &w, &bad))
		die("ibv_post_send UC");
	uint32_t aq = a->qp->qp_num, bq = b->qp->qp_num;
	expect_wc("uc", "WRITE_WITH_IMM", a->cq, (struct ibv_wc){ .wr_id = 31, .opcode = IBV_WC_RDMA_WRITE, .qp_num = aq },
		  0);
	expect_wc("uc", "WRITE_WITH_IMM receive", b->cq,
		  (struct ibv_wc){ .wr_id = 30, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .qp_num = bq,
			  .wc_flags = IBV_WC_WITH_IMM, .imm_data = htonl(0x01020304), .byte_len = UCLEN },
		  1);
	check_bytes("uc", "WRITE_WITH_IMM data", b->buf, want, BUF);
	free(want);
	if (ibv_destroy_qp(a->qp) || ibv_destroy_qp(b->qp))
		die("destroy UC");
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side a, b;
	open_side(&a, list[0]);
	open_side(&b, list[1]);
	ibv_free_device_list(list);
	ud(&a, &b);
	uc(&a, &b);
	struct side *s[2] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		if (ibv_dereg_mr(s[i]->mr) || ibv_destroy_cq(s[i]->cq) || ibv_dealloc_pd(s[i]->pd) ||
		    ibv_close_device(s[i]->ctx))
			die("destroy");
		free(s[i]->buf);
	}
	printf("OK ud send send_imm grh ah_from_wc qkey_drop flow_label sqe, uc write_imm\n");
	return 0;
}
