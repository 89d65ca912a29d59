/* rdmacm_bind: an rdma_cm program (only <rdma/rdma_cma.h> and
 * <infiniband/verbs.h>) that checks binding to the wildcard and loopback
 * addresses as the kernel's rdma_cm does. Arguments: the addresses of
 * devices "a" and "b" (two daemons on loopback addresses).
 *
 *   errors    an unknown port space (EINVAL), an unknown family (EINVAL),
 *             an address of no device (EADDRNOTAVAIL; ENODEV when it is
 *             a non-loopback interface's), IPv6 link-local
 *             without a scope ID (EINVAL), a second bind (EINVAL); ports:
 *             the same address and port (EADDRINUSE), the wildcard address
 *             on a port a specific address holds (EADDRNOTAVAIL), the
 *             same port in another port space (allowed), REUSEADDR on both
 *             (allowed), a listen on a port shared by REUSEADDR (EADDRINUSE
 *             at rdma_listen).
 *   wildcard  0.0.0.0 and :: bind without a device (id->verbs NULL) and
 *             get a port; a listen without a bind binds to 0.0.0.0.
 *   loopback  each daemon's own address binds to its device, another
 *             loopback address (and ::1) to the first device.
 *   passive   rdma_getaddrinfo("localhost", NULL, RAI_PASSIVE) gives a
 *             loopback source address that binds to a device and listens;
 *             a client on the other device connects to that device's
 *             address; one SEND each way; disconnect. Then the same with
 *             rdma_getaddrinfo(NULL, port, RAI_PASSIVE) (the wildcard
 *             address), connecting to device b; and a listener on a
 *             loopback address no daemon has, which a client reaches
 *             through that address (both on the first device).
 *
 * Prints "OK ..." and exits 0, or "ERROR ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>

#include "cmcheck.h"

static struct sockaddr_in a_addr, b_addr;

static struct rdma_cm_id *new_id(struct rdma_event_channel *ch, enum rdma_port_space ps) {
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, ps))
		die("rdma_create_id");
	return id;
}

/* expect_errno: ret must be -1 with errno e. */
static void expect_errno(const char *what, int ret, int e) {
	if (ret != -1 || errno != e) {
		char d[128];
		snprintf(d, sizeof d, "returned %d errno %s, want -1 %s", ret, strerror(errno), strerror(e));
		fail(what, d);
	}
}

static void expect_ok(const char *what, int ret) {
	if (ret)
		die(what);
}

static const char *dev_of(struct rdma_cm_id *id) {
	return id->verbs ? ibv_get_device_name(id->verbs->device) : "(none)";
}

static void expect_dev(const char *what, struct rdma_cm_id *id, const char *dev) {
	if (!id->verbs || strcmp(dev_of(id), dev) != 0) {
		char d[128];
		snprintf(d, sizeof d, "bound to device %s, want %s", dev_of(id), dev);
		fail(what, d);
	}
	if (!id->pd)
		fail(what, "no PD");
}

static void ack_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
	rdma_ack_cm_event(get_event(ch, want));
}

