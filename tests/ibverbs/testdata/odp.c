/* odp: a libibverbs program (only <infiniband/verbs.h>) that checks
 * on-demand paging between RC QPs on two devices (A and B):
 *
 *   caps     ibv_query_device_ex's odp_caps: ODP and implicit ODP; RC
 *            SEND RECV WRITE READ ATOMIC SRQ_RECV, UC and UD as offered.
 *   traffic  A's buffer is an explicit ODP MR (IBV_ACCESS_ON_DEMAND) of an
 *            mmap; B's memory is reached through one implicit ODP MR
 *            (addr NULL, SIZE_MAX) and mapped only after it was
 *            registered. SEND/RECV, RDMA WRITE, RDMA READ, CMP_AND_SWP and
 *            FETCH_AND_ADD between them, every byte and completion checked.
 *   remap    B unmaps a page and maps a new one with other contents at the
 *            same address: a READ gives the new contents (invalidation).
 *   advise   ibv_advise_mr PREFETCH, PREFETCH_WRITE (with FLUSH) and
 *            PREFETCH_NO_FAULT succeed; unmapped memory with FLUSH is
 *            EFAULT; another context's MR ENOENT (FLUSH) or EINVAL
 *            (asynchronous); an MR that is not ODP ENOENT; an unknown
 *            advice EOPNOTSUPP; unknown flags and no SGE EINVAL.
 *   errors   an RDMA WRITE to an unmapped page of B's implicit MR completes
 *            with IBV_WC_REM_ACCESS_ERR; a SEND from an unmapped page of
 *            A's explicit MR with IBV_WC_LOC_PROT_ERR. Registration of odd
 *            ranges: EINVAL, or EOVERFLOW for one that wraps.
 *
 * Prints "OK ..." and exits 0, or "ERROR ..." and exits 1. */
#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

#define PAGES 4
#define PG 4096
#define LEN 6000 /* crosses a page boundary */

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
	union ibv_gid gid;
	unsigned char *buf; /* PAGES pages */
	struct ibv_mr *mr;
};

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0)))
		die("open");
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	for (int i = 0; i < 2; i++)
		if (!(s->qp[i] = ibv_create_qp(s->pd, &a)))
			die("ibv_create_qp");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

static void connect_qp(struct ibv_qp *qp, struct ibv_qp *peer, union ibv_gid *dgid) {
	rc_to_rts(qp, peer->qp_num, dgid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, 7, 4);
}

static unsigned char *map_pages(void *at) {
	void *p = mmap(at, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED : 0), -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 7 + seed);
}

static void same(const char *kind, const void *got, const void *want, size_t n) {
	if (memcmp(got, want, n))
		fail(kind, "bytes", "differ");
}

static void send_wr(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, struct ibv_sge *sg, uint64_t raddr,
		    uint32_t rkey, uint64_t cmp, uint64_t swap) {
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = sg, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = cmp;
		wr.wr.atomic.swap = swap;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send");
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sg) {
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = sg, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv");
}

static void expect_errno(const char *what, int got, int want) {
	if (got != want) {
		char d[96];
		snprintf(d, sizeof d, "returned %d (%s), want %s", got, strerror(got), strerror(want));
		fail("advise", what, d);
	}
}

