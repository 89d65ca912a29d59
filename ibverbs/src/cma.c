/* cma.c - rdma_cm IDs, event channels and connections on the daemon's CM
 * (see cma.h). */
#include "cma.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

/* g_mu guards the device list, the ID list, every channel's queue and
 * every ID's event counts; g_cond is signalled when an event is acked. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static struct cma_dev *g_devs;
static bool g_init_done;
static struct cma_id *g_ids;
static int g_epoll = -1;
static bool g_thread_started;

#define ERRNO(e) (errno = (e), -1)

static uint32_t rand24(void) {
	uint32_t v = 0;
	if (getrandom(&v, sizeof v, 0) != sizeof v)
		v = (uint32_t)rand();
	return v & 0xffffff;
}

/* ---------------------------------------------------------------- devices */

static int init_devices(void) {
	pthread_mutex_lock(&g_mu);
	if (g_init_done) {
		pthread_mutex_unlock(&g_mu);
		return g_devs ? 0 : ERRNO(ENODEV);
	}
	g_init_done = true;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct cma_dev **tail = &g_devs;
	for (int i = 0; list && i < n; i++) {
		struct cma_dev *d = calloc(1, sizeof *d);
		if (!d)
			break;
		d->ibdev = list[i];
		d->sock = -1;
		d->ev_fd = -1;
		pthread_mutex_init(&d->call_mu, NULL);
		d->verbs = ibv_open_device(list[i]);
		if (!d->verbs) {
			free(d);
			continue;
		}
		struct ibv_device_attr da;
		if (ibv_query_device(d->verbs, &da) == 0) {
			d->max_qp_rd_atom = (uint8_t)(da.max_qp_rd_atom > 255 ? 255 : da.max_qp_rd_atom);
			d->max_qp_init_rd_atom =
				(uint8_t)(da.max_qp_init_rd_atom > 255 ? 255 : da.max_qp_init_rd_atom);
		}
		struct ibv_port_attr pa;
		int ngids = 1;
		if (ibv_query_port(d->verbs, 1, &pa) == 0) {
			ngids = pa.gid_tbl_len;
			d->active_mtu = pa.active_mtu;
		}
		for (int g = 0; g < ngids && g < CMA_MAX_GIDS; g++)
			if (ibv_query_gid(d->verbs, 1, g, &d->gids[d->ngids]) == 0)
				d->ngids++;
		*tail = d;
		tail = &d->next;
	}
	/* The devices stay valid after the list is freed (vrnic's libibverbs
	 * keeps them for the process). */
	if (list)
		ibv_free_device_list(list);
	int ret = g_devs ? 0 : ERRNO(ENODEV);
	pthread_mutex_unlock(&g_mu);
	return ret;
}

/* dev_by_addr returns the device with a GID equal to a's address. */
static struct cma_dev *dev_by_addr(const struct sockaddr *a, uint8_t *gid_index) {
	union ibv_gid g;
	cma_addr_to_gid(a, &g);
	for (struct cma_dev *d = g_devs; d; d = d->next)
		for (int i = 0; i < d->ngids; i++)
			if (memcmp(d->gids[i].raw, g.raw, 16) == 0) {
				if (gid_index)
					*gid_index = (uint8_t)i;
				return d;
			}
	return NULL;
}

/* the device's first GID of a's family, as the ID's source address. */
static int dev_gid_for(struct cma_dev *d, int family, uint8_t *gid_index) {
	for (int i = 0; i < d->ngids; i++) {
		struct sockaddr_storage ss;
		if (cma_gid_to_addr(&d->gids[i], &ss) && ss.ss_family == family) {
			*gid_index = (uint8_t)i;
			return 0;
		}
	}
	return -1;
}

static void *dispatcher(void *arg);

/* dev_open opens the device's CM context on the daemon (once). */
static int dev_open(struct cma_dev *d) {
	pthread_mutex_lock(&d->call_mu);
	if (d->sock >= 0 || d->dead) {
		int ret = d->dead ? EIO : 0;
		pthread_mutex_unlock(&d->call_mu);
		return ret;
	}
	struct vr_device *vd = (struct vr_device *)d->ibdev;
	int ret = 0;
	if (vd->magic != VR_DEVICE_MAGIC) {
		ret = ENODEV; /* not a vrnic device: another libibverbs is loaded */
		goto out;
	}
	int s = vr_connect(vd->sock);
	if (s < 0) {
		ret = errno;
		goto out;
	}
	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	const char *prog = program_invocation_short_name;
	snprintf(oc.client_name, sizeof oc.client_name, "cm:%.28s", prog ? prog : "?");
	struct vrnic_resp_open_context r;
	int fds[2] = { -1, -1 };
	d->seq = 0;
	ret = vr_call_sock(s, &d->seq, VRNIC_CMD_OPEN_CONTEXT, &oc, sizeof oc, NULL, 0, &r, sizeof r, fds, 2);
	if (ret) {
		close(s);
		goto out;
	}
	close(fds[0]);
	close(fds[1]);
	int ev = -1;
	ret = vr_call_sock(s, &d->seq, VRNIC_CMD_OPEN_EVENTS, NULL, 0, NULL, 0, NULL, 0, &ev, 1);
	if (ret) {
		close(s);
		goto out;
	}
	d->sock = s;
	d->ev_fd = ev;
	pthread_mutex_lock(&g_mu);
	if (g_epoll < 0)
		g_epoll = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = d };
	if (g_epoll < 0 || epoll_ctl(g_epoll, EPOLL_CTL_ADD, ev, &ee) < 0)
		ret = errno;
	if (!ret && !g_thread_started) {
		pthread_t t;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		ret = pthread_create(&t, &at, dispatcher, NULL);
		pthread_attr_destroy(&at);
		if (!ret)
			g_thread_started = true;
	}
	pthread_mutex_unlock(&g_mu);
out:
	pthread_mutex_unlock(&d->call_mu);
	return ret;
}

/* cm_call sends a CM command on the device's CM context; 0 or an errno
 * value. */
static int cm_call(struct cma_dev *d, uint16_t op, const void *req, size_t len, void *resp, size_t resp_len) {
	int ret = dev_open(d);
	if (ret)
		return ret;
	pthread_mutex_lock(&d->call_mu);
	ret = d->dead ? EIO : vr_call_sock(d->sock, &d->seq, op, req, len, NULL, 0, resp, resp_len, NULL, 0);
	if (ret == ECONNRESET || ret == EPIPE) {
		d->dead = true;
		ret = EIO;
	}
	pthread_mutex_unlock(&d->call_mu);
	return ret;
}

static int cm_handle_call(struct cma_dev *d, uint16_t op, uint32_t handle) {
	struct vrnic_cmd_handle h = { .handle = handle };
	return cm_call(d, op, &h, sizeof h, NULL, 0);
}

static uint32_t vr_qpt(enum ibv_qp_type t) {
	switch (t) {
	case IBV_QPT_UC:
		return VRNIC_QPT_UC;
	case IBV_QPT_UD:
		return VRNIC_QPT_UD;
	default:
		return VRNIC_QPT_RC;
	}
}

static int create_handle(struct cma_dev *d, enum ibv_qp_type t, uint32_t *handle) {
	/* Every ID takes part in ECE: its events carry the peer's, its RTR
	 * attributes the agreed options (cma_ece.c). */
	struct vrnic_cmd_cm_create_id c = { .qp_type = vr_qpt(t), .flags = VRNIC_CM_ID_F_ECE };
	struct vrnic_resp_cm_id r;
	int ret = cm_call(d, VRNIC_CMD_CM_CREATE_ID, &c, sizeof c, &r, sizeof r);
	if (!ret)
		*handle = r.cm_id;
	return ret;
}

VR_EXPORT struct ibv_context **rdma_get_devices(int *num_devices) {
	init_devices();
	int n = 0;
	pthread_mutex_lock(&g_mu);
	for (struct cma_dev *d = g_devs; d; d = d->next)
		n++;
	struct ibv_context **out = calloc((size_t)n + 1, sizeof *out);
	if (out) {
		int i = 0;
		for (struct cma_dev *d = g_devs; d; d = d->next)
			out[i++] = d->verbs;
	}
	pthread_mutex_unlock(&g_mu);
	if (num_devices)
		*num_devices = out ? n : 0;
	if (!out)
		errno = ENOMEM;
	return out;
}

VR_EXPORT void rdma_free_devices(struct ibv_context **list) {
	free(list);
}

/* --------------------------------------------------------------- channels */

static struct cma_chan *chan_of(struct rdma_event_channel *ch) {
	return (struct cma_chan *)ch;
}

/* new_chan makes a channel; it takes no lock (the dispatcher makes the
 * channels of synchronous IDs' connection requests under g_mu). */
static struct rdma_event_channel *new_chan(void) {
	struct cma_chan *c = calloc(1, sizeof *c);
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->ch.fd = eventfd(0, EFD_CLOEXEC);
	if (c->ch.fd < 0) {
		free(c);
		return NULL;
	}
	return &c->ch;
}

VR_EXPORT struct rdma_event_channel *rdma_create_event_channel(void) {
	if (init_devices())
		return NULL;
	return new_chan();
}

