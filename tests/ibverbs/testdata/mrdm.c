/* mrdm: a libibverbs program (only <infiniband/verbs.h>) for ibv_rereg_mr,
 * ibv_resize_cq and device memory, between RC QPs on two devices:
 *
 *   rereg: RDMA WRITEs into B's MR after each of CHANGE_TRANSLATION,
 *     CHANGE_ACCESS, CHANGE_PD and all three at once, every byte of the
 *     new and the old buffer checked; the old translation, the access
 *     taken away and the other PD refused (REM_ACCESS_ERR); the keys
 *     unchanged; bad flags and access refused with the codes of enum
 *     ibv_rereg_mr_err_code and errno.
 *   resize: completions outstanding (known to be in the CQ through the
 *     completion channel, one per WR) across a grow and a shrink, a
 *     shrink below them refused (EINVAL), then polled in order with every
 *     field checked.
 *   dm: ibv_alloc_dm, memcpy to and from, RDMA WRITE from a DM MR into a
 *     remote DM MR, READ from it into host memory and into DM, a
 *     FETCH_AND_ADD on it, a DM MR at an offset; memcpy and registration
 *     beyond the DM, unaligned memcpy, a DM MR without ZERO_BASED, sizes
 *     and comp_mask ibv_alloc_dm refuses, ibv_free_dm of a DM with an MR.
 *
 * Prints "OK ..." and exits 0, or "ERROR ..." and exits 1. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define LEN 6000 /* spans two pages, not page aligned */
#define DMLEN 4096

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static void open_side(struct side *s, struct ibv_device *dev, int cqe) {
	if (!(s->ctx = ibv_open_device(dev)))
		die("ibv_open_device");
	if (!(s->pd = ibv_alloc_pd(s->ctx)))
		die("ibv_alloc_pd");
	if (!(s->ch = ibv_create_comp_channel(s->ctx)))
		die("ibv_create_comp_channel");
	if (!(s->cq = ibv_create_cq(s->ctx, cqe, NULL, s->ch, 0)))
		die("ibv_create_cq");
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (!(s->qp = ibv_create_qp(s->pd, &a)))
		die("ibv_create_qp");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

/* connect_qp moves s's QP from RESET (or any state) to RTS towards peer. */
static void connect_qp(struct side *s, struct side *peer) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE))
		die("modify RESET");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 11;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 11;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					      IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");
}

/* reconnect restarts both QPs after an error completion. */
static void reconnect(struct side *a, struct side *b) {
	connect_qp(a, b);
	connect_qp(b, a);
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 7 + seed + (i >> 8));
}

static void same(const char *kind, const char *what, const unsigned char *got, const unsigned char *want, size_t n) {
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			char d[128];
			snprintf(d, sizeof d, "byte %zu is 0x%02x, want 0x%02x", i, got[i], want[i]);
			fail(kind, what, d);
		}
}

/* rdma posts one signaled RDMA operation from s. */
static void rdma(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr, uint32_t len, uint32_t lkey,
		 uint64_t raddr, uint32_t rkey) {
	struct ibv_sge sg = { .addr = (uintptr_t)laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sg, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(s->qp, &wr, &bad))
		die("ibv_post_send");
}

static struct ibv_wc wcw(uint64_t id, enum ibv_wc_status st, enum ibv_wc_opcode op, struct side *s) {
	return (struct ibv_wc){ .wr_id = id, .status = st, .opcode = op, .qp_num = s->qp->qp_num };
}

static void rereg_ok(const char *what, struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len,
		     int access) {
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	int r = ibv_rereg_mr(mr, flags, pd, addr, len, access);
	if (r) {
		char d[96];
		snprintf(d, sizeof d, "returned %d, errno %d", r, errno);
		fail("rereg", what, d);
	}
	if (mr->lkey != lkey || mr->rkey != rkey)
		fail("rereg", what, "keys changed");
	if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (mr->addr != addr || mr->length != len))
		fail("rereg", what, "addr or length not the new ones");
	if ((flags & IBV_REREG_MR_CHANGE_PD) && mr->pd != pd)
		fail("rereg", what, "pd not the new one");
}

