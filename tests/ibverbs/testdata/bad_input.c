/* bad_input: a libibverbs program (only <infiniband/verbs.h>) that feeds
 * the library bad input and checks each call fails cleanly: the documented
 * return value, errno set, no crash, no hang. Then it streams RDMA WRITEs
 * from device A to device B, prints "READY", and the test kills A's daemon
 * (SIGKILL): polling and posting must fail, a completion channel wait must
 * return, the async event must be IBV_EVENT_DEVICE_FATAL, and every object
 * must still be destroyable.
 *
 *   bad_input DEVICE_A DEVICE_B
 *
 * Prints one "ok ..." line per check, then "OK" and exits 0; on the first
 * failed check "ERROR ..." and exits 1. An alarm turns a hang into
 * "ERROR hang" and exit 2. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char *phase = "start";

static void on_alarm(int sig) {
	(void)sig;
	static const char m[] = "ERROR hang\n";
	ssize_t n = write(1, m, sizeof m - 1);
	(void)n;
	_exit(2);
}

static void fail(const char *what, const char *detail) {
	printf("ERROR %s: %s: %s\n", phase, what, detail);
	exit(1);
}

static void ok(const char *what) { printf("ok %s: %s\n", phase, what); }

/* expect_errno checks that a call failed (failed true) with errno want. */
static void expect_errno(const char *what, int failed, int want) {
	int e = errno;
	char d[160];
	if (!failed)
		fail(what, "succeeded, want a failure");
	if (e != want) {
		snprintf(d, sizeof d, "errno %d (%s), want %d (%s)", e, strerror(e), want, strerror(want));
		fail(what, d);
	}
	ok(what);
}

/* expect_ret checks an int-returning verb that returns an errno value. */
static void expect_ret(const char *what, int ret, int want) {
	char d[160];
	if (ret != want) {
		snprintf(d, sizeof d, "returned %d (%s), want %d (%s)", ret, strerror(ret), want, strerror(want));
		fail(what, d);
	}
	if (want && errno != want) {
		snprintf(d, sizeof d, "errno %d, want %d", errno, want);
		fail(what, d);
	}
	ok(what);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
	struct ibv_qp_cap cap;
};

static struct ibv_device *find(struct ibv_device **list, const char *name) {
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			return list[i];
	fail(name, "no such device");
	return NULL;
}

static struct ibv_qp *new_qp(struct side *s, uint32_t wr, struct ibv_qp_cap *cap) {
	struct ibv_qp_init_attr a = { .send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = wr, .max_recv_wr = wr, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(s->pd, &a);
	if (!qp)
		fail("ibv_create_qp", strerror(errno));
	if (cap)
		*cap = a.cap;
	return qp;
}

static void open_side(struct side *s, struct ibv_device *dev) {
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->ch = ibv_create_comp_channel(s->ctx)) || !(s->cq = ibv_create_cq(s->ctx, 64, NULL, s->ch, 0)))
		fail("open", strerror(errno));
	s->qp = new_qp(s, 4, &s->cap);
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		fail("ibv_query_gid", strerror(errno));
}

static int to_init(struct ibv_qp *qp) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static struct ibv_qp_attr rtr_attr(struct side *peer) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qp->qp_num,
		.rq_psn = 1, .max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	return a;
}

#define RTR_MASK \
	(IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | \
	 IBV_QP_MIN_RNR_TIMER)

static void connect_qp(struct side *s, struct side *peer) {
	struct ibv_qp_attr a = rtr_attr(peer);
	if (to_init(s->qp) || ibv_modify_qp(s->qp, &a, RTR_MASK))
		fail("connect", strerror(errno));
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 1,
		.max_rd_atomic = 1 };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("connect RTS", strerror(errno));
}

/* wait_wcs polls s's CQ for n successful completions. */
static void wait_wcs(struct side *s, int n, const char *what) {
	time_t t0 = time(NULL);
	struct ibv_wc wc;
	while (n > 0) {
		int got = ibv_poll_cq(s->cq, 1, &wc);
		if (got < 0)
			fail(what, "ibv_poll_cq failed");
		if (got && wc.status != IBV_WC_SUCCESS)
			fail(what, ibv_wc_status_str(wc.status));
		n -= got;
		if (time(NULL) - t0 > 10)
			fail(what, "completions missing after 10 s");
	}
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i))
		fail("ibv_query_qp", strerror(errno));
	return a.qp_state;
}