VR_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel) {
	if (!channel)
		return;
	struct cma_chan *c = chan_of(channel);
	pthread_mutex_lock(&g_mu);
	while (c->head) {
		struct cma_event *e = c->head;
		c->head = e->next;
		free(e);
	}
	pthread_mutex_unlock(&g_mu);
	close(c->ch.fd);
	free(c);
}

/* queue_locked appends e to the channel; the eventfd counts 1 while the
 * queue is not empty (both under g_mu). */
static void queue_locked(struct cma_chan *c, struct cma_event *e) {
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	if (c->head == e) {
		uint64_t one = 1;
		ssize_t n = write(c->ch.fd, &one, sizeof one);
		(void)n;
	}
}

static void drain_locked(struct cma_chan *c) {
	struct pollfd p = { .fd = c->ch.fd, .events = POLLIN };
	if (poll(&p, 1, 0) == 1) {
		uint64_t v;
		ssize_t n = read(c->ch.fd, &v, sizeof v);
		(void)n;
	}
}

static struct cma_event *pop_locked(struct cma_chan *c) {
	struct cma_event *e = c->head;
	if (!e)
		return NULL;
	c->head = e->next;
	if (!c->head) {
		c->tail = NULL;
		drain_locked(c);
	}
	return e;
}

/* unlink_locked removes the events pred selects from c, into *out. */
static void unlink_locked(struct cma_chan *c, bool (*pred)(struct cma_event *, void *), void *arg,
			  struct cma_event **out) {
	struct cma_event **pp = &c->head, *last = NULL;
	while (*pp) {
		struct cma_event *e = *pp;
		if (pred(e, arg)) {
			*pp = e->next;
			e->next = *out;
			*out = e;
		} else {
			last = e;
			pp = &e->next;
		}
	}
	c->tail = last;
	if (!c->head)
		drain_locked(c);
}

static void post_synth(struct cma_id *id, enum rdma_cm_event_type t, int status) {
	struct cma_event *e = calloc(1, sizeof *e);
	if (!e)
		return;
	e->synth = true;
	e->owner = id;
	e->ev.id = &id->id;
	e->ev.event = t;
	e->ev.status = status;
	pthread_mutex_lock(&g_mu);
	queue_locked(chan_of(id->id.channel), e);
	pthread_mutex_unlock(&g_mu);
}

/* -------------------------------------------------------------------- IDs */

static struct cma_id *alloc_id(struct rdma_event_channel *ch, void *context, enum rdma_port_space ps,
			       enum ibv_qp_type qpt) {
	struct cma_id *id = calloc(1, sizeof *id);
	if (!id)
		return NULL;
	id->id.context = context;
	id->id.ps = ps;
	id->id.qp_type = qpt;
	id->afonly = -1;
	if (!ch) {
		ch = new_chan();
		if (!ch) {
			free(id);
			return NULL;
		}
		id->sync = true;
	}
	id->id.channel = ch;
	return id;
}

static void link_id_locked(struct cma_id *id) {
	id->next = g_ids;
	if (g_ids)
		g_ids->pprev = &id->next;
	id->pprev = &g_ids;
	g_ids = id;
}

static void unlink_id_locked(struct cma_id *id) {
	if (!id->pprev)
		return;
	*id->pprev = id->next;
	if (id->next)
		id->next->pprev = id->pprev;
	id->next = NULL;
	id->pprev = NULL;
}

/* The handle table: every daemon CM handle the library holds (an ID's
 * connection handle, each of a listener's), by device and handle, so the
 * dispatcher finds an event's ID without walking every ID (a host with
 * thousands of connections gets an event per connection and request).
 * Under g_mu. */
#define CMA_HBUCKETS 4096
static struct cma_hent *g_htab[CMA_HBUCKETS];

static unsigned hbucket(const struct cma_dev *d, uint32_t handle) {
	uint64_t k = (uint64_t)(uintptr_t)d ^ ((uint64_t)handle * 0x9e3779b97f4a7c15ull);
	return (unsigned)((k ^ (k >> 29)) % CMA_HBUCKETS);
}

static void hadd_locked(struct cma_hent *h, struct cma_dev *d, uint32_t handle, bool listener, struct cma_id *id) {
	*h = (struct cma_hent){ .dev = d, .handle = handle, .listener = listener, .id = id };
	unsigned b = hbucket(d, handle);
	h->next = g_htab[b];
	g_htab[b] = h;
}

static void hdel_locked(struct cma_hent *h) {
	if (!h->id)
		return;
	for (struct cma_hent **pp = &g_htab[hbucket(h->dev, h->handle)]; *pp; pp = &(*pp)->next)
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	h->id = NULL;
}

/* set_dev ties id to device d (under g_mu: the dispatcher reads id->dev). */
static void set_dev(struct cma_id *id, struct cma_dev *d) {
	pthread_mutex_lock(&g_mu);
	id->dev = d;
	id->id.verbs = d->verbs;
	id->id.port_num = 1;
	if (!d->pd)
		d->pd = ibv_alloc_pd(d->verbs);
	if (!id->id.pd)
		id->id.pd = d->pd;
	pthread_mutex_unlock(&g_mu);
}

static int create_id2(struct rdma_event_channel *ch, struct rdma_cm_id **out, void *context,
		      enum rdma_port_space ps, enum ibv_qp_type qpt) {
	if (!out)
		return ERRNO(EINVAL);
	if (init_devices())
		return -1;
	struct cma_id *id = alloc_id(ch, context, ps, qpt);
	if (!id)
		return ERRNO(ENOMEM);
	pthread_mutex_lock(&g_mu);
	link_id_locked(id);
	pthread_mutex_unlock(&g_mu);
	*out = &id->id;
	return 0;
}

VR_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			     enum rdma_port_space ps) {
	/* The kernel's ucma_get_qp_type: the port spaces it knows, else EINVAL. */
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB)
		return ERRNO(EINVAL);
	enum ibv_qp_type t = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
	return create_id2(channel, id, context, ps, t);
}

static bool ev_of_owner(struct cma_event *e, void *arg) {
	return e->owner == arg;
}

VR_EXPORT int rdma_destroy_id(struct rdma_cm_id *cid) {
	if (!cid)
		return ERRNO(EINVAL);
	struct cma_id *id = (struct cma_id *)cid;
	if (id->id.event) {
		rdma_ack_cm_event(id->id.event);
		id->id.event = NULL;
	}
	/* The daemon ends the connection (a handshake is rejected, an
	 * established connection gets a DREQ) and stops listening. */
	if (id->handle && id->dev)
		cm_handle_call(id->dev, VRNIC_CMD_CM_DESTROY_ID, id->handle);
	for (int i = 0; i < id->nlistens; i++)
		cm_handle_call(id->listens[i].dev, VRNIC_CMD_CM_DESTROY_ID, id->listens[i].handle);
	struct cma_event *gone = NULL;
	pthread_mutex_lock(&g_mu);
	unlink_id_locked(id);
	hdel_locked(&id->hconn);
	for (int i = 0; i < id->nlistens; i++)
		hdel_locked(&id->listens[i].h);
	id->handle = 0;
	id->nlistens = 0;
	unlink_locked(chan_of(id->id.channel), ev_of_owner, id, &gone);
	while (id->acked < id->delivered)
		pthread_cond_wait(&g_cond, &g_mu);
	pthread_mutex_unlock(&g_mu);
	/* Connection requests never handed out: their IDs go too (the daemon
	 * rejects the request). */
	while (gone) {
		struct cma_event *e = gone;
		gone = e->next;
		if (e->child)
			rdma_destroy_id(&e->child->id);
		free(e);
	}
	free(id->listens);
	free(id->qp_init_attr);
	free(id->id.route.path_rec);
	if (id->sync)
		rdma_destroy_event_channel(id->id.channel);
	free(id);
	return 0;
}

/* ------------------------------------------------------------- addresses */

static uint16_t ephemeral_port(void) {
	return (uint16_t)(32768 + rand24() % (61000 - 32768));
}

/* afonly: RDMA_OPTION_ID_AFONLY, else the kernel's default for an ID
 * bound to an address of family (rdma_bind_addr): IPv4 only for IPv4,
 * the bindv6only sysctl for IPv6. */
static bool afonly(const struct cma_id *id, int family) {
	if (id->afonly >= 0)
		return id->afonly;
	if (family != AF_INET6)
		return true;
	static int v6only = -1;
	if (v6only < 0) {
		int v = 0;
		FILE *f = fopen("/proc/sys/net/ipv6/bindv6only", "re");
		if (f) {
			if (fscanf(f, "%d", &v) != 1)
				v = 0;
			fclose(f);
		}
		v6only = v != 0;
	}
	return v6only;
}

/* check_port_locked is the kernel's cma_check_port among this program's
 * IDs bound to port in id's port space: src's address conflicts with
 * another's (EADDRINUSE) unless both allow reuse, or both are
 * address-family-only of different families; the wildcard address
 * conflicts with every address of the port (EADDRNOTAVAIL). */
