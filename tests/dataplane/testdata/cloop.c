/* A vrnic client in C from abi/vrnic_abi.h and libc alone that moves data:
 * it creates two RC QPs in one context, connects them to each other at the
 * device's GID 0, and runs a SEND (with a posted receive) and an RDMA WRITE
 * through the daemon's data path, reading completions by their owner bit
 * and checking every byte. It prints "OK <send byte_len> <write bytes>"
 * and exits 0, or prints "ERROR ..." and exits 1. */
#include "vrnic_client.h"
#include <time.h>

/* Memory layout of the 1 MiB host memory (PA = pa + offset):
 *   0        CQ ring, 64 CQEs
 *   64 KiB   data MR, 64 KiB (IOVA = PA)
 *   256 KiB  QP 1 SQ, 512 KiB QP 1 RQ, 640 KiB QP 2 SQ, 768 KiB QP 2 RQ */
#define OFF_DATA (64 << 10)
#define OFF_SQ1 (256 << 10)
#define OFF_RQ1 (512 << 10)
#define OFF_SQ2 (640 << 10)
#define OFF_RQ2 (768 << 10)

static uint32_t cq_ci;

/* poll returns the next CQE (owner bit of the current pass), waiting at
 * most 10 s. */
static struct vrnic_cqe poll_cq(struct vrnic_db_cq *crec) {
	struct vrnic_cqe *ring_ = (void *)mem;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct vrnic_cqe *e = &ring_[cq_ci & 63];
		uint8_t owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
		if ((owner & 1) == 1 - ((cq_ci / 64) & 1)) {
			struct vrnic_cqe c = *e;
			cq_ci++;
			__atomic_store_n(&crec->cq_ci, cq_ci, __ATOMIC_SEQ_CST);
			return c;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			die("poll", ETIMEDOUT, "no completion");
		usleep(50);
	}
}

static void check_cqe(struct vrnic_cqe c, uint64_t wr_id, uint8_t opcode, uint32_t qpn, uint32_t byte_len) {
	if (c.wr_id != wr_id || c.status != VRNIC_WC_SUCCESS || c.opcode != opcode || c.qp_num != qpn ||
	    c.byte_len != byte_len || c.vendor_err != 0) {
		char m[160];
		snprintf(m, sizeof m, "wr_id %llu status %u opcode %u qp %u byte_len %u (want wr_id %llu opcode %u qp %u byte_len %u)",
			 (unsigned long long)c.wr_id, c.status, c.opcode, c.qp_num, c.byte_len,
			 (unsigned long long)wr_id, opcode, qpn, byte_len);
		die("completion", EPROTO, m);
	}
}