static void test_errors(void) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");
	struct rdma_cm_id *id;
	expect_errno("create_id(ps 0x999)", rdma_create_id(ch, &id, NULL, (enum rdma_port_space)0x999), EINVAL);

	id = new_id(ch, RDMA_PS_TCP);
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	expect_errno("bind(AF_UNIX)", rdma_bind_addr(id, (struct sockaddr *)&un), EINVAL);
	struct sockaddr_in nowhere = in4("192.0.2.1", 0); /* TEST-NET-1 */
	expect_errno("bind(192.0.2.1)", rdma_bind_addr(id, (struct sockaddr *)&nowhere), EADDRNOTAVAIL);
	/* An address of this host's own interfaces that no daemon has: the
	 * kernel finds its net device but no RDMA device (ENODEV). */
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) == 0) {
		for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
			if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK))
				continue;
			struct sockaddr_in own = *(struct sockaddr_in *)i->ifa_addr;
			if (own.sin_addr.s_addr == a_addr.sin_addr.s_addr || own.sin_addr.s_addr == b_addr.sin_addr.s_addr)
				continue;
			own.sin_port = 0;
			expect_errno("bind(an interface's address)", rdma_bind_addr(id, (struct sockaddr *)&own), ENODEV);
		}
		freeifaddrs(ifs);
	}
	struct sockaddr_in6 ll = { .sin6_family = AF_INET6 };
	inet_pton(AF_INET6, "fe80::1", &ll.sin6_addr);
	expect_errno("bind(fe80::1 without scope)", rdma_bind_addr(id, (struct sockaddr *)&ll), EINVAL);
	if (id->verbs)
		fail("failed bind", "left a device");
	struct sockaddr_in a = a_addr;
	a.sin_port = 0;
	expect_ok("bind(a)", rdma_bind_addr(id, (struct sockaddr *)&a));
	expect_errno("bind twice", rdma_bind_addr(id, (struct sockaddr *)&a), EINVAL);
	rdma_destroy_id(id);

	/* Port space rules. */
	uint16_t port = (uint16_t)(20000 + (time(NULL) % 10000));
	struct sockaddr_in ap = a_addr, anyp = { .sin_family = AF_INET };
	ap.sin_port = anyp.sin_port = htons(port);
	struct rdma_cm_id *owner = new_id(ch, RDMA_PS_TCP);
	expect_ok("bind(a:port)", rdma_bind_addr(owner, (struct sockaddr *)&ap));
	id = new_id(ch, RDMA_PS_TCP);
	expect_errno("bind(a:port) again", rdma_bind_addr(id, (struct sockaddr *)&ap), EADDRINUSE);
	expect_errno("bind(0.0.0.0:port)", rdma_bind_addr(id, (struct sockaddr *)&anyp), EADDRNOTAVAIL);
	struct sockaddr_in bp = b_addr;
	bp.sin_port = htons(port);
	expect_ok("bind(b:port)", rdma_bind_addr(id, (struct sockaddr *)&bp));
	rdma_destroy_id(id);
	id = new_id(ch, RDMA_PS_UDP);
	expect_ok("bind(a:port) in RDMA_PS_UDP", rdma_bind_addr(id, (struct sockaddr *)&ap));
	rdma_destroy_id(id);
	rdma_destroy_id(owner);
	/* Both allowing reuse may share the address; a listen must be alone. */
	int on = 1;
	struct rdma_cm_id *r1 = new_id(ch, RDMA_PS_TCP), *r2 = new_id(ch, RDMA_PS_TCP);
	expect_ok("REUSEADDR", rdma_set_option(r1, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on));
	expect_ok("REUSEADDR", rdma_set_option(r2, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on));
	expect_ok("bind(a:port) reuse", rdma_bind_addr(r1, (struct sockaddr *)&ap));
	expect_ok("bind(a:port) reuse again", rdma_bind_addr(r2, (struct sockaddr *)&ap));
	expect_errno("listen on a shared port", rdma_listen(r2, 1), EADDRINUSE);
	rdma_destroy_id(r1);
	rdma_destroy_id(r2);
	rdma_destroy_event_channel(ch);
}

static void test_wildcard_loopback(const char *first) {
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");
	struct rdma_cm_id *id = new_id(ch, RDMA_PS_TCP);
	struct sockaddr_in any = { .sin_family = AF_INET };
	expect_ok("bind(0.0.0.0)", rdma_bind_addr(id, (struct sockaddr *)&any));
	if (id->verbs)
		fail("bind(0.0.0.0)", "bound to a device");
	if (!rdma_get_src_port(id))
		fail("bind(0.0.0.0)", "no port");
	expect_ok("listen(0.0.0.0)", rdma_listen(id, 4));
	rdma_destroy_id(id);

	id = new_id(ch, RDMA_PS_TCP);
	struct sockaddr_in6 any6 = { .sin6_family = AF_INET6 };
	expect_ok("bind(::)", rdma_bind_addr(id, (struct sockaddr *)&any6));
	if (id->verbs)
		fail("bind(::)", "bound to a device");
	rdma_destroy_id(id);

	id = new_id(ch, RDMA_PS_TCP);
	expect_ok("listen without bind", rdma_listen(id, 4));
	struct sockaddr *s = rdma_get_local_addr(id);
	if (s->sa_family != AF_INET || ((struct sockaddr_in *)s)->sin_addr.s_addr != htonl(INADDR_ANY) ||
	    !rdma_get_src_port(id) || id->verbs)
		fail("listen without bind", "not bound to 0.0.0.0 and a port");
	rdma_destroy_id(id);

	const struct {
		struct sockaddr_in a;
		const char *dev;
	} own[] = { { a_addr, "a" }, { b_addr, "b" } };
	for (int i = 0; i < 2; i++) {
		id = new_id(ch, RDMA_PS_TCP);
		struct sockaddr_in a = own[i].a;
		a.sin_port = 0;
		expect_ok("bind(own address)", rdma_bind_addr(id, (struct sockaddr *)&a));
		expect_dev("bind(own address)", id, own[i].dev);
		rdma_destroy_id(id);
	}
	/* A loopback address no daemon has. */
	struct sockaddr_in lo = in4("127.0.0.77", 0);
	if (lo.sin_addr.s_addr == a_addr.sin_addr.s_addr || lo.sin_addr.s_addr == b_addr.sin_addr.s_addr)
		lo = in4("127.0.0.78", 0);
	id = new_id(ch, RDMA_PS_TCP);
	expect_ok("bind(other loopback)", rdma_bind_addr(id, (struct sockaddr *)&lo));
	expect_dev("bind(other loopback)", id, first);
	expect_ok("listen(other loopback)", rdma_listen(id, 4));
	rdma_destroy_id(id);
	id = new_id(ch, RDMA_PS_TCP);
	struct sockaddr_in6 lo6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	expect_ok("bind(::1)", rdma_bind_addr(id, (struct sockaddr *)&lo6));
	expect_dev("bind(::1)", id, first);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
}