/* Inputs the system's libibverbs accepts too. (It dereferences NULL
 * objects in ibv_free_device_list, ibv_dealloc_pd, ibv_destroy_* and the
 * like; those are not tested here, see tolerated_extra.) */
static void tolerated(struct ibv_device *dev, struct side *a) {
	phase = "tolerated";
	struct ibv_device **l2 = ibv_get_device_list(NULL);
	if (!l2 || !l2[0])
		fail("ibv_get_device_list(NULL)", "no list");
	ibv_free_device_list(l2);
	ok("ibv_get_device_list(NULL) returns the list");
	/* Device pointers stay valid after the list is freed. */
	struct ibv_context *c = ibv_open_device(dev);
	if (!c || ibv_close_device(c))
		fail("open after ibv_free_device_list", strerror(errno));
	ok("a device from a freed list opens");
	if (strcmp(ibv_wc_status_str((enum ibv_wc_status)999), "unknown") ||
	    strcmp(ibv_event_type_str((enum ibv_event_type)999), "unknown"))
		fail("status strings", "out of range is not \"unknown\"");
	ok("ibv_wc_status_str/ibv_event_type_str out of range");
	struct ibv_send_wr *sbad = (void *)1;
	struct ibv_recv_wr *rbad = (void *)1;
	if (ibv_post_send(a->qp, NULL, &sbad) || ibv_post_recv(a->qp, NULL, &rbad))
		fail("post of an empty list", strerror(errno));
	ok("posting an empty list returns 0");
	struct ibv_wc wc;
	if (ibv_poll_cq(a->cq, 0, &wc) != 0)
		fail("ibv_poll_cq(0 entries)", "not 0");
	ok("ibv_poll_cq for 0 entries returns 0");
	union ibv_gid g;
	expect_ret("ibv_query_gid past the table", ibv_query_gid(a->ctx, 1, 9999, &g) ? errno : 0, EINVAL);
	struct ibv_port_attr pa;
	int r = ibv_query_port(a->ctx, 7, &pa);
	expect_ret("ibv_query_port of port 7", r, EINVAL);
}

/* NULL where the system library would crash: vrnic fails with EINVAL. */
static void tolerated_extra(void) {
	phase = "NULL objects";
	ibv_free_device_list(NULL);
	ok("ibv_free_device_list(NULL)");
	expect_errno("ibv_open_device(NULL)", ibv_open_device(NULL) == NULL, EINVAL);
	expect_errno("ibv_alloc_pd(NULL)", ibv_alloc_pd(NULL) == NULL, EINVAL);
	expect_ret("ibv_dealloc_pd(NULL)", ibv_dealloc_pd(NULL), EINVAL);
	expect_ret("ibv_dereg_mr(NULL)", ibv_dereg_mr(NULL), EINVAL);
	expect_ret("ibv_destroy_qp(NULL)", ibv_destroy_qp(NULL), EINVAL);
	expect_ret("ibv_destroy_cq(NULL)", ibv_destroy_cq(NULL), EINVAL);
}

/* Registrations of memory the program cannot give: unmapped, PROT_NONE,
 * read-only for a device that may write it. Read-only memory registered
 * without IBV_ACCESS_LOCAL_WRITE is fine (as with the kernel, which pins it
 * for reading only): it can be sent and read remotely. */
