/* post_syscalls: counts the system calls a thread makes while it posts
 * RDMA WRITEs through libibverbs, with perf events on the tracepoints
 * raw_syscalls:sys_enter (every system call) and syscalls:sys_enter_write
 * (write(2): the kicks) attached to that thread only. The library writes
 * the daemon's kick eventfd only when the daemon's doorbell page says it
 * sleeps (an idle engine worker spins 50 us, then sleeps); every other
 * system call would be a cost per WQE while the daemon polls.
 *
 *   post_syscalls DEVICE_A DEVICE_B WQES
 *
 * A second thread polls the CQ (every 64th WRITE is signaled), so the
 * posting thread does nothing but ibv_post_send, retrying without a system
 * call while the send queue is full. A warm-up of WQES/4 WRITEs comes
 * first, so that the daemon is busy polling when the count starts.
 * Prints "WQES n SYSCALLS k KICKS w" (k counts the kicks w too), or
 * "SKIP reason" when the tracepoints or perf events are unavailable. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

#define SIGNAL_EVERY 64

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	union ibv_gid gid;
};

static struct ibv_device *find(struct ibv_device **list, const char *name) {
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			return list[i];
	die(name);
	return NULL;
}

static void open_side(struct side *s, struct ibv_device *dev) {
	struct ibv_qp_init_attr a = { .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 256, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 1024, NULL, NULL, 0)))
		die("open");
	a.send_cq = a.recv_cq = s->cq;
	if (!(s->qp = ibv_create_qp(s->pd, &a)) || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_create_qp");
}

static void connect_qp(struct side *s, struct side *peer) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_4096, .dest_qp_num = peer->qp->qp_num,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12 };
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.max_rd_atomic = 1 };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static struct side a, b;
static volatile long completed; /* WRITEs known complete (signaled ones count SIGNAL_EVERY) */
static volatile int stop;

static void *poller(void *arg) {
	(void)arg;
	struct ibv_wc wc[16];
	while (!stop) {
		int n = ibv_poll_cq(a.cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				printf("ERROR completion: %s\n", ibv_wc_status_str(wc[i].status));
				exit(1);
			}
		if (n)
			__atomic_add_fetch(&completed, (long)n * SIGNAL_EVERY, __ATOMIC_RELEASE);
	}
	return NULL;
}

/* tracepoint_id reads a tracepoint's id from tracefs; 0 if unavailable. */
static unsigned long long tracepoint_id(const char *event) {
	const char *roots[] = { "/sys/kernel/tracing", "/sys/kernel/debug/tracing" };
	for (size_t i = 0; i < 2; i++) {
		char path[256];
		snprintf(path, sizeof path, "%s/events/%s/id", roots[i], event);
		FILE *f = fopen(path, "r");
		unsigned long long id;
		if (f && fscanf(f, "%llu", &id) == 1) {
			fclose(f);
			return id;
		}
		if (f)
			fclose(f);
	}
	return 0;
}

static uint64_t count(int fd) {
	uint64_t v;
	if (read(fd, &v, sizeof v) != sizeof v)
		die("read perf counter");
	return v;
}

/* post posts n WRITEs from the calling thread, every SIGNAL_EVERY-th
 * signaled, retrying while the send queue is full. */
static void post(struct ibv_send_wr *w, long n, long *posted) {
	struct ibv_send_wr *bad;
	for (long i = 0; i < n;) {
		long p = *posted + 1;
		w->send_flags = p % SIGNAL_EVERY == 0 ? IBV_SEND_SIGNALED : 0;
		/* Unsignaled WRs free their slots as the daemon takes them; the
		 * signaled ones keep the CQ from overflowing. */
		if (p - __atomic_load_n(&completed, __ATOMIC_ACQUIRE) > 512)
			continue;
		int r = ibv_post_send(a.qp, w, &bad);
		if (r == ENOMEM)
			continue;
		if (r)
			die("ibv_post_send");
		*posted = p;
		i++;
	}
}

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: post_syscalls DEVICE_A DEVICE_B WQES\n");
		return 2;
	}
	long n = atol(argv[3]);
	unsigned long long id = tracepoint_id("raw_syscalls/sys_enter"), wid = tracepoint_id("syscalls/sys_enter_write");
	if (!id || !wid) {
		printf("SKIP no tracefs with raw_syscalls:sys_enter and syscalls:sys_enter_write\n");
		return 0;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list)
		die("ibv_get_device_list");
	open_side(&a, find(list, argv[1]));
	open_side(&b, find(list, argv[2]));
	ibv_free_device_list(list);
	connect_qp(&a, &b);
	connect_qp(&b, &a);
	static unsigned char buf[4096];
	struct ibv_mr *ma = ibv_reg_mr(a.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mb = ibv_reg_mr(b.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!ma || !mb)
		die("ibv_reg_mr");
	struct ibv_sge sg = { .addr = (uintptr_t)buf, .length = 8, .lkey = ma->lkey };
	struct ibv_send_wr w = { .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.wr.rdma = { .remote_addr = (uintptr_t)buf + 2048, .rkey = mb->rkey } };

	struct perf_event_attr pa = { .type = PERF_TYPE_TRACEPOINT, .size = sizeof pa, .config = id,
		.sample_period = 0, .disabled = 0 };
	int fd = (int)syscall(SYS_perf_event_open, &pa, 0 /* this thread */, -1, -1, 0);
	pa.config = wid;
	int wfd = (int)syscall(SYS_perf_event_open, &pa, 0, -1, -1, 0);
	if (fd < 0 || wfd < 0) {
		printf("SKIP perf_event_open(raw_syscalls:sys_enter): %s\n", strerror(errno));
		return 0;
	}
	pthread_t t;
	if (pthread_create(&t, NULL, poller, NULL))
		die("pthread_create");
	long posted = 0;
	post(&w, n / 4, &posted); /* warm-up: the daemon polls from here on */
	uint64_t w0 = count(wfd), c0 = count(fd);
	post(&w, n, &posted);
	uint64_t c1 = count(fd), w1 = count(wfd);
	/* A count includes the read(2) that returns it (the event fires on
	 * entry): between the two reads of fd the thread made c1 - c0 - 1
	 * calls. The reads of wfd are outside that window, and not writes. */
	while (__atomic_load_n(&completed, __ATOMIC_ACQUIRE) < posted - posted % SIGNAL_EVERY)
		;
	stop = 1;
	pthread_join(t, NULL);
	printf("WQES %ld SYSCALLS %llu KICKS %llu\n", n, (unsigned long long)(c1 - c0 - 1),
	       (unsigned long long)(w1 - w0));
	close(fd);
	close(wfd);
	if (ibv_destroy_qp(a.qp) || ibv_destroy_qp(b.qp) || ibv_dereg_mr(ma) || ibv_dereg_mr(mb) ||
	    ibv_destroy_cq(a.cq) || ibv_destroy_cq(b.cq) || ibv_dealloc_pd(a.pd) || ibv_dealloc_pd(b.pd) ||
	    ibv_close_device(a.ctx) || ibv_close_device(b.ctx))
		die("destroy");
	return 0;
}
