/* domain: thread domains and parent domains through the standard verbs
 * API (ibv_alloc_td, ibv_alloc_parent_domain, IBV_CQ_INIT_ATTR_MASK_PD).
 *
 * On device A a parent domain with allocators gives the rings of an
 * extended CQ, an SRQ and two RC QPs (one on the SRQ); the program checks
 * each allocator call (size, alignment, resource type), runs SEND and
 * RDMA WRITE both ways against device B with every byte and completion
 * checked, and checks that destroying each object hands its memory back to
 * the free function. Then the error cases: EINVAL for bad attributes,
 * EBUSY for a protection or thread domain still under a parent domain,
 * ENOMEM when the allocator has nothing, and IBV_ALLOCATOR_USE_DEFAULT.
 *
 * Prints "OK parent_domain td allocators traffic busy errors" and exits 0. */
#include "check.h"

#include <errno.h>
#include <stdint.h>

/* The resource types vrnic's library passes to a parent domain's alloc
 * (README, "Parent and thread domains"). */
#define RES_CQ ((0x7672ULL << 32) + 1)
#define RES_SQ ((0x7672ULL << 32) + 2)
#define RES_RQ ((0x7672ULL << 32) + 3)
#define RES_SRQ ((0x7672ULL << 32) + 4)

#define MAXB 32
struct alloc_log {
	int mode; /* 0: allocate, 1: return NULL, 2: return IBV_ALLOCATOR_USE_DEFAULT */
	int allocs, frees;
	struct {
		void *p;
		size_t size;
		uint64_t type;
		int freed;
	} b[MAXB];
	struct ibv_pd *want_pd;
};

static void *my_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type) {
	struct alloc_log *l = ctx;
	if (pd != l->want_pd)
		fail("alloc", "pd", "not the parent domain");
	if (l->mode == 1)
		return NULL;
	if (l->mode == 2)
		return IBV_ALLOCATOR_USE_DEFAULT;
	if (l->allocs == MAXB || align < 4096 || (align & (align - 1)) || size % 4096)
		fail("alloc", "call", "too many calls, or an alignment or size that is not whole pages");
	void *p;
	if (posix_memalign(&p, align, size))
		die("posix_memalign");
	memset(p, 0xa5, size); /* the library must clear it */
	l->b[l->allocs].p = p;
	l->b[l->allocs].size = size;
	l->b[l->allocs].type = type;
	l->allocs++;
	return p;
}

static void my_free(struct ibv_pd *pd, void *ctx, void *p, uint64_t type) {
	struct alloc_log *l = ctx;
	if (pd != l->want_pd)
		fail("free", "pd", "not the parent domain");
	for (int i = 0; i < l->allocs; i++)
		if (l->b[i].p == p) {
			if (l->b[i].freed || l->b[i].type != type)
				fail("free", "buffer", "freed twice, or with another resource type");
			l->b[i].freed = 1;
			l->frees++;
			free(p);
			return;
		}
	fail("free", "buffer", "not one the allocator returned");
}

/* count_type: the buffers of this type allocated, and how many of those
 * were freed. */
static int count_type(struct alloc_log *l, uint64_t type, int *freed) {
	int n = 0;
	*freed = 0;
	for (int i = 0; i < l->allocs; i++)
		if (l->b[i].type == type) {
			n++;
			*freed += l->b[i].freed;
		}
	return n;
}

static void expect_types(const char *what, struct alloc_log *l, int cq, int sq, int rq, int srq, int freed_all) {
	uint64_t types[] = { RES_CQ, RES_SQ, RES_RQ, RES_SRQ };
	int want[] = { cq, sq, rq, srq };
	for (int i = 0; i < 4; i++) {
		int f, n = count_type(l, types[i], &f);
		if (n != want[i] || f != (freed_all ? n : 0)) {
			char d[128];
			snprintf(d, sizeof d, "type %d: %d buffers (%d freed), want %d (%s freed)", i, n, f, want[i],
				 freed_all ? "all" : "none");
			fail("allocator", what, d);
		}
	}
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	unsigned char *buf;
	union ibv_gid gid;
};

static void connect_qp(struct ibv_qp *qp, struct ibv_qp *peer, union ibv_gid *gid) {
	rc_to_rts(qp, peer->qp_num, gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 9, 1);
}