static void registrations(struct side *a, struct side *b) {
	phase = "registration";
	long pg = sysconf(_SC_PAGESIZE);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	unsigned char *m = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		fail("mmap", strerror(errno));
	munmap(m + pg, pg); /* a hole in the middle */
	expect_errno("unmapped memory", ibv_reg_mr(a->pd, m + pg, 100, rw) == NULL, EFAULT);
	expect_errno("a range across a hole", ibv_reg_mr(a->pd, m, 3 * pg, rw) == NULL, EFAULT);
	mprotect(m + 2 * pg, pg, PROT_NONE);
	expect_errno("PROT_NONE memory", ibv_reg_mr(a->pd, m + 2 * pg, pg, IBV_ACCESS_REMOTE_READ) == NULL, EFAULT);
	memset(m + 3 * pg, 0x3c, pg);
	mprotect(m + 3 * pg, pg, PROT_READ);
	expect_errno("read-only memory with IBV_ACCESS_LOCAL_WRITE", ibv_reg_mr(a->pd, m + 3 * pg, pg, rw) == NULL,
		     EFAULT);
	expect_errno("IBV_ACCESS_REMOTE_WRITE without LOCAL_WRITE",
		     ibv_reg_mr(a->pd, m, 64, IBV_ACCESS_REMOTE_WRITE) == NULL, EINVAL);
	expect_errno("length 0", ibv_reg_mr(a->pd, m, 0, rw) == NULL, EINVAL);
	void *shm = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	expect_errno("MAP_SHARED memory (not supported)", ibv_reg_mr(a->pd, shm, 64, rw) == NULL, EOPNOTSUPP);
	munmap(shm, pg);
	/* Access bits as Linux 6.1 checks them (ib_check_mr_access): a bit
	 * it does not know is EINVAL, ON_DEMAND without ODP EOPNOTSUPP;
	 * HUGETLB, MW_BIND and the optional range (RELAXED_ORDERING) pass. */
	/* 1 << 8 and 1 << 9 are FLUSH_GLOBAL and FLUSH_PERSISTENT (Linux 6.2); 1 << 10 is unknown. */
	expect_errno("an unknown access bit (1 << 10)", ibv_reg_mr(a->pd, m, 64, rw | (1 << 10)) == NULL, EINVAL);
	/* ON_DEMAND: registered when the device reports ODP, EOPNOTSUPP
	 * (ib_check_mr_access's errno) when it does not. */
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(a->ctx, NULL, &dx))
		fail("ibv_query_device_ex", strerror(errno));
	struct ibv_mr *odp = ibv_reg_mr(a->pd, m, 64, rw | IBV_ACCESS_ON_DEMAND);
	if (dx.odp_caps.general_caps & IBV_ODP_SUPPORT) {
		if (!odp || ibv_dereg_mr(odp))
			fail("IBV_ACCESS_ON_DEMAND", "refused by a device that reports ODP");
		ok("IBV_ACCESS_ON_DEMAND with ODP");
	} else
		expect_errno("IBV_ACCESS_ON_DEMAND (no ODP)", odp == NULL, EOPNOTSUPP);
	expect_errno("IBV_ACCESS_ZERO_BASED (not supported)",
		     ibv_reg_mr(a->pd, m, 64, rw | IBV_ACCESS_ZERO_BASED) == NULL, EOPNOTSUPP);
	int hints[] = { IBV_ACCESS_HUGETLB, IBV_ACCESS_MW_BIND, IBV_ACCESS_RELAXED_ORDERING };
	const char *hint_names[] = { "IBV_ACCESS_HUGETLB is accepted", "IBV_ACCESS_MW_BIND is accepted",
				     "IBV_ACCESS_RELAXED_ORDERING is accepted" };
	for (int i = 0; i < 3; i++) {
		struct ibv_mr *h = ibv_reg_mr(a->pd, m, 64, rw | hints[i]);
		if (!h)
			fail(hint_names[i], strerror(errno));
		if (ibv_dereg_mr(h))
			fail("ibv_dereg_mr", strerror(errno));
		ok(hint_names[i]);
	}

	/* Read-only memory, read-only registration: B reads it with RDMA
	 * READ into writable memory. */
	struct ibv_mr *ro = ibv_reg_mr(a->pd, m + 3 * pg, pg, IBV_ACCESS_REMOTE_READ);
	if (!ro)
		fail("read-only memory without LOCAL_WRITE", strerror(errno));
	unsigned char *dst = calloc(1, pg);
	struct ibv_mr *md = ibv_reg_mr(b->pd, dst, pg, IBV_ACCESS_LOCAL_WRITE);
	if (!dst || !md)
		fail("ibv_reg_mr", strerror(errno));
	struct ibv_sge sg = { .addr = (uintptr_t)dst, .length = pg, .lkey = md->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)(m + 3 * pg), .rkey = ro->rkey } }, *bad;
	if (ibv_post_send(b->qp, &w, &bad))
		fail("post READ", strerror(errno));
	wait_wcs(b, 1, "READ of read-only memory");
	for (long i = 0; i < pg; i++)
		if (dst[i] != 0x3c)
			fail("READ of read-only memory", "data differs");
	ok("read-only memory registered without LOCAL_WRITE is read remotely");
	if (ibv_dereg_mr(ro) || ibv_dereg_mr(md))
		fail("ibv_dereg_mr", strerror(errno));
	free(dst);
	munmap(m, 4 * pg);
}