static void rereg_bad(const char *what, struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len,
		      int access, int want_ret, int want_errno) {
	errno = 0;
	int r = ibv_rereg_mr(mr, flags, pd, addr, len, access);
	if (r != want_ret || errno != want_errno) {
		char d[96];
		snprintf(d, sizeof d, "returned %d errno %d, want %d errno %d", r, errno, want_ret, want_errno);
		fail("rereg", what, d);
	}
}

static void test_rereg(struct side *a, struct side *b) {
	unsigned char *src = malloc(LEN), *b1 = malloc(LEN + 64), *b2 = malloc(LEN + 64), *b3 = malloc(LEN + 64);
	unsigned char *want = malloc(LEN + 64), *zero = calloc(1, LEN + 64);
	if (!src || !b1 || !b2 || !b3 || !want || !zero)
		die("malloc");
	fill(src, LEN, 1);
	memset(b1, 0, LEN + 64);
	memset(b2, 0, LEN + 64);
	memset(b3, 0, LEN + 64);
	struct ibv_mr *smr = ibv_reg_mr(a->pd, src, LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(b->pd, b1, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !mr)
		die("ibv_reg_mr");
	const uint32_t rkey = mr->rkey;
	rdma(a, IBV_WR_RDMA_WRITE, 1, src, LEN, smr->lkey, (uintptr_t)b1, rkey);
	expect_wc("rereg", "write before", a->cq, wcw(1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "write before", b1, src, LEN);

	/* CHANGE_TRANSLATION: the MR is b2 now; b1 is refused. */
	rereg_ok("translation", mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b2, LEN, 0);
	fill(src, LEN, 2);
	rdma(a, IBV_WR_RDMA_WRITE, 2, src, LEN, smr->lkey, (uintptr_t)b2, rkey);
	expect_wc("rereg", "write to the new translation", a->cq, wcw(2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "new translation", b2, src, LEN);
	same("rereg", "new translation, past its end", b2 + LEN, zero, 64);
	fill(want, LEN, 1);
	same("rereg", "old buffer unchanged", b1, want, LEN);
	rdma(a, IBV_WR_RDMA_WRITE, 3, src, 16, smr->lkey, (uintptr_t)b1, rkey);
	expect_wc("rereg", "write to the old translation", a->cq, wcw(3, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "old buffer after the refused write", b1, want, LEN);
	reconnect(a, b);

	/* CHANGE_ACCESS: no remote write, refused; then read, which works. */
	rereg_ok("access", mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE);
	rdma(a, IBV_WR_RDMA_WRITE, 4, src, 16, smr->lkey, (uintptr_t)b2, rkey);
	expect_wc("rereg", "write without remote write", a->cq, wcw(4, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, a),
		  0);
	same("rereg", "buffer after the refused write", b2, src, LEN);
	reconnect(a, b);
	rereg_ok("access read", mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	memset(src, 0, LEN);
	rdma(a, IBV_WR_RDMA_READ, 5, src, LEN, smr->lkey, (uintptr_t)b2, rkey);
	struct ibv_wc w = wcw(5, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, a);
	w.byte_len = LEN;
	expect_wc("rereg", "read after access change", a->cq, w, 1);
	same("rereg", "read after access change", src, b2, LEN);

	/* CHANGE_PD: the QP's PD no longer matches; then back. */
	struct ibv_pd *pd2 = ibv_alloc_pd(b->ctx);
	if (!pd2)
		die("ibv_alloc_pd");
	rereg_ok("access write", mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	rereg_ok("pd", mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0);
	rdma(a, IBV_WR_RDMA_WRITE, 6, src, 16, smr->lkey, (uintptr_t)b2, rkey);
	expect_wc("rereg", "write into another PD", a->cq, wcw(6, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, a), 0);
	reconnect(a, b);
	if (ibv_dealloc_pd(pd2) != EBUSY)
		fail("rereg", "pd", "a PD with an MR deallocated");
	rereg_ok("pd back", mr, IBV_REREG_MR_CHANGE_PD, b->pd, NULL, 0, 0);
	if (ibv_dealloc_pd(pd2))
		fail("rereg", "pd back", "the other PD still busy");
	fill(src, LEN, 3);
	rdma(a, IBV_WR_RDMA_WRITE, 7, src, LEN, smr->lkey, (uintptr_t)b2, rkey);
	expect_wc("rereg", "write after pd back", a->cq, wcw(7, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "write after pd back", b2, src, LEN);

	/* Bad input: nothing changes. */
	rereg_bad("unknown flag", mr, 8, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_bad("no flag", mr, 0, NULL, NULL, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL);
	rereg_bad("translation without addr", mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, LEN, 0,
		  IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_bad("addr without translation", mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, b3, LEN, IBV_ACCESS_LOCAL_WRITE,
		  IBV_REREG_MR_ERR_INPUT, EINVAL);
	rereg_bad("remote write without local write", mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		  IBV_ACCESS_REMOTE_WRITE, IBV_REREG_MR_ERR_CMD, EINVAL);
	rereg_bad("pd of another context", mr, IBV_REREG_MR_CHANGE_PD, a->pd, NULL, 0, 0, IBV_REREG_MR_ERR_CMD, EINVAL);
	fill(src, LEN, 4);
	rdma(a, IBV_WR_RDMA_WRITE, 8, src, LEN, smr->lkey, (uintptr_t)b2, rkey);
	expect_wc("rereg", "write after refused reregs", a->cq, wcw(8, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "write after refused reregs", b2, src, LEN);

	/* All three at once; the unaligned b3+5 keeps its page offset. */
	pd2 = ibv_alloc_pd(b->ctx);
	rereg_ok("all", mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS, b->pd,
		 b3 + 5, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	fill(src, LEN, 5);
	rdma(a, IBV_WR_RDMA_WRITE, 9, src, LEN, smr->lkey, (uintptr_t)b3 + 5, rkey);
	expect_wc("rereg", "write after all three", a->cq, wcw(9, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	same("rereg", "write after all three", b3 + 5, src, LEN);
	same("rereg", "before the new range", b3, zero, 5);
	same("rereg", "past the new range", b3 + 5 + LEN, zero, 59);
	if (ibv_dereg_mr(mr) || ibv_dereg_mr(smr) || ibv_dealloc_pd(pd2))
		die("cleanup rereg");
	free(src);
	free(b1);
	free(b2);
	free(b3);
	free(want);
	free(zero);
}

/* write_and_wait posts a signaled RDMA WRITE of 64 bytes and waits for
 * its completion through the completion channel, without polling it: the
 * CQE is then in the CQ, not yet consumed. */
static void write_and_wait(struct side *a, uint64_t id, void *src, uint32_t lkey, uint64_t raddr, uint32_t rkey) {
	if (ibv_req_notify_cq(a->cq, 0))
		die("ibv_req_notify_cq");
	rdma(a, IBV_WR_RDMA_WRITE, id, src, 64, lkey, raddr, rkey);
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(a->ch, &cq, &ctx))
		die("ibv_get_cq_event");
	if (cq != a->cq)
		fail("resize", "event", "another CQ");
	ibv_ack_cq_events(cq, 1);
}

static void resize(struct side *a, int cqe, int want, const char *what) {
	int r = ibv_resize_cq(a->cq, cqe);
	if (r != want) {
		char d[64];
		snprintf(d, sizeof d, "returned %d, want %d", r, want);
		fail("resize", what, d);
	}
	if (!r && a->cq->cqe < cqe)
		fail("resize", what, "cqe below the size asked for");
}

static void test_resize(struct side *a, struct side *b) {
	unsigned char src[64], dst[64 * 8];
	fill(src, sizeof src, 9);
	struct ibv_mr *smr = ibv_reg_mr(a->pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(b->pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr)
		die("ibv_reg_mr");
	/* a's CQ holds 4: three outstanding, then grown with them. */
	for (uint64_t i = 0; i < 3; i++)
		write_and_wait(a, 100 + i, src, smr->lkey, (uintptr_t)dst + 64 * i, dmr->rkey);
	resize(a, 2, EINVAL, "shrink below 3 outstanding");
	resize(a, 16, 0, "grow");
	if (a->cq->cqe != 16)
		fail("resize", "grow", "cqe not 16");
	write_and_wait(a, 103, src, smr->lkey, (uintptr_t)dst + 64 * 3, dmr->rkey);
	resize(a, 2, EINVAL, "shrink below 4 outstanding");
	resize(a, 4, 0, "shrink to 4 with 4 outstanding");
	resize(a, 1, EINVAL, "shrink below 4 outstanding, again");
	for (uint64_t i = 0; i < 4; i++) {
		char what[32];
		snprintf(what, sizeof what, "outstanding %" PRIu64, i);
		struct ibv_wc wc;
		if (!poll_wc(a->cq, &wc, 10000))
			fail("resize", what, "no completion");
		struct ibv_wc want = wcw(100 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a);
		if (wc.wr_id != want.wr_id || wc.status != want.status || wc.opcode != want.opcode ||
		    wc.qp_num != want.qp_num || wc.wc_flags != 0)
			fail("resize", what, "completion fields or order");
	}
	struct ibv_wc extra;
	if (ibv_poll_cq(a->cq, 1, &extra) != 0)
		fail("resize", "drained", "a fifth completion");
	resize(a, 1, 0, "shrink to 2 when empty");
	/* The small ring wraps several times. */
	for (uint64_t i = 0; i < 6; i++) {
		rdma(a, IBV_WR_RDMA_WRITE, 200 + i, src, 64, smr->lkey, (uintptr_t)dst + 64 * (i % 8), dmr->rkey);
		expect_wc("resize", "after shrink", a->cq, wcw(200 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	}
	for (int i = 0; i < 4; i++)
		same("resize", "data", dst + 64 * i, src, 64);
	resize(a, 16, 0, "grow back");
	if (ibv_dereg_mr(smr) || ibv_dereg_mr(dmr))
		die("cleanup resize");
}

static void dm_copy(const char *what, struct ibv_dm *dm, int to, uint64_t off, size_t len, int want) {
	unsigned char buf[DMLEN + 16] = { 0 };
	int r = to ? ibv_memcpy_to_dm(dm, off, buf, len) : ibv_memcpy_from_dm(buf, dm, off, len);
	if (r != want) {
		char d[64];
		snprintf(d, sizeof d, "returned %d, want %d", r, want);
		fail("dm", what, d);
	}
}

static struct ibv_dm *alloc_dm(struct side *s, size_t len) {
	struct ibv_alloc_dm_attr at = { .length = len, .log_align_req = 6 };
	struct ibv_dm *dm = ibv_alloc_dm(s->ctx, &at);
	if (!dm)
		die("ibv_alloc_dm");
	return dm;
}

static void test_dm(struct side *a, struct side *b) {
	struct ibv_device_attr_ex ax;
	if (ibv_query_device_ex(a->ctx, NULL, &ax))
		die("ibv_query_device_ex");
	if (ax.max_dm_size < 2 * DMLEN)
		fail("dm", "max_dm_size", "too small");
	struct ibv_alloc_dm_attr at = { .length = ax.max_dm_size + 1 };
	errno = 0;
	if (ibv_alloc_dm(a->ctx, &at) || errno != EINVAL)
		fail("dm", "alloc beyond max_dm_size", "not EINVAL");
	at = (struct ibv_alloc_dm_attr){ .length = DMLEN, .comp_mask = 1 };
	errno = 0;
	if (ibv_alloc_dm(a->ctx, &at) || errno != EINVAL)
		fail("dm", "alloc with comp_mask", "not EINVAL");
	struct ibv_dm *da = alloc_dm(a, DMLEN), *db = alloc_dm(b, DMLEN);
	unsigned char pat[DMLEN], got[DMLEN], zero[DMLEN] = { 0 };
	if (ibv_memcpy_from_dm(got, da, 0, DMLEN))
		die("ibv_memcpy_from_dm");
	same("dm", "new DM is zero", got, zero, DMLEN);
	fill(pat, DMLEN, 21);
	if (ibv_memcpy_to_dm(da, 0, pat, DMLEN) || ibv_memcpy_from_dm(got, da, 0, DMLEN))
		die("ibv_memcpy_to_dm");
	same("dm", "memcpy round trip", got, pat, DMLEN);
	for (int to = 0; to < 2; to++) {
		dm_copy("offset at the end", da, to, DMLEN, 4, EFAULT);
		dm_copy("length past the end", da, to, DMLEN - 4, 8, EFAULT);
		dm_copy("offset past the end", da, to, DMLEN + 8, 0, EFAULT);
		dm_copy("huge offset", da, to, UINT64_MAX - 3, 8, EFAULT);
		dm_copy("unaligned offset", da, to, 2, 4, EINVAL);
		dm_copy("unaligned length", da, to, 4, 3, EINVAL);
		dm_copy("the last word", da, to, DMLEN - 4, 4, 0);
	}
	if (ibv_memcpy_to_dm(da, 0, pat, DMLEN)) /* the last word was zeroed */
		die("ibv_memcpy_to_dm");
	unsigned acc = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;
	unsigned racc = acc | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	errno = 0;
	if (ibv_reg_dm_mr(a->pd, da, 0, DMLEN + 4, acc) || errno != EINVAL)
		fail("dm", "reg beyond the DM", "not EINVAL");
	errno = 0;
	if (ibv_reg_dm_mr(a->pd, da, 8, DMLEN, acc) || errno != EINVAL)
		fail("dm", "reg at an offset beyond the DM", "not EINVAL");
	errno = 0;
	if (ibv_reg_dm_mr(a->pd, da, 0, DMLEN, IBV_ACCESS_LOCAL_WRITE) || errno != EINVAL)
		fail("dm", "reg without ZERO_BASED", "not EINVAL");
	struct ibv_mr *ma = ibv_reg_dm_mr(a->pd, da, 0, DMLEN, acc);
	struct ibv_mr *mb = ibv_reg_dm_mr(b->pd, db, 0, DMLEN, racc);
	if (!ma || !mb)
		die("ibv_reg_dm_mr");
	errno = 0;
	if (ibv_rereg_mr(ma, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) !=
		    IBV_REREG_MR_ERR_INPUT ||
	    errno != EINVAL)
		fail("dm", "rereg of a DM MR", "not ERR_INPUT/EINVAL");

	/* WRITE from a's DM into b's DM (addresses from 0). */
	rdma(a, IBV_WR_RDMA_WRITE, 300, 0, DMLEN, ma->lkey, 0, mb->rkey);
	expect_wc("dm", "write DM to DM", a->cq, wcw(300, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	if (ibv_memcpy_from_dm(got, db, 0, DMLEN))
		die("ibv_memcpy_from_dm");
	same("dm", "write DM to DM", got, pat, DMLEN);
	/* A part, at offsets. */
	memset(zero, 0, sizeof zero);
	if (ibv_memcpy_to_dm(db, 0, zero, DMLEN))
		die("ibv_memcpy_to_dm");
	rdma(a, IBV_WR_RDMA_WRITE, 301, (void *)512, 256, ma->lkey, 1024, mb->rkey);
	expect_wc("dm", "write at offsets", a->cq, wcw(301, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	if (ibv_memcpy_from_dm(got, db, 0, DMLEN))
		die("ibv_memcpy_from_dm");
	same("dm", "write at offsets: before", got, zero, 1024);
	same("dm", "write at offsets: data", got + 1024, pat + 512, 256);
	same("dm", "write at offsets: after", got + 1280, zero, DMLEN - 1280);
	/* Beyond the remote DM MR: refused. */
	rdma(a, IBV_WR_RDMA_WRITE, 302, 0, 8, ma->lkey, DMLEN - 4, mb->rkey);
	expect_wc("dm", "write past the DM MR", a->cq, wcw(302, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, a), 0);
	reconnect(a, b);

	/* READ b's DM into host memory, then into a's DM. */
	unsigned char pat2[DMLEN], *host = malloc(DMLEN);
	if (!host)
		die("malloc");
	fill(pat2, DMLEN, 33);
	if (ibv_memcpy_to_dm(db, 0, pat2, DMLEN))
		die("ibv_memcpy_to_dm");
	memset(host, 0, DMLEN);
	struct ibv_mr *hm = ibv_reg_mr(a->pd, host, DMLEN, IBV_ACCESS_LOCAL_WRITE);
	if (!hm)
		die("ibv_reg_mr");
	rdma(a, IBV_WR_RDMA_READ, 303, host, DMLEN, hm->lkey, 0, mb->rkey);
	struct ibv_wc w = wcw(303, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, a);
	w.byte_len = DMLEN;
	expect_wc("dm", "read DM into host memory", a->cq, w, 1);
	same("dm", "read DM into host memory", host, pat2, DMLEN);
	rdma(a, IBV_WR_RDMA_READ, 304, (void *)100, 1000, ma->lkey, 2000, mb->rkey);
	w = wcw(304, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, a);
	w.byte_len = 1000;
	expect_wc("dm", "read DM into DM", a->cq, w, 1);
	if (ibv_memcpy_from_dm(got, da, 0, DMLEN))
		die("ibv_memcpy_from_dm");
	same("dm", "read DM into DM: before", got, pat, 100);
	same("dm", "read DM into DM: data", got + 100, pat2 + 2000, 1000);
	same("dm", "read DM into DM: after", got + 1100, pat + 1100, DMLEN - 1100);

	/* FETCH_AND_ADD on b's DM word at 8, the original value into host. */
	uint64_t v = 0x1122334455667788ull, orig = 0, now;
	if (ibv_memcpy_to_dm(db, 8, &v, 8))
		die("ibv_memcpy_to_dm");
	struct ibv_sge sg = { .addr = (uintptr_t)host, .length = 8, .lkey = hm->lkey };
	struct ibv_send_wr wr = { .wr_id = 305, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.atomic.remote_addr = 8;
	wr.wr.atomic.rkey = mb->rkey;
	wr.wr.atomic.compare_add = 5;
	if (ibv_post_send(a->qp, &wr, &bad))
		die("ibv_post_send");
	expect_wc("dm", "fetch_add on DM", a->cq, wcw(305, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, a), 0);
	memcpy(&orig, host, 8);
	if (ibv_memcpy_from_dm(&now, db, 8, 8))
		die("ibv_memcpy_from_dm");
	if (orig != v || now != v + 5)
		fail("dm", "fetch_add on DM", "values");

	/* A DM MR at offset 100 of b's DM: its address 0 is the DM's byte 100. */
	struct ibv_mr *mo = ibv_reg_dm_mr(b->pd, db, 100, 400, racc);
	if (!mo)
		die("ibv_reg_dm_mr at an offset");
	rdma(a, IBV_WR_RDMA_WRITE, 306, (void *)0, 16, ma->lkey, 0, mo->rkey);
	expect_wc("dm", "write to a DM MR at an offset", a->cq, wcw(306, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a), 0);
	if (ibv_memcpy_from_dm(got, db, 96, 24))
		die("ibv_memcpy_from_dm");
	same("dm", "offset MR: before", got, pat2 + 96, 4);
	if (ibv_memcpy_from_dm(got, da, 0, 16))
		die("ibv_memcpy_from_dm");
	unsigned char src16[16];
	memcpy(src16, got, 16);
	if (ibv_memcpy_from_dm(got, db, 100, 20))
		die("ibv_memcpy_from_dm");
	same("dm", "offset MR: data", got, src16, 16);
	same("dm", "offset MR: after", got + 16, pat2 + 116, 4);
	rdma(a, IBV_WR_RDMA_WRITE, 307, (void *)0, 8, ma->lkey, 396, mo->rkey);
	expect_wc("dm", "write past a DM MR at an offset", a->cq,
		  wcw(307, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, a), 0);
	reconnect(a, b);

	/* Free: busy while an MR uses the DM. */
	if (ibv_free_dm(db) != EBUSY)
		fail("dm", "free with an MR", "not EBUSY");
	if (ibv_dereg_mr(mo) || ibv_dereg_mr(mb) || ibv_dereg_mr(ma) || ibv_dereg_mr(hm))
		die("ibv_dereg_mr");
	if (ibv_free_dm(db) || ibv_free_dm(da))
		die("ibv_free_dm");
	/* The whole device memory, once freed, can be had again. */
	struct ibv_dm *all = alloc_dm(a, ax.max_dm_size);
	at = (struct ibv_alloc_dm_attr){ .length = 4 };
	errno = 0;
	if (ibv_alloc_dm(a->ctx, &at) || errno != ENOMEM)
		fail("dm", "alloc with none left", "not ENOMEM");
	if (ibv_free_dm(all))
		die("ibv_free_dm");
	free(host);
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side a, b;
	open_side(&a, list[0], 4);
	open_side(&b, list[1], 4);
	reconnect(&a, &b);
	test_rereg(&a, &b);
	test_resize(&a, &b);
	test_dm(&a, &b);
	struct side *sides[] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_destroy_qp(s->qp) || ibv_destroy_cq(s->cq) || ibv_destroy_comp_channel(s->ch) ||
		    ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
			die("cleanup");
	}
	ibv_free_device_list(list);
	printf("OK rereg translation access pd all bad_flags, resize grow shrink einval order, dm memcpy write read "
	       "fetch_add offset bounds free\n");
	return 0;
}