static int check_port_locked(const struct cma_id *id, const struct sockaddr *src, bool reuse) {
	uint16_t port = cma_port(src);
	for (struct cma_id *c = g_ids; c; c = c->next) {
		const struct sockaddr *cs = &c->id.route.addr.src_addr;
		if (c == id || !c->bound || c->id.ps != id->id.ps || cma_port(cs) != port)
			continue;
		if (reuse && c->reuseaddr)
			continue;
		if (afonly(id, src->sa_family) && afonly(c, cs->sa_family) && src->sa_family != cs->sa_family)
			continue;
		if (cma_any(src) || cma_any(cs))
			return EADDRNOTAVAIL;
		if (cma_addr_eq(src, cs))
			return EADDRINUSE;
	}
	return 0;
}

static bool port_used_locked(const struct cma_id *id, uint16_t port) {
	for (struct cma_id *c = g_ids; c; c = c->next)
		if (c != id && c->bound && c->id.ps == id->id.ps && cma_port(&c->id.route.addr.src_addr) == port)
			return true;
	return false;
}

/* bind_port gives id its source address src, as the kernel's
 * cma_get_port: port 0 draws an ephemeral port no other ID of the port
 * space holds (cma_alloc_any_port), another port must pass
 * check_port_locked (cma_use_port). Privileged ports are the daemon's to
 * refuse (its CM checks the client's credentials when it listens). */
static int bind_port(struct cma_id *id, const struct sockaddr *src) {
	switch (id->id.ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_UDP:
	case RDMA_PS_IB:
	case RDMA_PS_IPOIB:
		break;
	default:
		return EPROTONOSUPPORT; /* cma_select_ps */
	}
	struct sockaddr_storage a;
	memset(&a, 0, sizeof a);
	memcpy(&a, src, cma_addrlen(src));
	pthread_mutex_lock(&g_mu);
	int ret = 0;
	if (!cma_port(src)) {
		ret = EADDRNOTAVAIL;
		for (int i = 0; i < 64 && ret; i++) {
			uint16_t p = ephemeral_port();
			if (!port_used_locked(id, p)) {
				cma_set_port((struct sockaddr *)&a, p);
				ret = 0;
			}
		}
	} else {
		ret = check_port_locked(id, (struct sockaddr *)&a, id->reuseaddr);
	}
	if (!ret) {
		memcpy(&id->id.route.addr.src_storage, &a, sizeof a);
		id->bound = true;
	}
	pthread_mutex_unlock(&g_mu);
	return ret;
}

/* first_gid is the index of d's first GID of family, else 0. */
static uint8_t first_gid(struct cma_dev *d, int family) {
	uint8_t gi = 0;
	if (dev_gid_for(d, family, &gi))
		gi = 0;
	return gi;
}

/* rdma_bind_addr follows the kernel's (drivers/infiniband/core/cma.c):
 * an IPv6 link-local address needs its scope ID (cma_check_linklocal:
 * EINVAL); the wildcard address leaves the ID without a device
 * (cma_any_addr: a listen then listens on every device, a resolve picks
 * one); another address binds to the device that has it as a GID
 * (cma_acquire_dev_by_src_ip). A loopback address no device has
 * (127.0.0.0/8, ::1; a daemon on a loopback address has its own) binds
 * to the first device, as cma_bind_loopback does for loopback
 * destinations, since loopback reaches every device of this host. An
 * address of this host no device has is ENODEV (the kernel finds its
 * net device but no RDMA device on it), any other EADDRNOTAVAIL
 * (rdma_translate_ip finds no net device). The port follows the port
 * space's rules (check_port). */
VR_EXPORT int rdma_bind_addr(struct rdma_cm_id *cid, struct sockaddr *addr) {
	struct cma_id *id = (struct cma_id *)cid;
	socklen_t len = cma_addrlen(addr);
	if (!id || !len || id->bound)
		return ERRNO(EINVAL);
	if (addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)addr)->sin6_addr) &&
	    !((struct sockaddr_in6 *)addr)->sin6_scope_id)
		return ERRNO(EINVAL);
	struct cma_dev *d = NULL;
	uint8_t gi = 0;
	bool other_loopback = false;
	if (!cma_any(addr)) {
		d = dev_by_addr(addr, &gi);
		if (!d && cma_loopback(addr) && g_devs) {
			d = g_devs;
			gi = first_gid(d, addr->sa_family);
			other_loopback = true;
		}
		if (!d)
			return ERRNO(cma_local_addr(addr) ? ENODEV : EADDRNOTAVAIL);
	}
	struct sockaddr_storage src;
	memset(&src, 0, sizeof src);
	memcpy(&src, addr, len);
	/* Bound to the first device for another loopback address, the ID's
	 * local address is that device's own (with the port asked for), as
	 * cma_bind_loopback gives the ID the device's GID: a program that
	 * publishes rdma_get_local_addr (libfabric's verbs provider does,
	 * for a listener bound to "localhost") publishes an address a peer
	 * on another device reaches. */
	uint8_t fgi = 0;
	if (other_loopback && !dev_gid_for(d, addr->sa_family, &fgi)) {
		uint16_t port = cma_port(addr);
		cma_gid_to_addr(&d->gids[fgi], &src);
		cma_set_port((struct sockaddr *)&src, port);
		gi = fgi;
	}
	int ret = bind_port(id, (struct sockaddr *)&src);
	if (ret)
		return ERRNO(ret);
	if (d) {
		set_dev(id, d);
		id->sgid_index = gi;
	}
	return 0;
}

/* roce_port_taken: some socket (a daemon's UDP link) holds the RoCE v2
 * port, 4791, at a's address. */
