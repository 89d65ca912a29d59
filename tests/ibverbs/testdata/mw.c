/* mw: memory windows through the standard verbs API (only
 * <infiniband/verbs.h>), between QPs on two devices: A is the requester,
 * B owns the memory and the windows. B's MR is registered with
 * LOCAL_WRITE | MW_BIND and no remote right: every remote access goes
 * through a window.
 *
 *   caps       ibv_query_device(_ex): MEM_WINDOW, MEM_WINDOW_TYPE_2B, max_mw
 *   type1      ibv_bind_mw: IBV_WC_BIND_MW, mw->rkey the next key; RDMA
 *              WRITE and READ through it, every byte of both buffers
 *              checked; an access past the window's end and an RDMA
 *              READ without the right fail with IBV_WC_REM_ACCESS_ERR;
 *              LOCAL_INV of its rkey fails; unbind (length 0) kills the
 *              rkey
 *   type2      IBV_WR_BIND_MW in ibv_post_send with a key of our choice;
 *              WRITE through it; SEND_WITH_INV of it (IBV_WC_WITH_INV and
 *              invalidated_rkey at the receiver) kills the rkey; bound
 *              again, LOCAL_INV kills it; bound by ibv_wr_bind_mw,
 *              ibv_dealloc_mw kills it
 *   errors     binds refused with IBV_WC_MW_BIND_ERR (range beyond the MR,
 *              MR without MW_BIND, a type 2 window bound twice, a window
 *              of another PD), the QP in error after them; ibv_dereg_mr of
 *              an MR with a window bound: EINVAL; ibv_dealloc_pd of a PD
 *              with a window: EBUSY; ibv_alloc_mw of type 3: EINVAL
 *
 * Run through vrnic-run with two devices; prints "OK ..." and exits 0, or
 * "ERROR ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define LEN 16384
#define K "mw"

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	union ibv_gid gid;
	unsigned char *buf;
	struct ibv_mr *mr;
};

static struct side A, B;
static unsigned char refA[LEN], refB[LEN];

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 13 + seed + (i >> 8));
}

static void check(const char *what, const unsigned char *buf, const unsigned char *ref) {
	for (size_t i = 0; i < LEN; i++)
		if (buf[i] != ref[i]) {
			char d[128];
			snprintf(d, sizeof d, "byte %zu is 0x%02x, want 0x%02x", i, buf[i], ref[i]);
			fail(K, what, d);
		}
}

static void open_side(struct side *s, struct ibv_device *dev, int access) {
	if (!(s->ctx = ibv_open_device(dev)))
		die("ibv_open_device");
	if (!(s->pd = ibv_alloc_pd(s->ctx)))
		die("ibv_alloc_pd");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
	if (!(s->buf = malloc(LEN)))
		die("malloc");
	if (!(s->mr = ibv_reg_mr(s->pd, s->buf, LEN, access)))
		die("ibv_reg_mr");
}

static void to_rts(struct side *s, struct side *peer) {
	rc_to_rts(s->qp, peer->qp->qp_num, &peer->gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, 3, 4);
}

static void new_qp(struct side *s) {
	if (s->qp && ibv_destroy_qp(s->qp))
		die("ibv_destroy_qp");
	if (s->cq && ibv_destroy_cq(s->cq))
		die("ibv_destroy_cq");
	if (!(s->cq = ibv_create_cq(s->ctx, 32, NULL, NULL, 0)))
		die("ibv_create_cq");
	struct ibv_qp_init_attr_ex a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC, .pd = s->pd,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW };
	if (!(s->qp = ibv_create_qp_ex(s->ctx, &a)))
		die("ibv_create_qp_ex with IBV_QP_EX_WITH_BIND_MW");
	if (!(s->qpx = ibv_qp_to_qp_ex(s->qp)))
		die("ibv_qp_to_qp_ex");
}

/* reconnect gives A and B a new connected pair of QPs (after an error
 * moved them to the error state). */
static void reconnect(void) {
	new_qp(&A);
	new_qp(&B);
	to_rts(&A, &B);
	to_rts(&B, &A);
}

static void post(struct side *s, struct ibv_send_wr *wr) {
	struct ibv_send_wr *bad = NULL;
	if (ibv_post_send(s->qp, wr, &bad))
		die("ibv_post_send");
}

