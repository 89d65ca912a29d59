/* rdmacm_ece: ECE through librdmacm between devices "a" (the client) and
 * "b" (the server, listening on argv[2]), as rdma-core's librdmacm does it
 * with a kernel whose CM carries ECE. Arguments: the addresses of a and
 * b, the options the devices support (3, or 0 when the daemons run
 * -ece=false), and a gate file.
 *
 *   auto      both ends create their QPs with rdma_create_qp: the library
 *             offers the client QP's options, the server's QP takes what
 *             both support; ibv_query_ece then gives the agreed options
 *             on both QPs.
 *   external  both ends bring their own QPs (ibv_create_qp, conn_param
 *             qp_num): the client offers sr with rdma_set_local_ece, the
 *             server reads it with rdma_get_remote_ece, sets it on its
 *             QP with ibv_set_ece, moves the QP with rdma_init_qp_attr
 *             (whose mask ibv_modify_qp takes as it is) and accepts with
 *             rdma_set_local_ece; the client reads the REP's with
 *             rdma_get_remote_ece and applies it the same way.
 *   plain     external QPs without rdma_set_local_ece: nothing offered,
 *             the server sees no remote ECE, and neither does the client.
 *
 * A SEND goes each way on every connection. Then it prints the QP
 * numbers ("QPS auto-client auto-server ext-client ext-server
 * plain-client plain-server") and "READY", waits for the gate file (the
 * test checks the daemons' view of the QPs), disconnects everything and
 * prints "OK ...". Exit 0, or "ERROR ..." and 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmcheck.h"

static void expect_ece(const char *what, struct ibv_ece got, uint32_t vendor, uint32_t options) {
	if (got.vendor_id != vendor || got.options != options || got.comp_mask) {
		char d[160];
		snprintf(d, sizeof d, "vendor %#x options %#x comp_mask %#x, want %#x %#x 0", got.vendor_id, got.options,
			 got.comp_mask, vendor, options);
		fail(what, d);
	}
}

static void expect_remote(const char *what, struct rdma_cm_id *id, uint32_t vendor, uint32_t options) {
	struct ibv_ece e;
	memset(&e, 0xa5, sizeof e);
	if (rdma_get_remote_ece(id, &e))
		die(what);
	expect_ece(what, e, vendor, options);
}

static void expect_qp(const char *what, struct ibv_qp *qp, uint32_t options) {
	struct ibv_ece e;
	memset(&e, 0xa5, sizeof e);
	if (ibv_query_ece(qp, &e))
		die(what);
	expect_ece(what, e, 0x1ded, options);
}

#define MSG 64

struct end {
	struct rdma_cm_id *id;
	struct ibv_qp *qp; /* id->qp, or the external QP */
	struct ibv_cq *cq; /* the external QP's */
	struct ibv_mr *mr;
	char buf[2][MSG]; /* receive, send */
};

static void post_recv(struct end *e) {
	e->mr = ibv_reg_mr(e->id->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE);
	if (!e->mr)
		die("ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf[0], .length = MSG, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(e->qp, &wr, &bad))
		die("ibv_post_recv");
}

static void setup(struct end *e, bool external) {
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	if (external) {
		e->cq = ibv_create_cq(e->id->verbs, 16, NULL, NULL, 0);
		if (!e->cq)
			die("ibv_create_cq");
		qa.send_cq = qa.recv_cq = e->cq;
		e->qp = ibv_create_qp(e->id->pd, &qa);
		if (!e->qp)
			die("ibv_create_qp");
		return; /* in RESET: the receive is posted once it is in INIT */
	}
	if (rdma_create_qp(e->id, e->id->pd, &qa))
		die("rdma_create_qp");
	e->qp = e->id->qp;
	post_recv(e);
}

/* move takes an external QP to state with rdma_init_qp_attr's attributes,
 * the mask as it comes. */
static void move(struct end *e, enum ibv_qp_state state) {
	struct ibv_qp_attr a = { .qp_state = state };
	int mask;
	if (rdma_init_qp_attr(e->id, &a, &mask))
		die("rdma_init_qp_attr");
	if ((errno = ibv_modify_qp(e->qp, &a, mask)))
		die("ibv_modify_qp with rdma_init_qp_attr's mask");
}

static void send_to(struct end *from, struct end *to, const char *text) {
	snprintf(from->buf[1], MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)from->buf[1], .length = MSG, .lkey = from->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(from->qp, &wr, &bad))
		die("ibv_post_send");
	wait_wc(from->qp->send_cq, IBV_WC_SEND);
	wait_wc(to->qp->recv_cq, IBV_WC_RECV);
	if (strcmp(to->buf[0], text) != 0)
		fail("received", to->buf[0]);
}