static bool roce_port_taken(const struct sockaddr *a) {
	int saved = errno, s = socket(a->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool taken = false;
	if (s >= 0) {
		struct sockaddr_storage b;
		memset(&b, 0, sizeof b);
		memcpy(&b, a, cma_addrlen(a));
		cma_set_port((struct sockaddr *)&b, 4791);
		taken = bind(s, (struct sockaddr *)&b, cma_addrlen(a)) != 0 && errno == EADDRINUSE;
		close(s);
	}
	errno = saved; /* a probe: the caller's errno is not its business */
	return taken;
}

/* route_source asks the kernel which local address it would use to reach
 * dst (a UDP socket connected to it). */
static bool route_source(const struct sockaddr *dst, struct sockaddr_storage *src) {
	int s = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return false;
	struct sockaddr_storage d;
	memcpy(&d, dst, cma_addrlen(dst));
	if (!cma_port((struct sockaddr *)&d))
		cma_set_port((struct sockaddr *)&d, 4791);
	socklen_t l = sizeof *src;
	bool ok = connect(s, (struct sockaddr *)&d, cma_addrlen(dst)) == 0 &&
		  getsockname(s, (struct sockaddr *)src, &l) == 0;
	close(s);
	return ok;
}

static void fill_ibaddr(struct cma_id *id) {
	struct rdma_addr *a = &id->id.route.addr;
	cma_addr_to_gid(&a->src_addr, &a->addr.ibaddr.sgid);
	cma_addr_to_gid(&a->dst_addr, &a->addr.ibaddr.dgid);
	a->addr.ibaddr.pkey = htobe16(0xffff);
}

VR_EXPORT int rdma_resolve_addr(struct rdma_cm_id *cid, struct sockaddr *src_addr, struct sockaddr *dst_addr,
				int timeout_ms) {
	(void)timeout_ms;
	struct cma_id *id = (struct cma_id *)cid;
	socklen_t dlen = cma_addrlen(dst_addr);
	if (!id || !dlen || (src_addr && !cma_addrlen(src_addr)))
		return ERRNO(EINVAL);
	/* As the kernel's cma_bind_addr: an unbound ID is bound first, to
	 * the source address or the wildcard address of the destination's
	 * family, which gives it its port. */
	if (!id->bound) {
		struct sockaddr_storage any;
		memset(&any, 0, sizeof any);
		any.ss_family = dst_addr->sa_family;
		if (rdma_bind_addr(cid, src_addr ? src_addr : (struct sockaddr *)&any))
			return -1;
	}
	uint16_t port = cma_port(&id->id.route.addr.src_addr);
	struct cma_dev *d = id->dev;
	uint8_t gi = id->sgid_index;
	struct cma_dev *dst_dev = dev_by_addr(dst_addr, NULL);
	/* A loopback destination that is no daemon's address (none of ours,
	 * and nothing holds the RoCE v2 port there: daemons of other
	 * programs' devices run on loopback addresses too) is this host, as
	 * the kernel's cma_resolve_loopback: the ID's device, else the
	 * first (cma_bind_loopback), and the destination GID is that
	 * device's own. */
	bool loop = !dst_dev && cma_loopback(dst_addr) && !roce_port_taken(dst_addr);
	if (!d && loop)
		d = g_devs;
	if (!d) {
		struct sockaddr_storage rs;
		if (route_source(dst_addr, &rs))
			d = dev_by_addr((struct sockaddr *)&rs, &gi);
	}
	if (!d)
		d = dst_dev; /* the destination is this host's own device */
	if (!d && g_devs && !g_devs->next)
		d = g_devs; /* one device: it is the one */
	if (!d || dev_gid_for(d, dst_addr->sa_family, &gi))
		return ERRNO(EADDRNOTAVAIL);
	if (!id->dev)
		set_dev(id, d);
	id->sgid_index = gi;
	struct sockaddr_storage src;
	cma_gid_to_addr(&d->gids[gi], &src);
	cma_set_port((struct sockaddr *)&src, port ? port : ephemeral_port());
	pthread_mutex_lock(&g_mu); /* check_port_locked reads it */
	memcpy(&id->id.route.addr.src_storage, &src, sizeof src);
	pthread_mutex_unlock(&g_mu);
	memset(&id->id.route.addr.dst_storage, 0, sizeof id->id.route.addr.dst_storage);
	memcpy(&id->id.route.addr.dst_storage, dst_addr, dlen);
	fill_ibaddr(id);
	if (loop)
		id->id.route.addr.addr.ibaddr.dgid = d->gids[gi];
	if (!id->handle) {
		uint32_t h = 0;
		int ret = create_handle(d, id->id.qp_type, &h);
		if (ret)
			return ERRNO(ret);
		pthread_mutex_lock(&g_mu); /* the dispatcher looks IDs up by handle */
		id->handle = h;
		hadd_locked(&id->hconn, d, h, false, id);
		pthread_mutex_unlock(&g_mu);
	}
	post_synth(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	return cma_complete(id);
}

VR_EXPORT int rdma_resolve_route(struct rdma_cm_id *cid, int timeout_ms) {
	(void)timeout_ms;
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !id->dev || !id->handle)
		return ERRNO(EINVAL);
	struct ibv_sa_path_rec *p = calloc(1, sizeof *p);
	if (!p)
		return ERRNO(ENOMEM);
	p->sgid = id->id.route.addr.addr.ibaddr.sgid;
	p->dgid = id->id.route.addr.addr.ibaddr.dgid;
	p->pkey = htobe16(0xffff);
	p->hop_limit = 64;
	p->traffic_class = id->tos;
	p->mtu_selector = 2;
	p->mtu = id->dev->active_mtu ? id->dev->active_mtu : IBV_MTU_1024;
	p->rate_selector = 2;
	p->packet_life_time_selector = 2;
	p->packet_life_time = 16;
	p->numb_path = 1;
	p->reversible = 1;
	free(id->id.route.path_rec);
	id->id.route.path_rec = p;
	id->id.route.num_paths = 1;
	post_synth(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	return cma_complete(id);
}

/* ---------------------------------------------------------------- QPs */

/* cm_attr_to_ibv converts the CM's attributes to libibverbs'; the agreed
 * ECE options (VRNIC_QP_ECE, which libibverbs has no mask bit for) are
 * left out: modify_to applies them with ibv_set_ece. */
static void cm_attr_to_ibv(const struct vrnic_cm_qp_attr *a, struct ibv_qp_attr *q, int *mask) {
	memset(q, 0, sizeof *q);
	q->qp_state = (enum ibv_qp_state)a->qp_state;
	q->qp_access_flags = a->qp_access_flags;
	q->path_mtu = (enum ibv_mtu)a->path_mtu;
	q->dest_qp_num = a->dest_qp_num;
	q->rq_psn = a->rq_psn;
	q->sq_psn = a->sq_psn;
	q->ah_attr.is_global = 1;
	q->ah_attr.port_num = 1;
	q->ah_attr.sl = a->sl;
	memcpy(q->ah_attr.grh.dgid.raw, a->dgid, 16);
	q->ah_attr.grh.flow_label = a->flow_label;
	q->ah_attr.grh.sgid_index = a->sgid_index;
	q->ah_attr.grh.hop_limit = a->hop_limit;
	q->ah_attr.grh.traffic_class = a->traffic_class;
	q->max_dest_rd_atomic = a->max_dest_rd_atomic;
	q->min_rnr_timer = a->min_rnr_timer;
	q->timeout = a->timeout;
	q->retry_cnt = a->retry_cnt;
	q->rnr_retry = a->rnr_retry;
	q->max_rd_atomic = a->max_rd_atomic;
	q->port_num = a->port_num ? a->port_num : 1;
	q->pkey_index = a->pkey_index;
	*mask = (int)(a->attr_mask & ~VRNIC_QP_ECE);
}

static int init_qp_attr(struct cma_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask, int *ece);

VR_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *cid, struct ibv_qp_attr *qp_attr, int *qp_attr_mask) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !qp_attr || !qp_attr_mask)
		return ERRNO(EINVAL);
	int ece;
	return init_qp_attr(id, qp_attr, qp_attr_mask, &ece);
}

/* init_qp_attr is rdma_init_qp_attr; *ece gets the agreed ECE options of
 * an RTR (the CM's VRNIC_QP_ECE), -1 when the attributes carry none. */
static int init_qp_attr(struct cma_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask, int *ece) {
	*ece = -1;
	enum ibv_qp_state st = qp_attr->qp_state;
	bool ud = id->id.qp_type == IBV_QPT_UD;
	if (st == IBV_QPS_INIT && (ud || !id->connected_once)) {
		/* No connection yet (or UD): what rdma_cm gives before one. */
		memset(qp_attr, 0, sizeof *qp_attr);
		qp_attr->qp_state = IBV_QPS_INIT;
		qp_attr->pkey_index = 0;
		qp_attr->port_num = id->id.port_num ? id->id.port_num : 1;
		*qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (ud) {
			qp_attr->qkey = RDMA_UDP_QKEY;
			*qp_attr_mask |= IBV_QP_QKEY;
		} else {
			*qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	}
	if (ud) {
		memset(qp_attr, 0, sizeof *qp_attr);
		qp_attr->qp_state = st;
		*qp_attr_mask = IBV_QP_STATE;
		if (st == IBV_QPS_RTS)
			*qp_attr_mask |= IBV_QP_SQ_PSN;
		return 0;
	}
	if (!id->dev || !id->handle)
		return ERRNO(EINVAL);
	struct vrnic_cmd_cm_init_qp_attr c = { .cm_id = id->handle, .qp_state = (uint32_t)st };
	struct vrnic_cm_qp_attr a;
	int ret = cm_call(id->dev, VRNIC_CMD_CM_INIT_QP_ATTR, &c, sizeof c, &a, sizeof a);
	if (ret)
		return ERRNO(ret);
	cm_attr_to_ibv(&a, qp_attr, qp_attr_mask);
	if (a.attr_mask & VRNIC_QP_ECE)
		*ece = a.ece_options & VRNIC_ECE_OPTIONS;
	if (st == IBV_QPS_RTR && id->tos_set)
		qp_attr->ah_attr.grh.traffic_class = id->tos;
	if (st == IBV_QPS_RTS && id->ack_timeout_set) {
		qp_attr->timeout = id->ack_timeout;
		*qp_attr_mask |= IBV_QP_TIMEOUT;
	}
	return 0;
}

static int modify_to(struct cma_id *id, enum ibv_qp_state st, int rd_override, uint32_t sq_psn, bool set_psn) {
	struct ibv_qp_attr a = { .qp_state = st };
	int mask = 0, ece;
	if (init_qp_attr(id, &a, &mask, &ece))
		return -1;
	if (ece >= 0) /* the agreed ECE options go with this RTR */
		cma_apply_ece(id, (uint32_t)ece);
	if (st == IBV_QPS_RTR && rd_override >= 0)
		a.max_dest_rd_atomic = (uint8_t)rd_override;
	if (st == IBV_QPS_RTS && rd_override >= 0)
		a.max_rd_atomic = (uint8_t)rd_override;
	if (set_psn) {
		a.sq_psn = sq_psn;
		mask |= IBV_QP_SQ_PSN;
	}
	int ret = ibv_modify_qp(id->id.qp, &a, mask);
	return ret ? ERRNO(ret) : 0;
}

static void modify_err(struct cma_id *id) {
	if (!id->id.qp)
		return;
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	ibv_modify_qp(id->id.qp, &a, IBV_QP_STATE);
}

static void destroy_cqs(struct rdma_cm_id *id) {
	if (id->recv_cq) {
		ibv_destroy_cq(id->recv_cq);
		if (id->send_cq && id->send_cq != id->recv_cq)
			ibv_destroy_cq(id->send_cq);
	} else if (id->send_cq) {
		ibv_destroy_cq(id->send_cq);
	}
	id->recv_cq = id->send_cq = NULL;
	if (id->recv_cq_channel) {
		ibv_destroy_comp_channel(id->recv_cq_channel);
		if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
			ibv_destroy_comp_channel(id->send_cq_channel);
	} else if (id->send_cq_channel) {
		ibv_destroy_comp_channel(id->send_cq_channel);
	}
	id->recv_cq_channel = id->send_cq_channel = NULL;
}

static int create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size) {
	if (recv_size) {
		id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->recv_cq_channel)
			goto err;
		id->recv_cq = ibv_create_cq(id->verbs, (int)recv_size, id, id->recv_cq_channel, 0);
		if (!id->recv_cq)
			goto err;
	}
	if (send_size) {
		id->send_cq_channel = ibv_create_comp_channel(id->verbs);
		if (!id->send_cq_channel)
			goto err;
		id->send_cq = ibv_create_cq(id->verbs, (int)send_size, id, id->send_cq_channel, 0);
		if (!id->send_cq)
			goto err;
	}
	return 0;
err:
	destroy_cqs(id);
	return -1;
}