static struct ibv_wc wc_of(uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op, struct side *s) {
	return (struct ibv_wc){ .wr_id = wr_id, .status = st, .opcode = op, .qp_num = s->qp->qp_num };
}

/* rdma posts an RDMA WRITE or READ of n bytes between A's buffer at aoff
 * and raddr under rkey, and expects its completion with status st. */
static void rdma(const char *what, enum ibv_wr_opcode op, size_t aoff, uint64_t raddr, uint32_t rkey, uint32_t n,
		 enum ibv_wc_status st) {
	struct ibv_sge sg = { .addr = (uintptr_t)A.buf + aoff, .length = n, .lkey = A.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &sg, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey } };
	post(&A, &w);
	expect_wc(K, what, A.cq, wc_of(7, st, op == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE, &A), 0);
}

/* bind1 binds type 1 window mw with ibv_bind_mw and expects st. */
static void bind1(const char *what, struct ibv_mw *mw, struct ibv_mr *mr, uint64_t addr, uint64_t len, unsigned access,
		  enum ibv_wc_status st) {
	struct ibv_mw_bind b = { .wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = addr, .length = len, .mw_access_flags = access } };
	uint32_t old = mw->rkey;
	if (ibv_bind_mw(B.qp, mw, &b))
		die("ibv_bind_mw");
	if (mw->rkey != ibv_inc_rkey(old))
		fail(K, what, "mw->rkey is not the next key");
	expect_wc(K, what, B.cq, wc_of(11, st, IBV_WC_BIND_MW, &B), 0);
}

/* bind2 binds type 2 window mw under rkey with IBV_WR_BIND_MW in
 * ibv_post_send and expects st. */
static void bind2(const char *what, struct ibv_mw *mw, uint32_t rkey, struct ibv_mr *mr, uint64_t addr, uint64_t len,
		  unsigned access, enum ibv_wc_status st) {
	struct ibv_send_wr w = { .wr_id = 12, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED };
	w.bind_mw.mw = mw;
	w.bind_mw.rkey = rkey;
	w.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr, .addr = addr, .length = len, .mw_access_flags = access };
	post(&B, &w);
	expect_wc(K, what, B.cq, wc_of(12, st, IBV_WC_BIND_MW, &B), 0);
}

/* in_error checks that B's QP is in the error state: a WR posted now is
 * flushed. */