int main(int argc, char **argv) {
	if (argc != 2)
		return 2;
	open_context(argv[1], "c-loop");
	add_host_mem("cloop", 1 << 20);

	struct vrnic_cmd_query_gid qg = { .port_num = 1, .index = 0 };
	struct vrnic_resp_query_gid gid;
	call(VRNIC_CMD_QUERY_GID, &qg, sizeof qg, NULL, 0, NULL, 0, &gid, sizeof gid, NULL);

	struct vrnic_resp_alloc_pd pdr;
	call(VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &pdr, sizeof pdr, NULL);
	struct vrnic_resp_reg_mr mrr = reg_mr(pdr.pd_handle, OFF_DATA, VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE);

	struct vrnic_cmd_create_cq cq = { .ring_pa = pa, .cqe_count = 64 };
	struct vrnic_resp_create_cq cqr;
	call(VRNIC_CMD_CREATE_CQ, &cq, sizeof cq, NULL, 0, NULL, 0, &cqr, sizeof cqr, NULL);
	struct vrnic_db_cq *crec = (void *)(db + cqr.db_index * VRNIC_DB_RECORD_SIZE);

	struct vrnic_resp_create_qp qr[2];
	uint64_t sq[2] = { OFF_SQ1, OFF_SQ2 }, rq[2] = { OFF_RQ1, OFF_RQ2 };
	for (int i = 0; i < 2; i++) {
		struct vrnic_cmd_create_qp qc = { .sq_pa = pa + sq[i], .rq_pa = pa + rq[i], .qp_type = VRNIC_QPT_RC,
			.pd_handle = pdr.pd_handle, .send_cq = cqr.cq_handle, .recv_cq = cqr.cq_handle, .srq_handle = VRNIC_NO_SRQ,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
		call(VRNIC_CMD_CREATE_QP, &qc, sizeof qc, NULL, 0, NULL, 0, &qr[i], sizeof qr[i], NULL);
	}
	/* Each QP's PSNs start at 100 + its QPN. */
	for (int i = 0; i < 2; i++)
		rc_to_rts(qr[i].qpn, qr[1 - i].qpn, gid.gid, 64, 100 + qr[1 - i].qpn, 100 + qr[i].qpn, 1);
	struct vrnic_db_qp *rec1 = (void *)(db + qr[0].db_index * VRNIC_DB_RECORD_SIZE);
	struct vrnic_db_qp *rec2 = (void *)(db + qr[1].db_index * VRNIC_DB_RECORD_SIZE);
	uint8_t *data = mem + OFF_DATA;
	uint64_t iova = pa + OFF_DATA;

	/* Receive on QP 2 into data[8192..], SEND 3000 bytes from data[0..]. */
	for (int i = 0; i < 3000; i++)
		data[i] = (uint8_t)(i * 7 + 1);
	struct vrnic_recv_wqe *r = (void *)(mem + OFF_RQ2);
	r->wr_id = 20;
	r->num_sge = 1;
	struct vrnic_sge *rs = (void *)(r + 1);
	rs->addr = iova + 8192;
	rs->length = 4096;
	rs->lkey = mrr.lkey;
	ring(&rec2->rq_pi, 1);
	uint32_t stride = qr[0].sq_wqe_blocks * VRNIC_WQE_BLOCK;
	struct vrnic_send_wqe *w = (void *)(mem + OFF_SQ1);
	w->wr_id = 10;
	w->opcode = VRNIC_WR_SEND;
	w->flags = VRNIC_SEND_SIGNALED;
	w->num_sge = 1;
	struct vrnic_sge *sg = (void *)((uint8_t *)w + VRNIC_WQE_BLOCK);
	sg->addr = iova;
	sg->length = 3000;
	sg->lkey = mrr.lkey;
	ring(&rec1->sq_pi, 1);
	/* The two completions may come in either order. */
	struct vrnic_cqe c1 = poll_cq(crec), c2 = poll_cq(crec);
	if (c1.wr_id == 20) {
		struct vrnic_cqe t = c1;
		c1 = c2;
		c2 = t;
	}
	check_cqe(c1, 10, VRNIC_WC_SEND, qr[0].qpn, 0);
	check_cqe(c2, 20, VRNIC_WC_RECV, qr[1].qpn, 3000);
	if (memcmp(data, data + 8192, 3000) != 0)
		die("SEND data", EIO, "received bytes differ");

	/* RDMA WRITE 5000 bytes from QP 1 to data[32768..] through QP 2's side. */
	for (int i = 0; i < 5000; i++)
		data[16384 + i] = (uint8_t)(i * 13 + 5);
	w = (void *)(mem + OFF_SQ1 + stride);
	memset(w, 0, stride);
	w->wr_id = 11;
	w->opcode = VRNIC_WR_RDMA_WRITE;
	w->flags = VRNIC_SEND_SIGNALED;
	w->num_sge = 1;
	w->remote_addr = iova + 32768;
	w->rkey = mrr.rkey;
	sg = (void *)((uint8_t *)w + VRNIC_WQE_BLOCK);
	sg->addr = iova + 16384;
	sg->length = 5000;
	sg->lkey = mrr.lkey;
	ring(&rec1->sq_pi, 2);
	check_cqe(poll_cq(crec), 11, VRNIC_WC_RDMA_WRITE, qr[0].qpn, 0);
	if (memcmp(data + 16384, data + 32768, 5000) != 0)
		die("WRITE data", EIO, "written bytes differ");
	printf("OK %u %u\n", c2.byte_len, 5000);
	return 0;
}