VR_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *cid, struct ibv_qp_init_attr_ex *attr) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !attr || id->id.qp || !id->id.verbs)
		return ERRNO(EINVAL);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->id.pd;
	} else if (attr->pd->context != id->id.verbs) {
		return ERRNO(EINVAL);
	}
	if (!attr->pd)
		return ERRNO(EINVAL);
	if ((id->id.recv_cq && attr->recv_cq && id->id.recv_cq != attr->recv_cq) ||
	    (id->id.send_cq && attr->send_cq && id->id.send_cq != attr->send_cq))
		return ERRNO(EINVAL);
	if (create_cqs(&id->id, attr->send_cq || id->id.send_cq ? 0 : attr->cap.max_send_wr,
		       attr->recv_cq || id->id.recv_cq ? 0 : attr->cap.max_recv_wr))
		return -1;
	if (!attr->send_cq)
		attr->send_cq = id->id.send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->id.recv_cq;
	if (id->id.srq && !attr->srq)
		attr->srq = id->id.srq;
	struct ibv_qp *qp = ibv_create_qp_ex(id->id.verbs, attr);
	if (!qp) {
		int e = errno;
		destroy_cqs(&id->id);
		return ERRNO(e);
	}
	id->id.qp = qp;
	int ret;
	if (id->id.qp_type == IBV_QPT_UD) {
		ret = modify_to(id, IBV_QPS_INIT, -1, 0, false);
		if (!ret)
			ret = modify_to(id, IBV_QPS_RTR, -1, 0, false);
		if (!ret)
			ret = modify_to(id, IBV_QPS_RTS, -1, 0, true);
	} else {
		ret = modify_to(id, IBV_QPS_INIT, -1, 0, false);
	}
	if (ret) {
		int e = errno;
		id->id.qp = NULL;
		ibv_destroy_qp(qp);
		destroy_cqs(&id->id);
		return ERRNO(e);
	}
	id->id.pd = qp->pd;
	return 0;
}

VR_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr) {
	if (!id || !qp_init_attr)
		return ERRNO(EINVAL);
	struct ibv_qp_init_attr_ex ax;
	memset(&ax, 0, sizeof ax);
	memcpy(&ax, qp_init_attr, sizeof *qp_init_attr);
	ax.comp_mask = IBV_QP_INIT_ATTR_PD;
	ax.pd = pd ? pd : id->pd;
	int ret = rdma_create_qp_ex(id, &ax);
	memcpy(qp_init_attr, &ax, sizeof *qp_init_attr);
	return ret;
}

VR_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id) {
	if (!id)
		return;
	if (id->qp)
		ibv_destroy_qp(id->qp);
	id->qp = NULL;
	destroy_cqs(id);
}

VR_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr) {
	if (!id || !attr || !id->verbs)
		return ERRNO(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd;
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC)
		return ERRNO(EOPNOTSUPP);
	struct ibv_srq_init_attr a = { .srq_context = attr->srq_context, .attr = attr->attr };
	struct ibv_srq *srq = ibv_create_srq(attr->pd, &a);
	if (!srq)
		return -1;
	attr->attr = a.attr;
	if (!id->pd)
		id->pd = attr->pd;
	id->srq = srq;
	return 0;
}

VR_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr) {
	if (!attr)
		return ERRNO(EINVAL);
	struct ibv_srq_init_attr_ex ax;
	memset(&ax, 0, sizeof ax);
	memcpy(&ax, attr, sizeof *attr);
	ax.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	ax.srq_type = IBV_SRQT_BASIC;
	ax.pd = pd;
	int ret = rdma_create_srq_ex(id, &ax);
	memcpy(attr, &ax, sizeof *attr);
	return ret;
}

VR_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id) {
	if (!id)
		return;
	if (id->srq)
		ibv_destroy_srq(id->srq);
	id->srq = NULL;
	destroy_cqs(id);
}

/* ------------------------------------------------------------ connections */

static int put_private(uint8_t *dst, uint8_t *len, int max, const void *hdr, int hlen, const void *pd, int plen) {
	if (plen < 0 || hlen + plen > max)
		return EINVAL;
	if (hlen)
		memcpy(dst, hdr, (size_t)hlen);
	if (plen && pd)
		memcpy(dst + hlen, pd, (size_t)plen);
	*len = (uint8_t)(hlen + plen);
	return 0;
}

static void make_cma_hdr(struct cma_id *id, struct cma_hdr *h) {
	memset(h, 0, sizeof *h);
	const struct sockaddr *s = &id->id.route.addr.src_addr, *d = &id->id.route.addr.dst_addr;
	h->port = htons(cma_port(s));
	if (s->sa_family == AF_INET6) {
		h->ip_version = 6 << 4;
		memcpy(h->src, &((const struct sockaddr_in6 *)s)->sin6_addr, 16);
		memcpy(h->dst, &((const struct sockaddr_in6 *)d)->sin6_addr, 16);
	} else {
		h->ip_version = 4 << 4;
		memcpy(h->src + 12, &((const struct sockaddr_in *)s)->sin_addr, 4);
		memcpy(h->dst + 12, &((const struct sockaddr_in *)d)->sin_addr, 4);
	}
}

static uint64_t service_id(struct cma_id *id, uint16_t port) {
	return ((uint64_t)id->id.ps << 16) | port;
}

/* param_ok: the responder resources and initiator depth asked for are
 * within the device's (RDMA_MAX_*: as many as it has), as librdmacm's
 * ucma_valid_param checks for the TCP port space (only). */
static bool param_ok(const struct cma_id *id, const struct cma_dev *d, const struct rdma_conn_param *p) {
	if (id->id.ps != RDMA_PS_TCP)
		return true;
	return (p->responder_resources == RDMA_MAX_RESP_RES || p->responder_resources <= d->max_qp_rd_atom) &&
	       (p->initiator_depth == RDMA_MAX_INIT_DEPTH || p->initiator_depth <= d->max_qp_init_rd_atom);
}

VR_EXPORT int rdma_connect(struct rdma_cm_id *cid, struct rdma_conn_param *p) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !id->dev || !id->handle)
		return ERRNO(EINVAL);
	struct cma_dev *d = id->dev;
	bool ud = id->id.qp_type == IBV_QPT_UD;
	if (!ud && !id->id.qp && !p)
		return ERRNO(EINVAL);
	if (p && !ud && !param_ok(id, d, p))
		return ERRNO(EINVAL);
	id->initiator_depth =
		p && p->initiator_depth != RDMA_MAX_INIT_DEPTH ? p->initiator_depth : d->max_qp_init_rd_atom;
	id->responder_resources =
		p && p->responder_resources != RDMA_MAX_RESP_RES ? p->responder_resources : d->max_qp_rd_atom;
	struct vrnic_cmd_cm_connect c;
	memset(&c, 0, sizeof c);
	c.cm_id = id->handle;
	c.qpn = id->id.qp ? id->id.qp->qp_num : p ? p->qp_num : 0;
	c.srq = id->id.qp ? id->id.qp->srq != NULL : p ? p->srq : 0;
	/* The REQ's Starting PSN is the PSN this side expects to receive:
	 * random, as the kernel's rdma_cm draws an ID's seq_num
	 * (__rdma_create_id) and cma_connect_ib sends it; the daemon's RTR
	 * attributes give it back as rq_psn, and the peer sends from it. */
	id->psn = rand24();
	c.starting_psn = id->psn;
	c.service_id = service_id(id, cma_port(&id->id.route.addr.dst_addr));
	memcpy(c.dgid, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
	c.sgid_index = id->sgid_index;
	c.hop_limit = 64;
	c.traffic_class = id->tos;
	/* The route's MTU (the port's active MTU, rdma_resolve_route); the
	 * daemon's CM offers at most its port's. */
	if (id->id.route.path_rec)
		c.path_mtu = (uint8_t)id->id.route.path_rec->mtu;
	c.responder_resources = id->responder_resources;
	c.initiator_depth = id->initiator_depth;
	if (!ud)
		c.ece_options = cma_offer_ece(id);
	c.retry_count = p ? p->retry_count : 7;
	c.rnr_retry_count = p ? p->rnr_retry_count : 7;
	struct cma_hdr h;
	make_cma_hdr(id, &h);
	int max = ud ? VRNIC_CM_SIDR_REQ_PRIVATE_DATA : VRNIC_CM_REQ_PRIVATE_DATA;
	int ret = put_private(c.private_data, &c.private_data_len, max, &h, CMA_HDR_LEN, p ? p->private_data : NULL,
			      p ? p->private_data_len : 0);
	if (ret)
		return ERRNO(ret);
	id->connected_once = true;
	id->active = true;
	ret = cm_call(d, VRNIC_CMD_CM_CONNECT, &c, sizeof c, NULL, 0);
	if (ret)
		return ERRNO(ret);
	return cma_complete(id);
}

