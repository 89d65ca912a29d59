/* xrc.c - XRC through the standard verbs between two daemons: on A one
 * XRC initiator QP; on B one XRC target QP and two XRC SRQs of its domain
 * (each with its own CQ), and an SRQ of a second domain. The initiator
 * sends SEND and SEND_WITH_IMM to each SRQ (the receive completes in the
 * CQ of the SRQ named, with the target QP's number), RDMA WRITE, RDMA READ
 * and both atomics through the target; every byte and completion field
 * is checked. Then a SEND naming the other domain's SRQ completes with
 * IBV_WC_REM_INV_REQ_ERR, and one naming no SRQ likewise (on a new
 * connection). Bad input: an XRC SRQ with another context's domain or CQ
 * is EINVAL, closing a domain in use EBUSY, opening a file's domain
 * without O_CREAT ENOENT; two contexts opening the same file share it.
 * Prints "OK ..." and exits 0, or "ERROR ..." and 1. */
#include "check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#define LEN 8192

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	union ibv_gid gid;
	unsigned char *buf;
	struct ibv_mr *mr;
};

static void open_side(struct side *s, struct ibv_device *dev) {
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("ibv_open_device");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	s->buf = calloc(1, LEN);
	if (!s->pd || !s->cq || !s->buf)
		die("resources");
	s->mr = ibv_reg_mr(s->pd, s->buf, LEN,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC);
	if (!s->mr)
		die("ibv_reg_mr");
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid, int tgt) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = tgt ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (tgt)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	if (ibv_modify_qp(qp, &a, mask))
		die("modify RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 7;
	a.max_rd_atomic = 4;
	mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
	if (!tgt)
		mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	if (ibv_modify_qp(qp, &a, mask))
		die("modify RTS");
}

static struct ibv_xrcd *open_xrcd(struct ibv_context *ctx, int fd, int oflags) {
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
		.fd = fd, .oflags = oflags };
	return ibv_open_xrcd(ctx, &xa);
}

static struct ibv_srq *xrc_srq(struct side *s, struct ibv_xrcd *x, struct ibv_cq *cq) {
	struct ibv_srq_init_attr_ex sa = { .attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = s->pd, .xrcd = x, .cq = cq };
	return ibv_create_srq_ex(s->ctx, &sa);
}

static struct ibv_qp *ini_qp(struct side *s) {
	struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_SEND, .send_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_send_sge = 1 }, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = s->pd };
	struct ibv_qp *qp = ibv_create_qp_ex(s->ctx, &qa);
	if (!qp)
		die("create XRC_SEND QP");
	return qp;
}

static struct ibv_qp *tgt_qp(struct side *s, struct ibv_xrcd *x) {
	struct ibv_qp_init_attr_ex qa = { .qp_type = IBV_QPT_XRC_RECV, .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = x };
	struct ibv_qp *qp = ibv_create_qp_ex(s->ctx, &qa);
	if (!qp)
		die("create XRC_RECV QP");
	return qp;
}

static void post(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, uint32_t srqn, void *addr, uint32_t len,
		 uint32_t lkey, uint64_t raddr, uint32_t rkey) {
	struct ibv_sge sg = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED };
	wr.qp_type.xrc.remote_srqn = srqn;
	if (op == IBV_WR_SEND_WITH_IMM)
		wr.imm_data = htonl(0x1234);
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = op == IBV_WR_ATOMIC_FETCH_AND_ADD ? 5 : 45;
		wr.wr.atomic.swap = 99;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	struct ibv_send_wr *bad;
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send");
}

static void recv_srq(struct ibv_srq *srq, uint64_t id, void *addr, uint32_t len, uint32_t lkey) {
	struct ibv_sge sg = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = 1 }, *bad;
	if (ibv_post_srq_recv(srq, &wr, &bad))
		die("ibv_post_srq_recv");
}

