/* rc_ops: a vrnic client in C, written from abi/vrnic_abi.h and libc alone.
 *
 *   rc_ops SOCKET_A [SOCKET_B]
 *
 * It opens a context on each device (SOCKET_A and SOCKET_B are the control
 * sockets of two vrnicd daemons; with one socket both contexts are on the
 * same device), creates an RC QP in each, connects the two QPs to each
 * other at the devices' GID 0 (path MTU 1024, so the larger messages go as
 * FIRST/MIDDLE/LAST packets), and then, from QP A to QP B:
 *
 *   1. RDMA WRITE   5000 bytes into B's memory
 *   2. SEND         3000 bytes into a RECV posted on B
 *   3. RDMA READ    6000 bytes of B's memory into A's
 *   4. FETCH_AND_ADD 23 to a 64-bit word in B's memory (was 1000)
 *   5. CMP_AND_SWP  that word: compare 1023, swap 77
 *
 * Every completion is checked field by field (wr_id, status, opcode, qp_num,
 * byte_len, wc_flags) and every byte moved is compared with its source. On
 * success it prints one line and exits 0:
 *
 *   OK write 5000 send 3000 read 6000 fetch_add 1000->1023 cmp_swap 1023->77
 *
 * On any failure it prints "ERROR <what>: <reason>" and exits 1.
 *
 * Everything a client does is here: the control socket (one SOCK_SEQPACKET
 * datagram per command, file descriptors as SCM_RIGHTS), host memory (a
 * sealed memfd handed to the daemon), the doorbell page, WQEs written into
 * the rings, doorbell records and the kick eventfd, and CQEs read by their
 * owner bit. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "vrnic_abi.h"

/* Host memory of each context: 1 MiB, laid out as (offsets, PA = pa + off)
 *   0        CQ ring, CQ_SLOTS CQEs
 *   64 KiB   data MR, 64 KiB (IOVA = PA), the offsets below are in it
 *   256 KiB  SQ ring, 512 KiB RQ ring */
#define HOST_MEM (1u << 20)
#define OFF_DATA (64u << 10)
#define OFF_SQ (256u << 10)
#define OFF_RQ (512u << 10)
#define CQ_SLOTS 64u
#define QP_SLOTS 16u
#define MTU_BYTES 1024u

/* Offsets inside the data MR. */
#define D_WRITE_SRC 0u       /* A: what the WRITE sends */
#define D_WRITE_DST 8192u    /* B: where it lands */
#define D_SEND_SRC 16384u    /* A: what the SEND sends */
#define D_RECV_DST 24576u    /* B: the RECV buffer (4096 bytes) */
#define D_READ_SRC 32768u    /* B: what the READ fetches */
#define D_READ_DST 40960u    /* A: where it lands */
#define D_ATOMIC_WORD 57344u /* B: the atomic target (8-byte aligned) */
#define D_ATOMIC_RES 57352u  /* A: the original values returned (2 words) */

#define WRITE_LEN 5000u
#define SEND_LEN 3000u
#define READ_LEN 6000u

static void die(const char *what, int err, const char *msg) {
	printf("ERROR %s: %s%s%s\n", what, strerror(err), msg ? ": " : "", msg ? msg : "");
	exit(1);
}

/* dev is one context on one device and the objects this program creates
 * in it. */
struct dev {
	const char *name;
	int sock;        /* control socket */
	uint32_t seq;    /* last command's sequence number */
	uint8_t *db;     /* doorbell page */
	int kick;        /* kick eventfd */
	uint8_t *mem;    /* host memory, mapped */
	uint64_t pa;     /* its device physical base */
	uint8_t gid[16]; /* the device's GID 0 */
	uint32_t pd, lkey, rkey;
	uint32_t cq_ci;
	struct vrnic_db_cq *cq_rec;
	uint32_t qpn;
	struct vrnic_db_qp *qp_rec;
	uint32_t sq_stride, rq_stride;
	uint32_t sq_pi, rq_pi;
};

/* call sends one command (header + req, then extra bytes and fds) and
 * reads the reply into resp and, if rfds, the 2 fds OPEN_CONTEXT returns. */