VR_EXPORT int rdma_listen(struct rdma_cm_id *cid, int backlog) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || id->nlistens || id->handle)
		return ERRNO(EINVAL);
	/* The kernel's rdma_listen binds an unbound ID to the IPv4 wildcard
	 * address, and a listener allowing reuse must still be alone on its
	 * address (cma_check_port without reuse). */
	if (!id->bound) {
		struct sockaddr_in any = { .sin_family = AF_INET };
		if (rdma_bind_addr(cid, (struct sockaddr *)&any))
			return -1;
	} else if (id->reuseaddr) {
		pthread_mutex_lock(&g_mu);
		int r = check_port_locked(id, &id->id.route.addr.src_addr, false);
		if (!r)
			id->reuseaddr = false;
		pthread_mutex_unlock(&g_mu);
		if (r)
			return ERRNO(r);
	}
	int n = 0;
	for (struct cma_dev *d = g_devs; d; d = d->next)
		n++;
	id->listens = calloc((size_t)n, sizeof *id->listens);
	if (!id->listens)
		return ERRNO(ENOMEM);
	uint64_t sid = service_id(id, cma_port(&id->id.route.addr.src_addr));
	int ret = ENODEV;
	for (struct cma_dev *d = g_devs; d; d = d->next) {
		if (id->dev && d != id->dev)
			continue;
		uint32_t h = 0;
		int r = create_handle(d, id->id.qp_type, &h);
		if (!r) {
			/* The kernel's ucma: 0, negative or too large means its
			 * max_backlog, 1024. */
			uint32_t bl = backlog > 0 && backlog < 1024 ? (uint32_t)backlog : 1024;
			struct vrnic_cmd_cm_listen c = { .cm_id = h, .backlog = bl, .service_id = sid };
			r = cm_call(d, VRNIC_CMD_CM_LISTEN, &c, sizeof c, NULL, 0);
			if (r)
				cm_handle_call(d, VRNIC_CMD_CM_DESTROY_ID, h);
		}
		if (!r) {
			pthread_mutex_lock(&g_mu);
			struct cma_listen *ls = &id->listens[id->nlistens++];
			ls->dev = d;
			ls->handle = h;
			hadd_locked(&ls->h, d, h, true, id);
			pthread_mutex_unlock(&g_mu);
			ret = 0;
		} else if (ret) {
			ret = r;
		}
	}
	return ret ? ERRNO(ret) : 0;
}

VR_EXPORT int rdma_accept(struct rdma_cm_id *cid, struct rdma_conn_param *p) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !id->dev || !id->handle || !id->connected_once)
		return ERRNO(EINVAL);
	struct cma_dev *d = id->dev;
	bool ud = id->id.qp_type == IBV_QPT_UD;
	if (!id->id.qp && !p)
		return ERRNO(EINVAL);
	struct vrnic_cmd_cm_accept c;
	memset(&c, 0, sizeof c);
	c.cm_id = id->handle;
	c.qpn = id->id.qp ? id->id.qp->qp_num : p->qp_num;
	c.srq = id->id.qp ? id->id.qp->srq != NULL : p->srq;
	int ret;
	if (ud) {
		c.qkey = RDMA_UDP_QKEY;
		ret = put_private(c.private_data, &c.private_data_len, VRNIC_CM_SIDR_REP_PRIVATE_DATA, NULL, 0,
				  p ? p->private_data : NULL, p ? p->private_data_len : 0);
		if (ret)
			return ERRNO(ret);
		ret = cm_call(d, VRNIC_CMD_CM_ACCEPT, &c, sizeof c, NULL, 0);
		if (ret)
			return ERRNO(ret);
		if (id->sync && id->id.event) {
			rdma_ack_cm_event(id->id.event);
			id->id.event = NULL;
		}
		return 0;
	}
	if (p && !param_ok(id, d, p))
		return ERRNO(EINVAL);
	/* As librdmacm's rdma_accept: what the peer offered (the
	 * CONNECT_REQUEST's depths, seen from this side), at most the
	 * device's, unless the program asks for its own. */
	if (!p || p->initiator_depth == RDMA_MAX_INIT_DEPTH)
		id->initiator_depth = id->initiator_depth < d->max_qp_init_rd_atom ? id->initiator_depth
										  : d->max_qp_init_rd_atom;
	else
		id->initiator_depth = p->initiator_depth;
	if (!p || p->responder_resources == RDMA_MAX_RESP_RES)
		id->responder_resources = id->responder_resources < d->max_qp_rd_atom ? id->responder_resources
											: d->max_qp_rd_atom;
	else
		id->responder_resources = p->responder_resources;
	/* The REP's Starting PSN is the PSN this side expects to receive:
	 * the rq_psn of the RTR attributes, which the daemon drew when the
	 * REQ arrived (the kernel's rdma_init_qp_attr gives the ID's seq_num,
	 * and cma_accept_ib announces the same). The RTS attributes' sq_psn
	 * is the REQ's Starting PSN, the PSN the peer expects. */
	struct ibv_qp_attr rtr = { .qp_state = IBV_QPS_RTR };
	int rtr_mask = 0;
	if (rdma_init_qp_attr(&id->id, &rtr, &rtr_mask))
		return -1;
	id->psn = rtr.rq_psn;
	if (id->id.qp) {
		/* As librdmacm (ucma_modify_qp_rtr, ucma_modify_qp_rts): INIT
		 * again with the CM's access flags, RTR, then RTS, all before the
		 * REP. */
		if (modify_to(id, IBV_QPS_INIT, -1, 0, false) ||
		    modify_to(id, IBV_QPS_RTR, id->responder_resources, 0, false) ||
		    modify_to(id, IBV_QPS_RTS, id->initiator_depth, 0, false))
			return -1;
	}
	c.starting_psn = id->psn;
	c.responder_resources = id->responder_resources;
	c.initiator_depth = id->initiator_depth;
	c.rnr_retry_count = p ? p->rnr_retry_count : 7;
	c.ece_options = cma_accept_ece(id);
	ret = put_private(c.private_data, &c.private_data_len, VRNIC_CM_REP_PRIVATE_DATA, NULL, 0,
			  p ? p->private_data : NULL, p ? p->private_data_len : 0);
	if (!ret)
		ret = cm_call(d, VRNIC_CMD_CM_ACCEPT, &c, sizeof c, NULL, 0);
	if (ret) {
		modify_err(id);
		return ERRNO(ret);
	}
	return cma_complete(id);
}

static int private_call(struct cma_id *id, uint16_t op, const void *pd, uint8_t len, int max) {
	if (!id || !id->dev || !id->handle)
		return ERRNO(EINVAL);
	struct vrnic_cmd_cm_private c;
	memset(&c, 0, sizeof c);
	c.cm_id = id->handle;
	int ret = put_private(c.private_data, &c.private_data_len, max, NULL, 0, pd, len);
	if (!ret)
		ret = cm_call(id->dev, op, &c, sizeof c, NULL, 0);
	return ret ? ERRNO(ret) : 0;
}

VR_EXPORT int rdma_reject(struct rdma_cm_id *cid, const void *private_data, uint8_t private_data_len) {
	return private_call((struct cma_id *)cid, VRNIC_CMD_CM_REJECT, private_data, private_data_len,
			    VRNIC_CM_REJ_PRIVATE_DATA);
}

VR_EXPORT int rdma_disconnect(struct rdma_cm_id *cid) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !id->id.verbs)
		return ERRNO(EINVAL);
	modify_err(id);
	if (private_call(id, VRNIC_CMD_CM_DISCONNECT, NULL, 0, VRNIC_CM_DREQ_PRIVATE_DATA)) {
		/* As the kernel's rdma_disconnect: a connection already past its
		 * disconnection (DREP sent, in TimeWait) is not an error. */
		return errno == EINVAL ? 0 : -1;
	}
	return cma_complete(id);
}

static int establish(struct cma_id *id) {
	if (!id->dev || !id->handle)
		return EINVAL;
	return cm_handle_call(id->dev, VRNIC_CMD_CM_ESTABLISH, id->handle);
}

VR_EXPORT int rdma_establish(struct rdma_cm_id *cid) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || id->id.qp)
		return ERRNO(EINVAL);
	/* The active side's RTU raises no event in the kernel's rdma_cm
	 * (ib_send_cm_rtu; cma_ib_handler reports ESTABLISHED only to the
	 * passive side, or from the REP when the ID has a QP): the daemon's
	 * ESTABLISHED that follows is not reported. UCX's rdmacm CM takes an
	 * ESTABLISHED on its client as a server's and aborts. */
	if (id->active)
		id->swallow_established = true;
	int ret = establish(id);
	if (ret && id->active)
		id->swallow_established = false;
	return ret ? ERRNO(ret) : 0;
}

VR_EXPORT int rdma_notify(struct rdma_cm_id *cid, enum ibv_event_type event) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id)
		return ERRNO(EINVAL);
	if (event != IBV_EVENT_COMM_EST)
		return 0;
	int ret = establish(id);
	return ret ? ERRNO(ret) : 0;
}

VR_EXPORT int rdma_set_option(struct rdma_cm_id *cid, int level, int optname, void *optval, size_t optlen) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || !optval)
		return ERRNO(EINVAL);
	if (level != RDMA_OPTION_ID)
		return ERRNO(ENOSYS); /* RDMA_OPTION_IB_PATH: the CM builds the path itself */
	switch (optname) {
	case RDMA_OPTION_ID_TOS:
		if (optlen != sizeof(uint8_t))
			return ERRNO(EINVAL);
		id->tos = *(uint8_t *)optval;
		id->tos_set = true;
		return 0;
	case RDMA_OPTION_ID_REUSEADDR:
		/* rdma_set_reuseaddr: before a bind, or on when not listening. */
		if (optlen != sizeof(int))
			return ERRNO(EINVAL);
		if (id->bound && (!*(int *)optval || id->nlistens))
			return ERRNO(EINVAL);
		id->reuseaddr = *(int *)optval != 0;
		return 0;
	case RDMA_OPTION_ID_AFONLY:
		/* rdma_set_afonly: idle or bound only. */
		if (optlen != sizeof(int))
			return ERRNO(EINVAL);
		if (id->nlistens || id->handle)
			return ERRNO(EINVAL);
		id->afonly = *(int *)optval != 0;
		return 0;
	case RDMA_OPTION_ID_ACK_TIMEOUT:
		if (optlen != sizeof(uint8_t) || *(uint8_t *)optval > 31)
			return ERRNO(EINVAL);
		id->ack_timeout = *(uint8_t *)optval;
		id->ack_timeout_set = true;
		return 0;
	default:
		return ERRNO(ENOSYS);
	}
}