/* ------------------------------------------------- a connection and SENDs */

#define MSG 64

struct end {
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	char buf[2][MSG]; /* receive, send */
};

static void setup_qp(struct end *e) {
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC, .sq_sig_all = 1 };
	if (rdma_create_qp(e->id, e->id->pd, &qa))
		die("rdma_create_qp");
	e->mr = ibv_reg_mr(e->id->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE);
	if (!e->mr)
		die("ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf[0], .length = MSG, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(e->id->qp, &wr, &bad))
		die("ibv_post_recv");
}

static void send_to(struct end *from, struct end *to, const char *text) {
	snprintf(from->buf[1], MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)from->buf[1], .length = MSG, .lkey = from->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED },
			   *bad;
	if (ibv_post_send(from->id->qp, &wr, &bad))
		die("ibv_post_send");
	wait_wc(from->id->send_cq, IBV_WC_SEND);
	wait_wc(to->id->recv_cq, IBV_WC_RECV);
	if (strcmp(to->buf[0], text) != 0)
		fail("received", to->buf[0]);
}

static void teardown(struct end *e) {
	rdma_destroy_qp(e->id);
	ibv_dereg_mr(e->mr);
	rdma_destroy_id(e->id);
}

/* connect_through binds a listener to src (a passive rdma_getaddrinfo
 * answer), expects it on device dev (NULL: none), and connects a client
 * from the other device's address to dst (a device address) on the
 * listener's port; one SEND each way, then a disconnect. */
