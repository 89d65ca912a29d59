/* vrnic_client.h: the control-path plumbing of the C test client
 * tests/controlpath/testdata/cclient.c, written from abi/vrnic_abi.h and
 * libc alone, as any unmodified client would be (examples/rc_ops.c is a
 * complete client in one file that does not need this header). One
 * client is one C file that includes this header once; the state below is
 * the process's single context:
 *
 *   sock  the device's SOCK_SEQPACKET control socket
 *   seq   the sequence number of the last command
 *   db    the context's doorbell page (mmapped), dh its header
 *   kick  the context's kick eventfd
 *   mem   the host memory (a sealed memfd, mmapped), pa its physical base
 *
 * Every failure prints "ERROR <what>: <reason>" and exits 1. */
#ifndef VRNIC_TEST_CLIENT_H
#define VRNIC_TEST_CLIENT_H

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
#include "vrnic_abi.h"

static int sock;
static uint32_t seq;
static uint8_t *db;
static struct vrnic_db_header *dh;
static int kick;
static uint8_t *mem;
static uint64_t pa;

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

/* open_context connects to the device's control socket at path, opens a
 * context named name and maps its doorbell page (sock, db, dh, kick). */
static void open_context(const char *path, const char *name) {
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	strncpy(a.sun_path, path, sizeof a.sun_path - 1);
	if (connect(sock, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect", errno, NULL);
	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	strncpy(oc.client_name, name, sizeof oc.client_name - 1);
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
}

/* add_host_mem creates len bytes of host memory (a memfd sealed against
 * shrinking), maps it at mem and registers it (pa). */
static void add_host_mem(const char *name, size_t len) {
	int mfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0 || ftruncate(mfd, len) < 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		die("memfd", errno, NULL);
	mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (mem == MAP_FAILED)
		die("mmap memory", errno, NULL);
	struct vrnic_cmd_add_host_mem ah = { .length = len };
	struct vrnic_resp_add_host_mem ahr;
	call(VRNIC_CMD_ADD_HOST_MEM, &ah, sizeof ah, NULL, 0, &mfd, 1, &ahr, sizeof ahr, NULL);
	pa = ahr.pa_base;
}

/* reg_mr registers 16 pages (64 KiB) of host memory at offset off as an MR
 * of pd with IOVA = PA. */
static struct vrnic_resp_reg_mr reg_mr(uint32_t pd, uint64_t off, uint32_t access) {
	struct vrnic_cmd_reg_mr mr = { .iova = pa + off, .length = 65536, .pd_handle = pd,
		.access = access, .page_shift = VRNIC_PAGE_SHIFT_4K, .npages = 16 };
	uint64_t pages[16];
	for (int i = 0; i < 16; i++)
		pages[i] = pa + off + 4096 * i;
	struct vrnic_resp_reg_mr mrr;
	call(VRNIC_CMD_REG_MR, &mr, sizeof mr, pages, sizeof pages, NULL, 0, &mrr, sizeof mrr, NULL);
	return mrr;
}

/* ring publishes producer index v in the doorbell record word pi and
 * writes the kick eventfd only if the daemon asks for kicks. */
static void ring(uint32_t *pi, uint32_t v) {
	__atomic_store_n(pi, v, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&dh->kick_needed, __ATOMIC_SEQ_CST)) {
		uint64_t one = 1;
		if (write(kick, &one, 8) != 8)
			die("kick", errno, NULL);
	}
}

/* rc_to_rts moves RC QP qpn RESET → INIT (remote write access) → RTR
 * towards dest_qpn at gid (path MTU 1024, one READ/atomic outstanding)
 * → RTS (ACK timeout 14, 7 retries, 7 RNR retries). */
static void rc_to_rts(uint32_t qpn, uint32_t dest_qpn, const uint8_t *gid, uint8_t hop_limit,
		      uint32_t rq_psn, uint32_t sq_psn, uint8_t min_rnr_timer) {
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
	mq.attr.dest_qp_num = dest_qpn;
	mq.attr.rq_psn = rq_psn;
	mq.attr.max_dest_rd_atomic = 1;
	mq.attr.min_rnr_timer = min_rnr_timer;
	memcpy(mq.attr.ah_attr.dgid, gid, 16);
	mq.attr.ah_attr.hop_limit = hop_limit;
	mq.attr.ah_attr.port_num = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
	memset(&mq.attr, 0, sizeof mq.attr);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_TIMEOUT | VRNIC_QP_RETRY_CNT | VRNIC_QP_RNR_RETRY |
		       VRNIC_QP_SQ_PSN | VRNIC_QP_MAX_QP_RD_ATOMIC;
	mq.attr.qp_state = VRNIC_QPS_RTS;
	mq.attr.timeout = 14;
	mq.attr.retry_cnt = 7;
	mq.attr.rnr_retry = 7;
	mq.attr.sq_psn = sq_psn;
	mq.attr.max_rd_atomic = 1;
	call(VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
}

#endif
