/* mem_ops: a libibverbs program (only <infiniband/verbs.h>) that registers
 * memory from malloc, the stack and an anonymous mmap on two devices,
 * connects an RC QP on each, and does RDMA WRITE, RDMA READ and SEND
 * between them, checking every byte. Run through vrnic-run with two
 * devices; prints "OK ..." and exits 0, or "ERROR ..." and exits 1. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define LEN 20000 /* spans several pages, not page aligned */

static void die(const char *what) {
	perror(what);
	printf("ERROR %s\n", what);
	exit(1);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
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
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 7;
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
	a.sq_psn = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					      IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify RTS");
}

static struct ibv_wc wait_wc(struct side *s, const char *what) {
	struct ibv_wc wc;
	time_t t0 = time(NULL);
	int n;
	while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0)
		if (time(NULL) - t0 > 10)
			die(what);
	if (n < 0 || wc.status != IBV_WC_SUCCESS) {
		printf("ERROR %s: %s\n", what, n < 0 ? "poll" : ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

static void fill(unsigned char *p, size_t n, int seed) {
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed + (i >> 9));
}

static void check(const void *a, const void *b, size_t n, const char *what) {
	if (memcmp(a, b, n)) {
		printf("ERROR %s: data differs\n", what);
		exit(1);
	}
}

static void post(struct side *s, struct ibv_send_wr *wr) {
	struct ibv_send_wr *bad;
	if (ibv_post_send(s->qp, wr, &bad))
		die("ibv_post_send");
}

int main(void) {
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2) {
		printf("ERROR need two devices, have %d\n", list ? n : -1);
		return 1;
	}
	struct side a, b;
	open_side(&a, list[0]);
	open_side(&b, list[1]);
	ibv_free_device_list(list);
	connect_qp(&a, &b);
	connect_qp(&b, &a);

	/* Three kinds of memory, registered in place; the stack buffer is in
	 * main's frame, below it are the library's frames. */
	unsigned char stack_buf[LEN + 100];
	unsigned char *heap = malloc(LEN + 3);
	unsigned char *map = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!heap || map == MAP_FAILED)
		die("alloc");
	unsigned char *src = heap + 3, *dst = stack_buf + 50;
	fill(src, LEN, 1);
	memset(dst, 0, LEN);
	fill(map, 2 * LEN, 2);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *msrc = ibv_reg_mr(a.pd, src, LEN, acc);
	struct ibv_mr *mdst = ibv_reg_mr(b.pd, dst, LEN, acc);
	struct ibv_mr *mmap_a = ibv_reg_mr(a.pd, map, LEN, acc);           /* first half: A */
	struct ibv_mr *mmap_b = ibv_reg_mr(b.pd, map + LEN, LEN, acc);     /* second half: B */
	if (!msrc || !mdst || !mmap_a || !mmap_b)
		die("ibv_reg_mr");
	/* Contents survived the registration. */
	unsigned char ref[2 * LEN];
	fill(ref, 2 * LEN, 2);
	check(map, ref, 2 * LEN, "mmap contents after registration");
	fill(ref, LEN, 1);
	check(src, ref, LEN, "heap contents after registration");

	/* 1. WRITE heap (A) -> stack (B). */
	struct ibv_sge sg = { .addr = (uintptr_t)src, .length = LEN, .lkey = msrc->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)dst, .rkey = mdst->rkey } };
	post(&a, &w);
	wait_wc(&a, "WRITE");
	check(src, dst, LEN, "WRITE");

	/* 2. READ mmap second half (B) -> mmap first half (A). */
	sg = (struct ibv_sge){ .addr = (uintptr_t)map, .length = LEN, .lkey = mmap_a->lkey };
	w = (struct ibv_send_wr){ .wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)(map + LEN), .rkey = mmap_b->rkey } };
	post(&a, &w);
	wait_wc(&a, "READ");
	check(map, map + LEN, LEN, "READ");

	/* 3. SEND from B's stack buffer into a RECV on A's heap, two SGEs. */
	memset(src, 0, LEN);
	struct ibv_sge rsg[2] = { { .addr = (uintptr_t)src, .length = 1000, .lkey = msrc->lkey },
		{ .addr = (uintptr_t)src + 1000, .length = LEN - 1000, .lkey = msrc->lkey } };
	struct ibv_recv_wr r = { .wr_id = 3, .sg_list = rsg, .num_sge = 2 }, *rbad;
	if (ibv_post_recv(a.qp, &r, &rbad))
		die("ibv_post_recv");
	fill(dst, LEN, 3);
	sg = (struct ibv_sge){ .addr = (uintptr_t)dst, .length = LEN, .lkey = mdst->lkey };
	w = (struct ibv_send_wr){ .wr_id = 4, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED };
	post(&b, &w);
	wait_wc(&b, "SEND");
	struct ibv_wc wc = wait_wc(&a, "RECV");
	if (wc.byte_len != LEN || wc.opcode != IBV_WC_RECV || wc.wr_id != 3) {
		printf("ERROR RECV completion: len %u opcode %d\n", wc.byte_len, wc.opcode);
		return 1;
	}
	check(src, dst, LEN, "SEND");

	/* Deregistration leaves the memory usable. */
	if (ibv_dereg_mr(msrc) || ibv_dereg_mr(mdst) || ibv_dereg_mr(mmap_a) || ibv_dereg_mr(mmap_b))
		die("ibv_dereg_mr");
	memset(src, 0x5a, LEN);
	free(heap);
	munmap(map, 2 * LEN);
	if (ibv_destroy_qp(a.qp) || ibv_destroy_qp(b.qp) || ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq) ||
	    ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd) || ibv_close_device(a.ctx) || ibv_close_device(b.ctx))
		die("destroy");
	printf("OK write %d read %d send %d (heap, stack, mmap)\n", LEN, LEN, LEN);
	return 0;
}
