/* ts: completion timestamps through the standard verbs API.
 *
 * The device's clock is the host's CLOCK_REALTIME in nanoseconds:
 * ibv_query_device_ex reports a 1 GHz hca_core_clock and a 64-bit
 * completion_timestamp_mask, ibv_query_rt_values_ex reads the clock now.
 * An RC SEND from device A to device B on extended CQs created with
 * IBV_WC_EX_WITH_COMPLETION_TIMESTAMP and _WALLCLOCK: each completion's
 * timestamp lies between the program's clock readings around the
 * exchange, the raw and the wall-clock value are the same, the receive
 * completed before the send (whose completion waits for the ACK the
 * receiver sent after writing its CQE). Two unpolled completions survive
 * an ibv_resize_cq with their timestamps. A CQ without the flags still
 * takes the standard fields.
 *
 * Prints "OK caps rt_values send_recv resize" and exits 0. */
#include "check.h"

#include <errno.h>

static uint64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[256];
	union ibv_gid gid;
};

#define TS_FLAGS                                                                                                  \
	(IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)))
		die("open");
	struct ibv_cq_init_attr_ex ca = { .cqe = 8, .wc_flags = TS_FLAGS };
	if (!(s->cq = ibv_create_cq_ex(s->ctx, &ca)))
		die("ibv_create_cq_ex with timestamps");
	struct ibv_qp_init_attr a = { .send_cq = ibv_cq_ex_to_cq(s->cq), .recv_cq = ibv_cq_ex_to_cq(s->cq),
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (!(s->qp = ibv_create_qp(s->pd, &a)))
		die("ibv_create_qp");
	if (!(s->mr = ibv_reg_mr(s->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE)))
		die("ibv_reg_mr");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

/* poll_one polls one completion of cq (10 s at most) and returns its
 * timestamp, checking status, opcode and that both readings agree. */
static uint64_t poll_one(const char *what, struct ibv_cq_ex *cq, enum ibv_wc_opcode op, uint64_t wr_id) {
	struct ibv_poll_cq_attr pa = { 0 };
	int64_t end = now_ms() + 10000;
	int ret;
	while ((ret = ibv_start_poll(cq, &pa)) == ENOENT)
		if (now_ms() > end)
			fail("ts", what, "no completion in 10 s");
	if (ret)
		fail("ts", what, "ibv_start_poll failed");
	char d[160];
	if (cq->status != IBV_WC_SUCCESS || ibv_wc_read_opcode(cq) != op || cq->wr_id != wr_id) {
		snprintf(d, sizeof d, "status %d opcode %d wr_id %" PRIu64, cq->status, ibv_wc_read_opcode(cq), cq->wr_id);
		fail("ts", what, d);
	}
	uint64_t ts = ibv_wc_read_completion_ts(cq), wall = ibv_wc_read_completion_wallclock_ns(cq);
	ibv_end_poll(cq);
	if (ts != wall) {
		snprintf(d, sizeof d, "completion_ts %" PRIu64 " != wallclock %" PRIu64, ts, wall);
		fail("ts", what, d);
	}
	return ts;
}

static void within(const char *what, uint64_t lo, uint64_t v, uint64_t hi) {
	if (v < lo || v > hi) {
		char d[160];
		snprintf(d, sizeof d, "%" PRIu64 " not in [%" PRIu64 ", %" PRIu64 "]", v, lo, hi);
		fail("ts", what, d);
	}
}

static void post_recv(struct side *s, uint64_t id) {
	struct ibv_sge sg = { .addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &sg, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &w, &bad))
		die("ibv_post_recv");
}

static void post_send(struct side *s, uint64_t id) {
	struct ibv_sge sg = { .addr = (uintptr_t)s->buf, .length = 64, .lkey = s->mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(s->qp, &w, &bad))
		die("ibv_post_send");
}

int main(void) {
	struct ibv_device **list = two_devices();
	struct side A = { 0 }, B = { 0 };
	open_side(&A, list[0]);
	open_side(&B, list[1]);

	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(A.ctx, NULL, &dx))
		die("ibv_query_device_ex");
	if (dx.hca_core_clock != 1000000 || dx.completion_timestamp_mask != UINT64_MAX)
		fail("ts", "caps", "hca_core_clock is not 1 GHz or the mask not 64 bits");
	printf("OK caps");

	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	uint64_t t0 = now_ns();
	if (ibv_query_rt_values_ex(A.ctx, &v))
		die("ibv_query_rt_values_ex");
	uint64_t t1 = now_ns();
	within("rt_values", t0, (uint64_t)v.raw_clock.tv_sec * 1000000000u + (uint64_t)v.raw_clock.tv_nsec, t1);
	v.comp_mask = 1u << 5;
	if (ibv_query_rt_values_ex(A.ctx, &v) != EINVAL)
		fail("ts", "rt_values", "an unknown comp_mask bit is not EINVAL");
	printf(" rt_values");

	rc_to_rts(A.qp, B.qp->qp_num, &B.gid, 0, 5, 1);
	rc_to_rts(B.qp, A.qp->qp_num, &A.gid, 0, 5, 1);
	post_recv(&B, 1);
	uint64_t start = now_ns();
	post_send(&A, 2);
	uint64_t rts = poll_one("recv", B.cq, IBV_WC_RECV, 1);
	uint64_t sts = poll_one("send", A.cq, IBV_WC_SEND, 2);
	uint64_t stop = now_ns();
	within("recv completion", start, rts, stop);
	within("send completion", start, sts, stop);
	if (rts > sts)
		fail("ts", "order", "the receive completed after the send its ACK completed");
	printf(" send_recv");

	/* Two completions unpolled across a resize keep their timestamps. */
	post_recv(&B, 3);
	post_recv(&B, 4);
	start = now_ns();
	post_send(&A, 5);
	post_send(&A, 6);
	poll_one("send 5", A.cq, IBV_WC_SEND, 5);
	poll_one("send 6", A.cq, IBV_WC_SEND, 6);
	uint64_t mid = now_ns();
	if (ibv_resize_cq(ibv_cq_ex_to_cq(B.cq), 64))
		die("ibv_resize_cq");
	uint64_t r3 = poll_one("recv 3 after resize", B.cq, IBV_WC_RECV, 3);
	uint64_t r4 = poll_one("recv 4 after resize", B.cq, IBV_WC_RECV, 4);
	within("recv 3 after resize", start, r3, mid);
	within("recv 4 after resize", r3, r4, mid);
	printf(" resize\n");

	struct side *sides[] = { &A, &B };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_destroy_qp(s->qp) || ibv_destroy_cq(ibv_cq_ex_to_cq(s->cq)) || ibv_dereg_mr(s->mr) ||
		    ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
			die("close");
	}
	ibv_free_device_list(list);
	return 0;
}