/* ----------------------------------------------------------------- events */

static struct cma_id *find_locked(struct cma_dev *d, uint32_t handle, bool listener) {
	for (struct cma_hent *h = g_htab[hbucket(d, handle)]; h; h = h->next)
		if (h->dev == d && h->handle == handle && h->listener == listener)
			return h->id;
	return NULL;
}

/* child_of makes the ID of a connection request on listener l. */
static struct cma_id *child_of(struct cma_id *l, struct cma_dev *d, const struct vrnic_cm_event *r) {
	struct cma_id *c = alloc_id(l->sync ? NULL : l->id.channel, l->id.context, l->id.ps, l->id.qp_type);
	if (!c)
		return NULL;
	c->dev = d;
	c->id.verbs = d->verbs;
	c->id.port_num = 1;
	c->id.pd = d->pd;
	c->handle = r->cm_id;
	c->connected_once = true;
	/* The connection's addresses come from the cma_hdr of the request. */
	struct rdma_addr *a = &c->id.route.addr;
	const struct sockaddr *ls = &l->id.route.addr.src_addr;
	uint16_t lport = cma_port(ls);
	struct cma_hdr h;
	bool have_hdr = r->private_data_len >= CMA_HDR_LEN;
	if (have_hdr)
		memcpy(&h, r->private_data, sizeof h);
	if (have_hdr && (h.ip_version >> 4) == 6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)&a->src_storage, *t = (struct sockaddr_in6 *)&a->dst_storage;
		s->sin6_family = t->sin6_family = AF_INET6;
		memcpy(&s->sin6_addr, h.dst, 16);
		memcpy(&t->sin6_addr, h.src, 16);
		s->sin6_port = htons(lport);
		t->sin6_port = h.port;
	} else if (have_hdr) {
		struct sockaddr_in *s = (struct sockaddr_in *)&a->src_storage, *t = (struct sockaddr_in *)&a->dst_storage;
		s->sin_family = t->sin_family = AF_INET;
		memcpy(&s->sin_addr, h.dst + 12, 4);
		memcpy(&t->sin_addr, h.src + 12, 4);
		s->sin_port = htons(lport);
		t->sin_port = h.port;
	} else {
		/* No rdma_cm header (a plain IB CM peer): the addresses are the GIDs. */
		struct sockaddr_storage ss;
		union ibv_gid g;
		memcpy(g.raw, r->peer_gid, 16);
		if (cma_gid_to_addr(&g, &ss))
			memcpy(&a->dst_storage, &ss, sizeof ss);
		if (d->ngids && cma_gid_to_addr(&d->gids[0], &ss)) {
			cma_set_port((struct sockaddr *)&ss, lport);
			memcpy(&a->src_storage, &ss, sizeof ss);
		}
	}
	fill_ibaddr(c);
	memcpy(a->addr.ibaddr.dgid.raw, r->peer_gid, 16);
	uint8_t gi = 0;
	if (dev_by_addr(&a->src_addr, &gi) == d)
		c->sgid_index = gi;
	/* From the passive side's view (as the kernel reports it), kept as
	 * librdmacm's ucma_process_conn_req keeps the event's: rdma_accept
	 * clamps them to the device's when the program does not choose. */
	c->initiator_depth = r->responder_resources;
	c->responder_resources = r->initiator_depth;
	return c;
}

/* dispatch queues one CM event read from device d's event socket, with
 * the ECE of the REQ or REP it reports (zero for none). */
static void dispatch(struct cma_dev *d, const struct vrnic_cm_event *r, const struct vrnic_cm_ece *ece) {
	struct cma_event *e = calloc(1, sizeof *e);
	if (!e)
		return;
	e->raw = *r;
	e->peer_ece = *ece;
	uint32_t orphan = 0;
	pthread_mutex_lock(&g_mu);
	if (r->event_type == VRNIC_CM_EVENT_CONNECT_REQUEST) {
		struct cma_id *l = find_locked(d, r->listen_id, true);
		struct cma_id *c = l ? child_of(l, d, r) : NULL;
		if (c) {
			link_id_locked(c);
			hadd_locked(&c->hconn, d, c->handle, false, c);
			e->owner = l;
			e->child = c;
			queue_locked(chan_of(l->id.channel), e);
			e = NULL;
		} else {
			orphan = r->cm_id;
		}
	} else {
		struct cma_id *id = find_locked(d, r->cm_id, false);
		if (id) {
			e->owner = id;
			queue_locked(chan_of(id->id.channel), e);
			e = NULL;
		}
	}
	pthread_mutex_unlock(&g_mu);
	free(e);
	if (orphan) /* nobody listens any more: the daemon rejects it */
		cm_handle_call(d, VRNIC_CMD_CM_DESTROY_ID, orphan);
}

/* device_gone reports DEVICE_REMOVAL to every ID on d. */
static void device_gone(struct cma_dev *d) {
	pthread_mutex_lock(&d->call_mu);
	d->dead = true;
	pthread_mutex_unlock(&d->call_mu);
	pthread_mutex_lock(&g_mu);
	for (struct cma_id *id = g_ids; id; id = id->next) {
		bool on = id->dev == d;
		for (int i = 0; i < id->nlistens; i++)
			on |= id->listens[i].dev == d;
		if (!on)
			continue;
		struct cma_event *e = calloc(1, sizeof *e);
		if (!e)
			continue;
		e->synth = true;
		e->owner = id;
		e->ev.id = &id->id;
		e->ev.event = RDMA_CM_EVENT_DEVICE_REMOVAL;
		queue_locked(chan_of(id->id.channel), e);
	}
	pthread_mutex_unlock(&g_mu);
}

static void *dispatcher(void *arg) {
	(void)arg;
	struct epoll_event evs[8];
	for (;;) {
		int n = epoll_wait(g_epoll, evs, 8, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return NULL;
		}
		for (int i = 0; i < n; i++) {
			struct cma_dev *d = evs[i].data.ptr;
			/* The IDs take part in ECE: their events are struct
			 * vrnic_cm_event_ece (struct vrnic_cm_event before). */
			struct vrnic_cm_event_ece r;
			ssize_t got = recv(d->ev_fd, &r, sizeof r, MSG_DONTWAIT);
			if (got < 0 && (errno == EAGAIN || errno == EINTR))
				continue;
			if (got <= 0) { /* end of file: the daemon is gone */
				epoll_ctl(g_epoll, EPOLL_CTL_DEL, d->ev_fd, NULL);
				device_gone(d);
				continue;
			}
			if ((size_t)got == sizeof r && r.ev.event_type >= VRNIC_CM_EVENT_BASE) {
				dispatch(d, &r.ev, &r.peer_ece);
			} else if ((size_t)got == sizeof r.ev && r.ev.event_type >= VRNIC_CM_EVENT_BASE) {
				struct vrnic_cm_ece none = { 0 };
				dispatch(d, &r.ev, &none);
			}
			/* Anything else (an asynchronous event of the CM context,
			 * which has no QPs) is not for rdma_cm. */
		}
	}
}

static void copy_conn(struct cma_event *e, bool swap) {
	struct rdma_conn_param *c = &e->ev.param.conn;
	const struct vrnic_cm_event *r = &e->raw;
	if (swap) {
		c->responder_resources = r->initiator_depth;
		c->initiator_depth = r->responder_resources;
	} else {
		c->responder_resources = r->responder_resources;
		c->initiator_depth = r->initiator_depth;
	}
	c->retry_count = r->retry_count;
	c->rnr_retry_count = r->rnr_retry_count;
	c->srq = r->srq;
	c->qp_num = r->peer_qpn;
}

static void set_private(struct cma_event *e, int skip, bool ud) {
	int len = e->raw.private_data_len - skip;
	if (len < 0)
		len = 0;
	if (len > VRNIC_CM_MAX_PRIVATE_DATA)
		len = VRNIC_CM_MAX_PRIVATE_DATA;
	if (len)
		memcpy(e->pd, e->raw.private_data + skip, (size_t)len);
	if (ud) {
		e->ev.param.ud.private_data = len ? e->pd : NULL;
		e->ev.param.ud.private_data_len = (uint8_t)len;
	} else {
		e->ev.param.conn.private_data = len ? e->pd : NULL;
		e->ev.param.conn.private_data_len = (uint8_t)len;
	}
}

/* process turns a queued event into what the program sees; it returns
 * false for an event the program must not see. */
