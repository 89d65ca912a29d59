/* A vrnic client in C from abi/vrnic_abi.h and libc alone that moves data:
 * it creates two RC QPs in one context, connects them to each other at the
 * device's GID 0, and runs a SEND (with a posted receive) and an RDMA WRITE
 * through the daemon's data path, reading completions by their owner bit
 * and checking every byte. It prints "OK <send byte_len> <write bytes>"
 * and exits 0, or prints "ERROR ..." and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "vrnic_abi.h"

static int sock;
static uint32_t seq;

static void die(const char *what, int err, const char *msg) {
	printf("ERROR %s: %s%s%s\n", what, strerror(err), msg ? ": " : "", msg ? msg : "");
	exit(1);
}

/* call sends one command (header + req, plus extra bytes and fds) and reads
 * the reply into resp and, if rfds, the 2 fds of OPEN_CONTEXT. */
static void call(uint16_t op, const void *req, size_t req_len, const void *extra, size_t extra_len,
		 const int *fds, int nfds, void *resp, size_t resp_len, int *rfds) {
	static uint8_t buf[VRNIC_MAX_MSG_SIZE];
	struct vrnic_msg_hdr h = { .opcode = op, .length = sizeof h + req_len + extra_len, .seq = ++seq };
	memcpy(buf, &h, sizeof h);
	if (req_len)
		memcpy(buf + sizeof h, req, req_len);
	if (extra_len)
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
	if (resp_len)
		memcpy(resp, buf + sizeof r, resp_len);
	if (rfds) {
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int)))
			die("reply fds", EPROTO, NULL);
		memcpy(rfds, CMSG_DATA(c), 2 * sizeof(int));
	}
}

/* Memory layout of the 1 MiB host memory (PA = pa + offset):
 *   0        CQ ring, 64 CQEs
 *   64 KiB   data MR, 64 KiB (IOVA = PA)
 *   256 KiB  QP 1 SQ, 512 KiB QP 1 RQ, 640 KiB QP 2 SQ, 768 KiB QP 2 RQ */
#define OFF_DATA (64 << 10)
#define OFF_SQ1 (256 << 10)
#define OFF_RQ1 (512 << 10)
#define OFF_SQ2 (640 << 10)
#define OFF_RQ2 (768 << 10)

static uint8_t *mem, *db;
static uint64_t pa;
static int kick;
static struct vrnic_db_header *dh;

static void ring(uint32_t *pi, uint32_t v) {
	__atomic_store_n(pi, v, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&dh->kick_needed, __ATOMIC_SEQ_CST)) {
		uint64_t one = 1;
		if (write(kick, &one, 8) != 8)
			die("kick", errno, NULL);
	}
}

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

static void modify_to_rts(uint32_t qpn, uint32_t dest, const uint8_t *gid) {
	struct vrnic_cmd_modify_qp mq = { .qpn = qpn };
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_PKEY_INDEX | VRNIC_QP_PORT | VRNIC_QP_ACCESS_FLAGS;
	mq.attr.qp_state = VRNIC_QPS_INIT;
	mq.attr.port_num = 1;
	mq.attr.qp_access_flags = VRNIC_ACCESS_REMOTE_WRITE;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
	memset(&mq.attr, 0, sizeof mq.attr);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_AV | VRNIC_QP_PATH_MTU | VRNIC_QP_DEST_QPN | VRNIC_QP_RQ_PSN |
		       VRNIC_QP_MAX_DEST_RD_ATOMIC | VRNIC_QP_MIN_RNR_TIMER;
	mq.attr.qp_state = VRNIC_QPS_RTR;
	mq.attr.path_mtu = VRNIC_MTU_1024;
	mq.attr.dest_qp_num = dest;
	mq.attr.rq_psn = 100 + dest;
	mq.attr.max_dest_rd_atomic = 1;
	mq.attr.min_rnr_timer = 1;
	memcpy(mq.attr.ah_attr.dgid, gid, 16);
	mq.attr.ah_attr.hop_limit = 64;
	mq.attr.ah_attr.port_num = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
	memset(&mq.attr, 0, sizeof mq.attr);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_TIMEOUT | VRNIC_QP_RETRY_CNT | VRNIC_QP_RNR_RETRY |
		       VRNIC_QP_SQ_PSN | VRNIC_QP_MAX_QP_RD_ATOMIC;
	mq.attr.qp_state = VRNIC_QPS_RTS;
	mq.attr.timeout = 14;
	mq.attr.retry_cnt = 7;
	mq.attr.rnr_retry = 7;
	mq.attr.sq_psn = 100 + qpn;
	mq.attr.max_rd_atomic = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
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
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
	if (connect(sock, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect", errno, NULL);

	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	strcpy(oc.client_name, "c-loop");
	struct vrnic_resp_open_context ocr;
	int fds[2];
	call(VRNIC_CMD_OPEN_CONTEXT, &oc, sizeof oc, NULL, 0, NULL, 0, &ocr, sizeof ocr, fds);
	db = mmap(NULL, ocr.db_page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (db == MAP_FAILED)
		die("mmap doorbell", errno, NULL);
	dh = (void *)db;
	if (dh->magic != VRNIC_DB_MAGIC)
		die("doorbell magic", EPROTO, NULL);
	kick = fds[1];

	size_t len = 1 << 20;
	int mfd = memfd_create("cloop", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0 || ftruncate(mfd, len) < 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		die("memfd", errno, NULL);
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (mem == MAP_FAILED)
		die("mmap memory", errno, NULL);
	struct vrnic_cmd_add_host_mem ah = { .length = len };
	struct vrnic_resp_add_host_mem ahr;
	call(VRNIC_CMD_ADD_HOST_MEM, &ah, sizeof ah, NULL, 0, &mfd, 1, &ahr, sizeof ahr, NULL);
	pa = ahr.pa_base;

	struct vrnic_cmd_query_gid qg = { .port_num = 1, .index = 0 };
	struct vrnic_resp_query_gid gid;
	call(VRNIC_CMD_QUERY_GID, &qg, sizeof qg, NULL, 0, NULL, 0, &gid, sizeof gid, NULL);

	struct vrnic_resp_alloc_pd pdr;
	call(VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &pdr, sizeof pdr, NULL);
	struct vrnic_cmd_reg_mr mr = { .iova = pa + OFF_DATA, .length = 65536, .pd_handle = pdr.pd_handle,
		.access = VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE, .page_shift = VRNIC_PAGE_SHIFT_4K, .npages = 16 };
	uint64_t pages[16];
	for (int i = 0; i < 16; i++)
		pages[i] = pa + OFF_DATA + 4096 * i;
	struct vrnic_resp_reg_mr mrr;
	call(VRNIC_CMD_REG_MR, &mr, sizeof mr, pages, sizeof pages, NULL, 0, &mrr, sizeof mrr, NULL);

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
	modify_to_rts(qr[0].qpn, qr[1].qpn, gid.gid);
	modify_to_rts(qr[1].qpn, qr[0].qpn, gid.gid);
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