static struct ibv_qp *new_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq) {
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = srq ? 0 : 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	return ibv_create_qp(pd, &a);
}

static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq, uint64_t id, struct ibv_mr *mr, size_t off, size_t n) {
	struct ibv_sge sg = { .addr = (uintptr_t)mr->addr + off, .length = (uint32_t)n, .lkey = mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &sg, .num_sge = 1 }, *bad;
	if (srq ? ibv_post_srq_recv(srq, &w, &bad) : ibv_post_recv(qp, &w, &bad))
		die("post recv");
}

static void post_send(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_mr *mr, size_t off, size_t n,
		      struct ibv_mr *rmr, size_t roff) {
	struct ibv_sge sg = { .addr = (uintptr_t)mr->addr + off, .length = (uint32_t)n, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	if (rmr) {
		w.wr.rdma.remote_addr = (uintptr_t)rmr->addr + roff;
		w.wr.rdma.rkey = rmr->rkey;
	}
	if (ibv_post_send(qp, &w, &bad))
		die("post send");
}

/* expect_many waits for n successful completions on cq, in any order (the
 * CQ serves several QPs), each matching by wr_id one of want: opcode,
 * qp_num, wc_flags 0, and byte_len for receives. Then the CQ is empty. */
static void expect_many(const char *what, struct ibv_cq *cq, int n, const struct ibv_wc *want) {
	int seen[8] = { 0 };
	char d[160];
	for (int k = 0; k < n; k++) {
		struct ibv_wc wc;
		if (!poll_wc(cq, &wc, 10000))
			fail("completions", what, "fewer than expected in 10 s");
		int i = 0;
		while (i < n && want[i].wr_id != wc.wr_id)
			i++;
		if (i == n || seen[i]++) {
			snprintf(d, sizeof d, "unexpected wr_id %" PRIu64, wc.wr_id);
			fail("completions", what, d);
		}
		if (wc.status != IBV_WC_SUCCESS || wc.opcode != want[i].opcode || wc.qp_num != want[i].qp_num ||
		    wc.wc_flags || (want[i].opcode == IBV_WC_RECV && wc.byte_len != want[i].byte_len)) {
			snprintf(d, sizeof d, "wr_id %" PRIu64 ": status %d opcode %d qp %u flags %u len %u", wc.wr_id,
				 wc.status, wc.opcode, wc.qp_num, wc.wc_flags, wc.byte_len);
			fail("completions", what, d);
		}
	}
	struct ibv_wc extra;
	if (ibv_poll_cq(cq, 1, &extra) != 0)
		fail("completions", what, "one more than expected");
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 7 + seed);
}

