/* A vrnic client written in C from abi/vrnic_abi.h and libc alone: it
 * opens a context, registers host memory and an MR, creates a CQ with a
 * completion eventfd and an RC QP, brings the QP to RTS, posts a send WQE
 * into the ring and rings the doorbell, queries the QP, prints
 * "OK <qpn> <state> <sq_psn>" and then waits for stdin to close. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/eventfd.h>
#include "vrnic_abi.h"

static int sock;
static uint32_t seq;

static void die(const char *what, int err, const char *msg) {
	printf("ERROR %s: %s%s%s\n", what, strerror(err), msg ? ": " : "", msg ? msg : "");
	exit(1);
}

/* call sends one command (header + req, plus extra bytes and fds) and reads
 * the reply into resp (resp_len bytes) and up to 2 fds. */
static void call(uint16_t op, const void *req, size_t req_len, const void *extra, size_t extra_len,
		 const int *fds, int nfds, void *resp, size_t resp_len, int *rfds) {
	static uint8_t buf[VRNIC_MAX_MSG_SIZE];
	struct vrnic_msg_hdr h = { .opcode = op, .length = sizeof h + req_len + extra_len, .seq = ++seq };
	memcpy(buf, &h, sizeof h);
	memcpy(buf + sizeof h, req, req_len);
	memcpy(buf + sizeof h + req_len, extra, extra_len);
	struct iovec iov = { buf, h.length };
	union { struct cmsghdr c; char b[CMSG_SPACE(sizeof(int) * VRNIC_MAX_FDS)]; } cm;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		m.msg_control = cm.b;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	if (sendmsg(sock, &m, 0) < 0)
		die("sendmsg", errno, NULL);
	iov.iov_len = sizeof buf;
	m.msg_control = cm.b;
	m.msg_controllen = sizeof cm.b;
	ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	if (n < (ssize_t)sizeof h)
		die("recvmsg", n < 0 ? errno : EPROTO, NULL);
	struct vrnic_msg_hdr r;
	memcpy(&r, buf, sizeof r);
	if (r.opcode != op || r.seq != h.seq || !(r.flags & VRNIC_MSG_F_REPLY))
		die("reply", EPROTO, NULL);
	if (r.status)
		die("command", r.status, (const char *)buf + sizeof r);
	if ((size_t)n != sizeof r + resp_len)
		die("reply length", EPROTO, NULL);
	memcpy(resp, buf + sizeof r, resp_len);
	if (rfds) {
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int)))
			die("reply fds", EPROTO, NULL);
		memcpy(rfds, CMSG_DATA(c), 2 * sizeof(int));
	}
}

int main(int argc, char **argv) {
	if (argc != 2)
		return 2;
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
	if (connect(sock, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect", errno, NULL);

	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	strcpy(oc.client_name, "c-client");
	struct vrnic_resp_open_context ocr;
	int fds[2];
	call(VRNIC_CMD_OPEN_CONTEXT, &oc, sizeof oc, NULL, 0, NULL, 0, &ocr, sizeof ocr, fds);
	uint8_t *db = mmap(NULL, ocr.db_page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (db == MAP_FAILED)
		die("mmap doorbell", errno, NULL);
	struct vrnic_db_header *dh = (void *)db;
	if (dh->magic != VRNIC_DB_MAGIC)
		die("doorbell magic", EPROTO, NULL);
	int kick = fds[1];

	/* Host memory: a sealed memfd of 1 MiB. */
	size_t len = 1 << 20;
	int mfd = memfd_create("cclient", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0 || ftruncate(mfd, len) < 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		die("memfd", errno, NULL);
	uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	struct vrnic_cmd_add_host_mem ah = { .length = len };
	struct vrnic_resp_add_host_mem ahr;
	call(VRNIC_CMD_ADD_HOST_MEM, &ah, sizeof ah, NULL, 0, &mfd, 1, &ahr, sizeof ahr, NULL);
	uint64_t pa = ahr.pa_base;

	struct vrnic_resp_alloc_pd pdr;
	call(VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &pdr, sizeof pdr, NULL);

	/* MR over the second 64 KiB: 16 pages inline, IOVA = PA. */
	struct vrnic_cmd_reg_mr mr = { .iova = pa + 65536, .length = 65536, .pd_handle = pdr.pd_handle,
		.access = VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE, .page_shift = VRNIC_PAGE_SHIFT_4K, .npages = 16 };
	uint64_t pages[16];
	for (int i = 0; i < 16; i++)
		pages[i] = pa + 65536 + 4096 * i;
	struct vrnic_resp_reg_mr mrr;
	call(VRNIC_CMD_REG_MR, &mr, sizeof mr, pages, sizeof pages, NULL, 0, &mrr, sizeof mrr, NULL);

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

	struct vrnic_cmd_modify_qp mq = { .qpn = qr.qpn };
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_PKEY_INDEX | VRNIC_QP_PORT | VRNIC_QP_ACCESS_FLAGS;
	mq.attr.qp_state = VRNIC_QPS_INIT;
	mq.attr.port_num = 1;
	mq.attr.qp_access_flags = VRNIC_ACCESS_REMOTE_WRITE;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_AV | VRNIC_QP_PATH_MTU | VRNIC_QP_DEST_QPN | VRNIC_QP_RQ_PSN |
		       VRNIC_QP_MAX_DEST_RD_ATOMIC | VRNIC_QP_MIN_RNR_TIMER;
	mq.attr.qp_state = VRNIC_QPS_RTR;
	mq.attr.path_mtu = VRNIC_MTU_1024;
	mq.attr.dest_qp_num = 0x42;
	mq.attr.rq_psn = 7;
	mq.attr.max_dest_rd_atomic = 1;
	mq.attr.min_rnr_timer = 12;
	uint8_t gid[16] = { [10] = 0xff, [11] = 0xff, [12] = 127, [15] = 2 };
	memcpy(mq.attr.ah_attr.dgid, gid, 16);
	mq.attr.ah_attr.port_num = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_TIMEOUT | VRNIC_QP_RETRY_CNT | VRNIC_QP_RNR_RETRY |
		       VRNIC_QP_SQ_PSN | VRNIC_QP_MAX_QP_RD_ATOMIC;
	mq.attr.qp_state = VRNIC_QPS_RTS;
	mq.attr.timeout = 14;
	mq.attr.retry_cnt = 7;
	mq.attr.rnr_retry = 7;
	mq.attr.sq_psn = 0x1234;
	mq.attr.max_rd_atomic = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);

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
	__atomic_store_n(&rec->sq_pi, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&dh->kick_needed, __ATOMIC_SEQ_CST)) {
		uint64_t one = 1;
		if (write(kick, &one, 8) != 8)
			die("kick", errno, NULL);
	}
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