static void call(struct dev *d, uint16_t op, const void *req, size_t req_len, const void *extra, size_t extra_len,
		 const int *fds, int nfds, void *resp, size_t resp_len, int *rfds) {
	static uint8_t buf[VRNIC_MAX_MSG_SIZE];
	struct vrnic_msg_hdr h = { .opcode = op, .length = sizeof h + req_len + extra_len, .seq = ++d->seq };
	memcpy(buf, &h, sizeof h);
	if (req_len)
		memcpy(buf + sizeof h, req, req_len);
	if (extra_len)
		memcpy(buf + sizeof h + req_len, extra, extra_len);
	struct iovec iov = { buf, h.length };
	union {
		struct cmsghdr c;
		char b[CMSG_SPACE(sizeof(int) * VRNIC_MAX_FDS)];
	} cm;
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
	if (sendmsg(d->sock, &m, 0) < 0)
		die("sendmsg", errno, d->name);
	iov.iov_len = sizeof buf;
	m.msg_control = cm.b;
	m.msg_controllen = sizeof cm.b;
	ssize_t n = recvmsg(d->sock, &m, MSG_CMSG_CLOEXEC);
	if (n < (ssize_t)sizeof h)
		die("recvmsg", n < 0 ? errno : EPROTO, d->name);
	struct vrnic_msg_hdr r;
	memcpy(&r, buf, sizeof r);
	if (r.opcode != op || r.seq != h.seq || !(r.flags & VRNIC_MSG_F_REPLY))
		die("reply", EPROTO, d->name);
	if (r.status)
		die("command", r.status, (const char *)buf + sizeof r);
	if ((size_t)n != sizeof r + resp_len)
		die("reply length", EPROTO, d->name);
	if (resp_len)
		memcpy(resp, buf + sizeof r, resp_len);
	if (rfds) {
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int)))
			die("reply fds", EPROTO, d->name);
		memcpy(rfds, CMSG_DATA(c), 2 * sizeof(int));
	}
}

/* open_dev opens a context on the device whose control socket is path,
 * maps its doorbell page, gives it host memory, and creates a PD, an MR
 * over the data area, a CQ and an RC QP (RESET). */
