/* cmcheck.h - what the rdma_cm test programs share: failing with a
 * message, IPv4 addresses, taking the one CM event expected and waiting for
 * one completion. Each program prints "ERROR ..." and exits 1 at the first
 * difference. */
#ifndef CMCHECK_H
#define CMCHECK_H

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline void fail(const char *what, const char *detail) {
	printf("ERROR %s: %s\n", what, detail);
	exit(1);
}

static inline void die(const char *what) {
	fail(what, strerror(errno));
}

static inline struct sockaddr_in in4(const char *s, uint16_t port) {
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, s, &a.sin_addr) != 1)
		fail("inet_pton", s);
	return a;
}

/* get_event takes the next event of ch, which must be want, with status 0,
 * within 20 s. */
static inline struct rdma_cm_event *get_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	if (poll(&p, 1, 20000) != 1)
		fail("event", rdma_event_str(want));
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event != want || ev->status) {
		char d[160];
		snprintf(d, sizeof d, "%s status %d, want %s", rdma_event_str(ev->event), ev->status,
			 rdma_event_str(want));
		fail("event", d);
	}
	return ev;
}

/* wait_wc polls cq for one successful completion of opcode op, 20 s at
 * most. */
static inline void wait_wc(struct ibv_cq *cq, enum ibv_wc_opcode op) {
	struct ibv_wc wc;
	for (int i = 0; i < 20000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS || wc.opcode != op)
				fail("completion", ibv_wc_status_str(wc.status));
			return;
		}
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	fail("completion", "none in 20 s");
}

#endif