/* More work requests than the queue holds: ENOMEM, *bad_wr the first WR
 * not posted, the ones before it posted (they complete). An invalid WR in
 * a list: EINVAL, *bad_wr that WR. */
static void overflow(struct side *a, struct side *b) {
	phase = "queue overflow";
	unsigned n = a->cap.max_send_wr;
	if (n < 4 || n > 64)
		fail("max_send_wr", "unexpected capacity");
	static unsigned char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(a->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(b->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr || !rmr)
		fail("ibv_reg_mr", strerror(errno));
	struct ibv_sge sg = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_send_wr w[70], *bad = NULL;
	for (unsigned i = 0; i < n + 3; i++)
		w[i] = (struct ibv_send_wr){ .wr_id = i, .next = i + 1 < n + 3 ? &w[i + 1] : NULL, .sg_list = &sg,
			.num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = (uintptr_t)buf + 1024, .rkey = rmr->rkey } };
	int r = ibv_post_send(a->qp, w, &bad);
	expect_ret("send queue overflow", r, ENOMEM);
	if (bad != &w[n])
		fail("send queue overflow", "*bad_wr is not the first WR not posted");
	ok("*bad_wr is the first WR not posted");
	wait_wcs(a, (int)n, "the WRs posted before the overflow");
	ok("the WRs before it completed");

	struct ibv_recv_wr rw[70], *rbad = NULL;
	unsigned nr = a->cap.max_recv_wr;
	for (unsigned i = 0; i < nr + 2; i++)
		rw[i] = (struct ibv_recv_wr){ .wr_id = i, .next = i + 1 < nr + 2 ? &rw[i + 1] : NULL, .sg_list = &sg,
			.num_sge = 1 };
	r = ibv_post_recv(a->qp, rw, &rbad);
	expect_ret("receive queue overflow", r, ENOMEM);
	if (rbad != &rw[nr])
		fail("receive queue overflow", "*bad_wr is not the first WR not posted");
	ok("*bad_wr is the first receive not posted");

	/* Too many SGEs in the second WR: the first is posted. */
	struct ibv_sge sgs[8];
	for (int i = 0; i < 8; i++)
		sgs[i] = sg;
	w[0].next = &w[1];
	w[1].next = NULL;
	w[1].sg_list = sgs;
	w[1].num_sge = 8;
	r = ibv_post_send(a->qp, w, &bad);
	expect_ret("a WR with more SGEs than max_send_sge", r, EINVAL);
	if (bad != &w[1])
		fail("too many SGEs", "*bad_wr is not that WR");
	wait_wcs(a, 1, "the WR before the bad one");
	w[0].next = NULL;
	w[0].opcode = (enum ibv_wr_opcode)77;
	r = ibv_post_send(a->qp, w, &bad);
	expect_ret("an unknown opcode", r, EINVAL);
	if (bad != &w[0])
		fail("unknown opcode", "*bad_wr is not that WR");
	if (ibv_dereg_mr(mr) || ibv_dereg_mr(rmr))
		fail("ibv_dereg_mr", strerror(errno));
}

/* Invalid QP and CQ attributes: creation and modification fail, the QP
 * stays in its state. */
