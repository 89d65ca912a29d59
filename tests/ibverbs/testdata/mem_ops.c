/* mem_ops: a libibverbs program (only <infiniband/verbs.h>) that runs the
 * RC operation matrix between QPs on two devices, on memory from malloc,
 * the stack and an anonymous mmap, registered in place:
 *
 *   SEND, SEND_WITH_IMM, RDMA WRITE, RDMA WRITE_WITH_IMM, RDMA READ,
 *   ATOMIC_CMP_AND_SWP (a swap that happens and one that does not),
 *   ATOMIC_FETCH_AND_ADD.
 *
 * It checks every byte of each destination buffer (the data, and the
 * guard bytes around it unchanged) and every field of every completion
 * the verbs define for it: wr_id, status, opcode, qp_num and wc_flags
 * always; byte_len for receive completions (SEND, WRITE_WITH_IMM: the
 * length written) and for RDMA READ; imm_data when IBV_WC_WITH_IMM is set.
 * (src_qp, slid, sl, pkey_index are defined for UD only; byte_len of a
 * SEND, WRITE or atomic send completion is undefined.) Atomics operate on
 * the 8-byte word in host byte order, as Soft-RoCE does, and return the
 * original value into the local buffer.
 *
 * Run through vrnic-run with two devices; prints "OK ..." and exits 0, or
 * "ERROR ..." and exits 1. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"

#define LEN 20000 /* spans several pages, not page aligned */
#define GUARD 64  /* bytes before and after the data that no operation may touch */
/* A side's buffer: guard, data, guard, then 8-byte aligned atomic words. */
#define BUF_LEN (GUARD + LEN + GUARD + 8 + 64)

/* atomic_off is the offset in buf of its first 8-byte aligned atomic word. */
static size_t atomic_off(const unsigned char *buf) {
	uintptr_t p = (uintptr_t)buf + GUARD + LEN + GUARD;
	return (size_t)(((p + 7) & ~(uintptr_t)7) - (uintptr_t)buf);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
	unsigned char *buf; /* BUF_LEN bytes of the current memory kind */
	struct ibv_mr *mr;
};

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)))
		die("ibv_open_device");
	if (!(s->pd = ibv_alloc_pd(s->ctx)))
		die("ibv_alloc_pd");
	if (!(s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0)))
		die("ibv_create_cq");
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2 } };
	if (!(s->qp = ibv_create_qp(s->pd, &a)))
		die("ibv_create_qp");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

static void connect_qp(struct side *s, struct side *peer) {
	rc_to_rts(s->qp, peer->qp->qp_num, &peer->gid, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC, 7, 4);
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed + (i >> 9));
}

/* check_buf checks all of s's buffer against ref (BUF_LEN bytes). */
static void check_buf(const char *kind, const char *what, const unsigned char *buf, const unsigned char *ref) {
	for (size_t i = 0; i < BUF_LEN; i++)
		if (buf[i] != ref[i]) {
			char d[128];
			snprintf(d, sizeof d, "byte %zu (data starts at %d, %d long) is 0x%02x, want 0x%02x", i, GUARD,
				 LEN, buf[i], ref[i]);
			fail(kind, what, d);
		}
}

static void post_send(struct side *s, struct ibv_send_wr *wr) {
	struct ibv_send_wr *bad = NULL;
	if (ibv_post_send(s->qp, wr, &bad))
		die("ibv_post_send");
}

static void post_recv(struct side *s, uint64_t wr_id, struct ibv_sge *sg, int nsge) {
	struct ibv_recv_wr r = { .wr_id = wr_id, .sg_list = sg, .num_sge = nsge }, *bad = NULL;
	if (ibv_post_recv(s->qp, &r, &bad))
		die("ibv_post_recv");
}

static uint64_t word(const unsigned char *p) {
	uint64_t v;
	memcpy(&v, p, sizeof v);
	return v;
}

static void set_word(unsigned char *p, uint64_t v) { memcpy(p, &v, sizeof v); }

/* matrix runs every operation with A as requester and B as responder on
 * the BUF_LEN buffers a->buf and b->buf (registered here). ra and rb are
 * the expected contents of each buffer, kept up to date. */