static void check_bytes(const char *what, const void *a, const void *b, size_t n) {
	if (memcmp(a, b, n))
		fail("xrc", what, "bytes differ");
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side a, b;
	open_side(&a, list[0]);
	open_side(&b, list[1]);
	struct ibv_device_attr da;
	if (ibv_query_device(b.ctx, &da) || !(da.device_cap_flags & IBV_DEVICE_XRC))
		fail("xrc", "query_device", "no IBV_DEVICE_XRC");

	char path[] = "/tmp/vrnic-xrc-XXXXXX";
	int fd = mkstemp(path);
	if (fd < 0)
		die("mkstemp");
	unlink(path);
	errno = 0;
	if (open_xrcd(b.ctx, fd, 0) || errno != ENOENT)
		fail("xrc", "open without O_CREAT", "want ENOENT");
	struct ibv_xrcd *x = open_xrcd(b.ctx, fd, O_CREAT);
	struct ibv_xrcd *other = open_xrcd(b.ctx, -1, 0);
	if (!x || !other)
		die("ibv_open_xrcd");
	struct ibv_cq *cq1 = ibv_create_cq(b.ctx, 16, NULL, NULL, 0), *cq2 = ibv_create_cq(b.ctx, 16, NULL, NULL, 0);
	struct ibv_srq *s1 = xrc_srq(&b, x, cq1), *s2 = xrc_srq(&b, x, cq2), *sf = xrc_srq(&b, other, b.cq);
	if (!cq1 || !cq2 || !s1 || !s2 || !sf)
		die("XRC SRQs");
	uint32_t n1, n2, nf;
	if (ibv_get_srq_num(s1, &n1) || ibv_get_srq_num(s2, &n2) || ibv_get_srq_num(sf, &nf) || n1 == n2)
		fail("xrc", "get_srq_num", "no distinct numbers");

	/* A second context opening the same file shares the domain: its
	 * handle closes on its own; the first one's is in use. */
	struct ibv_context *c2 = ibv_open_device(list[1]);
	struct ibv_xrcd *x2 = c2 ? open_xrcd(c2, fd, O_CREAT) : NULL;
	if (!x2)
		die("second context's xrcd");
	errno = 0;
	if (open_xrcd(c2, fd, O_CREAT | O_EXCL) || errno != EEXIST)
		fail("xrc", "O_EXCL on an existing domain", "want EEXIST");
	/* Objects of another context: EINVAL. */
	errno = 0;
	if (xrc_srq(&b, x2, b.cq) || errno != EINVAL)
		fail("xrc", "SRQ with another context's domain", "want EINVAL");
	if (ibv_close_xrcd(x2))
		die("close second context's xrcd");
	ibv_close_device(c2);
	errno = 0;
	if (ibv_close_xrcd(x) != EBUSY)
		fail("xrc", "close an XRC domain in use", "want EBUSY");

	struct ibv_qp *ini = ini_qp(&a), *tgt = tgt_qp(&b, x);
	connect_qp(ini, tgt->qp_num, b.gid, 0);
	connect_qp(tgt, ini->qp_num, a.gid, 1);

	unsigned char ref[LEN];
	for (int i = 0; i < LEN; i++)
		a.buf[i] = ref[i] = (unsigned char)(i * 7 + 3);
	recv_srq(s1, 11, b.buf, 3000, b.mr->lkey);
	recv_srq(s2, 21, b.buf + 4096, 200, b.mr->lkey);
	post(ini, 1, IBV_WR_SEND, n1, a.buf, 3000, a.mr->lkey, 0, 0);
	expect_wc("xrc", "send", a.cq, (struct ibv_wc){ .wr_id = 1, .opcode = IBV_WC_SEND, .qp_num = ini->qp_num }, 0);
	expect_wc("xrc", "recv srq1", cq1,
		  (struct ibv_wc){ .wr_id = 11, .opcode = IBV_WC_RECV, .qp_num = tgt->qp_num, .byte_len = 3000 }, 1);
	post(ini, 2, IBV_WR_SEND_WITH_IMM, n2, a.buf + 100, 64, a.mr->lkey, 0, 0);
	expect_wc("xrc", "send_imm", a.cq, (struct ibv_wc){ .wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = ini->qp_num }, 0);
	expect_wc("xrc", "recv srq2", cq2,
		  (struct ibv_wc){ .wr_id = 21, .opcode = IBV_WC_RECV, .qp_num = tgt->qp_num, .byte_len = 64,
				   .wc_flags = IBV_WC_WITH_IMM, .imm_data = htonl(0x1234) },
		  1);
	check_bytes("send", b.buf, ref, 3000);
	check_bytes("send_imm", b.buf + 4096, ref + 100, 64);

	post(ini, 3, IBV_WR_RDMA_WRITE, n1, a.buf, 2000, a.mr->lkey, (uintptr_t)b.buf + 5000, b.mr->rkey);
	expect_wc("xrc", "write", a.cq, (struct ibv_wc){ .wr_id = 3, .opcode = IBV_WC_RDMA_WRITE, .qp_num = ini->qp_num }, 0);
	check_bytes("write", b.buf + 5000, ref, 2000);
	post(ini, 4, IBV_WR_RDMA_READ, n2, a.buf + 4096, 1500, a.mr->lkey, (uintptr_t)b.buf + 5000, b.mr->rkey);
	expect_wc("xrc", "read", a.cq,
		  (struct ibv_wc){ .wr_id = 4, .opcode = IBV_WC_RDMA_READ, .qp_num = ini->qp_num, .byte_len = 1500 }, 1);
	check_bytes("read", a.buf + 4096, ref, 1500);
	uint64_t v = 40;
	memcpy(b.buf + 8000, &v, 8);
	post(ini, 5, IBV_WR_ATOMIC_FETCH_AND_ADD, n1, a.buf + 7000, 8, a.mr->lkey, (uintptr_t)b.buf + 8000, b.mr->rkey);
	expect_wc("xrc", "fetch_add", a.cq, (struct ibv_wc){ .wr_id = 5, .opcode = IBV_WC_FETCH_ADD, .qp_num = ini->qp_num }, 0);
	post(ini, 6, IBV_WR_ATOMIC_CMP_AND_SWP, n2, a.buf + 7008, 8, a.mr->lkey, (uintptr_t)b.buf + 8000, b.mr->rkey);
	expect_wc("xrc", "cmp_swap", a.cq, (struct ibv_wc){ .wr_id = 6, .opcode = IBV_WC_COMP_SWAP, .qp_num = ini->qp_num }, 0);
	uint64_t got[2], now;
	memcpy(got, a.buf + 7000, 16);
	memcpy(&now, b.buf + 8000, 8);
	if (got[0] != 40 || got[1] != 45 || now != 99)
		fail("xrc", "atomics", "wrong values");

	/* An SRQ of another domain: REM_INV_REQ_ERR, nothing lands. */
	recv_srq(sf, 31, b.buf, 64, b.mr->lkey);
	post(ini, 7, IBV_WR_SEND, nf, a.buf, 64, a.mr->lkey, 0, 0);
	expect_wc("xrc", "foreign srq", a.cq,
		  (struct ibv_wc){ .wr_id = 7, .status = IBV_WC_REM_INV_REQ_ERR, .opcode = IBV_WC_SEND, .qp_num = ini->qp_num }, 0);
	struct ibv_wc wc;
	if (poll_wc(b.cq, &wc, 200))
		fail("xrc", "foreign srq", "a receive completed");

	/* A number no SRQ has, on a new pair. */
	struct ibv_qp *ini2 = ini_qp(&a), *tgt2 = tgt_qp(&b, x);
	connect_qp(ini2, tgt2->qp_num, b.gid, 0);
	connect_qp(tgt2, ini2->qp_num, a.gid, 1);
	post(ini2, 8, IBV_WR_SEND, 0xfffffe, a.buf, 64, a.mr->lkey, 0, 0);
	expect_wc("xrc", "no srq", a.cq,
		  (struct ibv_wc){ .wr_id = 8, .status = IBV_WC_REM_INV_REQ_ERR, .opcode = IBV_WC_SEND, .qp_num = ini2->qp_num }, 0);

	if (ibv_destroy_qp(tgt) || ibv_destroy_qp(tgt2) || ibv_destroy_qp(ini) || ibv_destroy_qp(ini2) ||
	    ibv_destroy_srq(s1) || ibv_destroy_srq(s2) || ibv_destroy_srq(sf))
		die("destroy");
	if (ibv_close_xrcd(x) || ibv_close_xrcd(other))
		die("ibv_close_xrcd");
	close(fd);
	ibv_destroy_cq(cq1);
	ibv_destroy_cq(cq2);
	struct side *sides[] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) || ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
			die("teardown");
		free(s->buf);
	}
	ibv_free_device_list(list);
	printf("OK xrc send send_imm write read fetch_add cmp_swap, foreign_srq no_srq, ebusy enoent eexist einval shared\n");
	return 0;
}