static struct rdma_event_channel *sch, *cch;
static struct sockaddr_in a_addr, b_addr;
static struct rdma_cm_id *listener;

/* connect_pair connects a client on a to the listener on b, both with
 * QPs of their own (mode 0), external QPs where the client offers sr
 * (mode 1), or external QPs without ECE (mode 2). */
static void connect_pair(struct end *cli, struct end *srv, int mode, uint32_t caps) {
	bool external = mode != 0;
	memset(cli, 0, sizeof *cli);
	memset(srv, 0, sizeof *srv);
	if (rdma_create_id(cch, &cli->id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	struct sockaddr_in dst = b_addr, src = a_addr;
	dst.sin_port = rdma_get_src_port(listener);
	src.sin_port = 0;
	if (rdma_resolve_addr(cli->id, (struct sockaddr *)&src, (struct sockaddr *)&dst, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(get_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(cli->id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(get_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	setup(cli, external);
	if (mode == 1) {
		struct ibv_ece bad = { .vendor_id = 0x1ded, .options = 1, .comp_mask = 1 };
		errno = 0;
		if (rdma_set_local_ece(cli->id, &bad) != -1 || errno != EINVAL)
			fail("rdma_set_local_ece", "a comp_mask bit is not EINVAL");
		struct ibv_ece e = { .vendor_id = 0x1ded, .options = 1 };
		if (rdma_set_local_ece(cli->id, &e))
			die("rdma_set_local_ece (client)");
	}
	struct rdma_conn_param cp = { .retry_count = 7, .rnr_retry_count = 7, .responder_resources = 1,
		.initiator_depth = 1, .qp_num = external ? cli->qp->qp_num : 0 };
	if (rdma_connect(cli->id, &cp))
		die("rdma_connect");

	struct rdma_cm_event *ev = get_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv->id = ev->id;
	rdma_ack_cm_event(ev);
	setup(srv, external);
	if (!external) {
		expect_qp("auto: the server's QP before accepting", srv->qp, caps);
		cp.qp_num = 0;
		if (rdma_accept(srv->id, &cp))
			die("rdma_accept");
		rdma_ack_cm_event(get_event(cch, RDMA_CM_EVENT_ESTABLISHED));
		rdma_ack_cm_event(get_event(sch, RDMA_CM_EVENT_ESTABLISHED));
		expect_qp("auto: the client's QP", cli->qp, caps);
		expect_qp("auto: the server's QP", srv->qp, caps);
		errno = 0;
		struct ibv_ece e;
		if (rdma_get_remote_ece(cli->id, &e) != -1 || errno != EINVAL)
			fail("rdma_get_remote_ece", "an ID with a QP of its own is not EINVAL");
		return;
	}
	uint32_t want = mode == 1 && caps ? 1 : 0;
	expect_remote("the server's rdma_get_remote_ece", srv->id, want ? 0x1ded : 0, want);
	if (want) {
		struct ibv_ece e = { .vendor_id = 0x1ded, .options = want };
		if (ibv_set_ece(srv->qp, &e))
			die("ibv_set_ece (server)");
	}
	move(srv, IBV_QPS_INIT);
	post_recv(srv);
	move(srv, IBV_QPS_RTR);
	move(srv, IBV_QPS_RTS);
	if (want) {
		expect_qp("external: the server's QP", srv->qp, want);
		struct ibv_ece e = { .vendor_id = 0x1ded, .options = want };
		if (rdma_set_local_ece(srv->id, &e))
			die("rdma_set_local_ece (server)");
	}
	cp.qp_num = srv->qp->qp_num;
	if (rdma_accept(srv->id, &cp))
		die("rdma_accept");
	ev = get_event(cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	rdma_ack_cm_event(ev);
	expect_remote("the client's rdma_get_remote_ece", cli->id, want ? 0x1ded : 0, want);
	if (want) {
		struct ibv_ece e = { .vendor_id = 0x1ded, .options = want };
		if (ibv_set_ece(cli->qp, &e))
			die("ibv_set_ece (client)");
	}
	move(cli, IBV_QPS_INIT);
	post_recv(cli);
	move(cli, IBV_QPS_RTR);
	move(cli, IBV_QPS_RTS);
	if (want)
		expect_qp("external: the client's QP", cli->qp, want);
	if (rdma_establish(cli->id))
		die("rdma_establish");
	rdma_ack_cm_event(get_event(sch, RDMA_CM_EVENT_ESTABLISHED));
}

static void teardown(struct end *cli, struct end *srv) {
	if (rdma_disconnect(cli->id))
		die("rdma_disconnect");
	rdma_ack_cm_event(get_event(sch, RDMA_CM_EVENT_DISCONNECTED));
	if (rdma_disconnect(srv->id))
		die("rdma_disconnect (server)");
	rdma_ack_cm_event(get_event(cch, RDMA_CM_EVENT_DISCONNECTED));
	struct end *ends[] = { cli, srv };
	for (int i = 0; i < 2; i++) {
		struct end *e = ends[i];
		if (e->cq) {
			ibv_destroy_qp(e->qp);
			ibv_destroy_cq(e->cq);
		} else {
			rdma_destroy_qp(e->id);
		}
		ibv_dereg_mr(e->mr);
		rdma_destroy_id(e->id);
	}
}

int main(int argc, char **argv) {
	if (argc != 5) {
		printf("ERROR usage: rdmacm_ece A-ADDR B-ADDR CAPS GATE\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	a_addr = in4(argv[1], 0);
	b_addr = in4(argv[2], 0);
	uint32_t caps = (uint32_t)strtoul(argv[3], NULL, 0);
	sch = rdma_create_event_channel();
	cch = rdma_create_event_channel();
	if (!sch || !cch)
		die("rdma_create_event_channel");
	if (rdma_create_id(sch, &listener, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (rdma_bind_addr(listener, (struct sockaddr *)&b_addr))
		die("rdma_bind_addr");
	if (rdma_listen(listener, 4))
		die("rdma_listen");
	static struct end cli[3], srv[3];
	const char *names[] = { "auto", "external", "plain" };
	for (int m = 0; m < 3; m++) {
		connect_pair(&cli[m], &srv[m], m, caps);
		char text[MSG];
		snprintf(text, sizeof text, "%s: client to server", names[m]);
		send_to(&cli[m], &srv[m], text);
		snprintf(text, sizeof text, "%s: server to client", names[m]);
		send_to(&srv[m], &cli[m], text);
	}
	printf("QPS %u %u %u %u %u %u\nREADY\n", cli[0].qp->qp_num, srv[0].qp->qp_num, cli[1].qp->qp_num,
	       srv[1].qp->qp_num, cli[2].qp->qp_num, srv[2].qp->qp_num);
	for (int64_t i = 0; access(argv[4], F_OK); i++) {
		if (i > 6000)
			fail("gate", "not created in 60 s");
		usleep(10000);
	}
	for (int m = 0; m < 3; m++)
		teardown(&cli[m], &srv[m]);
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
	printf("OK auto external plain\n");
	return 0;
}