static void same(const char *what, const unsigned char *a, const unsigned char *b, size_t n) {
	if (memcmp(a, b, n))
		fail("traffic", what, "the bytes differ");
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side A = { 0 }, B = { 0 };
	struct side *sides[] = { &A, &B };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (!(s->ctx = ibv_open_device(list[i])) || !(s->pd = ibv_alloc_pd(s->ctx)))
			die("open");
		if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
			die("ibv_query_gid");
		s->buf = calloc(1, 8192);
		if (!s->buf || !(s->mr = ibv_reg_mr(s->pd, s->buf, 8192,
						    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)))
			die("ibv_reg_mr");
	}

	/* Thread domain and parent domain attributes. */
	struct ibv_td_init_attr tda = { .comp_mask = 1 };
	errno = 0;
	if (ibv_alloc_td(A.ctx, &tda) || errno != EINVAL)
		fail("td", "comp_mask 1", "not EINVAL");
	tda.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(A.ctx, &tda);
	if (!td || td->context != A.ctx)
		die("ibv_alloc_td");
	struct alloc_log log = { 0 };
	struct ibv_parent_domain_init_attr pa = { .pd = NULL, .td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = my_alloc, .free = my_free, .pd_context = &log };
	errno = 0;
	if (ibv_alloc_parent_domain(A.ctx, &pa) || errno != EINVAL)
		fail("parent domain", "no PD", "not EINVAL");
	pa.pd = B.pd;
	errno = 0;
	if (ibv_alloc_parent_domain(A.ctx, &pa) || errno != EINVAL)
		fail("parent domain", "a PD of another context", "not EINVAL");
	pa.pd = A.pd;
	pa.comp_mask |= 1u << 7;
	errno = 0;
	if (ibv_alloc_parent_domain(A.ctx, &pa) || errno != EINVAL)
		fail("parent domain", "unknown comp_mask bit", "not EINVAL");
	pa.comp_mask &= ~(1u << 7);
	pa.free = NULL;
	errno = 0;
	if (ibv_alloc_parent_domain(A.ctx, &pa) || errno != EINVAL)
		fail("parent domain", "alloc without free", "not EINVAL");
	pa.free = my_free;
	struct ibv_pd *pdom = ibv_alloc_parent_domain(A.ctx, &pa);
	if (!pdom)
		die("ibv_alloc_parent_domain");
	log.want_pd = pdom;
	struct ibv_parent_domain_init_attr pp = { .pd = pdom };
	errno = 0;
	if (ibv_alloc_parent_domain(A.ctx, &pp) || errno != EINVAL)
		fail("parent domain", "of a parent domain", "not EINVAL");
	printf("OK parent_domain td");

	/* A's objects on the parent domain. */
	struct ibv_cq_init_attr_ex cx = { .cqe = 32, .wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = A.pd };
	errno = 0;
	if (ibv_create_cq_ex(A.ctx, &cx) || errno != EINVAL)
		fail("cq", "parent_domain a plain PD", "not EINVAL");
	cx.parent_domain = pdom;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(A.ctx, &cx);
	if (!cqx)
		die("ibv_create_cq_ex on the parent domain");
	A.cq = ibv_cq_ex_to_cq(cqx);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	if (!(A.srq = ibv_create_srq(pdom, &sa)))
		die("ibv_create_srq on the parent domain");
	if (!(A.qp[0] = new_qp(pdom, A.cq, A.srq)) || !(A.qp[1] = new_qp(pdom, A.cq, NULL)))
		die("ibv_create_qp on the parent domain");
	if (A.qp[0]->pd != pdom || A.srq->pd != pdom)
		fail("objects", "pd", "not the parent domain they were created on");
	expect_types("after creation", &log, 1, 2, 1, 1, 0);
	if (!(B.cq = ibv_create_cq(B.ctx, 32, NULL, NULL, 0)) || !(B.qp[0] = new_qp(B.pd, B.cq, NULL)) ||
	    !(B.qp[1] = new_qp(B.pd, B.cq, NULL)))
		die("B's objects");
	/* An MR on the parent domain is one of its protection domain. */
	unsigned char *abuf2 = calloc(1, 4096);
	struct ibv_mr *pmr = abuf2 ? ibv_reg_mr(pdom, abuf2, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : NULL;
	if (!pmr)
		die("ibv_reg_mr on the parent domain");
	printf(" allocators");

	for (int i = 0; i < 2; i++) {
		connect_qp(A.qp[i], B.qp[i], &B.gid);
		connect_qp(B.qp[i], A.qp[i], &A.gid);
	}
	fill(B.buf, 8192, 3);
	fill(A.buf + 4096, 4096, 5);
	/* B -> A: SENDs into the SRQ (QP 0) and the RQ (QP 1); a WRITE into
	 * the MR registered on the parent domain. */
	post_recv(A.qp[0], A.srq, 10, A.mr, 0, 1000);
	post_recv(A.qp[1], NULL, 11, A.mr, 1024, 1000);
	post_send(B.qp[0], 20, IBV_WR_SEND, B.mr, 0, 1000, NULL, 0);
	post_send(B.qp[1], 21, IBV_WR_SEND, B.mr, 1000, 900, NULL, 0);
	post_send(B.qp[1], 22, IBV_WR_RDMA_WRITE, B.mr, 2000, 3000, pmr, 1000);
	expect_many("b to a", A.cq, 2,
		    (struct ibv_wc[]){ { .wr_id = 10, .opcode = IBV_WC_RECV, .qp_num = A.qp[0]->qp_num, .byte_len = 1000 },
				       { .wr_id = 11, .opcode = IBV_WC_RECV, .qp_num = A.qp[1]->qp_num, .byte_len = 900 } });
	expect_many("b's sends", B.cq, 3,
		    (struct ibv_wc[]){ { .wr_id = 20, .opcode = IBV_WC_SEND, .qp_num = B.qp[0]->qp_num },
				       { .wr_id = 21, .opcode = IBV_WC_SEND, .qp_num = B.qp[1]->qp_num },
				       { .wr_id = 22, .opcode = IBV_WC_RDMA_WRITE, .qp_num = B.qp[1]->qp_num } });
	same("send into the SRQ", A.buf, B.buf, 1000);
	same("send into the RQ", A.buf + 1024, B.buf + 1000, 900);
	same("write into the parent domain's MR", abuf2 + 1000, B.buf + 2000, 3000);
	/* A -> B: a SEND and a WRITE from the parent domain's QPs. */
	post_recv(B.qp[0], NULL, 30, B.mr, 4096, 2048);
	post_send(A.qp[0], 40, IBV_WR_SEND, A.mr, 4096, 2048, NULL, 0);
	post_send(A.qp[1], 41, IBV_WR_RDMA_WRITE, A.mr, 6144, 2048, B.mr, 6144);
	expect_many("a's sends", A.cq, 2,
		    (struct ibv_wc[]){ { .wr_id = 40, .opcode = IBV_WC_SEND, .qp_num = A.qp[0]->qp_num },
				       { .wr_id = 41, .opcode = IBV_WC_RDMA_WRITE, .qp_num = A.qp[1]->qp_num } });
	expect_many("a to b", B.cq, 1,
		    (struct ibv_wc[]){ { .wr_id = 30, .opcode = IBV_WC_RECV, .qp_num = B.qp[0]->qp_num, .byte_len = 2048 } });
	same("send from the parent domain's QP", B.buf + 4096, A.buf + 4096, 2048);
	same("write from the parent domain's QP", B.buf + 6144, A.buf + 6144, 2048);
	printf(" traffic");

	/* In use: the protection domain, the thread domain, and the parent
	 * domain whose memory the objects hold. */
	if (ibv_dealloc_pd(A.pd) != EBUSY)
		fail("busy", "the protection domain", "not EBUSY");
	if (ibv_dealloc_td(td) != EBUSY)
		fail("busy", "the thread domain", "not EBUSY");
	if (ibv_dealloc_pd(pdom) != EBUSY)
		fail("busy", "the parent domain", "not EBUSY");
	if (ibv_dereg_mr(pmr))
		die("ibv_dereg_mr");
	for (int i = 0; i < 2; i++)
		if (ibv_destroy_qp(A.qp[i]) || ibv_destroy_qp(B.qp[i]))
			die("ibv_destroy_qp");
	if (ibv_destroy_srq(A.srq) || ibv_destroy_cq(A.cq) || ibv_destroy_cq(B.cq))
		die("destroy");
	expect_types("after destruction", &log, 1, 2, 1, 1, 1);
	printf(" busy");

	/* Allocation failure, then the default allocator. */
	struct ibv_cq *cq = ibv_create_cq(A.ctx, 8, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq");
	log.mode = 1;
	errno = 0;
	if (new_qp(pdom, cq, NULL) || errno != ENOMEM)
		fail("errors", "an allocator with nothing", "not ENOMEM");
	log.mode = 2;
	int before = log.allocs;
	struct ibv_qp *qp = new_qp(pdom, cq, NULL);
	if (!qp || log.allocs != before)
		fail("errors", "IBV_ALLOCATOR_USE_DEFAULT", "no QP, or memory from the allocator");
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq))
		die("destroy");
	if (log.frees != log.allocs)
		fail("errors", "free", "a buffer was not freed");
	if (ibv_dealloc_pd(pdom) || ibv_dealloc_td(td))
		die("dealloc the parent and thread domains");
	for (int i = 0; i < 2; i++)
		if (ibv_dereg_mr(sides[i]->mr) || ibv_dealloc_pd(sides[i]->pd) || ibv_close_device(sides[i]->ctx))
			die("close");
	free(A.buf);
	free(B.buf);
	free(abuf2);
	printf(" errors\n");
	ibv_free_device_list(list);
	return 0;
}