static void qp_attrs(struct side *a, struct side *b) {
	phase = "QP attributes";
	struct ibv_qp_init_attr ia = { .send_cq = a->cq, .recv_cq = a->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1u << 30, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	expect_errno("max_send_wr 2^30", ibv_create_qp(a->pd, &ia) == NULL, EINVAL);
	ia.cap.max_send_wr = 1;
	ia.cap.max_send_sge = 1000;
	expect_errno("max_send_sge 1000", ibv_create_qp(a->pd, &ia) == NULL, EINVAL);
	ia.cap.max_send_sge = 1;
	ia.cap.max_inline_data = 1u << 20;
	expect_errno("max_inline_data 1 MiB", ibv_create_qp(a->pd, &ia) == NULL, EINVAL);
	ia.cap.max_inline_data = 0;
	ia.send_cq = NULL;
	expect_errno("no send CQ", ibv_create_qp(a->pd, &ia) == NULL, EINVAL);
	ia.send_cq = a->cq;
	ia.qp_type = IBV_QPT_XRC_SEND;
	/* An XRC initiator needs only a PD and a send CQ (as mlx5's); a
	 * target needs an XRC domain, which ibv_create_qp cannot name. */
	struct ibv_qp *xq = ibv_create_qp(a->pd, &ia);
	if (!xq || ibv_destroy_qp(xq))
		fail("an XRC initiator QP through ibv_create_qp", strerror(errno));
	ok("an XRC initiator QP through ibv_create_qp");
	ia.qp_type = IBV_QPT_XRC_RECV;
	errno = 0;
	xq = ibv_create_qp(a->pd, &ia);
	if (xq || !errno)
		fail("an XRC target QP without a domain", "succeeded, or failed without errno");
	ok("an XRC target QP without a domain fails");
	ia.qp_type = IBV_QPT_RC;
	expect_errno("a CQ of 0 entries", ibv_create_cq(a->ctx, 0, NULL, NULL, 0) == NULL, EINVAL);
	expect_errno("a CQ of 2^30 entries", ibv_create_cq(a->ctx, 1 << 30, NULL, NULL, 0) == NULL, EINVAL);
	expect_errno("a CQ on completion vector num_comp_vectors",
		     ibv_create_cq(a->ctx, 4, NULL, NULL, a->ctx->num_comp_vectors) == NULL, EINVAL);
	expect_errno("a CQ on completion vector -1", ibv_create_cq(a->ctx, 4, NULL, NULL, -1) == NULL, EINVAL);
	struct ibv_cq_init_attr_ex cx = { .cqe = 4, .comp_vector = (uint32_t)a->ctx->num_comp_vectors };
	expect_errno("an extended CQ on completion vector num_comp_vectors", ibv_create_cq_ex(a->ctx, &cx) == NULL,
		     EINVAL);
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(a->ctx, NULL, &dx))
		fail("ibv_query_device_ex", strerror(errno));
	if (dx.phys_port_cnt_ex != dx.orig_attr.phys_port_cnt || dx.phys_port_cnt_ex != 1)
		fail("ibv_query_device_ex", "phys_port_cnt_ex is not the port count");
	ok("phys_port_cnt_ex is the port count");

	/* Posting in a state that takes no work requests is an immediate
	 * EINVAL (the RQ before INIT, the SQ before RTS), *bad_wr the first. */
	struct ibv_qp *qp = new_qp(a, 4, NULL);
	struct ibv_sge sg = { .addr = 0, .length = 0, .lkey = 0 };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND }, *sbad = NULL;
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &sg, .num_sge = 1 }, *rbad = NULL;
	expect_ret("ibv_post_recv in RESET", ibv_post_recv(qp, &rw, &rbad), EINVAL);
	expect_ret("ibv_post_send in RESET", ibv_post_send(qp, &sw, &sbad), EINVAL);
	if (rbad != &rw || sbad != &sw)
		fail("posts in RESET", "*bad_wr is not the first WR");
	if (to_init(qp))
		fail("INIT", strerror(errno));
	expect_ret("ibv_post_send in INIT", ibv_post_send(qp, &sw, &sbad), EINVAL);
	if (ibv_post_recv(qp, &rw, &rbad))
		fail("ibv_post_recv in INIT", strerror(errno));
	ok("ibv_post_recv in INIT");
	struct ibv_qp_attr rs = { .qp_state = IBV_QPS_RESET };
	if (ibv_modify_qp(qp, &rs, IBV_QP_STATE))
		fail("to RESET", strerror(errno));

	struct ibv_qp_attr at = rtr_attr(b);
	expect_ret("RESET to RTR", ibv_modify_qp(qp, &at, RTR_MASK), EINVAL);
	if (qp_state(qp) != IBV_QPS_RESET)
		fail("RESET to RTR", "the QP left RESET");
	struct ibv_qp_attr in = { .qp_state = IBV_QPS_INIT, .port_num = 2 };
	expect_ret("INIT on port 2", ibv_modify_qp(qp, &in, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX), EINVAL);
	in.port_num = 1;
	expect_ret("INIT without the access flags", ibv_modify_qp(qp, &in, IBV_QP_STATE | IBV_QP_PORT), EINVAL);
	if (qp_state(qp) != IBV_QPS_RESET)
		fail("bad INIT", "the QP left RESET");
	if (to_init(qp))
		fail("INIT", strerror(errno));
	at.path_mtu = (enum ibv_mtu)9;
	expect_ret("RTR with path MTU 9", ibv_modify_qp(qp, &at, RTR_MASK), EINVAL);
	at = rtr_attr(b);
	at.ah_attr.is_global = 0;
	expect_ret("RTR without a GRH", ibv_modify_qp(qp, &at, RTR_MASK), EINVAL);
	at = rtr_attr(b);
	expect_ret("RTR without a destination QPN", ibv_modify_qp(qp, &at, RTR_MASK & ~IBV_QP_DEST_QPN), EINVAL);
	at.qp_state = IBV_QPS_RTS;
	expect_ret("INIT to RTS", ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), EINVAL);
	expect_ret("an unknown attribute bit", ibv_modify_qp(qp, &at, IBV_QP_STATE | (1 << 30)), EOPNOTSUPP);
	if (qp_state(qp) != IBV_QPS_INIT)
		fail("bad RTR", "the QP left INIT");
	ok("the QP stayed in INIT");
	if (ibv_destroy_qp(qp))
		fail("ibv_destroy_qp", strerror(errno));
}