static void connect_through(const char *what, struct sockaddr *src, const char *dev, const struct sockaddr_in *to) {
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	if (!sch || !cch)
		die("rdma_create_event_channel");
	struct rdma_cm_id *l = new_id(sch, RDMA_PS_TCP);
	expect_ok(what, rdma_bind_addr(l, src));
	if (dev)
		expect_dev(what, l, dev);
	else if (l->verbs)
		fail(what, "wildcard bound to a device");
	expect_ok("rdma_listen", rdma_listen(l, 4));
	/* The server's device: its own, or b for a wildcard listener. */
	bool on_a = dev && strcmp(dev, "a") == 0;
	struct sockaddr_in dst = on_a ? a_addr : b_addr, csrc = on_a ? b_addr : a_addr;
	if (to)
		dst = *to;
	dst.sin_port = rdma_get_src_port(l);
	csrc.sin_port = 0;
	/* A client resolving a loopback destination without a source
	 * address is on the listener's device too. */
	const char *cdev = to ? dev : on_a ? "b" : "a";

	static struct end cli, srv;
	memset(&cli, 0, sizeof cli);
	memset(&srv, 0, sizeof srv);
	cli.id = new_id(cch, RDMA_PS_TCP);
	expect_ok("rdma_resolve_addr",
		  rdma_resolve_addr(cli.id, to ? NULL : (struct sockaddr *)&csrc, (struct sockaddr *)&dst, 2000));
	ack_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
	expect_dev("client", cli.id, cdev);
	expect_ok("rdma_resolve_route", rdma_resolve_route(cli.id, 2000));
	ack_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	setup_qp(&cli);
	struct rdma_conn_param cp = { .retry_count = 7, .rnr_retry_count = 7 };
	expect_ok("rdma_connect", rdma_connect(cli.id, &cp));

	struct rdma_cm_event *ev = get_event(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	srv.id = ev->id;
	rdma_ack_cm_event(ev);
	expect_dev("connection request", srv.id, on_a ? "a" : "b");
	setup_qp(&srv);
	expect_ok("rdma_accept", rdma_accept(srv.id, &cp));
	ack_event(cch, RDMA_CM_EVENT_ESTABLISHED);
	ack_event(sch, RDMA_CM_EVENT_ESTABLISHED);

	send_to(&cli, &srv, "client to server");
	send_to(&srv, &cli, "server to client");

	/* The DREQ reaches the server, whose rdma_disconnect answers with
	 * the DREP that ends the client's side. */
	expect_ok("rdma_disconnect", rdma_disconnect(cli.id));
	ack_event(sch, RDMA_CM_EVENT_DISCONNECTED);
	expect_ok("rdma_disconnect (server)", rdma_disconnect(srv.id));
	ack_event(cch, RDMA_CM_EVENT_DISCONNECTED);
	teardown(&cli);
	teardown(&srv);
	rdma_destroy_id(l);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
}

static void test_passive(const char *first) {
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *res;
	int ret = rdma_getaddrinfo("localhost", NULL, &hints, &res);
	if (ret)
		fail("rdma_getaddrinfo(localhost, RAI_PASSIVE)", gai_strerror(ret));
	if (!res->ai_src_addr || res->ai_dst_addr || !(res->ai_flags & RAI_PASSIVE))
		fail("rdma_getaddrinfo(localhost, RAI_PASSIVE)", "no source address only");
	struct sockaddr *s = res->ai_src_addr;
	bool loop = s->sa_family == AF_INET ? (ntohl(((struct sockaddr_in *)s)->sin_addr.s_addr) >> 24) == 127
					    : IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)s)->sin6_addr);
	if (!loop)
		fail("rdma_getaddrinfo(localhost, RAI_PASSIVE)", "not a loopback address");
	/* localhost is a daemon's own address, or another loopback address
	 * (the first device). */
	const char *dev = first;
	if (s->sa_family == AF_INET && ((struct sockaddr_in *)s)->sin_addr.s_addr == a_addr.sin_addr.s_addr)
		dev = "a";
	else if (s->sa_family == AF_INET && ((struct sockaddr_in *)s)->sin_addr.s_addr == b_addr.sin_addr.s_addr)
		dev = "b";
	connect_through("bind(localhost)", s, dev, NULL);
	rdma_freeaddrinfo(res);

	char port[16];
	snprintf(port, sizeof port, "%d", 20000 + (int)(time(NULL) % 10000) + 1);
	ret = rdma_getaddrinfo(NULL, port, &hints, &res);
	if (ret)
		fail("rdma_getaddrinfo(NULL, port, RAI_PASSIVE)", gai_strerror(ret));
	s = res->ai_src_addr;
	if (!s || s->sa_family != AF_INET || ((struct sockaddr_in *)s)->sin_addr.s_addr != htonl(INADDR_ANY) ||
	    ntohs(((struct sockaddr_in *)s)->sin_port) != atoi(port))
		fail("rdma_getaddrinfo(NULL, port, RAI_PASSIVE)", "not 0.0.0.0:port");
	connect_through("bind(0.0.0.0:port)", s, NULL, NULL);
	rdma_freeaddrinfo(res);

	/* A loopback address no daemon has: the listener and a client
	 * resolving it without a source address are both on the first
	 * device (the kernel's cma_bind_loopback), and the REQ goes to that
	 * device's own GID (cma_resolve_loopback). */
	struct sockaddr_in lo = in4("127.0.0.77", 0);
	if (lo.sin_addr.s_addr == a_addr.sin_addr.s_addr || lo.sin_addr.s_addr == b_addr.sin_addr.s_addr)
		lo = in4("127.0.0.78", 0);
	connect_through("bind(other loopback)", (struct sockaddr *)&lo, first, &lo);
}

int main(int argc, char **argv) {
	if (argc != 3)
		fail("usage", "rdmacm_bind ADDR_A ADDR_B");
	setvbuf(stdout, NULL, _IONBF, 0);
	a_addr = in4(argv[1], 0);
	b_addr = in4(argv[2], 0);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2)
		fail("devices", "need a and b");
	static char first[64];
	snprintf(first, sizeof first, "%s", ibv_get_device_name(list[0]));
	ibv_free_device_list(list);

	test_errors();
	test_wildcard_loopback(first);
	test_passive(first);
	printf("OK errors wildcard loopback passive send loopback-connect\n");
	return 0;
}
