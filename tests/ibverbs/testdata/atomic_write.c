/* atomic_write: RDMA ATOMIC WRITE (IBTA 1.5 Memory Placement Extensions)
 * through the standard verbs API, from device A to device B.
 *
 * ibv_query_device_ex reports ATOMIC_WRITE and FLUSH_GLOBAL (bits 40 and
 * 38 of device_cap_flags_ex, IB_UVERBS_DEVICE_*) and not FLUSH_PERSISTENT;
 * ibv_reg_mr with IBV_ACCESS_FLUSH_PERSISTENT fails with EOPNOTSUPP (no
 * persistent memory). ibv_wr_atomic_write writes the 8 bytes at an aligned
 * address of an MR with remote write, the neighbouring words untouched,
 * and completes IBV_WC_ATOMIC_WRITE; so does ibv_post_send with
 * IBV_WR_ATOMIC_WRITE (the value in its one 8-byte SGE). Errors, each on
 * a fresh QP pair: an MR without remote write completes with
 * IBV_WC_REM_ACCESS_ERR, a misaligned address with IBV_WC_REM_INV_REQ_ERR,
 * and the target word is unchanged.
 *
 * Prints "OK caps wr_atomic_write post_send rem_access misaligned" and exits 0. */
#include "check.h"

#include <errno.h>

#define DEV_FLUSH_GLOBAL (1ULL << 38)
#define DEV_FLUSH_PERSISTENT (1ULL << 39)
#define DEV_ATOMIC_WRITE (1ULL << 40)
/* IB_UVERBS_ACCESS_FLUSH_PERSISTENT (Linux 6.2; rdma-core 44 names no such bit) */
#define ACCESS_FLUSH_PERSISTENT (1 << 9)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr, *ro;
	uint64_t buf[64], robuf[8];
	union ibv_gid gid;
};

static void new_qp(struct side *s) {
	struct ibv_qp_init_attr_ex a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = s->pd,
		.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE };
	if (!(s->qp = ibv_create_qp_ex(s->ctx, &a)))
		die("ibv_create_qp_ex with IBV_QP_EX_WITH_ATOMIC_WRITE");
}

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0)))
		die("open");
	if (!(s->mr = ibv_reg_mr(s->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)))
		die("ibv_reg_mr");
	if (!(s->ro = ibv_reg_mr(s->pd, s->robuf, sizeof s->robuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)))
		die("ibv_reg_mr read-only");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
	new_qp(s);
}

static void connect(struct side *a, struct side *b) {
	int acc = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	rc_to_rts(a->qp, b->qp->qp_num, &b->gid, acc, 11, 4);
	rc_to_rts(b->qp, a->qp->qp_num, &a->gid, acc, 11, 4);
}

static void renew(struct side *a, struct side *b) {
	if (ibv_destroy_qp(a->qp) || ibv_destroy_qp(b->qp))
		die("ibv_destroy_qp");
	new_qp(a);
	new_qp(b);
	connect(a, b);
}

static void atomic_write(struct side *s, uint64_t id, uint32_t rkey, uint64_t addr, uint64_t v) {
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(s->qp);
	ibv_wr_start(x);
	x->wr_id = id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, rkey, addr, &v);
	if (ibv_wr_complete(x))
		die("ibv_wr_complete");
}