static void open_dev(struct dev *d, const char *path, const char *name) {
	d->name = name;
	d->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	strncpy(a.sun_path, path, sizeof a.sun_path - 1);
	if (d->sock < 0 || connect(d->sock, (struct sockaddr *)&a, sizeof a) < 0)
		die("connect", errno, path);

	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	snprintf(oc.client_name, sizeof oc.client_name, "rc_ops-%s", name);
	struct vrnic_resp_open_context ocr;
	int fds[2];
	call(d, VRNIC_CMD_OPEN_CONTEXT, &oc, sizeof oc, NULL, 0, NULL, 0, &ocr, sizeof ocr, fds);
	d->db = mmap(NULL, ocr.db_page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (d->db == MAP_FAILED)
		die("mmap doorbell page", errno, name);
	close(fds[0]);
	if (((struct vrnic_db_header *)d->db)->magic != VRNIC_DB_MAGIC)
		die("doorbell magic", EPROTO, name);
	d->kick = fds[1];

	/* Host memory: a memfd sealed against shrinking. */
	int mfd = memfd_create("rc_ops", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0 || ftruncate(mfd, HOST_MEM) < 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		die("memfd", errno, name);
	d->mem = mmap(NULL, HOST_MEM, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (d->mem == MAP_FAILED)
		die("mmap host memory", errno, name);
	struct vrnic_cmd_add_host_mem ah = { .length = HOST_MEM };
	struct vrnic_resp_add_host_mem ahr;
	call(d, VRNIC_CMD_ADD_HOST_MEM, &ah, sizeof ah, NULL, 0, &mfd, 1, &ahr, sizeof ahr, NULL);
	close(mfd);
	d->pa = ahr.pa_base;

	struct vrnic_cmd_query_gid qg = { .port_num = 1, .index = 0 };
	struct vrnic_resp_query_gid gid;
	call(d, VRNIC_CMD_QUERY_GID, &qg, sizeof qg, NULL, 0, NULL, 0, &gid, sizeof gid, NULL);
	if (!gid.valid)
		die("GID 0", ENOENT, name);
	memcpy(d->gid, gid.gid, 16);

	struct vrnic_resp_alloc_pd pdr;
	call(d, VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &pdr, sizeof pdr, NULL);
	d->pd = pdr.pd_handle;

	/* The data MR: 16 pages of 4 KiB, page list inline, IOVA = PA. Remote
	 * write and atomic need local write (IBTA C10-83). */
	struct vrnic_cmd_reg_mr mr = { .iova = d->pa + OFF_DATA, .length = 65536, .pd_handle = d->pd,
		.access = VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE | VRNIC_ACCESS_REMOTE_READ | VRNIC_ACCESS_REMOTE_ATOMIC,
		.page_shift = VRNIC_PAGE_SHIFT_4K, .npages = 16 };
	uint64_t pages[16];
	for (int i = 0; i < 16; i++)
		pages[i] = d->pa + OFF_DATA + 4096u * i;
	struct vrnic_resp_reg_mr mrr;
	call(d, VRNIC_CMD_REG_MR, &mr, sizeof mr, pages, sizeof pages, NULL, 0, &mrr, sizeof mrr, NULL);
	d->lkey = mrr.lkey;
	d->rkey = mrr.rkey;

	struct vrnic_cmd_create_cq cq = { .ring_pa = d->pa, .cqe_count = CQ_SLOTS };
	struct vrnic_resp_create_cq cqr;
	call(d, VRNIC_CMD_CREATE_CQ, &cq, sizeof cq, NULL, 0, NULL, 0, &cqr, sizeof cqr, NULL);
	d->cq_rec = (void *)(d->db + cqr.db_index * VRNIC_DB_RECORD_SIZE);

	struct vrnic_cmd_create_qp qc = { .sq_pa = d->pa + OFF_SQ, .rq_pa = d->pa + OFF_RQ, .qp_type = VRNIC_QPT_RC,
		.pd_handle = d->pd, .send_cq = cqr.cq_handle, .recv_cq = cqr.cq_handle, .srq_handle = VRNIC_NO_SRQ,
		.cap = { .max_send_wr = QP_SLOTS, .max_recv_wr = QP_SLOTS, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct vrnic_resp_create_qp qr;
	call(d, VRNIC_CMD_CREATE_QP, &qc, sizeof qc, NULL, 0, NULL, 0, &qr, sizeof qr, NULL);
	d->qpn = qr.qpn;
	d->qp_rec = (void *)(d->db + qr.db_index * VRNIC_DB_RECORD_SIZE);
	d->sq_stride = qr.sq_wqe_blocks * VRNIC_WQE_BLOCK;
	d->rq_stride = qr.rq_wqe_size;
}

/* to_rts moves d's QP RESET -> INIT -> RTR -> RTS, connected to peer's QP
 * at peer's GID 0. Each side's first PSN is 100 + its QPN. */
static void to_rts(struct dev *d, const struct dev *peer) {
	struct vrnic_cmd_modify_qp mq = { .qpn = d->qpn };
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_PKEY_INDEX | VRNIC_QP_PORT | VRNIC_QP_ACCESS_FLAGS;
	mq.attr.qp_state = VRNIC_QPS_INIT;
	mq.attr.port_num = 1;
	mq.attr.qp_access_flags = VRNIC_ACCESS_REMOTE_WRITE | VRNIC_ACCESS_REMOTE_READ | VRNIC_ACCESS_REMOTE_ATOMIC;
	call(d, VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);

	memset(&mq.attr, 0, sizeof mq.attr);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_AV | VRNIC_QP_PATH_MTU | VRNIC_QP_DEST_QPN | VRNIC_QP_RQ_PSN |
		       VRNIC_QP_MAX_DEST_RD_ATOMIC | VRNIC_QP_MIN_RNR_TIMER;
	mq.attr.qp_state = VRNIC_QPS_RTR;
	mq.attr.path_mtu = VRNIC_MTU_1024;
	mq.attr.dest_qp_num = peer->qpn;
	mq.attr.rq_psn = 100 + peer->qpn;
	mq.attr.max_dest_rd_atomic = 1;
	mq.attr.min_rnr_timer = 12; /* 0.64 ms */
	memcpy(mq.attr.ah_attr.dgid, peer->gid, 16);
	mq.attr.ah_attr.hop_limit = 64;
	mq.attr.ah_attr.port_num = 1;
	call(d, VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);

	memset(&mq.attr, 0, sizeof mq.attr);
	mq.attr_mask = VRNIC_QP_STATE | VRNIC_QP_TIMEOUT | VRNIC_QP_RETRY_CNT | VRNIC_QP_RNR_RETRY | VRNIC_QP_SQ_PSN |
		       VRNIC_QP_MAX_QP_RD_ATOMIC;
	mq.attr.qp_state = VRNIC_QPS_RTS;
	mq.attr.timeout = 14; /* 4.096 us * 2^14 = 67 ms */
	mq.attr.retry_cnt = 7;
	mq.attr.rnr_retry = 7; /* infinite */
	mq.attr.sq_psn = 100 + d->qpn;
	mq.attr.max_rd_atomic = 1;
	call(d, VRNIC_CMD_MODIFY_QP, &mq, sizeof mq, NULL, 0, NULL, 0, NULL, 0, NULL);
}

/* ring publishes producer index v in the doorbell record word pi and
 * writes the kick eventfd only if the daemon asks for kicks. */
static void ring(struct dev *d, uint32_t *pi, uint32_t v) {
	__atomic_store_n(pi, v, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&((struct vrnic_db_header *)d->db)->kick_needed, __ATOMIC_SEQ_CST)) {
		uint64_t one = 1;
		if (write(d->kick, &one, 8) != 8)
			die("kick", errno, d->name);
	}
}

/* iova is the MR address of data offset off. */
static uint64_t iova(const struct dev *d, uint32_t off) { return d->pa + OFF_DATA + off; }
static uint8_t *data(const struct dev *d, uint32_t off) { return d->mem + OFF_DATA + off; }

/* post_recv posts one RQE of one SGE (len bytes at data offset off). */
static void post_recv(struct dev *d, uint64_t wr_id, uint32_t off, uint32_t len) {
	uint8_t *slot = d->mem + OFF_RQ + (d->rq_pi % QP_SLOTS) * d->rq_stride;
	memset(slot, 0, d->rq_stride);
	struct vrnic_recv_wqe *r = (void *)slot;
	r->wr_id = wr_id;
	r->num_sge = 1;
	struct vrnic_sge *sg = (void *)(r + 1);
	sg->addr = iova(d, off);
	sg->length = len;
	sg->lkey = d->lkey;
	ring(d, &d->qp_rec->rq_pi, ++d->rq_pi);
}

/* post_send posts w (signaled) with one SGE (len bytes at data offset off). */
static void post_send(struct dev *d, struct vrnic_send_wqe w, uint32_t off, uint32_t len) {
	uint8_t *slot = d->mem + OFF_SQ + (d->sq_pi % QP_SLOTS) * d->sq_stride;
	memset(slot, 0, d->sq_stride);
	w.flags |= VRNIC_SEND_SIGNALED;
	w.num_sge = 1;
	memcpy(slot, &w, sizeof w);
	struct vrnic_sge *sg = (void *)(slot + VRNIC_WQE_BLOCK);
	sg->addr = iova(d, off);
	sg->length = len;
	sg->lkey = d->lkey;
	ring(d, &d->qp_rec->sq_pi, ++d->sq_pi);
}

/* poll_cq returns d's next CQE (its owner bit matches the pass of the
 * consumer index), waiting at most 10 s, and frees its slot. */
static struct vrnic_cqe poll_cq(struct dev *d) {
	struct vrnic_cqe *cq = (void *)d->mem;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct vrnic_cqe *e = &cq[d->cq_ci % CQ_SLOTS];
		uint8_t owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
		if ((owner & 1) == 1 - ((d->cq_ci / CQ_SLOTS) & 1)) {
			struct vrnic_cqe c = *e;
			__atomic_store_n(&d->cq_rec->cq_ci, ++d->cq_ci, __ATOMIC_SEQ_CST);
			return c;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			die("poll CQ", ETIMEDOUT, d->name);
		usleep(20);
	}
}

/* expect_cqe polls d's CQ and checks every field of the completion. */
static void expect_cqe(struct dev *d, const char *what, uint64_t wr_id, uint8_t opcode, uint32_t byte_len) {
	struct vrnic_cqe c = poll_cq(d);
	if (c.wr_id != wr_id || c.status != VRNIC_WC_SUCCESS || c.opcode != opcode || c.qp_num != d->qpn ||
	    c.byte_len != byte_len || c.wc_flags != 0 || c.imm_or_inv != 0 || c.vendor_err != 0) {
		char m[200];
		snprintf(m, sizeof m,
			 "wr_id %llu status %u opcode %u qp %u byte_len %u wc_flags %u vendor_err %u "
			 "(want wr_id %llu status 0 opcode %u qp %u byte_len %u wc_flags 0)",
			 (unsigned long long)c.wr_id, c.status, c.opcode, c.qp_num, c.byte_len, c.wc_flags, c.vendor_err,
			 (unsigned long long)wr_id, opcode, d->qpn, byte_len);
		die(what, EPROTO, m);
	}
}

static void fill(uint8_t *p, uint32_t n, uint32_t seed) {
	for (uint32_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 8));
}

static uint64_t load64(const uint8_t *p) {
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

int main(int argc, char **argv) {
	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: %s SOCKET_A [SOCKET_B]\n", argv[0]);
		return 2;
	}
	static struct dev a, b;
	open_dev(&a, argv[1], "a");
	open_dev(&b, argv[argc - 1], "b");
	to_rts(&a, &b);
	to_rts(&b, &a);

	/* 1. RDMA WRITE: A's data[D_WRITE_SRC..] to B's data[D_WRITE_DST..]. */
	fill(data(&a, D_WRITE_SRC), WRITE_LEN, 1);
	post_send(&a, (struct vrnic_send_wqe){ .wr_id = 1, .opcode = VRNIC_WR_RDMA_WRITE,
		.remote_addr = iova(&b, D_WRITE_DST), .rkey = b.rkey }, D_WRITE_SRC, WRITE_LEN);
	expect_cqe(&a, "WRITE completion", 1, VRNIC_WC_RDMA_WRITE, 0);
	if (memcmp(data(&a, D_WRITE_SRC), data(&b, D_WRITE_DST), WRITE_LEN) != 0)
		die("WRITE data", EIO, "B's memory differs from what A wrote");

	/* 2. SEND into a RECV B posted first. */
	fill(data(&a, D_SEND_SRC), SEND_LEN, 2);
	post_recv(&b, 20, D_RECV_DST, 4096);
	post_send(&a, (struct vrnic_send_wqe){ .wr_id = 2, .opcode = VRNIC_WR_SEND }, D_SEND_SRC, SEND_LEN);
	expect_cqe(&a, "SEND completion", 2, VRNIC_WC_SEND, 0);
	expect_cqe(&b, "RECV completion", 20, VRNIC_WC_RECV, SEND_LEN);
	if (memcmp(data(&a, D_SEND_SRC), data(&b, D_RECV_DST), SEND_LEN) != 0)
		die("SEND data", EIO, "the received bytes differ from the sent ones");

	/* 3. RDMA READ: B's data[D_READ_SRC..] into A's data[D_READ_DST..]. */
	fill(data(&b, D_READ_SRC), READ_LEN, 3);
	post_send(&a, (struct vrnic_send_wqe){ .wr_id = 3, .opcode = VRNIC_WR_RDMA_READ,
		.remote_addr = iova(&b, D_READ_SRC), .rkey = b.rkey }, D_READ_DST, READ_LEN);
	expect_cqe(&a, "READ completion", 3, VRNIC_WC_RDMA_READ, READ_LEN);
	if (memcmp(data(&b, D_READ_SRC), data(&a, D_READ_DST), READ_LEN) != 0)
		die("READ data", EIO, "the bytes read differ from B's memory");

	/* 4. FETCH_AND_ADD, then 5. CMP_AND_SWP, on B's word; the original
	 * values land in A's memory. */
	uint64_t word = 1000;
	memcpy(data(&b, D_ATOMIC_WORD), &word, 8);
	post_send(&a, (struct vrnic_send_wqe){ .wr_id = 4, .opcode = VRNIC_WR_ATOMIC_FETCH_AND_ADD,
		.remote_addr = iova(&b, D_ATOMIC_WORD), .rkey = b.rkey, .compare_add = 23 }, D_ATOMIC_RES, 8);
	expect_cqe(&a, "FETCH_AND_ADD completion", 4, VRNIC_WC_FETCH_ADD, 0);
	uint64_t fa_orig = load64(data(&a, D_ATOMIC_RES)), fa_now = load64(data(&b, D_ATOMIC_WORD));
	if (fa_orig != 1000 || fa_now != 1023) {
		char m[100];
		snprintf(m, sizeof m, "returned %llu, word now %llu (want 1000, 1023)", (unsigned long long)fa_orig,
			 (unsigned long long)fa_now);
		die("FETCH_AND_ADD", EIO, m);
	}
	post_send(&a, (struct vrnic_send_wqe){ .wr_id = 5, .opcode = VRNIC_WR_ATOMIC_CMP_AND_SWP,
		.remote_addr = iova(&b, D_ATOMIC_WORD), .rkey = b.rkey, .compare_add = 1023, .swap = 77 }, D_ATOMIC_RES + 8, 8);
	expect_cqe(&a, "CMP_AND_SWP completion", 5, VRNIC_WC_COMP_SWAP, 0);
	uint64_t cs_orig = load64(data(&a, D_ATOMIC_RES + 8)), cs_now = load64(data(&b, D_ATOMIC_WORD));
	if (cs_orig != 1023 || cs_now != 77) {
		char m[100];
		snprintf(m, sizeof m, "returned %llu, word now %llu (want 1023, 77)", (unsigned long long)cs_orig,
			 (unsigned long long)cs_now);
		die("CMP_AND_SWP", EIO, m);
	}

	printf("OK write %u send %u read %u fetch_add %llu->%llu cmp_swap %llu->%llu\n", WRITE_LEN, SEND_LEN, READ_LEN,
	       (unsigned long long)fa_orig, (unsigned long long)fa_now, (unsigned long long)cs_orig,
	       (unsigned long long)cs_now);
	return 0;
}