/* kernel_inputs: MODIFY_QP inputs Linux accepts for an rxe QP and vrnic
 * accepts too, and the path migration inputs it refuses as an unsupported
 * feature (it keeps no alternate path), with the kernel's EINVAL where the
 * transition does not take the attribute at all. */
static void kernel_inputs(struct side *a, struct side *b) {
	phase = "kernel inputs";
	struct ibv_qp *qp = new_qp(a, 4, NULL);
	if (to_init(qp))
		fail("INIT", strerror(errno));
	struct ibv_qp_attr at = rtr_attr(b);
	at.dest_qp_num = 0xabcde; /* a peer no other QP of this test has */
	expect_ret("ALT_PATH on INIT to RTR (no alternate paths)", ibv_modify_qp(qp, &at, RTR_MASK | IBV_QP_ALT_PATH),
		   EOPNOTSUPP);
	at.path_mig_state = IBV_MIG_MIGRATED;
	expect_ret("PATH_MIG_STATE on INIT to RTR (not in the table)",
		   ibv_modify_qp(qp, &at, RTR_MASK | IBV_QP_PATH_MIG_STATE), EINVAL);
	if (ibv_modify_qp(qp, &at, RTR_MASK))
		fail("RTR", strerror(errno));
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.sq_psn = 1, .max_rd_atomic = 1, .path_mig_state = IBV_MIG_MIGRATED };
	int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		  IBV_QP_MAX_QP_RD_ATOMIC;
	expect_ret("RTR to RTS with PATH_MIG_STATE MIGRATED", ibv_modify_qp(qp, &at, rts | IBV_QP_PATH_MIG_STATE), 0);
	at.path_mig_state = IBV_MIG_ARMED;
	expect_ret("PATH_MIG_STATE ARMED (no alternate path)",
		   ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PATH_MIG_STATE), EOPNOTSUPP);
	at = (struct ibv_qp_attr){ .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 2 };
	expect_ret("RTS to SQD with en_sqd_async_notify 2", ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY),
		   0);
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &at, IBV_QP_STATE, &ia))
		fail("ibv_query_qp", strerror(errno));
	if (at.qp_state != IBV_QPS_SQD || at.path_mig_state != IBV_MIG_MIGRATED)
		fail("ibv_query_qp", "want SQD and MIGRATED");
	ok("the QP is in SQD, its path MIGRATED");
	if (ibv_destroy_qp(qp))
		fail("ibv_destroy_qp", strerror(errno));

	/* SRQs: rxe checks no srq_limit at creation (and arms the SRQ with
	 * it), takes a limit up to max_wr on modify, and ignores a QP's
	 * receive capabilities when it has an SRQ. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1, .srq_limit = 100 } };
	struct ibv_srq *srq = ibv_create_srq(a->pd, &si);
	if (!srq)
		fail("an SRQ with srq_limit above max_wr", strerror(errno));
	struct ibv_srq_attr sa;
	if (ibv_query_srq(srq, &sa) || sa.srq_limit != 100)
		fail("an SRQ with srq_limit above max_wr", "not armed with 100");
	ok("an SRQ with srq_limit above max_wr");
	sa.srq_limit = si.attr.max_wr;
	expect_ret("srq_limit = max_wr", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), 0);
	sa.srq_limit = si.attr.max_wr + 1;
	expect_ret("srq_limit above max_wr", ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), EINVAL);
	struct ibv_qp_init_attr qa = { .send_cq = a->cq, .recv_cq = a->cq, .srq = srq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_send_sge = 1, .max_recv_wr = 1u << 30, .max_recv_sge = 1000 } };
	qp = ibv_create_qp(a->pd, &qa);
	if (!qp)
		fail("a QP with an SRQ and max_recv_wr 2^30", strerror(errno));
	ok("a QP with an SRQ and max_recv_wr 2^30");
	if (ibv_destroy_qp(qp) || ibv_destroy_srq(srq))
		fail("destroy", strerror(errno));

	/* ibv_create_qp_ex: CREATE_FLAGS in the mask with no flag passes
	 * rdma-core's rxe provider; a flag it does not support does not. */
	struct ibv_qp_init_attr_ex xa = { .send_cq = a->cq, .recv_cq = a->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS, .pd = a->pd };
	qp = ibv_create_qp_ex(a->ctx, &xa);
	if (!qp)
		fail("ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS 0", strerror(errno));
	ok("ibv_create_qp_ex with IBV_QP_INIT_ATTR_CREATE_FLAGS 0");
	if (ibv_destroy_qp(qp))
		fail("destroy", strerror(errno));
	xa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	expect_errno("ibv_create_qp_ex with IBV_QP_CREATE_SCATTER_FCS", ibv_create_qp_ex(a->ctx, &xa) == NULL,
		     EOPNOTSUPP);
}