static bool process(struct cma_event *e) {
	if (e->synth)
		return true;
	const struct vrnic_cm_event *r = &e->raw;
	struct cma_id *id = e->owner;
	bool ud = id->id.qp_type == IBV_QPT_UD;
	e->ev.id = &id->id;
	e->ev.event = (enum rdma_cm_event_type)(r->event_type - VRNIC_CM_EVENT_BASE);
	e->ev.status = (int)r->status;
	switch (r->event_type) {
	case VRNIC_CM_EVENT_CONNECT_REQUEST:
		if (!e->child->id.pd)
			set_dev(e->child, e->child->dev);
		e->ev.id = &e->child->id;
		e->ev.listen_id = &id->id;
		e->child->remote_ece = (struct ibv_ece){ .vendor_id = e->peer_ece.vendor_id,
			.options = e->peer_ece.options };
		if (ud) {
			set_private(e, CMA_HDR_LEN, true);
			e->ev.param.ud.qp_num = r->peer_qpn;
			e->ev.param.ud.qkey = r->peer_qkey;
		} else {
			copy_conn(e, true);
			set_private(e, CMA_HDR_LEN, false);
		}
		return true;
	case VRNIC_CM_EVENT_CONNECT_RESPONSE:
		if (ud) {
			/* The SIDR_REP: the peer's QP and Q_Key, and how to reach it. */
			e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
			struct rdma_ud_param *u = &e->ev.param.ud;
			set_private(e, 0, true);
			u->qp_num = r->peer_qpn;
			u->qkey = r->peer_qkey;
			u->ah_attr.is_global = 1;
			u->ah_attr.port_num = 1;
			memcpy(u->ah_attr.grh.dgid.raw, id->id.route.addr.addr.ibaddr.dgid.raw, 16);
			u->ah_attr.grh.sgid_index = id->sgid_index;
			u->ah_attr.grh.hop_limit = 64;
			u->ah_attr.grh.traffic_class = id->tos;
			return true;
		}
		copy_conn(e, true);
		set_private(e, 0, false);
		id->remote_ece = (struct ibv_ece){ .vendor_id = e->peer_ece.vendor_id, .options = e->peer_ece.options };
		if (!id->id.qp)
			return true; /* the program moves its QP and calls rdma_establish */
		if (modify_to(id, IBV_QPS_INIT, -1, 0, false) || modify_to(id, IBV_QPS_RTR, -1, 0, false) ||
		    modify_to(id, IBV_QPS_RTS, -1, 0, false)) {
			e->ev.status = -errno;
			e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
			modify_err(id);
			return true;
		}
		int ret = establish(id);
		if (ret) {
			e->ev.status = -ret;
			e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
			modify_err(id);
			return true;
		}
		/* Reported as ESTABLISHED with the REP's data; the daemon's own
		 * ESTABLISHED that follows the RTU is not reported again. */
		id->swallow_established = true;
		e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
		return true;
	case VRNIC_CM_EVENT_ESTABLISHED:
		if (id->swallow_established) {
			id->swallow_established = false;
			return false;
		}
		return true;
	case VRNIC_CM_EVENT_REJECTED:
		modify_err(id);
		if (ud)
			set_private(e, 0, true);
		else
			set_private(e, 0, false);
		return true;
	case VRNIC_CM_EVENT_UNREACHABLE:
		if (r->status == ETIMEDOUT)
			e->ev.status = -ETIMEDOUT;
		return true;
	case VRNIC_CM_EVENT_DISCONNECTED:
		e->ev.status = 0;
		if (!ud)
			set_private(e, 0, false);
		return true;
	default:
		e->ev.status = 0;
		return true;
	}
}

VR_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event) {
	if (!channel || !event)
		return ERRNO(EINVAL);
	struct cma_chan *c = chan_of(channel);
	for (;;) {
		pthread_mutex_lock(&g_mu);
		struct cma_event *e = pop_locked(c);
		if (e)
			e->owner->delivered++;
		pthread_mutex_unlock(&g_mu);
		if (e) {
			if (process(e)) {
				*event = &e->ev;
				return 0;
			}
			rdma_ack_cm_event(&e->ev);
			continue;
		}
		int fl = fcntl(c->ch.fd, F_GETFL);
		if (fl >= 0 && (fl & O_NONBLOCK))
			return ERRNO(EAGAIN);
		struct pollfd p = { .fd = c->ch.fd, .events = POLLIN };
		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -1;
	}
}

VR_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event) {
	if (!event)
		return ERRNO(EINVAL);
	struct cma_event *e = (struct cma_event *)event;
	pthread_mutex_lock(&g_mu);
	e->owner->acked++;
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_mu);
	free(e);
	return 0;
}

/* cma_complete: for an ID without a channel of the program's (sync),
 * wait for the event that ends the operation, keep it in id->event, and
 * fail as the event says. */
int cma_complete(struct cma_id *id) {
	if (!id->sync)
		return 0;
	if (id->id.event) {
		rdma_ack_cm_event(id->id.event);
		id->id.event = NULL;
	}
	if (rdma_get_cm_event(id->id.channel, &id->id.event))
		return -1;
	struct rdma_cm_event *ev = id->id.event;
	if (ev->status) {
		if (ev->event == RDMA_CM_EVENT_REJECTED)
			return ERRNO(ECONNREFUSED);
		return ERRNO(ev->status < 0 ? -ev->status : ev->status);
	}
	if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
		return ERRNO(ENODEV);
	return 0;
}

VR_EXPORT int rdma_migrate_id(struct rdma_cm_id *cid, struct rdma_event_channel *channel) {
	struct cma_id *id = (struct cma_id *)cid;
	if (!id || (id->sync && !channel))
		return ERRNO(EINVAL);
	bool sync = channel == NULL;
	if (sync) {
		channel = rdma_create_event_channel();
		if (!channel)
			return -1;
	}
	if (id->sync && id->id.event) {
		rdma_ack_cm_event(id->id.event);
		id->id.event = NULL;
	}
	struct rdma_event_channel *old = id->id.channel;
	bool was_sync = id->sync;
	struct cma_event *moved = NULL;
	pthread_mutex_lock(&g_mu);
	unlink_locked(chan_of(old), ev_of_owner, id, &moved);
	/* Keep their order on the new channel. */
	struct cma_event *rev = NULL;
	while (moved) {
		struct cma_event *e = moved;
		moved = e->next;
		e->next = rev;
		rev = e;
	}
	while (rev) {
		struct cma_event *e = rev;
		rev = e->next;
		queue_locked(chan_of(channel), e);
	}
	id->id.channel = channel;
	id->sync = sync;
	while (id->acked < id->delivered)
		pthread_cond_wait(&g_cond, &g_mu);
	pthread_mutex_unlock(&g_mu);
	if (was_sync)
		rdma_destroy_event_channel(old);
	return 0;
}

VR_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **out) {
	struct cma_id *l = (struct cma_id *)listen;
	if (!l || !out || !l->sync)
		return ERRNO(EINVAL);
	if (l->id.event) {
		rdma_ack_cm_event(l->id.event);
		l->id.event = NULL;
	}
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(l->id.channel, &ev))
		return -1;
	int err = 0;
	if (ev->status)
		err = ev->status < 0 ? -ev->status : ev->status;
	else if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		err = EINVAL;
	if (!err && l->qp_init_attr) {
		struct ibv_qp_init_attr a = *l->qp_init_attr;
		if (rdma_create_qp(ev->id, l->id.pd, &a))
			err = errno;
	}
	if (err) {
		l->id.event = ev;
		return ERRNO(err);
	}
	*out = ev->id;
	(*out)->event = ev;
	return 0;
}

/* ------------------------------------------------------------- endpoints */

VR_EXPORT int rdma_create_ep(struct rdma_cm_id **out, struct rdma_addrinfo *res, struct ibv_pd *pd,
			     struct ibv_qp_init_attr *qp_init_attr) {
	if (!out || !res)
		return ERRNO(EINVAL);
	struct rdma_cm_id *cid;
	int ps = res->ai_port_space ? res->ai_port_space : RDMA_PS_TCP;
	enum ibv_qp_type qpt = res->ai_qp_type ? (enum ibv_qp_type)res->ai_qp_type : IBV_QPT_RC;
	if (create_id2(NULL, &cid, NULL, (enum rdma_port_space)ps, qpt))
		return -1;
	struct cma_id *id = (struct cma_id *)cid;
	if (res->ai_flags & RAI_PASSIVE) {
		if (!res->ai_src_addr || rdma_bind_addr(cid, res->ai_src_addr))
			goto err;
		if (pd)
			cid->pd = pd;
		if (qp_init_attr) {
			id->qp_init_attr = malloc(sizeof *qp_init_attr);
			if (!id->qp_init_attr) {
				errno = ENOMEM;
				goto err;
			}
			*id->qp_init_attr = *qp_init_attr;
			id->qp_init_attr->qp_type = qpt;
		}
		*out = cid;
		return 0;
	}
	if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000) || rdma_resolve_route(cid, 2000))
		goto err;
	if (qp_init_attr) {
		qp_init_attr->qp_type = qpt;
		if (rdma_create_qp(cid, pd, qp_init_attr))
			goto err;
	}
	*out = cid;
	return 0;
err: {
	int e = errno;
	rdma_destroy_ep(cid);
	return ERRNO(e);
}
}

VR_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id) {
	if (!id)
		return;
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}