static void expect(const char *what, struct side *s, uint64_t id, enum ibv_wc_status st) {
	struct ibv_wc want = { .wr_id = id, .status = st, .opcode = IBV_WC_ATOMIC_WRITE, .qp_num = s->qp->qp_num };
	struct ibv_wc got;
	if (!poll_wc(s->cq, &got, 10000))
		fail("atomic_write", what, "no completion in 10 s");
	if (got.wr_id != want.wr_id || got.status != want.status || got.qp_num != want.qp_num ||
	    (st == IBV_WC_SUCCESS && (got.opcode != want.opcode || got.wc_flags))) {
		char d[160];
		snprintf(d, sizeof d, "wr_id %" PRIu64 " status %s opcode %d qp %u flags %u", got.wr_id,
			 ibv_wc_status_str(got.status), got.opcode, got.qp_num, got.wc_flags);
		fail("atomic_write", what, d);
	}
	/* An error completion flushes the QP: drain what follows. */
	while (ibv_poll_cq(s->cq, 1, &got) > 0)
		;
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side A = { 0 }, B = { 0 };
	open_side(&A, list[0]);
	open_side(&B, list[1]);

	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(A.ctx, NULL, &dx))
		die("ibv_query_device_ex");
	if (!(dx.device_cap_flags_ex & DEV_ATOMIC_WRITE) || !(dx.device_cap_flags_ex & DEV_FLUSH_GLOBAL) ||
	    (dx.device_cap_flags_ex & DEV_FLUSH_PERSISTENT))
		fail("atomic_write", "caps", "device_cap_flags_ex: want ATOMIC_WRITE and FLUSH_GLOBAL, not FLUSH_PERSISTENT");
	errno = 0;
	if (ibv_reg_mr(A.pd, A.buf, sizeof A.buf, IBV_ACCESS_LOCAL_WRITE | ACCESS_FLUSH_PERSISTENT) ||
	    errno != EOPNOTSUPP)
		fail("atomic_write", "caps", "FLUSH_PERSISTENT registration is not EOPNOTSUPP");
	printf("OK caps");

	connect(&A, &B);
	const uint64_t v = 0x0123456789abcdefULL, sentinel = 0x5a5a5a5a5a5a5a5aULL;
	for (size_t i = 0; i < 64; i++)
		B.buf[i] = sentinel;
	atomic_write(&A, 1, B.mr->rkey, (uintptr_t)&B.buf[5], v);
	expect("wr_atomic_write", &A, 1, IBV_WC_SUCCESS);
	if (B.buf[5] != v || B.buf[4] != sentinel || B.buf[6] != sentinel)
		fail("atomic_write", "wr_atomic_write", "the word or its neighbours are wrong");
	printf(" wr_atomic_write");

	uint64_t val = ~v;
	struct ibv_mr *vm = ibv_reg_mr(A.pd, &val, sizeof val, IBV_ACCESS_LOCAL_WRITE);
	if (!vm)
		die("ibv_reg_mr value");
	struct ibv_sge sg = { .addr = (uintptr_t)&val, .length = 8, .lkey = vm->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_ATOMIC_WRITE,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)&B.buf[7];
	w.wr.rdma.rkey = B.mr->rkey;
	if (ibv_post_send(A.qp, &w, &bad))
		die("ibv_post_send IBV_WR_ATOMIC_WRITE");
	expect("post_send", &A, 2, IBV_WC_SUCCESS);
	if (B.buf[7] != ~v || B.buf[6] != sentinel || B.buf[8] != sentinel)
		fail("atomic_write", "post_send", "the word or its neighbours are wrong");
	sg.length = 4;
	if (ibv_post_send(A.qp, &w, &bad) != EINVAL)
		fail("atomic_write", "post_send", "an SGE of 4 bytes is not EINVAL");
	printf(" post_send");

	B.robuf[2] = sentinel;
	atomic_write(&A, 3, B.ro->rkey, (uintptr_t)&B.robuf[2], v);
	expect("an MR without remote write", &A, 3, IBV_WC_REM_ACCESS_ERR);
	if (B.robuf[2] != sentinel)
		fail("atomic_write", "rem_access", "the word changed");
	printf(" rem_access");

	renew(&A, &B);
	atomic_write(&A, 4, B.mr->rkey, (uintptr_t)&B.buf[10] + 4, v);
	expect("misaligned", &A, 4, IBV_WC_REM_INV_REQ_ERR);
	if (B.buf[10] != sentinel || B.buf[11] != sentinel)
		fail("atomic_write", "misaligned", "the words changed");
	printf(" misaligned\n");

	ibv_dereg_mr(vm);
	struct side *sides[] = { &A, &B };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_destroy_qp(s->qp) || ibv_destroy_cq(s->cq) || ibv_dereg_mr(s->mr) || ibv_dereg_mr(s->ro) ||
		    ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
			die("close");
	}
	ibv_free_device_list(list);
	return 0;
}