static void matrix(const char *kind, struct side *a, struct side *b) {
	static unsigned char ra[BUF_LEN], rb[BUF_LEN];
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	fill(a->buf, BUF_LEN, 1);
	fill(b->buf, BUF_LEN, 2);
	if (!(a->mr = ibv_reg_mr(a->pd, a->buf, BUF_LEN, acc)) || !(b->mr = ibv_reg_mr(b->pd, b->buf, BUF_LEN, acc)))
		die("ibv_reg_mr");
	fill(ra, BUF_LEN, 1);
	fill(rb, BUF_LEN, 2);
	check_buf(kind, "A's contents after registration", a->buf, ra);
	check_buf(kind, "B's contents after registration", b->buf, rb);
	unsigned char *ad = a->buf + GUARD, *bd = b->buf + GUARD; /* the data areas */
	uint32_t aq = a->qp->qp_num, bq = b->qp->qp_num;
	struct ibv_sge sg = { .addr = (uintptr_t)ad, .length = LEN, .lkey = a->mr->lkey };
	/* Receives scatter into two SGEs, split at an odd offset. */
	struct ibv_sge rsg[2] = { { .addr = (uintptr_t)bd, .length = 1001, .lkey = b->mr->lkey },
		{ .addr = (uintptr_t)bd + 1001, .length = LEN - 1001, .lkey = b->mr->lkey } };
	struct ibv_send_wr w;

	/* SEND: A's data into B's receive buffers. */
	fill(ad, LEN, 10), fill(ra + GUARD, LEN, 10);
	post_recv(b, 100, rsg, 2);
	w = (struct ibv_send_wr){ .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED };
	post_send(a, &w);
	expect_wc(kind, "SEND", a->cq, (struct ibv_wc){ .wr_id = 1, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	expect_wc(kind, "SEND receive", b->cq,
		  (struct ibv_wc){ .wr_id = 100, .opcode = IBV_WC_RECV, .qp_num = bq, .byte_len = LEN }, 1);
	memcpy(rb + GUARD, ra + GUARD, LEN);
	check_buf(kind, "SEND", b->buf, rb);

	/* SEND_WITH_IMM: a shorter message, the immediate in the receive. */
	fill(ad, LEN, 11), fill(ra + GUARD, LEN, 11);
	post_recv(b, 101, rsg, 2);
	sg.length = LEN - 3333;
	w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x12345678) };
	post_send(a, &w);
	expect_wc(kind, "SEND_WITH_IMM", a->cq, (struct ibv_wc){ .wr_id = 2, .opcode = IBV_WC_SEND, .qp_num = aq }, 0);
	expect_wc(kind, "SEND_WITH_IMM receive", b->cq,
		  (struct ibv_wc){ .wr_id = 101, .opcode = IBV_WC_RECV, .qp_num = bq, .byte_len = LEN - 3333,
			  .wc_flags = IBV_WC_WITH_IMM, .imm_data = htonl(0x12345678) },
		  1);
	memcpy(rb + GUARD, ra + GUARD, LEN - 3333);
	check_buf(kind, "SEND_WITH_IMM", b->buf, rb);
	sg.length = LEN;

	/* RDMA WRITE: no receive consumed, no completion at B. */
	fill(ad, LEN, 12), fill(ra + GUARD, LEN, 12);
	w = (struct ibv_send_wr){ .wr_id = 3, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)bd, .rkey = b->mr->rkey } };
	post_send(a, &w);
	expect_wc(kind, "WRITE", a->cq, (struct ibv_wc){ .wr_id = 3, .opcode = IBV_WC_RDMA_WRITE, .qp_num = aq }, 0);
	memcpy(rb + GUARD, ra + GUARD, LEN);
	check_buf(kind, "WRITE", b->buf, rb);
	struct ibv_wc none;
	if (ibv_poll_cq(b->cq, 1, &none) != 0)
		fail(kind, "WRITE", "a completion at the responder");

	/* RDMA WRITE_WITH_IMM: consumes a receive (no SGE), whose completion
	 * carries the immediate and the length written. */
	fill(ad, LEN, 13), fill(ra + GUARD, LEN, 13);
	post_recv(b, 102, NULL, 0);
	sg.length = LEN - 1;
	w = (struct ibv_send_wr){ .wr_id = 4, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0xcafe0001),
		.wr.rdma = { .remote_addr = (uintptr_t)bd + 1, .rkey = b->mr->rkey } };
	post_send(a, &w);
	expect_wc(kind, "WRITE_WITH_IMM", a->cq, (struct ibv_wc){ .wr_id = 4, .opcode = IBV_WC_RDMA_WRITE, .qp_num = aq },
		  0);
	expect_wc(kind, "WRITE_WITH_IMM receive", b->cq,
		  (struct ibv_wc){ .wr_id = 102, .opcode = IBV_WC_RECV_RDMA_WITH_IMM, .qp_num = bq,
			  .byte_len = LEN - 1, .wc_flags = IBV_WC_WITH_IMM, .imm_data = htonl(0xcafe0001) },
		  1);
	memcpy(rb + GUARD + 1, ra + GUARD, LEN - 1);
	check_buf(kind, "WRITE_WITH_IMM", b->buf, rb);
	sg.length = LEN;

	/* RDMA READ: B's data into A's, two local SGEs. */
	fill(bd, LEN, 14), fill(rb + GUARD, LEN, 14);
	struct ibv_sge rdsg[2] = { { .addr = (uintptr_t)ad, .length = 4097, .lkey = a->mr->lkey },
		{ .addr = (uintptr_t)ad + 4097, .length = LEN - 4097, .lkey = a->mr->lkey } };
	w = (struct ibv_send_wr){ .wr_id = 5, .sg_list = rdsg, .num_sge = 2, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)bd, .rkey = b->mr->rkey } };
	post_send(a, &w);
	expect_wc(kind, "READ", a->cq,
		  (struct ibv_wc){ .wr_id = 5, .opcode = IBV_WC_RDMA_READ, .qp_num = aq, .byte_len = LEN }, 1);
	memcpy(ra + GUARD, rb + GUARD, LEN);
	check_buf(kind, "READ", a->buf, ra);

	/* Atomics on B's first atomic word; the original value lands in A's
	 * atomic words. */
	size_t boff = atomic_off(b->buf), aoff = atomic_off(a->buf);
	unsigned char *bw = b->buf + boff, *aw = a->buf + aoff;
	uint64_t v0 = 0x0123456789abcdefull, v1 = 0xfedcba9876543210ull, add = 0x1111000000000001ull;
	set_word(bw, v0), set_word(rb + boff, v0);
	struct ibv_sge asg = { .addr = (uintptr_t)aw, .length = 8, .lkey = a->mr->lkey };
	struct {
		const char *name;
		enum ibv_wr_opcode op;
		enum ibv_wc_opcode wc;
		uint64_t compare_add, swap, orig, after;
	} at[] = {
		{ "CMP_AND_SWP (equal)", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP, v0, v1, v0, v1 },
		{ "CMP_AND_SWP (not equal)", IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP, v0, 7, v1, v1 },
		{ "FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD, add, 0, v1, v1 + add },
		{ "FETCH_AND_ADD (wraps)", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD, ~0ull, 0, v1 + add,
			v1 + add - 1 },
	};
	for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
		asg.addr = (uintptr_t)(aw + 8 * i);
		w = (struct ibv_send_wr){ .wr_id = 6 + i, .sg_list = &asg, .num_sge = 1, .opcode = at[i].op,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.atomic = { .remote_addr = (uintptr_t)bw, .rkey = b->mr->rkey,
				.compare_add = at[i].compare_add, .swap = at[i].swap } };
		post_send(a, &w);
		expect_wc(kind, at[i].name, a->cq, (struct ibv_wc){ .wr_id = 6 + i, .opcode = at[i].wc, .qp_num = aq }, 0);
		char d[128];
		if (word(aw + 8 * i) != at[i].orig) {
			snprintf(d, sizeof d, "returned 0x%016" PRIx64 ", want the original 0x%016" PRIx64,
				 word(aw + 8 * i), at[i].orig);
			fail(kind, at[i].name, d);
		}
		if (word(bw) != at[i].after) {
			snprintf(d, sizeof d, "target is 0x%016" PRIx64 ", want 0x%016" PRIx64, word(bw), at[i].after);
			fail(kind, at[i].name, d);
		}
		set_word(ra + aoff + 8 * i, at[i].orig);
		set_word(rb + boff, at[i].after);
		check_buf(kind, at[i].name, a->buf, ra);
		check_buf(kind, at[i].name, b->buf, rb);
	}

	if (ibv_dereg_mr(a->mr) || ibv_dereg_mr(b->mr))
		die("ibv_dereg_mr");
	/* Deregistration leaves the memory the program's, contents intact. */
	check_buf(kind, "A after deregistration", a->buf, ra);
	check_buf(kind, "B after deregistration", b->buf, rb);
	memset(a->buf, 0x5a, BUF_LEN);
	memset(b->buf, 0x5b, BUF_LEN);
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side a, b;
	open_side(&a, list[0]);
	open_side(&b, list[1]);
	ibv_free_device_list(list);
	connect_qp(&a, &b);
	connect_qp(&b, &a);

	/* malloc: at odd offsets into the allocations. */
	unsigned char *ha = malloc(BUF_LEN + 8), *hb = malloc(BUF_LEN + 8);
	if (!ha || !hb)
		die("malloc");
	a.buf = ha + 3, b.buf = hb + 5;
	matrix("heap", &a, &b);
	free(ha);
	free(hb);

	/* The stack: in main's frame, the library's frames below it. */
	unsigned char sa[BUF_LEN + 8], sb[BUF_LEN + 8];
	a.buf = sa + 1, b.buf = sb + 8;
	matrix("stack", &a, &b);

	/* An anonymous private mapping, A and B in one mapping. */
	unsigned char *map = mmap(NULL, 2 * BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED)
		die("mmap");
	a.buf = map, b.buf = map + BUF_LEN;
	matrix("mmap", &a, &b);

	/* Asynchronous events: an RDMA WRITE with an rkey B never granted
	 * fails both QPs (ibv_get_async_event on the blocking async_fd). B's
	 * client has no completion that says why (the WRITE took no receive
	 * WQE): QP_ACCESS_ERR for its QP, the affiliated error of an R_Key
	 * violation (IBTA C9-222.1.1; Linux rxe and mlx5 raise it). A's
	 * completion (REM_ACCESS_ERR) says why: no event, as on Linux; the
	 * next one A's context reads is QP_LAST_WQE_REACHED of a QP with an SRQ
	 * that A then moves to ERR itself. */
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	if (!(a.mr = ibv_reg_mr(a.pd, a.buf, BUF_LEN, acc)) || !(b.mr = ibv_reg_mr(b.pd, b.buf, BUF_LEN, acc)))
		die("ibv_reg_mr");
	struct ibv_sge sg = { .addr = (uintptr_t)a.buf, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 99, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)b.buf, .rkey = b.mr->rkey ^ 0x5a } };
	post_send(&a, &wr);
	expect_wc("async", "write to a bad rkey", a.cq,
		  (struct ibv_wc){ .wr_id = 99, .status = IBV_WC_REM_ACCESS_ERR, .opcode = IBV_WC_RDMA_WRITE, .qp_num = a.qp->qp_num }, 0);
	struct ibv_srq *srq = ibv_create_srq(a.pd, &(struct ibv_srq_init_attr){ .attr = { .max_wr = 4, .max_sge = 1 } });
	if (!srq)
		die("ibv_create_srq");
	struct ibv_qp *mark = ibv_create_qp(a.pd, &(struct ibv_qp_init_attr){ .send_cq = a.cq, .recv_cq = a.cq, .srq = srq,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 }, .qp_type = IBV_QPT_RC });
	if (!mark)
		die("ibv_create_qp");
	if (ibv_modify_qp(mark, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_ERR }, IBV_QP_STATE))
		die("ibv_modify_qp");
	struct {
		struct side *s;
		enum ibv_event_type type;
		struct ibv_qp *qp;
	} want[2] = { { &b, IBV_EVENT_QP_ACCESS_ERR, b.qp }, { &a, IBV_EVENT_QP_LAST_WQE_REACHED, mark } };
	for (int i = 0; i < 2; i++) {
		struct ibv_async_event ev;
		if (ibv_get_async_event(want[i].s->ctx, &ev))
			die("ibv_get_async_event");
		if (ev.event_type != want[i].type || ev.element.qp != want[i].qp) {
			char d[128];
			snprintf(d, sizeof d, "side %c: event %d (%s) for QP %p, want %s for %p", i ? 'a' : 'b', ev.event_type,
				 ibv_event_type_str(ev.event_type), (void *)ev.element.qp, ibv_event_type_str(want[i].type),
				 (void *)want[i].qp);
			fail("async", ibv_event_type_str(want[i].type), d);
		}
		ibv_ack_async_event(&ev);
	}
	if (ibv_destroy_qp(mark) || ibv_destroy_srq(srq))
		die("destroy");
	if (ibv_dereg_mr(a.mr) || ibv_dereg_mr(b.mr))
		die("ibv_dereg_mr");
	munmap(map, 2 * BUF_LEN);

	if (ibv_destroy_qp(a.qp) || ibv_destroy_qp(b.qp) || ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq) ||
	    ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd) || ibv_close_device(a.ctx) || ibv_close_device(b.ctx))
		die("destroy");
	printf("OK send send_imm write write_imm read cmp_swap fetch_add, %d bytes (heap, stack, mmap); async QP_ACCESS_ERR\n", LEN);
	return 0;
}