/* daemon_killed streams WRITEs from a to b until the test kills a's
 * daemon, then checks every way the program can notice. */
static void daemon_killed(struct side *a, struct side *b) {
	phase = "daemon killed";
	static unsigned char buf[1 << 16];
	struct ibv_mr *mr = ibv_reg_mr(a->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *rmr = ibv_reg_mr(b->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!mr || !rmr)
		fail("ibv_reg_mr", strerror(errno));
	/* An armed CQ with a completion channel, nothing posted on it. */
	struct ibv_cq *ecq = ibv_create_cq(a->ctx, 4, NULL, a->ch, 0);
	if (!ecq || ibv_req_notify_cq(ecq, 0))
		fail("event CQ", strerror(errno));
	struct ibv_sge sg = { .addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey };
	struct ibv_send_wr w = { .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { .remote_addr = (uintptr_t)buf, .rkey = rmr->rkey } },
			   *bad;
	printf("READY\n");
	fflush(stdout);
	long posted = 0, polled = 0;
	int poll_ret = 0, poll_errno = 0;
	struct ibv_wc wc[16];
	time_t t0 = time(NULL);
	for (;;) {
		if (time(NULL) - t0 > 20)
			fail("ibv_poll_cq", "still no error 20 s after READY");
		int n = ibv_poll_cq(a->cq, 16, wc);
		if (n < 0) {
			poll_ret = n, poll_errno = errno;
			break;
		}
		for (int i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				fail("completion", ibv_wc_status_str(wc[i].status)); /* none: the daemon is gone */
		polled += n;
		w.wr_id = (uint64_t)posted;
		if (posted - polled < (long)a->cap.max_send_wr) {
			int r = ibv_post_send(a->qp, &w, &bad);
			if (r && r != ENOMEM && r != EIO)
				fail("ibv_post_send", strerror(r));
			if (!r)
				posted++;
		}
	}
	printf("ok %s: %ld WRITEs completed, then ibv_poll_cq returned %d\n", phase, polled, poll_ret);
	if (polled < 1)
		fail("the stream", "no WRITE completed before the kill");
	errno = poll_errno;
	expect_errno("ibv_poll_cq fails", poll_ret < 0, EIO);
	bad = NULL;
	expect_ret("ibv_post_send fails", ibv_post_send(a->qp, &w, &bad), EIO);
	if (bad != &w)
		fail("ibv_post_send", "*bad_wr is not the WR");
	struct ibv_recv_wr rw = { .sg_list = &sg, .num_sge = 1 }, *rbad = NULL;
	expect_ret("ibv_post_recv fails", ibv_post_recv(a->qp, &rw, &rbad), EIO);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	expect_errno("ibv_get_cq_event returns", ibv_get_cq_event(a->ch, &ev_cq, &ev_ctx) < 0, EIO);
	struct ibv_async_event ae;
	if (ibv_get_async_event(a->ctx, &ae))
		fail("ibv_get_async_event", strerror(errno));
	if (ae.event_type != IBV_EVENT_DEVICE_FATAL)
		fail("ibv_get_async_event", ibv_event_type_str(ae.event_type));
	ibv_ack_async_event(&ae);
	ok("ibv_get_async_event: IBV_EVENT_DEVICE_FATAL");
	struct ibv_port_attr pa;
	expect_ret("ibv_query_port fails", ibv_query_port(a->ctx, 1, &pa), EIO);
	expect_errno("ibv_alloc_pd fails", ibv_alloc_pd(a->ctx) == NULL, EIO);
	expect_errno("ibv_reg_mr fails", ibv_reg_mr(a->pd, buf, 100, IBV_ACCESS_LOCAL_WRITE) == NULL, EIO);
	/* Everything is still destroyed without an error. */
	if (ibv_destroy_qp(a->qp) || ibv_destroy_cq(ecq) || ibv_destroy_cq(a->cq) ||
	    ibv_destroy_comp_channel(a->ch) || ibv_dereg_mr(mr) || ibv_dealloc_pd(a->pd) ||
	    ibv_close_device(a->ctx))
		fail("destroying A's objects", strerror(errno));
	ok("A's objects destroyed, A closed");
	if (ibv_dereg_mr(rmr))
		fail("B", strerror(errno));
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: bad_input DEVICE_A DEVICE_B\n");
		return 2;
	}
	signal(SIGALRM, on_alarm);
	alarm(60);
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list)
		fail("ibv_get_device_list", strerror(errno));
	struct side a, b;
	open_side(&a, find(list, argv[1]));
	open_side(&b, find(list, argv[2]));
	connect_qp(&a, &b);
	connect_qp(&b, &a);
	struct ibv_device *dev = list[0];
	ibv_free_device_list(list);
	tolerated(dev, &a);
	tolerated_extra();
	registrations(&a, &b);
	overflow(&a, &b);
	qp_attrs(&a, &b);
	kernel_inputs(&a, &b);
	daemon_killed(&a, &b);
	if (ibv_destroy_qp(b.qp) || ibv_destroy_cq(b.cq) || ibv_destroy_comp_channel(b.ch) || ibv_dealloc_pd(b.pd) ||
	    ibv_close_device(b.ctx))
		fail("destroying B's objects", strerror(errno));
	printf("OK\n");
	return 0;
}