static void in_error(const char *what) {
	struct ibv_send_wr w = { .wr_id = 13, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	post(&B, &w);
	expect_wc(K, what, B.cq, wc_of(13, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, &B), 0);
}

static uint64_t baddr(size_t off) { return (uintptr_t)B.buf + off; }

static void caps(void) {
	struct ibv_device_attr a;
	if (ibv_query_device(B.ctx, &a))
		die("ibv_query_device");
	if (!(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW) || !(a.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B))
		fail(K, "caps", "device_cap_flags lacks MEM_WINDOW or MEM_WINDOW_TYPE_2B");
	if (a.max_mw <= 0)
		fail(K, "caps", "max_mw is 0");
	struct ibv_device_attr_ex x;
	if (ibv_query_device_ex(B.ctx, NULL, &x))
		die("ibv_query_device_ex");
	if (!(x.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW) || !(x.device_cap_flags_ex & IBV_DEVICE_MEM_WINDOW_TYPE_2B) ||
	    x.orig_attr.max_mw != a.max_mw)
		fail(K, "caps", "ibv_query_device_ex disagrees");
	errno = 0;
	if (ibv_alloc_mw(B.pd, (enum ibv_mw_type)3) || errno != EINVAL)
		fail(K, "alloc type 3", "did not fail with EINVAL");
}

static void type1(void) {
	struct ibv_mw *mw = ibv_alloc_mw(B.pd, IBV_MW_TYPE_1);
	if (!mw || mw->type != IBV_MW_TYPE_1 || mw->pd != B.pd)
		die("ibv_alloc_mw type 1");
	uint32_t k0 = mw->rkey;
	/* The window: B's bytes [1000, 5000). */
	bind1("type 1 bind", mw, B.mr, baddr(1000), 4000, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, IBV_WC_SUCCESS);
	if (mw->rkey == k0 || (mw->rkey >> 8) != (k0 >> 8))
		fail(K, "type 1 bind", "the key index changed or the key did not");
	fill(A.buf, LEN, 1), memcpy(refA, A.buf, LEN);
	rdma("type 1 WRITE", IBV_WR_RDMA_WRITE, 0, baddr(1500), mw->rkey, 3000, IBV_WC_SUCCESS);
	memcpy(refB + 1500, refA, 3000);
	check("type 1 WRITE", B.buf, refB);
	rdma("type 1 READ", IBV_WR_RDMA_READ, 8000, baddr(1000), mw->rkey, 4000, IBV_WC_SUCCESS);
	memcpy(refA + 8000, refB + 1000, 4000);
	check("type 1 READ", A.buf, refA);
	/* One byte past the window (but inside the MR). */
	rdma("type 1 WRITE past the window", IBV_WR_RDMA_WRITE, 0, baddr(4990), mw->rkey, 11, IBV_WC_REM_ACCESS_ERR);
	check("type 1 WRITE past the window", B.buf, refB);
	reconnect();
	/* A window without REMOTE_READ. */
	bind1("type 1 write-only rebind", mw, B.mr, baddr(0), 100, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS);
	rdma("type 1 READ without the right", IBV_WR_RDMA_READ, 0, baddr(0), mw->rkey, 10, IBV_WC_REM_ACCESS_ERR);
	reconnect();
	/* A type 1 window is not invalidated. */
	struct ibv_send_wr w = { .wr_id = 14, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = mw->rkey };
	post(&B, &w);
	expect_wc(K, "type 1 LOCAL_INV", B.cq, wc_of(14, IBV_WC_LOC_PROT_ERR, IBV_WC_LOCAL_INV, &B), 0);
	reconnect();
	rdma("type 1 after the failed LOCAL_INV", IBV_WR_RDMA_WRITE, 0, baddr(10), mw->rkey, 20, IBV_WC_SUCCESS);
	memcpy(refB + 10, refA, 20);
	check("type 1 after the failed LOCAL_INV", B.buf, refB);
	/* The MR is held while the window is bound. */
	if (ibv_dereg_mr(B.mr) != EINVAL)
		fail(K, "dereg_mr of a bound MR", "did not fail with EINVAL");
	/* Unbind: length 0, no MR. */
	uint32_t old = mw->rkey;
	bind1("type 1 unbind", mw, NULL, 0, 0, 0, IBV_WC_SUCCESS);
	rdma("type 1 WRITE after unbind", IBV_WR_RDMA_WRITE, 0, baddr(10), old, 20, IBV_WC_REM_ACCESS_ERR);
	reconnect();
	rdma("type 1 WRITE through the new key", IBV_WR_RDMA_WRITE, 0, baddr(10), mw->rkey, 20, IBV_WC_REM_ACCESS_ERR);
	reconnect();
	if (ibv_dealloc_mw(mw))
		die("ibv_dealloc_mw type 1");
	check("type 1 end", B.buf, refB);
}

static void type2(void) {
	struct ibv_mw *mw = ibv_alloc_mw(B.pd, IBV_MW_TYPE_2);
	if (!mw || mw->type != IBV_MW_TYPE_2)
		die("ibv_alloc_mw type 2");
	/* The consumer's key: the window's index, our 8 bits. */
	uint32_t k = (mw->rkey & ~0xffu) | ((mw->rkey + 0x55) & 0xff);
	bind2("type 2 bind", mw, k, B.mr, baddr(8192), 4096, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS);
	fill(A.buf, LEN, 2), memcpy(refA, A.buf, LEN);
	rdma("type 2 WRITE", IBV_WR_RDMA_WRITE, 100, baddr(8192), k, 4096, IBV_WC_SUCCESS);
	memcpy(refB + 8192, refA + 100, 4096);
	check("type 2 WRITE", B.buf, refB);
	/* Only the QP that bound it: another connection between the same
	 * PDs (on the same daemon worker) is refused. */
	struct side A2 = A, B2 = B;
	A2.qp = B2.qp = NULL, A2.cq = B2.cq = NULL;
	new_qp(&A2), new_qp(&B2), to_rts(&A2, &B2), to_rts(&B2, &A2);
	struct ibv_sge sg2 = { .addr = (uintptr_t)A.buf, .length = 8, .lkey = A.mr->lkey };
	struct ibv_send_wr w2 = { .wr_id = 15, .sg_list = &sg2, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = baddr(8192), .rkey = k } };
	post(&A2, &w2);
	expect_wc(K, "type 2 WRITE through another QP", A2.cq, wc_of(15, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, &A2), 0);
	check("type 2 WRITE through another QP", B.buf, refB);
	if (ibv_destroy_qp(A2.qp) || ibv_destroy_qp(B2.qp) || ibv_destroy_cq(A2.cq) || ibv_destroy_cq(B2.cq))
		die("destroy the second pair");
	rdma("type 2 WRITE, the bound QP again", IBV_WR_RDMA_WRITE, 100, baddr(8192), k, 16, IBV_WC_SUCCESS);
	bind2("type 2 bound twice", mw, ibv_inc_rkey(k), B.mr, baddr(0), 10, IBV_ACCESS_REMOTE_WRITE, IBV_WC_MW_BIND_ERR);
	in_error("type 2 bound twice");
	/* A SEND with Invalidate of the window's rkey. */
	reconnect();
	struct ibv_sge rs = { .addr = baddr(100), .length = 64, .lkey = B.mr->lkey };
	struct ibv_recv_wr r = { .wr_id = 30, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(B.qp, &r, &rbad))
		die("ibv_post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)A.buf, .length = 64, .lkey = A.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 31, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = k };
	post(&A, &w);
	expect_wc(K, "SEND_WITH_INV", A.cq, wc_of(31, IBV_WC_SUCCESS, IBV_WC_SEND, &A), 0);
	struct ibv_wc got, want = wc_of(30, IBV_WC_SUCCESS, IBV_WC_RECV, &B);
	want.wc_flags = IBV_WC_WITH_INV;
	want.byte_len = 64;
	expect_wc_out(K, "SEND_WITH_INV receive", B.cq, want, 1, &got);
	if (got.invalidated_rkey != k)
		fail(K, "SEND_WITH_INV receive", "invalidated_rkey is not the window's rkey");
	memcpy(refB + 100, refA, 64);
	check("SEND_WITH_INV", B.buf, refB);
	rdma("type 2 WRITE after SEND_WITH_INV", IBV_WR_RDMA_WRITE, 0, baddr(8192), k, 8, IBV_WC_REM_ACCESS_ERR);
	check("type 2 WRITE after SEND_WITH_INV", B.buf, refB);
	/* Free again: bound anew, then LOCAL_INV. */
	reconnect();
	k = ibv_inc_rkey(k);
	bind2("type 2 rebind", mw, k, B.mr, baddr(0), 64, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	      IBV_WC_SUCCESS);
	rdma("type 2 READ", IBV_WR_RDMA_READ, 0, baddr(0), k, 64, IBV_WC_SUCCESS);
	memcpy(refA, refB, 64);
	check("type 2 READ", A.buf, refA);
	struct ibv_send_wr li = { .wr_id = 32, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = k };
	post(&B, &li);
	expect_wc(K, "LOCAL_INV", B.cq, wc_of(32, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, &B), 0);
	rdma("type 2 READ after LOCAL_INV", IBV_WR_RDMA_READ, 0, baddr(0), k, 64, IBV_WC_REM_ACCESS_ERR);
	/* ibv_wr_bind_mw, then ibv_dealloc_mw. */
	reconnect();
	k = ibv_inc_rkey(k);
	struct ibv_mw_bind_info bi = { .mr = B.mr, .addr = baddr(4096), .length = 4096,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(B.qpx);
	B.qpx->wr_id = 33;
	B.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(B.qpx, mw, k, &bi);
	if (ibv_wr_complete(B.qpx))
		die("ibv_wr_complete (bind)");
	expect_wc(K, "ibv_wr_bind_mw", B.cq, wc_of(33, IBV_WC_SUCCESS, IBV_WC_BIND_MW, &B), 0);
	rdma("type 2 WRITE (wr_bind_mw)", IBV_WR_RDMA_WRITE, 0, baddr(4096 + 4000), k, 96, IBV_WC_SUCCESS);
	memcpy(refB + 4096 + 4000, refA, 96);
	check("type 2 WRITE (wr_bind_mw)", B.buf, refB);
	if (ibv_dealloc_pd(B.pd) != EBUSY)
		fail(K, "dealloc_pd with a window", "did not fail with EBUSY");
	if (ibv_dealloc_mw(mw))
		die("ibv_dealloc_mw type 2");
	rdma("type 2 WRITE after dealloc", IBV_WR_RDMA_WRITE, 0, baddr(4096), k, 8, IBV_WC_REM_ACCESS_ERR);
	check("type 2 after dealloc", B.buf, refB);
	reconnect();
}

static void errors(void) {
	struct ibv_mw *mw = ibv_alloc_mw(B.pd, IBV_MW_TYPE_2);
	if (!mw)
		die("ibv_alloc_mw");
	bind2("bind beyond the MR", mw, ibv_inc_rkey(mw->rkey), B.mr, baddr(LEN - 100), 101, IBV_ACCESS_REMOTE_WRITE,
	      IBV_WC_MW_BIND_ERR);
	in_error("bind beyond the MR");
	reconnect();
	bind2("bind before the MR", mw, ibv_inc_rkey(mw->rkey), B.mr, baddr(0) - 1, 10, IBV_ACCESS_REMOTE_WRITE,
	      IBV_WC_MW_BIND_ERR);
	reconnect();
	struct ibv_mr *plain = ibv_reg_mr(B.pd, B.buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!plain)
		die("ibv_reg_mr without MW_BIND");
	bind2("bind to an MR without MW_BIND", mw, ibv_inc_rkey(mw->rkey), plain, baddr(0), 10, IBV_ACCESS_REMOTE_WRITE,
	      IBV_WC_MW_BIND_ERR);
	in_error("bind to an MR without MW_BIND");
	reconnect();
	struct ibv_pd *pd2 = ibv_alloc_pd(B.ctx);
	if (!pd2)
		die("ibv_alloc_pd");
	struct ibv_mw *other = ibv_alloc_mw(pd2, IBV_MW_TYPE_2);
	if (!other)
		die("ibv_alloc_mw (second PD)");
	bind2("bind a window of another PD", other, ibv_inc_rkey(other->rkey), B.mr, baddr(0), 10, IBV_ACCESS_REMOTE_WRITE,
	      IBV_WC_MW_BIND_ERR);
	reconnect();
	/* A's QP cannot use B's window: A names it through its own device,
	 * where the key means nothing (its rkey never bound). */
	rdma("WRITE through a never-bound rkey", IBV_WR_RDMA_WRITE, 0, baddr(0), mw->rkey, 8, IBV_WC_REM_ACCESS_ERR);
	reconnect();
	if (ibv_dealloc_mw(other) || ibv_dealloc_pd(pd2) || ibv_dealloc_mw(mw) || ibv_dereg_mr(plain))
		die("cleanup");
	check("errors", B.buf, refB);
}

int main(void) {
	struct ibv_device **list = two_devices();
	open_side(&A, list[0], IBV_ACCESS_LOCAL_WRITE);
	open_side(&B, list[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	fill(B.buf, LEN, 9), memcpy(refB, B.buf, LEN);
	reconnect();
	caps();
	type1();
	type2();
	errors();
	if (ibv_destroy_qp(A.qp) || ibv_destroy_qp(B.qp) || ibv_destroy_cq(A.cq) || ibv_destroy_cq(B.cq) ||
	    ibv_dereg_mr(A.mr) || ibv_dereg_mr(B.mr) || ibv_dealloc_pd(A.pd) || ibv_dealloc_pd(B.pd) ||
	    ibv_close_device(A.ctx) || ibv_close_device(B.ctx))
		die("teardown");
	free(A.buf);
	free(B.buf);
	ibv_free_device_list(list);
	printf("OK caps; type1 bind write read past_window no_read local_inv_refused dereg_busy unbind; "
	       "type2 post_bind write other_qp bound_twice send_inv local_inv wr_bind_mw dealloc_pd_busy dealloc; "
	       "errors beyond_mr before_mr no_mw_bind other_pd unbound_rkey\n");
	return 0;
}
