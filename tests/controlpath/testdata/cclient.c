/* A vrnic client written in C from abi/vrnic_abi.h and libc alone: it
 * opens a context, registers host memory and an MR, creates a CQ with a
 * completion eventfd and an RC QP, brings the QP to RTS, posts a send WQE
 * into the ring and rings the doorbell, queries the QP, prints
 * "OK <qpn> <state> <sq_psn>" and then waits for stdin to close. */
#include "vrnic_client.h"
#include <sys/eventfd.h>

int main(int argc, char **argv) {
	if (argc != 2)
		return 2;
	open_context(argv[1], "c-client");

	/* Host memory: a sealed memfd of 1 MiB. */
	add_host_mem("cclient", 1 << 20);

	struct vrnic_resp_alloc_pd pdr;
	call(VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &pdr, sizeof pdr, NULL);

	/* MR over the second 64 KiB: 16 pages inline, IOVA = PA. */
	struct vrnic_resp_reg_mr mrr = reg_mr(pdr.pd_handle, 65536, VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE);

	/* CQ of 64 entries at offset 0, with a completion eventfd. */
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct vrnic_cmd_create_cq cq = { .ring_pa = pa, .cqe_count = 64 };
	struct vrnic_resp_create_cq cqr;
	call(VRNIC_CMD_CREATE_CQ, &cq, sizeof cq, NULL, 0, &efd, 1, &cqr, sizeof cqr, NULL);

	/* RC QP: SQ at 256 KiB, RQ at 512 KiB. */
	struct vrnic_cmd_create_qp qc = { .sq_pa = pa + (256 << 10), .rq_pa = pa + (512 << 10), .qp_type = VRNIC_QPT_RC,
		.pd_handle = pdr.pd_handle, .send_cq = cqr.cq_handle, .recv_cq = cqr.cq_handle, .srq_handle = VRNIC_NO_SRQ,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct vrnic_resp_create_qp qr;
	call(VRNIC_CMD_CREATE_QP, &qc, sizeof qc, NULL, 0, NULL, 0, &qr, sizeof qr, NULL);
	if (qr.sq_wqe_blocks != VRNIC_SQ_WQE_BLOCKS(1, 0) || qr.rq_wqe_size != VRNIC_RQ_WQE_SIZE(1))
		die("WQE geometry", EPROTO, NULL);

	/* To RTS towards QP 0x42 at 127.0.0.2 (no such peer is needed). */
	uint8_t gid[16] = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 2 };
	rc_to_rts(qr.qpn, 0x42, gid, 0, 7, 0x1234, 12);

	/* Post one send WQE and ring the doorbell as the header describes. */
	struct vrnic_send_wqe *w = (void *)(mem + (256 << 10));
	w->wr_id = 1;
	w->opcode = VRNIC_WR_SEND;
	w->flags = VRNIC_SEND_SIGNALED;
	w->num_sge = 1;
	struct vrnic_sge *sg = (void *)((uint8_t *)w + VRNIC_WQE_BLOCK);
	sg->addr = pa + 65536;
	sg->length = 64;
	sg->lkey = mrr.lkey;
	struct vrnic_db_qp *rec = (void *)(db + qr.db_index * VRNIC_DB_RECORD_SIZE);
	ring(&rec->sq_pi, 1);
	/* Arm the CQ. */
	struct vrnic_db_cq *crec = (void *)(db + cqr.db_index * VRNIC_DB_RECORD_SIZE);
	__atomic_store_n(&crec->arm, (1u << VRNIC_CQ_ARM_SN_SHIFT) | VRNIC_CQ_ARM_ARMED, __ATOMIC_SEQ_CST);

	struct vrnic_cmd_handle qh = { .handle = qr.qpn };
	struct vrnic_resp_query_qp qq;
	call(VRNIC_CMD_QUERY_QP, &qh, sizeof qh, NULL, 0, NULL, 0, &qq, sizeof qq, NULL);
	printf("OK %u %u %u\n", qr.qpn, qq.attr.qp_state, qq.attr.sq_psn);
	fflush(stdout);
	char c;
	while (read(0, &c, 1) > 0)
		;
	return 0;
}