static void odd_registrations(struct side *a) {
	errno = 0;
	if (ibv_reg_mr(a->pd, a->buf, (size_t)1 << 41, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) || errno != EINVAL)
		fail("reg", "ODP MR longer than max_mr_size", "not EINVAL");
	errno = 0;
	if (ibv_reg_mr_iova(a->pd, NULL, SIZE_MAX, 4096, IBV_ACCESS_ON_DEMAND) || errno != EINVAL)
		fail("reg", "implicit ODP MR at iova 4096", "not EINVAL");
	errno = 0;
	if (ibv_reg_mr(a->pd, a->buf, PG, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND) || errno != EINVAL)
		fail("reg", "ODP remote write without local write", "not EINVAL");
	errno = 0;
	/* ib_init_umem_odp's check_add_overflow */
	if (ibv_reg_mr(a->pd, (void *)(uintptr_t)(UINT64_MAX - PG), 2 * PG, IBV_ACCESS_ON_DEMAND) || errno != EOVERFLOW)
		fail("reg", "ODP MR wrapping the address space", "not EOVERFLOW");
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side A = { 0 }, B = { 0 };
	open_side(&A, list[0]);
	open_side(&B, list[1]);
	connect_qp(A.qp[0], B.qp[0], &B.gid);
	connect_qp(B.qp[0], A.qp[0], &A.gid);
	connect_qp(A.qp[1], B.qp[1], &B.gid);
	connect_qp(B.qp[1], A.qp[1], &A.gid);

	/* caps */
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(A.ctx, NULL, &dx))
		die("ibv_query_device_ex");
	if (dx.odp_caps.general_caps != (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) ||
	    dx.odp_caps.per_transport_caps.rc_odp_caps != 0x3f ||
	    dx.odp_caps.per_transport_caps.uc_odp_caps !=
		    (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV) ||
	    dx.odp_caps.per_transport_caps.ud_odp_caps !=
		    (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV))
		fail("caps", "odp_caps", "not as offered");

	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
		  IBV_ACCESS_ON_DEMAND;
	A.buf = map_pages(NULL);
	if (!(A.mr = ibv_reg_mr(A.pd, A.buf, PAGES * PG, all)))
		die("ibv_reg_mr ODP");
	if (A.mr->addr != A.buf || A.mr->length != PAGES * PG)
		fail("reg", "explicit ODP MR", "addr or length");
	if (!(B.mr = ibv_reg_mr(B.pd, NULL, SIZE_MAX, all)))
		die("ibv_reg_mr implicit ODP");
	B.buf = map_pages(NULL); /* after the registration */
	struct ibv_mr *plain = ibv_reg_mr(A.pd, malloc(PG), PG, IBV_ACCESS_LOCAL_WRITE);
	if (!plain)
		die("ibv_reg_mr");
	odd_registrations(&A);

	/* SEND A -> B */
	unsigned char ref[PAGES * PG];
	fill(A.buf, LEN, 1);
	struct ibv_sge rs = { (uintptr_t)B.buf + 100, LEN, B.mr->lkey }, ss = { (uintptr_t)A.buf + 50, LEN, A.mr->lkey };
	post_recv(B.qp[0], 1, &rs);
	send_wr(A.qp[0], IBV_WR_SEND, 2, &ss, 0, 0, 0, 0);
	expect_wc("send", "sender", A.cq, (struct ibv_wc){ .wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = A.qp[0]->qp_num }, 0);
	expect_wc("send", "receiver", B.cq,
		  (struct ibv_wc){ .wr_id = 1, .opcode = IBV_WC_RECV, .byte_len = LEN, .qp_num = B.qp[0]->qp_num }, 1);
	same("send", B.buf + 100, A.buf + 50, LEN);

	/* WRITE A -> B */
	fill(A.buf, LEN, 2);
	ss = (struct ibv_sge){ (uintptr_t)A.buf, LEN, A.mr->lkey };
	send_wr(A.qp[0], IBV_WR_RDMA_WRITE, 3, &ss, (uintptr_t)B.buf + 1000, B.mr->rkey, 0, 0);
	expect_wc("write", "", A.cq, (struct ibv_wc){ .wr_id = 3, .opcode = IBV_WC_RDMA_WRITE, .qp_num = A.qp[0]->qp_num }, 0);
	same("write", B.buf + 1000, A.buf, LEN);

	/* READ A <- B */
	fill(B.buf, LEN, 3);
	memcpy(ref, B.buf, LEN);
	ss = (struct ibv_sge){ (uintptr_t)A.buf + PG, LEN, A.mr->lkey };
	send_wr(A.qp[0], IBV_WR_RDMA_READ, 4, &ss, (uintptr_t)B.buf, B.mr->rkey, 0, 0);
	expect_wc("read", "", A.cq,
		  (struct ibv_wc){ .wr_id = 4, .opcode = IBV_WC_RDMA_READ, .byte_len = LEN, .qp_num = A.qp[0]->qp_num }, 1);
	same("read", A.buf + PG, ref, LEN);

	/* Atomics on B's word, the original value into A's. */
	uint64_t v = 41, got;
	memcpy(B.buf + 8, &v, 8);
	ss = (struct ibv_sge){ (uintptr_t)A.buf + 16, 8, A.mr->lkey };
	send_wr(A.qp[0], IBV_WR_ATOMIC_CMP_AND_SWP, 5, &ss, (uintptr_t)B.buf + 8, B.mr->rkey, 41, 1000);
	expect_wc("cmp_swap", "", A.cq,
		  (struct ibv_wc){ .wr_id = 5, .opcode = IBV_WC_COMP_SWAP, .qp_num = A.qp[0]->qp_num }, 0);
	memcpy(&got, A.buf + 16, 8);
	memcpy(&v, B.buf + 8, 8);
	if (got != 41 || v != 1000)
		fail("cmp_swap", "values", "wrong");
	send_wr(A.qp[0], IBV_WR_ATOMIC_FETCH_AND_ADD, 6, &ss, (uintptr_t)B.buf + 8, B.mr->rkey, 5, 0);
	expect_wc("fetch_add", "", A.cq,
		  (struct ibv_wc){ .wr_id = 6, .opcode = IBV_WC_FETCH_ADD, .qp_num = A.qp[0]->qp_num }, 0);
	memcpy(&got, A.buf + 16, 8);
	memcpy(&v, B.buf + 8, 8);
	if (got != 1000 || v != 1005)
		fail("fetch_add", "values", "wrong");

	/* remap: B replaces its second page; a READ sees the new contents. */
	if (munmap(B.buf + PG, PG))
		die("munmap");
	if (mmap(B.buf + PG, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
		die("mmap");
	fill(B.buf + PG, PG, 9);
	ss = (struct ibv_sge){ (uintptr_t)A.buf + 2 * PG, PG, A.mr->lkey };
	send_wr(A.qp[0], IBV_WR_RDMA_READ, 7, &ss, (uintptr_t)B.buf + PG, B.mr->rkey, 0, 0);
	expect_wc("remap", "", A.cq,
		  (struct ibv_wc){ .wr_id = 7, .opcode = IBV_WC_RDMA_READ, .byte_len = PG, .qp_num = A.qp[0]->qp_num }, 1);
	same("remap", A.buf + 2 * PG, B.buf + PG, PG);

	/* advise */
	struct ibv_sge as = { (uintptr_t)A.buf, PAGES * PG, A.mr->lkey };
	expect_errno("PREFETCH", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &as, 1), 0);
	expect_errno("PREFETCH_WRITE",
		     ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &as, 1), 0);
	expect_errno("PREFETCH_NO_FAULT", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &as, 1), 0);
	expect_errno("async PREFETCH", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 1), 0);
	struct ibv_sge bs = { (uintptr_t)B.buf, PG, B.mr->lkey };
	expect_errno("implicit", ibv_advise_mr(B.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &bs, 1), 0);
	struct ibv_sge foreign = { (uintptr_t)B.buf, PG, B.mr->lkey };
	expect_errno("foreign MR",
		     ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &foreign, 1), ENOENT);
	expect_errno("async foreign MR", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &foreign, 1), EINVAL);
	struct ibv_sge ps = { (uintptr_t)plain->addr, PG, plain->lkey };
	expect_errno("non-ODP MR", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &ps, 1),
		     ENOENT);
	expect_errno("advice 7", ibv_advise_mr(A.pd, (enum ibv_advise_mr_advice)7, 0, &as, 1), EOPNOTSUPP);
	expect_errno("flags 2", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 2, &as, 1), EINVAL);
	expect_errno("no SGE", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 0), EINVAL);
	struct ibv_sge big = { (uintptr_t)A.buf, PAGES * PG + 1, A.mr->lkey };
	expect_errno("past the MR", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &big, 1),
		     EFAULT);
	if (munmap(A.buf + 3 * PG, PG))
		die("munmap");
	expect_errno("unmapped", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH, &as, 1),
		     EFAULT);
	expect_errno("async unmapped", ibv_advise_mr(A.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &as, 1), 0);

	/* errors: a remote access to an unmapped page of B ... */
	if (munmap(B.buf + 3 * PG, PG))
		die("munmap");
	ss = (struct ibv_sge){ (uintptr_t)A.buf, 64, A.mr->lkey };
	send_wr(A.qp[0], IBV_WR_RDMA_WRITE, 8, &ss, (uintptr_t)B.buf + 3 * PG, B.mr->rkey, 0, 0);
	expect_wc("rem_access", "", A.cq,
		  (struct ibv_wc){ .wr_id = 8, .status = IBV_WC_REM_ACCESS_ERR, .opcode = IBV_WC_RDMA_WRITE,
				   .qp_num = A.qp[0]->qp_num },
		  0);
	/* ... and a local SGE on an unmapped page of A's explicit MR. */
	rs = (struct ibv_sge){ (uintptr_t)B.buf, 64, B.mr->lkey };
	post_recv(B.qp[1], 9, &rs);
	ss = (struct ibv_sge){ (uintptr_t)A.buf + 3 * PG, 64, A.mr->lkey };
	send_wr(A.qp[1], IBV_WR_SEND, 10, &ss, 0, 0, 0, 0);
	expect_wc("loc_prot", "", A.cq,
		  (struct ibv_wc){ .wr_id = 10, .status = IBV_WC_LOC_PROT_ERR, .opcode = IBV_WC_SEND,
				   .qp_num = A.qp[1]->qp_num },
		  0);

	void *pbuf = plain->addr;
	if (ibv_dereg_mr(plain) || ibv_dereg_mr(A.mr) || ibv_dereg_mr(B.mr))
		die("ibv_dereg_mr");
	free(pbuf);
	for (int i = 0; i < 2; i++)
		if (ibv_destroy_qp(A.qp[i]) || ibv_destroy_qp(B.qp[i]))
			die("ibv_destroy_qp");
	if (ibv_destroy_cq(A.cq) || ibv_destroy_cq(B.cq) || ibv_dealloc_pd(A.pd) || ibv_dealloc_pd(B.pd) ||
	    ibv_close_device(A.ctx) || ibv_close_device(B.ctx))
		die("teardown");
	ibv_free_device_list(list);
	munmap(A.buf, 3 * PG);
	munmap(B.buf, 3 * PG);
	printf("OK odp caps, explicit+implicit send write read cmp_swap fetch_add, remap, advise, rem_access loc_prot\n");
	return 0;
}
