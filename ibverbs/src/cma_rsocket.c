/* cma_rsocket.c - rsockets: stream sockets over RC QPs (<rdma/rsocket.h>).
 *
 * The protocol is librdmacm's (cma_rsocket.h); the code is vrnic's. An
 * rsocket is a synchronous rdma_cm_id (its own event channel) whose
 * channel fd, a real eventfd, is the socket's number: rpoll and the
 * preload library's fd table need numbers no other fd has.
 *
 * Per rsocket: one mapped area holds the send buffer (plus the slots of
 * control messages), the receive buffer and the target SGL with the iomap
 * table, registered as one MR (local and remote write). Areas are pooled
 * per process and reused by later rsockets, because every new range of
 * memory the library registers costs a host memory region in the daemon.
 *
 * Locks: slock serializes senders, rlock receivers (each held for a whole
 * call); mu guards the rest and is dropped only while a caller sleeps in
 * poll() on the completion channel and the CM channel (both kept
 * O_NONBLOCK: blocking calls are built from poll). Order: slock or rlock,
 * then mu; g_mu (the table) is taken alone. */
#include "cma.h"
#include "cma_rsocket.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#define ERRNO(e) (errno = (e), -1)

_Static_assert(sizeof(struct rs_conn_data) == 40, "rs_conn_data is 40 bytes");
_Static_assert(sizeof(struct rs_iomap) == 24, "rs_iomap is 24 bytes");

enum {
	RS_INIT = 0,
	RS_BOUND = 0x1,
	RS_LISTENING = 0x2,
	RS_OPENING = 0x4,
	RS_RESOLVING_ADDR = RS_OPENING | 0x10,
	RS_RESOLVING_ROUTE = RS_OPENING | 0x20,
	RS_CONNECTING = RS_OPENING | 0x40,
	RS_ACCEPTING = RS_OPENING | 0x80,
	RS_CONNECTED = 0x100,
	RS_WRITABLE = 0x200,
	RS_READABLE = 0x400,
	RS_CONNECT_RDWR = RS_CONNECTED | RS_READABLE | RS_WRITABLE,
	RS_CONNECT_ERROR = 0x800,
	RS_DISCONNECTED = 0x1000,
	RS_ERROR = 0x2000,
};

#define RS_OPT_SWAP_SGL 1

#define WR_RECV (1ull << 63)

struct rs_msg {
	uint32_t op, data;
};

struct rs_iomr {
	struct rs_iomr *next;
	uint64_t offset;
	struct ibv_mr *mr;
	int index; /* in the peer's iomap table; -1: local only */
	bool pending;
};

struct rs {
	int index;
	pthread_mutex_t slock, rlock, mu;
	struct rdma_cm_id *cm_id;
	int state, err, opts, fs_flags, fd_flags;
	uint32_t so_opts, tcp_opts;
	struct sockaddr_storage dst;
	bool keepalive;
	unsigned keepalive_time;
	uint64_t ka_next;
	struct linger linger;

	uint32_t sbuf_size, rbuf_size;
	uint16_t sq_size, rq_size;
	uint32_t sq_inline;
	int target_iomap_size;

	unsigned ctrl_seqno, ctrl_max_seqno;
	uint16_t sseq_no, sseq_comp, rseq_no, rseq_comp;
	int remote_sge;
	struct rs_sge remote_sgl, remote_iomap;
	int target_sge;
	volatile struct rs_sge *target_sgl;
	struct rs_iomap *target_iomap;

	int rbuf_bytes_avail, rbuf_free_offset, rbuf_offset;
	uint8_t *area, *sbuf, *rbuf;
	size_t area_len;
	struct ibv_mr *mr;
	int sbuf_bytes_avail;
	struct ibv_sge ssgl[2];
	int sqe_avail;
	int rmsg_head, rmsg_tail;
	struct rs_msg *rmsg;
	bool cq_armed;
	int unack_cqe;

	struct rs_iomr *iomaps;
	bool iomap_pending;
	bool *remote_slot_used;
};

static bool rs_trace(void) {
	static int on = -1;
	if (on < 0)
		on = getenv("VRNIC_RS_TRACE") != NULL;
	return on;
}
#define TRACE(...) (rs_trace() ? (void)fprintf(stderr, "rsocket: " __VA_ARGS__) : (void)0)

/* ------------------------------------------------------------ the table */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rs **g_tab;
static int g_cap;

static int tab_set(int fd, struct rs *rs) {
	pthread_mutex_lock(&g_mu);
	if (fd >= g_cap) {
		int cap = g_cap ? g_cap : 1024;
		while (cap <= fd)
			cap *= 2;
		struct rs **t = realloc(g_tab, (size_t)cap * sizeof *t);
		if (!t) {
			pthread_mutex_unlock(&g_mu);
			return ERRNO(ENOMEM);
		}
		memset(t + g_cap, 0, (size_t)(cap - g_cap) * sizeof *t);
		g_tab = t;
		g_cap = cap;
	}
	g_tab[fd] = rs;
	pthread_mutex_unlock(&g_mu);
	return 0;
}

static struct rs *lookup(int fd) {
	struct rs *rs = NULL;
	pthread_mutex_lock(&g_mu);
	if (fd >= 0 && fd < g_cap)
		rs = g_tab[fd];
	pthread_mutex_unlock(&g_mu);
	if (!rs)
		TRACE("lookup(%d): not an rsocket\n", fd);
	return rs;
}

static void tab_del(struct rs *rs) {
	pthread_mutex_lock(&g_mu);
	if (rs->index >= 0 && rs->index < g_cap && g_tab[rs->index] == rs)
		g_tab[rs->index] = NULL;
	pthread_mutex_unlock(&g_mu);
}

/* ------------------------------------------------------ buffer areas */

struct rs_area {
	void *p;
	size_t len;
	struct rs_area *next;
};

static pthread_mutex_t g_area_mu = PTHREAD_MUTEX_INITIALIZER;
static struct rs_area *g_areas;

static void *area_get(size_t len) {
	pthread_mutex_lock(&g_area_mu);
	for (struct rs_area **pp = &g_areas; *pp; pp = &(*pp)->next)
		if ((*pp)->len == len) {
			struct rs_area *a = *pp;
			*pp = a->next;
			pthread_mutex_unlock(&g_area_mu);
			void *p = a->p;
			free(a);
			return p;
		}
	pthread_mutex_unlock(&g_area_mu);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void area_put(void *p, size_t len) {
	struct rs_area *a = malloc(sizeof *a);
	if (!a) {
		munmap(p, len);
		return;
	}
	a->p = p;
	a->len = len;
	pthread_mutex_lock(&g_area_mu);
	a->next = g_areas;
	g_areas = a;
	pthread_mutex_unlock(&g_area_mu);
}

/* ------------------------------------------------------------- helpers */

static uint64_t now_us(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -1;
	return fl & O_NONBLOCK ? 0 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int cm_fd(struct rs *rs) { return rs->cm_id->channel->fd; }

static int comp_fd(struct rs *rs) { return rs->cm_id->recv_cq_channel ? rs->cm_id->recv_cq_channel->fd : -1; }

static bool nonblocking(struct rs *rs, int flags) { return (rs->fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

static struct rs *rs_alloc(const struct rs *parent) {
	struct rs *rs = calloc(1, sizeof *rs);
	if (!rs)
		return NULL;
	rs->index = -1;
	pthread_mutex_init(&rs->slock, NULL);
	pthread_mutex_init(&rs->rlock, NULL);
	pthread_mutex_init(&rs->mu, NULL);
	if (parent) {
		rs->sbuf_size = parent->sbuf_size;
		rs->rbuf_size = parent->rbuf_size;
		rs->sq_size = parent->sq_size;
		rs->rq_size = parent->rq_size;
		rs->sq_inline = parent->sq_inline;
		rs->target_iomap_size = parent->target_iomap_size;
		rs->so_opts = parent->so_opts;
		rs->tcp_opts = parent->tcp_opts;
		rs->keepalive_time = parent->keepalive_time;
		rs->fs_flags = parent->fs_flags;
		rs->fd_flags = parent->fd_flags;
		rs->linger = parent->linger;
	} else {
		rs->sbuf_size = 1 << 17;
		rs->rbuf_size = 1 << 17;
		rs->sq_size = 384;
		rs->rq_size = 384;
		rs->sq_inline = 64;
	}
	rs->ctrl_max_seqno = RS_QP_CTRL_SIZE;
	return rs;
}

static void rs_free(struct rs *rs) {
	tab_del(rs);
	for (struct rs_iomr *m = rs->iomaps, *n; m; m = n) {
		n = m->next;
		ibv_dereg_mr(m->mr);
		free(m);
	}
	free(rs->remote_slot_used);
	if (rs->mr)
		ibv_dereg_mr(rs->mr);
	if (rs->area)
		area_put(rs->area, rs->area_len);
	free(rs->rmsg);
	if (rs->cm_id) {
		if (rs->cm_id->qp) {
			if (rs->unack_cqe)
				ibv_ack_cq_events(rs->cm_id->recv_cq, (unsigned)rs->unack_cqe);
			rdma_destroy_qp(rs->cm_id);
		}
		rdma_destroy_id(rs->cm_id);
	}
	pthread_mutex_destroy(&rs->slock);
	pthread_mutex_destroy(&rs->rlock);
	pthread_mutex_destroy(&rs->mu);
	free(rs);
}

/* --------------------------------------------------------- endpoint */

static int create_ep(struct rs *rs) {
	struct rdma_cm_id *id = rs->cm_id;
	if (rs->sq_size < RS_QP_MIN_SIZE)
		rs->sq_size = RS_QP_MIN_SIZE;
	if (rs->rq_size < RS_QP_MIN_SIZE)
		rs->rq_size = RS_QP_MIN_SIZE;
	struct ibv_device_attr da;
	if (!ibv_query_device(id->verbs, &da) && da.max_qp_wr > 0) {
		int m = da.max_qp_wr < RS_QP_MAX_SIZE ? da.max_qp_wr : RS_QP_MAX_SIZE;
		if (rs->sq_size > m)
			rs->sq_size = (uint16_t)m;
		if (rs->rq_size > m)
			rs->rq_size = (uint16_t)m;
	}
	if (rs->rbuf_size < 2 * RS_SNDLOWAT)
		rs->rbuf_size = 2 * RS_SNDLOWAT;
	if (rs->sbuf_size < 2 * RS_SNDLOWAT)
		rs->sbuf_size = 2 * RS_SNDLOWAT;
	rs->rbuf_size &= ~1u;

	id->recv_cq_channel = ibv_create_comp_channel(id->verbs);
	if (!id->recv_cq_channel)
		return -1;
	if (set_nonblock(id->recv_cq_channel->fd))
		return -1;
	id->recv_cq = ibv_create_cq(id->verbs, rs->sq_size + rs->rq_size, id, id->recv_cq_channel, 0);
	if (!id->recv_cq)
		return -1;
	id->send_cq_channel = id->recv_cq_channel;
	id->send_cq = id->recv_cq;

	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.qp_context = rs;
	qa.send_cq = id->send_cq;
	qa.recv_cq = id->recv_cq;
	qa.qp_type = IBV_QPT_RC;
	qa.sq_sig_all = 1;
	qa.cap.max_send_wr = rs->sq_size;
	qa.cap.max_recv_wr = rs->rq_size;
	qa.cap.max_send_sge = 2;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = rs->sq_inline;
	if (rdma_create_qp(id, NULL, &qa))
		return -1;
	rs->sq_inline = qa.cap.max_inline_data;

	/* The area: send buffer, control message slots, receive buffer,
	 * target SGL and iomap table. */
	size_t ctrl = (size_t)RS_MAX_CTRL_MSG * RS_QP_CTRL_SIZE;
	size_t tlen = sizeof(struct rs_sge) * RS_SGL_SIZE + sizeof(struct rs_iomap) * (size_t)rs->target_iomap_size;
	size_t len = rs->sbuf_size + ctrl + rs->rbuf_size + tlen;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	len = (len + pg - 1) & ~(pg - 1);
	rs->area = area_get(len);
	if (!rs->area)
		return ERRNO(ENOMEM);
	rs->area_len = len;
	memset(rs->area, 0, len);
	rs->sbuf = rs->area;
	rs->rbuf = rs->area + rs->sbuf_size + ctrl;
	rs->target_sgl = (volatile struct rs_sge *)(rs->rbuf + rs->rbuf_size);
	if (rs->target_iomap_size)
		rs->target_iomap = (struct rs_iomap *)(rs->rbuf + rs->rbuf_size + sizeof(struct rs_sge) * RS_SGL_SIZE);
	rs->mr = ibv_reg_mr(id->pd, rs->area, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!rs->mr)
		return -1;
	rs->rmsg = calloc((size_t)rs->rq_size + 1, sizeof *rs->rmsg);
	if (!rs->rmsg)
		return ERRNO(ENOMEM);

	rs->ssgl[0].addr = rs->ssgl[1].addr = (uintptr_t)rs->sbuf;
	rs->ssgl[0].lkey = rs->ssgl[1].lkey = rs->mr->lkey;
	rs->sbuf_bytes_avail = (int)rs->sbuf_size;
	rs->rbuf_free_offset = (int)(rs->rbuf_size >> 1);
	rs->rbuf_bytes_avail = (int)(rs->rbuf_size >> 1);
	rs->sqe_avail = rs->sq_size - (int)rs->ctrl_max_seqno;
	rs->rseq_comp = rs->rq_size >> 1;

	for (int i = 0; i < rs->rq_size; i++) {
		struct ibv_recv_wr wr = { .wr_id = WR_RECV }, *bad;
		int ret = ibv_post_recv(id->qp, &wr, &bad);
		if (ret)
			return ERRNO(ret);
	}
	return 0;
}

static void conn_data_of(struct rs *rs, struct rs_conn_data *c) {
	rs_conn_data_put(c, rs->rq_size, rs->target_iomap_size, (uintptr_t)rs->target_sgl, rs->mr->rkey,
			 (uintptr_t)rs->rbuf, rs->mr->rkey, rs->rbuf_size >> 1);
}

static int save_conn_data(struct rs *rs, const void *pd, int len) {
	struct rs_conn_data c;
	if (!pd || len < (int)sizeof c)
		return ERRNO(ECONNREFUSED);
	memcpy(&c, pd, sizeof c);
	if (c.version != RS_PROTO_VERSION)
		return ERRNO(ENOTSUP);
	rs->remote_sgl.addr = be64toh(c.target_sgl.addr);
	rs->remote_sgl.length = be32toh(c.target_sgl.length);
	rs->remote_sgl.key = be32toh(c.target_sgl.key);
	if (rs->remote_sgl.length == 0)
		rs->remote_sgl.length = RS_SGL_SIZE;
	rs->remote_sge = 1;
	bool peer_net = c.flags & RS_CONN_FLAG_NET, we_net = __BYTE_ORDER == __BIG_ENDIAN;
	if (peer_net != we_net)
		rs->opts |= RS_OPT_SWAP_SGL;
	if (c.flags & RS_CONN_FLAG_IOMAP) {
		rs->remote_iomap.addr = rs->remote_sgl.addr + sizeof(struct rs_sge) * rs->remote_sgl.length;
		rs->remote_iomap.length = (uint32_t)rs_scale_to_value(c.target_iomap_size, 8);
		rs->remote_iomap.key = rs->remote_sgl.key;
	}
	rs->target_sgl[0].addr = be64toh(c.data_buf.addr);
	rs->target_sgl[0].length = be32toh(c.data_buf.length);
	rs->target_sgl[0].key = be32toh(c.data_buf.key);
	rs->sseq_comp = be16toh(c.credits);
	return 0;
}

/* ------------------------------------------------------- data path */

static int post_write(struct rs *rs, struct ibv_sge *sgl, int nsge, uint32_t msg, int flags, uint64_t addr,
		      uint32_t rkey, bool imm) {
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = msg;
	wr.sg_list = sgl;
	wr.num_sge = nsge;
	wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	wr.send_flags = flags;
	if (imm)
		wr.imm_data = htobe32(msg);
	wr.wr.rdma.remote_addr = addr;
	wr.wr.rdma.rkey = rkey;
	int ret = ibv_post_send(rs->cm_id->qp, &wr, &bad);
	return ret ? ERRNO(ret) : 0;
}

static int post_msg(struct rs *rs, uint32_t msg) { return post_write(rs, NULL, 0, msg, 0, 0, 0, true); }

static bool ctrl_avail(struct rs *rs) { return rs->ctrl_seqno != rs->ctrl_max_seqno; }

static void send_credits(struct rs *rs) {
	rs->ctrl_seqno++;
	rs->rseq_comp = (uint16_t)(rs->rseq_no + (rs->rq_size >> 1));
	uint32_t msg = RS_MSG_SET(RS_OP_SGL, (uint16_t)(rs->rseq_no + rs->rq_size));
	if (rs->rbuf_bytes_avail >= (int)(rs->rbuf_size >> 1)) {
		struct rs_sge sge = {
			.addr = (uintptr_t)&rs->rbuf[rs->rbuf_free_offset],
			.key = rs->mr->rkey,
			.length = rs->rbuf_size >> 1,
		};
		if (rs->opts & RS_OPT_SWAP_SGL) {
			sge.addr = __builtin_bswap64(sge.addr);
			sge.key = __builtin_bswap32(sge.key);
			sge.length = __builtin_bswap32(sge.length);
		}
		struct ibv_sge s = { .length = sizeof sge };
		int flags = 0;
		if (rs->sq_inline >= sizeof sge) {
			s.addr = (uintptr_t)&sge;
			flags = IBV_SEND_INLINE;
		} else {
			void *slot = rs->sbuf + rs->sbuf_size + RS_MAX_CTRL_MSG * (rs->ctrl_seqno & (RS_QP_CTRL_SIZE - 1));
			memcpy(slot, &sge, sizeof sge);
			s.addr = (uintptr_t)slot;
			s.lkey = rs->mr->lkey;
		}
		post_write(rs, &s, 1, msg, flags, rs->remote_sgl.addr + (uint64_t)rs->remote_sge * sizeof(struct rs_sge),
			   rs->remote_sgl.key, true);
		rs->rbuf_bytes_avail -= (int)(rs->rbuf_size >> 1);
		rs->rbuf_free_offset += (int)(rs->rbuf_size >> 1);
		if (rs->rbuf_free_offset >= (int)rs->rbuf_size)
			rs->rbuf_free_offset = 0;
		if (++rs->remote_sge == (int)rs->remote_sgl.length)
			rs->remote_sge = 0;
	} else {
		post_msg(rs, msg);
	}
}

static void update_credits(struct rs *rs) {
	if ((rs->state & RS_CONNECTED) && ctrl_avail(rs) &&
	    (rs->rbuf_bytes_avail >= (int)(rs->rbuf_size >> 1) || (int16_t)(rs->rseq_no - rs->rseq_comp) >= 0))
		send_credits(rs);
}

static void post_recvs(struct rs *rs, int n) {
	while (n-- > 0) {
		struct ibv_recv_wr wr = { .wr_id = WR_RECV }, *bad;
		int ret = ibv_post_recv(rs->cm_id->qp, &wr, &bad);
		if (ret) {
			rs->state = RS_ERROR;
			rs->err = ret;
			return;
		}
	}
}

static void poll_cq(struct rs *rs) {
	if (!rs->cm_id || !rs->cm_id->recv_cq)
		return;
	struct ibv_wc wc[16];
	int n, rcnt = 0;
	while ((n = ibv_poll_cq(rs->cm_id->recv_cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			struct ibv_wc *w = &wc[i];
			if (w->wr_id & WR_RECV) {
				if (w->status != IBV_WC_SUCCESS)
					continue;
				rcnt++;
				if (!(w->wc_flags & IBV_WC_WITH_IMM))
					continue;
				uint32_t msg = be32toh(w->imm_data);
				switch (RS_MSG_OP(msg)) {
				case RS_OP_SGL:
					rs->sseq_comp = (uint16_t)RS_MSG_DATA(msg);
					break;
				case RS_OP_IOMAP_SGL:
				case RS_OP_WRITE:
					break;
				case RS_OP_CTRL:
					if (RS_MSG_DATA(msg) == RS_CTRL_DISCONNECT) {
						rs->state = RS_DISCONNECTED;
					} else if (RS_MSG_DATA(msg) == RS_CTRL_SHUTDOWN) {
						if (rs->state & RS_WRITABLE)
							rs->state &= ~RS_READABLE;
						else
							rs->state = RS_DISCONNECTED;
					}
					break;
				default:
					rs->rmsg[rs->rmsg_tail].op = RS_MSG_OP(msg);
					rs->rmsg[rs->rmsg_tail].data = RS_MSG_DATA(msg);
					if (++rs->rmsg_tail == rs->rq_size + 1)
						rs->rmsg_tail = 0;
					break;
				}
			} else {
				uint32_t msg = (uint32_t)w->wr_id;
				switch (RS_MSG_OP(msg)) {
				case RS_OP_SGL:
				case RS_OP_CTRL:
					rs->ctrl_max_seqno++;
					if (RS_MSG_OP(msg) == RS_OP_CTRL && RS_MSG_DATA(msg) == RS_CTRL_DISCONNECT)
						rs->state = RS_DISCONNECTED;
					break;
				case RS_OP_IOMAP_SGL:
					rs->sqe_avail++;
					rs->sbuf_bytes_avail += (int)sizeof(struct rs_iomap);
					break;
				default:
					rs->sqe_avail++;
					rs->sbuf_bytes_avail += (int)RS_MSG_DATA(msg);
					break;
				}
				if (w->status != IBV_WC_SUCCESS && (rs->state & RS_CONNECTED)) {
					rs->state = RS_ERROR;
					rs->err = ECONNRESET;
				}
			}
		}
	}
	if (rs->state & RS_CONNECTED)
		post_recvs(rs, rcnt);
}

/* check_cm reads the CM events of a connected rsocket: a DISCONNECTED
 * before the peer's in-band DISCONNECT is an abort (the peer or its
 * daemon went away): ECONNRESET. */
static void check_cm(struct rs *rs) {
	if (!(rs->state & (RS_CONNECTED | RS_DISCONNECTED)))
		return;
	struct rdma_cm_event *ev;
	while (rdma_get_cm_event(rs->cm_id->channel, &ev) == 0) {
		enum rdma_cm_event_type t = ev->event;
		rdma_ack_cm_event(ev);
		if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
		    t == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
			poll_cq(rs);
			if (rs->state & RS_CONNECTED) {
				rs->state = RS_ERROR;
				rs->err = ECONNRESET;
			}
		}
	}
}

static void drain_cq_events(struct rs *rs) {
	struct ibv_cq *cq;
	void *ctx;
	if (!rs->cm_id->recv_cq_channel)
		return;
	while (ibv_get_cq_event(rs->cm_id->recv_cq_channel, &cq, &ctx) == 0) {
		rs->cq_armed = false;
		if (++rs->unack_cqe >= 64) {
			ibv_ack_cq_events(cq, (unsigned)rs->unack_cqe);
			rs->unack_cqe = 0;
		}
	}
}

/* process polls until test holds (0), or fails: EWOULDBLOCK when
 * nonblocking. mu held; dropped while sleeping. */
static int process(struct rs *rs, bool nonblock, bool (*test)(struct rs *)) {
	uint64_t spin_until = now_us() + 20;
	for (;;) {
		update_credits(rs);
		poll_cq(rs);
		check_cm(rs);
		update_credits(rs);
		if (test(rs))
			return 0;
		if (nonblock)
			return ERRNO(EWOULDBLOCK);
		if (now_us() < spin_until) {
			pthread_mutex_unlock(&rs->mu);
			sched_yield();
			pthread_mutex_lock(&rs->mu);
			continue;
		}
		if (!rs->cq_armed && rs->cm_id->recv_cq) {
			ibv_req_notify_cq(rs->cm_id->recv_cq, 0);
			rs->cq_armed = true;
			continue;
		}
		struct pollfd p[2] = { { .fd = comp_fd(rs), .events = POLLIN }, { .fd = cm_fd(rs), .events = POLLIN } };
		pthread_mutex_unlock(&rs->mu);
		poll(p, 2, 1000);
		pthread_mutex_lock(&rs->mu);
		drain_cq_events(rs);
	}
}

static bool can_send(struct rs *rs) {
	return rs->sqe_avail && rs->sbuf_bytes_avail >= RS_SNDLOWAT && rs->sseq_no != rs->sseq_comp &&
	       rs->target_sgl[rs->target_sge].length != 0;
}
static bool conn_can_send(struct rs *rs) { return can_send(rs) || !(rs->state & RS_WRITABLE); }
static bool conn_can_send_ctrl(struct rs *rs) { return ctrl_avail(rs) || !(rs->state & RS_CONNECTED); }
static bool have_rdata(struct rs *rs) { return rs->rmsg_head != rs->rmsg_tail; }
static bool conn_have_rdata(struct rs *rs) { return have_rdata(rs) || !(rs->state & RS_READABLE); }
static bool all_sends_done(struct rs *rs) {
	return ((int)rs->ctrl_max_seqno - (int)rs->ctrl_seqno) + rs->sqe_avail == rs->sq_size ||
	       !(rs->state & RS_CONNECTED);
}
static bool poll_all(struct rs *rs) {
	(void)rs;
	return true;
}

/* ------------------------------------------------------- connecting */

/* connect_step advances an opening rsocket by what its CM has done:
 * 0 when connected, -1 with EAGAIN while waiting, else the error. */
static int connect_step(struct rs *rs) {
	struct rdma_cm_id *id = rs->cm_id;
	int ret;
	switch (rs->state) {
	case RS_INIT:
	case RS_BOUND:
		ret = rdma_resolve_addr(id, NULL, (struct sockaddr *)&rs->dst, 2000);
		if (ret) {
			if (errno == EAGAIN)
				rs->state = RS_RESOLVING_ADDR;
			return -1;
		}
		goto route;
	case RS_RESOLVING_ADDR:
		if (cma_complete((struct cma_id *)id))
			return -1;
	route:
		ret = rdma_resolve_route(id, 2000);
		if (ret) {
			rs->state = RS_RESOLVING_ROUTE;
			return -1;
		}
		goto connect;
	case RS_RESOLVING_ROUTE:
		if (cma_complete((struct cma_id *)id))
			return -1;
	connect: {
		if (create_ep(rs))
			return -1;
		struct rs_conn_data c;
		conn_data_of(rs, &c);
		struct rdma_conn_param p;
		memset(&p, 0, sizeof p);
		p.private_data = &c;
		p.private_data_len = sizeof c;
		p.flow_control = 1;
		p.retry_count = 7;
		p.rnr_retry_count = 7;
		p.responder_resources = 1;
		p.initiator_depth = 1;
		rs->state = RS_CONNECTING;
		if (rdma_connect(id, &p))
			return -1;
		goto connected;
	}
	case RS_CONNECTING:
		if (cma_complete((struct cma_id *)id))
			return -1;
	connected:
		if (!id->event)
			return ERRNO(EIO);
		ret = save_conn_data(rs, id->event->param.conn.private_data, id->event->param.conn.private_data_len);
		rdma_ack_cm_event(id->event);
		id->event = NULL;
		if (ret)
			return -1;
		rs->state = RS_CONNECT_RDWR;
		return 0;
	case RS_ACCEPTING:
		if (cma_complete((struct cma_id *)id))
			return -1;
		rdma_ack_cm_event(id->event);
		id->event = NULL;
		rs->state = RS_CONNECT_RDWR;
		return 0;
	case RS_CONNECT_ERROR:
	case RS_DISCONNECTED:
	case RS_ERROR:
		return ERRNO(ENOTCONN);
	default:
		return (rs->state & RS_CONNECTED) ? 0 : ERRNO(EINVAL);
	}
}

/* do_connect: mu held. Nonblocking: EINPROGRESS while it goes on. */
static int do_connect(struct rs *rs, bool nonblock) {
	for (;;) {
		if (!(rs->state & RS_OPENING) && rs->state != RS_INIT && rs->state != RS_BOUND)
			return connect_step(rs);
		if (!connect_step(rs))
			return 0;
		if (errno != EAGAIN) {
			rs->err = errno;
			rs->state = RS_CONNECT_ERROR;
			return ERRNO(rs->err);
		}
		if (nonblock)
			return ERRNO(EINPROGRESS);
		struct pollfd p = { .fd = cm_fd(rs), .events = POLLIN };
		pthread_mutex_unlock(&rs->mu);
		poll(&p, 1, 1000);
		pthread_mutex_lock(&rs->mu);
	}
}

/* opening: finish the connection for a data call; EAGAIN if it goes on. */
static int finish_open(struct rs *rs, int flags) {
	if (!(rs->state & RS_OPENING))
		return 0;
	pthread_mutex_lock(&rs->mu);
	int ret = (rs->state & RS_OPENING) ? do_connect(rs, nonblocking(rs, flags)) : 0;
	pthread_mutex_unlock(&rs->mu);
	TRACE("finish_open(%d) = %d errno %d state %#x\n", rs->index, ret, errno, rs->state);
	if (ret && errno == EINPROGRESS)
		errno = EAGAIN;
	return ret;
}

/* ------------------------------------------------------------ the API */

VR_EXPORT int rsocket(int domain, int type, int protocol) {
	int st = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
	if ((domain != AF_INET && domain != AF_INET6) || st != SOCK_STREAM ||
	    (protocol && protocol != IPPROTO_TCP))
		return ERRNO(ENOTSUP);
	struct rs *rs = rs_alloc(NULL);
	if (!rs)
		return ERRNO(ENOMEM);
	rs->fs_flags = type & SOCK_NONBLOCK ? O_NONBLOCK : 0;
	rs->fd_flags = type & SOCK_CLOEXEC ? FD_CLOEXEC : 0;
	if (rdma_create_id(NULL, &rs->cm_id, rs, RDMA_PS_TCP))
		goto err;
	rs->cm_id->route.addr.src_addr.sa_family = (sa_family_t)domain;
	if (set_nonblock(cm_fd(rs)))
		goto err;
	if (rs->fd_flags)
		fcntl(cm_fd(rs), F_SETFD, FD_CLOEXEC);
	rs->index = cm_fd(rs);
	if (tab_set(rs->index, rs))
		goto err;
	return rs->index;
err: {
	int e = errno;
	rs_free(rs);
	return ERRNO(e);
}
}

VR_EXPORT int rbind(int socket, const struct sockaddr *addr, socklen_t addrlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (!addr || addrlen < cma_addrlen(addr) || !cma_addrlen(addr))
		return ERRNO(EINVAL);
	if (rs->state != RS_INIT)
		return ERRNO(EINVAL);
	int ret = rdma_bind_addr(rs->cm_id, (struct sockaddr *)addr);
	if (!ret)
		rs->state = RS_BOUND;
	return ret;
}

VR_EXPORT int rlisten(int socket, int backlog) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (rs->state == RS_LISTENING)
		return 0;
	if (rs->state != RS_BOUND && rs->state != RS_INIT)
		return ERRNO(EINVAL);
	if (rdma_listen(rs->cm_id, backlog))
		return -1;
	rs->state = RS_LISTENING;
	return 0;
}

VR_EXPORT int raccept(int socket, struct sockaddr *addr, socklen_t *addrlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (rs->state != RS_LISTENING)
		return ERRNO(EINVAL);
	for (;;) {
		struct rdma_cm_id *cid;
		if (rdma_get_request(rs->cm_id, &cid)) {
			if (errno != EAGAIN)
				return -1;
			if (rs->fs_flags & O_NONBLOCK)
				return ERRNO(EAGAIN);
			struct pollfd p = { .fd = cm_fd(rs), .events = POLLIN };
			poll(&p, 1, -1);
			continue;
		}
		struct rs *n = rs_alloc(rs);
		if (!n) {
			rdma_reject(cid, NULL, 0);
			rdma_destroy_id(cid);
			return ERRNO(ENOMEM);
		}
		n->cm_id = cid;
		cid->context = n;
		n->index = cm_fd(n);
		set_nonblock(n->index);
		if (n->fd_flags)
			fcntl(n->index, F_SETFD, FD_CLOEXEC);
		pthread_mutex_lock(&n->mu);
		int ret = -1;
		const uint8_t *pd = cid->event->param.conn.private_data;
		if (pd && cid->event->param.conn.private_data_len >= sizeof(struct rs_conn_data) &&
		    pd[0] == RS_PROTO_VERSION && !create_ep(n) &&
		    !save_conn_data(n, pd, cid->event->param.conn.private_data_len)) {
			struct rs_conn_data c;
			conn_data_of(n, &c);
			struct rdma_conn_param p = cid->event->param.conn;
			p.private_data = &c;
			p.private_data_len = sizeof c;
			p.flow_control = 1;
			p.retry_count = 7;
			p.rnr_retry_count = 7;
			n->state = RS_ACCEPTING;
			ret = rdma_accept(cid, &p);
			if (ret && errno == EAGAIN) {
				/* Wait for the RTU here (it follows our REP at
				 * once): a program may close the listener as
				 * soon as accept returns, and the connection
				 * must not depend on it. */
				ret = 0;
				uint64_t until = now_us() + 10 * 1000000;
				while (n->state == RS_ACCEPTING && now_us() < until) {
					if (!connect_step(n))
						break;
					if (errno != EAGAIN) {
						ret = -1;
						break;
					}
					struct pollfd pf = { .fd = cm_fd(n), .events = POLLIN };
					poll(&pf, 1, 100);
				}
			} else if (!ret) {
				if (cid->event) {
					rdma_ack_cm_event(cid->event);
					cid->event = NULL;
				}
				n->state = RS_CONNECT_RDWR;
			}
		}
		pthread_mutex_unlock(&n->mu);
		if (ret) {
			int e = errno;
			if (n->state != RS_ACCEPTING)
				rdma_reject(cid, NULL, 0);
			rs_free(n);
			if (rs->fs_flags & O_NONBLOCK)
				return ERRNO(e == EAGAIN ? ECONNABORTED : e);
			continue;
		}
		if (tab_set(n->index, n)) {
			rs_free(n);
			return ERRNO(ENOMEM);
		}
		if (addr && addrlen)
			rgetpeername(n->index, addr, addrlen);
		TRACE("raccept(%d) = %d state %#x\n", socket, n->index, n->state);
		return n->index;
	}
}

VR_EXPORT int rconnect(int socket, const struct sockaddr *addr, socklen_t addrlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	pthread_mutex_lock(&rs->mu);
	int ret;
	if (rs->state == RS_INIT || rs->state == RS_BOUND) {
		if (!addr || !cma_addrlen(addr) || addrlen < cma_addrlen(addr) || addrlen > sizeof rs->dst) {
			pthread_mutex_unlock(&rs->mu);
			return ERRNO(EINVAL);
		}
		memcpy(&rs->dst, addr, cma_addrlen(addr));
	} else if (rs->state & RS_CONNECTED) {
		pthread_mutex_unlock(&rs->mu);
		return ERRNO(EISCONN);
	} else if (rs->state == RS_LISTENING) {
		pthread_mutex_unlock(&rs->mu);
		return ERRNO(EINVAL);
	} else if (rs->state & RS_OPENING && (rs->fs_flags & O_NONBLOCK)) {
		ret = do_connect(rs, true);
		pthread_mutex_unlock(&rs->mu);
		if (ret && errno == EINPROGRESS)
			errno = EALREADY;
		return ret;
	}
	ret = do_connect(rs, rs->fs_flags & O_NONBLOCK);
	pthread_mutex_unlock(&rs->mu);
	return ret;
}

static ssize_t copy_out(struct rs *rs, uint8_t *buf, size_t len, bool peek) {
	size_t left = len;
	int head = rs->rmsg_head, off = rs->rbuf_offset;
	while (left && head != rs->rmsg_tail) {
		uint32_t rsize;
		if (left < rs->rmsg[head].data) {
			rsize = (uint32_t)left;
			if (!peek)
				rs->rmsg[head].data -= rsize;
		} else {
			rsize = rs->rmsg[head].data;
			if (++head == rs->rq_size + 1)
				head = 0;
			if (!peek)
				rs->rseq_no++;
		}
		left -= rsize;
		while (rsize) {
			uint32_t end = rs->rbuf_size - (uint32_t)off, n = rsize < end ? rsize : end;
			memcpy(buf, &rs->rbuf[off], n);
			buf += n;
			rsize -= n;
			off += (int)n;
			if (off == (int)rs->rbuf_size)
				off = 0;
			if (!peek)
				rs->rbuf_bytes_avail += (int)n;
		}
	}
	if (!peek) {
		rs->rmsg_head = head;
		rs->rbuf_offset = off;
	}
	return (ssize_t)(len - left);
}

VR_EXPORT ssize_t rrecv(int socket, void *buf, size_t len, int flags) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (rs->state & RS_OPENING) {
		if (finish_open(rs, flags))
			return -1;
	}
	if (!(rs->state & (RS_CONNECTED | RS_DISCONNECTED | RS_ERROR)))
		return ERRNO(ENOTCONN);
	pthread_mutex_lock(&rs->rlock);
	pthread_mutex_lock(&rs->mu);
	size_t got = 0;
	int ret = 0;
	do {
		if (!have_rdata(rs)) {
			ret = process(rs, nonblocking(rs, flags), conn_have_rdata);
			if (ret)
				break;
			if (!have_rdata(rs)) {
				if (rs->state & RS_ERROR) {
					ret = ERRNO(rs->err ? rs->err : ECONNRESET);
				}
				break;
			}
		}
		got += (size_t)copy_out(rs, (uint8_t *)buf + got, len - got, flags & MSG_PEEK);
		if (flags & MSG_PEEK)
			break;
		update_credits(rs);
	} while (got < len && (flags & MSG_WAITALL) && (rs->state & RS_READABLE));
	pthread_mutex_unlock(&rs->mu);
	pthread_mutex_unlock(&rs->rlock);
	TRACE("rrecv(%d, %zu, %#x) = %zd (errno %d) state %#x\n", socket, len, flags, ret && got == 0 ? (ssize_t)ret : (ssize_t)got, errno, rs->state);
	return ret && got == 0 ? ret : (ssize_t)got;
}

VR_EXPORT ssize_t rrecvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr, socklen_t *addrlen) {
	ssize_t ret = rrecv(socket, buf, len, flags);
	if (ret > 0 && src_addr && addrlen)
		rgetpeername(socket, src_addr, addrlen);
	return ret;
}

static ssize_t recvv(int socket, const struct iovec *iov, int iovcnt, int flags) {
	if (iovcnt == 1)
		return rrecv(socket, iov[0].iov_base, iov[0].iov_len, flags);
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	uint8_t *tmp = malloc(total ? total : 1);
	if (!tmp)
		return ERRNO(ENOMEM);
	ssize_t ret = rrecv(socket, tmp, total, flags);
	for (ssize_t off = 0, i = 0; ret > 0 && off < ret && i < iovcnt; i++) {
		size_t n = iov[i].iov_len < (size_t)(ret - off) ? iov[i].iov_len : (size_t)(ret - off);
		memcpy(iov[i].iov_base, tmp + off, n);
		off += (ssize_t)n;
	}
	free(tmp);
	return ret;
}

/* A stream rsocket has no ancillary data: msg_control comes back empty
 * (as from a TCP socket without options asking for any). */
VR_EXPORT ssize_t rrecvmsg(int socket, struct msghdr *msg, int flags) {
	if (!msg)
		return ERRNO(EFAULT);
	msg->msg_controllen = 0;
	msg->msg_flags = 0;
	if (msg->msg_name && msg->msg_namelen)
		rgetpeername(socket, msg->msg_name, &msg->msg_namelen);
	return recvv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

VR_EXPORT ssize_t rread(int socket, void *buf, size_t count) { return rrecv(socket, buf, count, 0); }

VR_EXPORT ssize_t rreadv(int socket, const struct iovec *iov, int iovcnt) { return recvv(socket, iov, iovcnt, 0); }

/* put_sbuf copies len bytes into the send ring and fills sgl (1 or 2
 * entries); returns the number of entries. */
static int put_sbuf(struct rs *rs, const uint8_t *src, uint32_t len, struct ibv_sge *sgl) {
	uint32_t left = (uint32_t)((uintptr_t)(rs->sbuf + rs->sbuf_size) - rs->ssgl[0].addr);
	if (len <= left) {
		memcpy((void *)(uintptr_t)rs->ssgl[0].addr, src, len);
		sgl[0] = (struct ibv_sge){ .addr = rs->ssgl[0].addr, .length = len, .lkey = rs->mr->lkey };
		rs->ssgl[0].addr = len < left ? rs->ssgl[0].addr + len : (uintptr_t)rs->sbuf;
		return 1;
	}
	memcpy((void *)(uintptr_t)rs->ssgl[0].addr, src, left);
	memcpy(rs->sbuf, src + left, len - left);
	sgl[0] = (struct ibv_sge){ .addr = rs->ssgl[0].addr, .length = left, .lkey = rs->mr->lkey };
	sgl[1] = (struct ibv_sge){ .addr = (uintptr_t)rs->sbuf, .length = len - left, .lkey = rs->mr->lkey };
	rs->ssgl[0].addr = (uintptr_t)rs->sbuf + (len - left);
	return 2;
}

/* send_iomaps writes the pending iomap entries into the peer's table. */
static int send_iomaps(struct rs *rs, int flags) {
	for (struct rs_iomr *m = rs->iomaps; m; m = m->next) {
		if (!m->pending)
			continue;
		if (!can_send(rs)) {
			if (process(rs, nonblocking(rs, flags), conn_can_send))
				return -1;
			if (!(rs->state & RS_WRITABLE))
				return ERRNO(ECONNRESET);
		}
		struct rs_iomap iom = { .offset = m->offset,
					.sge = { .addr = (uintptr_t)m->mr->addr, .key = m->mr->rkey, .length = (uint32_t)m->mr->length } };
		if (rs->opts & RS_OPT_SWAP_SGL) {
			iom.offset = __builtin_bswap64(iom.offset);
			iom.sge.addr = __builtin_bswap64(iom.sge.addr);
			iom.sge.key = __builtin_bswap32(iom.sge.key);
			iom.sge.length = __builtin_bswap32(iom.sge.length);
		}
		struct ibv_sge sgl[2];
		int n, fl = 0;
		if (rs->sq_inline >= sizeof iom) {
			sgl[0] = (struct ibv_sge){ .addr = (uintptr_t)&iom, .length = sizeof iom };
			n = 1;
			fl = IBV_SEND_INLINE;
		} else {
			n = put_sbuf(rs, (const uint8_t *)&iom, sizeof iom, sgl);
		}
		rs->sseq_no++;
		rs->sqe_avail--;
		rs->sbuf_bytes_avail -= (int)sizeof iom;
		m->pending = false;
		if (post_write(rs, sgl, n, RS_MSG_SET(RS_OP_IOMAP_SGL, m->index), fl,
			       rs->remote_iomap.addr + (uint64_t)m->index * sizeof(struct rs_iomap), rs->remote_iomap.key,
			       true))
			return -1;
	}
	rs->iomap_pending = false;
	return 0;
}

/* rs_sendv sends len bytes from iov (data), or with io (riowrite) to
 * the peer's iomap at offset. */
static ssize_t do_send(struct rs *rs, const struct iovec *iov, int iovcnt, size_t len, int flags, bool io,
		       off_t offset) {
	pthread_mutex_lock(&rs->slock);
	pthread_mutex_lock(&rs->mu);
	size_t left = len;
	uint32_t olen = RS_OLAP_START_SIZE;
	int ret = 0;
	int vi = 0;
	size_t voff = 0;
	struct rs_iomap *iom = NULL;
	if (rs->iomap_pending && (ret = send_iomaps(rs, flags)))
		goto out;
	while (left) {
		if (!(rs->state & RS_WRITABLE)) {
			ret = ERRNO(rs->state & RS_ERROR ? (rs->err ? rs->err : ECONNRESET) : EPIPE);
			break;
		}
		if (io && (!iom || (uint64_t)offset >= iom->offset + iom->sge.length)) {
			iom = NULL;
			for (int i = 0; i < rs->target_iomap_size; i++)
				if ((uint64_t)offset >= rs->target_iomap[i].offset &&
				    (uint64_t)offset < rs->target_iomap[i].offset + rs->target_iomap[i].sge.length) {
					iom = &rs->target_iomap[i];
					break;
				}
			if (!iom)
				break;
		}
		if (!can_send(rs)) {
			ret = process(rs, nonblocking(rs, flags), conn_can_send);
			if (ret)
				break;
			if (!(rs->state & RS_WRITABLE)) {
				ret = ERRNO(rs->state & RS_ERROR ? (rs->err ? rs->err : ECONNRESET) : ECONNRESET);
				break;
			}
		}
		uint32_t x;
		if (olen < left) {
			x = olen;
			if (olen < RS_MAX_TRANSFER)
				olen <<= 1;
		} else {
			x = (uint32_t)left;
		}
		if (x > (uint32_t)rs->sbuf_bytes_avail)
			x = (uint32_t)rs->sbuf_bytes_avail;
		if (io) {
			uint64_t room = iom->offset + iom->sge.length - (uint64_t)offset;
			if (x > room)
				x = (uint32_t)room;
		} else if (x > rs->target_sgl[rs->target_sge].length) {
			x = rs->target_sgl[rs->target_sge].length;
		}
		/* Gather x bytes from iov. */
		uint8_t stackbuf[256];
		const uint8_t *src;
		uint8_t *tmp = NULL;
		if (iov[vi].iov_len - voff >= x) {
			src = (const uint8_t *)iov[vi].iov_base + voff;
		} else {
			tmp = x <= sizeof stackbuf ? stackbuf : malloc(x);
			if (!tmp) {
				ret = ERRNO(ENOMEM);
				break;
			}
			size_t got = 0;
			int v = vi;
			size_t o = voff;
			while (got < x) {
				size_t n = iov[v].iov_len - o < x - got ? iov[v].iov_len - o : x - got;
				memcpy(tmp + got, (const uint8_t *)iov[v].iov_base + o, n);
				got += n;
				o += n;
				if (o == iov[v].iov_len) {
					v++;
					o = 0;
				}
			}
			src = tmp;
		}
		struct ibv_sge sgl[2];
		int nsge, fl = 0;
		if (x <= rs->sq_inline) {
			sgl[0] = (struct ibv_sge){ .addr = (uintptr_t)src, .length = x };
			nsge = 1;
			fl = IBV_SEND_INLINE;
		} else {
			nsge = put_sbuf(rs, src, x, sgl);
		}
		rs->sqe_avail--;
		rs->sbuf_bytes_avail -= (int)x;
		if (io) {
			ret = post_write(rs, sgl, nsge, RS_MSG_SET(RS_OP_WRITE, x), fl,
					 iom->sge.addr + (uint64_t)offset - iom->offset, iom->sge.key, false);
		} else {
			rs->sseq_no++;
			uint64_t addr = rs->target_sgl[rs->target_sge].addr;
			uint32_t key = rs->target_sgl[rs->target_sge].key;
			rs->target_sgl[rs->target_sge].addr = addr + x;
			rs->target_sgl[rs->target_sge].length -= x;
			if (!rs->target_sgl[rs->target_sge].length && ++rs->target_sge == RS_SGL_SIZE)
				rs->target_sge = 0;
			ret = post_write(rs, sgl, nsge, RS_MSG_SET(RS_OP_DATA, x), fl, addr, key, true);
		}
		if (tmp && tmp != stackbuf)
			free(tmp);
		if (ret)
			break;
		left -= x;
		offset += x;
		voff += x;
		while (vi < iovcnt && voff >= iov[vi].iov_len && left) {
			voff -= iov[vi].iov_len;
			vi++;
		}
	}
out:
	pthread_mutex_unlock(&rs->mu);
	pthread_mutex_unlock(&rs->slock);
	return ret && left == len ? ret : (ssize_t)(len - left);
}

static ssize_t sendv(int socket, const struct iovec *iov, int iovcnt, int flags) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (iovcnt < 0)
		return ERRNO(EINVAL);
	if (rs->state & RS_OPENING) {
		if (finish_open(rs, flags))
			return -1;
	}
	if (!(rs->state & (RS_CONNECTED | RS_DISCONNECTED | RS_ERROR)))
		return ERRNO(ENOTCONN);
	size_t len = 0;
	for (int i = 0; i < iovcnt; i++)
		len += iov[i].iov_len;
	/* Skip leading empty entries. */
	while (iovcnt > 0 && iov[0].iov_len == 0) {
		iov++;
		iovcnt--;
	}
	if (!len)
		return 0;
	return do_send(rs, iov, iovcnt, len, flags, false, 0);
}

VR_EXPORT ssize_t rsend(int socket, const void *buf, size_t len, int flags) {
	struct iovec v = { .iov_base = (void *)buf, .iov_len = len };
	return sendv(socket, &v, 1, flags);
}

VR_EXPORT ssize_t rsendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
			  socklen_t addrlen) {
	(void)addrlen;
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (dest_addr)
		return ERRNO(EISCONN);
	return rsend(socket, buf, len, flags);
}

VR_EXPORT ssize_t rsendmsg(int socket, const struct msghdr *msg, int flags) {
	if (msg->msg_control && msg->msg_controllen)
		return ERRNO(ENOTSUP);
	return sendv(socket, msg->msg_iov, (int)msg->msg_iovlen, flags);
}

VR_EXPORT ssize_t rwrite(int socket, const void *buf, size_t count) { return rsend(socket, buf, count, 0); }

VR_EXPORT ssize_t rwritev(int socket, const struct iovec *iov, int iovcnt) { return sendv(socket, iov, iovcnt, 0); }

/* ------------------------------------------------------------ polling */

/* poll_rs returns the revents of rs for events, after processing what
 * its CQ and CM hold; arm: arm the CQ when nothing is ready. */
static short poll_rs(struct rs *rs, short events, bool arm) {
	short rev = 0;
	pthread_mutex_lock(&rs->mu);
	if (rs->state & RS_OPENING) {
		if (do_connect(rs, true) && errno == EINPROGRESS) {
			pthread_mutex_unlock(&rs->mu);
			return 0;
		}
	}
	if (rs->state == RS_LISTENING) {
		struct pollfd p = { .fd = cm_fd(rs), .events = POLLIN };
		poll(&p, 1, 0);
		pthread_mutex_unlock(&rs->mu);
		return p.revents & POLLIN ? (short)(events & POLLIN) : 0;
	}
	if (rs->state & (RS_CONNECTED | RS_DISCONNECTED | RS_ERROR)) {
		process(rs, true, poll_all);
		if ((events & POLLIN) && conn_have_rdata(rs))
			rev |= POLLIN;
		if ((events & POLLOUT) && can_send(rs))
			rev |= POLLOUT;
		/* Hang-up or error only once the data that came before is
		 * read: a program polling for the last message must not see
		 * the peer's close first. */
		if (!(rs->state & RS_CONNECTED) && !have_rdata(rs))
			rev |= rs->state == RS_DISCONNECTED ? POLLHUP : POLLERR;
		if (!rev && arm && !rs->cq_armed) {
			ibv_req_notify_cq(rs->cm_id->recv_cq, 0);
			rs->cq_armed = true;
			process(rs, true, poll_all);
			if ((events & POLLIN) && conn_have_rdata(rs))
				rev |= POLLIN;
			if ((events & POLLOUT) && can_send(rs))
				rev |= POLLOUT;
		}
	} else if (rs->state == RS_CONNECT_ERROR) {
		rev = (short)((events & (POLLIN | POLLOUT)) | POLLERR);
	} else if (rs->state == RS_INIT || rs->state == RS_BOUND) {
		rev = 0;
	}
	pthread_mutex_unlock(&rs->mu);
	return rev;
}

static int check_all(struct pollfd *fds, nfds_t nfds, bool arm) {
	int cnt = 0;
	for (nfds_t i = 0; i < nfds; i++) {
		struct rs *rs = lookup(fds[i].fd);
		if (rs) {
			fds[i].revents = poll_rs(rs, fds[i].events, arm);
		} else {
			fds[i].revents = 0;
			if (fds[i].fd >= 0)
				poll(&fds[i], 1, 0);
		}
		if (fds[i].revents)
			cnt++;
	}
	return cnt;
}

VR_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) {
	uint64_t start = now_us();
	int ret;
	for (nfds_t i = 0; rs_trace() && i < nfds; i++)
		TRACE("rpoll(%d) fd %d events %#x\n", timeout, fds[i].fd, fds[i].events);
	for (;;) {
		ret = check_all(fds, nfds, false);
		if (ret || timeout == 0) {
			for (nfds_t i = 0; rs_trace() && i < nfds; i++)
				TRACE("rpoll fd %d revents %#x\n", fds[i].fd, fds[i].revents);
			return ret;
		}
		if (now_us() - start > 20)
			break;
	}
	struct pollfd *rf = calloc(nfds * 2 + 1, sizeof *rf);
	if (!rf)
		return ERRNO(ENOMEM);
	for (;;) {
		ret = check_all(fds, nfds, true);
		if (ret)
			break;
		for (nfds_t i = 0; i < nfds; i++) {
			struct rs *rs = lookup(fds[i].fd);
			rf[2 * i] = (struct pollfd){ .fd = -1 };
			rf[2 * i + 1] = (struct pollfd){ .fd = -1 };
			if (!rs) {
				rf[2 * i].fd = fds[i].fd;
				rf[2 * i].events = fds[i].events;
				continue;
			}
			rf[2 * i + 1].fd = cm_fd(rs);
			rf[2 * i + 1].events = POLLIN;
			if (comp_fd(rs) >= 0 && (rs->state & (RS_CONNECTED | RS_DISCONNECTED | RS_ERROR))) {
				rf[2 * i].fd = comp_fd(rs);
				rf[2 * i].events = POLLIN;
			}
		}
		int wait = 500;
		if (timeout >= 0) {
			int64_t left = (int64_t)timeout - (int64_t)((now_us() - start) / 1000);
			if (left <= 0) {
				ret = 0;
				break;
			}
			if (left < wait)
				wait = (int)left;
		}
		ret = poll(rf, nfds * 2, wait);
		if (ret < 0)
			break;
		int cnt = 0;
		for (nfds_t i = 0; i < nfds; i++) {
			struct rs *rs = lookup(fds[i].fd);
			if (!rs) {
				fds[i].revents = rf[2 * i].revents;
				if (fds[i].revents)
					cnt++;
				continue;
			}
			if (rf[2 * i].revents) {
				pthread_mutex_lock(&rs->mu);
				drain_cq_events(rs);
				pthread_mutex_unlock(&rs->mu);
			}
			fds[i].revents = poll_rs(rs, fds[i].events, false);
			if (fds[i].revents)
				cnt++;
		}
		if (cnt) {
			ret = cnt;
			break;
		}
	}
	free(rf);
	for (nfds_t i = 0; rs_trace() && i < nfds; i++)
		TRACE("rpoll fd %d events %#x revents %#x\n", fds[i].fd, fds[i].events, fds[i].revents);
	return ret;
}

VR_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout) {
	if (nfds < 0 || nfds > FD_SETSIZE)
		return ERRNO(EINVAL);
	struct pollfd *p = calloc((size_t)nfds + 1, sizeof *p);
	if (!p)
		return ERRNO(ENOMEM);
	int n = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (readfds && FD_ISSET(fd, readfds))
			ev |= POLLIN;
		if (writefds && FD_ISSET(fd, writefds))
			ev |= POLLOUT;
		if (exceptfds && FD_ISSET(fd, exceptfds))
			ev |= POLLPRI;
		if (ev)
			p[n++] = (struct pollfd){ .fd = fd, .events = ev };
	}
	int to = timeout ? (int)(timeout->tv_sec * 1000 + timeout->tv_usec / 1000) : -1;
	int ret = rpoll(p, (nfds_t)n, to);
	if (ret >= 0) {
		if (readfds)
			FD_ZERO(readfds);
		if (writefds)
			FD_ZERO(writefds);
		if (exceptfds)
			FD_ZERO(exceptfds);
		ret = 0;
		for (int i = 0; i < n; i++) {
			bool any = false;
			if (readfds && (p[i].revents & (POLLIN | POLLHUP | POLLERR)) && (p[i].events & POLLIN)) {
				FD_SET(p[i].fd, readfds);
				any = true;
			}
			if (writefds && (p[i].revents & (POLLOUT | POLLERR)) && (p[i].events & POLLOUT)) {
				FD_SET(p[i].fd, writefds);
				any = true;
			}
			if (exceptfds && (p[i].revents & POLLPRI)) {
				FD_SET(p[i].fd, exceptfds);
				any = true;
			}
			ret += any;
		}
	}
	free(p);
	return ret;
}

/* --------------------------------------------------- shutdown, close */

VR_EXPORT int rshutdown(int socket, int how) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return ERRNO(EINVAL);
	pthread_mutex_lock(&rs->mu);
	int ret = 0;
	if (rs->state & RS_CONNECTED) {
		int ctrl;
		bool send = true;
		if (how == SHUT_RDWR) {
			ctrl = RS_CTRL_DISCONNECT;
			rs->state &= ~(RS_READABLE | RS_WRITABLE);
		} else if (how == SHUT_WR) {
			rs->state &= ~RS_WRITABLE;
			ctrl = rs->state & RS_READABLE ? RS_CTRL_SHUTDOWN : RS_CTRL_DISCONNECT;
		} else {
			rs->state &= ~RS_READABLE;
			ctrl = RS_CTRL_DISCONNECT;
			send = !(rs->state & RS_WRITABLE);
		}
		if (send) {
			if (!ctrl_avail(rs))
				ret = process(rs, false, conn_can_send_ctrl);
			if (!ret && (rs->state & RS_CONNECTED) && ctrl_avail(rs)) {
				rs->ctrl_seqno++;
				ret = post_msg(rs, RS_MSG_SET(RS_OP_CTRL, ctrl));
			}
			if (rs->state & RS_CONNECTED)
				process(rs, false, all_sends_done);
		}
	}
	pthread_mutex_unlock(&rs->mu);
	return ret;
}

static void ka_del(struct rs *rs);

VR_EXPORT int rclose(int socket) {
	struct rs *rs = lookup(socket);
	TRACE("rclose(%d) %s\n", socket, rs ? "" : "EBADF");
	if (!rs)
		return ERRNO(EBADF);
	ka_del(rs);
	if (rs->state & RS_CONNECTED)
		rshutdown(socket, SHUT_RDWR);
	tab_del(rs);
	rs_free(rs);
	return 0;
}

/* ------------------------------------------------------- addresses */

static int copy_addr(const struct sockaddr *src, struct sockaddr *dst, socklen_t *len) {
	socklen_t n = cma_addrlen(src);
	if (!n) {
		struct sockaddr_in z = { .sin_family = AF_INET };
		src = (const struct sockaddr *)&z;
		n = sizeof z;
		memcpy(dst, src, *len < n ? *len : n);
		*len = n;
		return 0;
	}
	memcpy(dst, src, *len < n ? *len : n);
	*len = n;
	return 0;
}

VR_EXPORT int rgetpeername(int socket, struct sockaddr *addr, socklen_t *addrlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (!addr || !addrlen)
		return ERRNO(EFAULT);
	if (!(rs->state & (RS_CONNECTED | RS_OPENING | RS_DISCONNECTED | RS_ERROR)))
		return ERRNO(ENOTCONN);
	return copy_addr(rdma_get_peer_addr(rs->cm_id), addr, addrlen);
}

VR_EXPORT int rgetsockname(int socket, struct sockaddr *addr, socklen_t *addrlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (!addr || !addrlen)
		return ERRNO(EFAULT);
	return copy_addr(rdma_get_local_addr(rs->cm_id), addr, addrlen);
}

/* ------------------------------------------------------- keepalive */

static pthread_mutex_t g_ka_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_ka_cond = PTHREAD_COND_INITIALIZER;
static struct rs **g_ka;
static int g_nka, g_capka;
static bool g_ka_thread;

/* A keepalive is a zero-length RDMA WRITE WITH IMMEDIATE of
 * RS_CTRL_KEEPALIVE: the peer's HCA acknowledges it and a dead peer fails
 * it, which fails the connection here. */
static void *ka_run(void *arg) {
	(void)arg;
	pthread_mutex_lock(&g_ka_mu);
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&g_ka_cond, &g_ka_mu, &ts);
		uint64_t now = now_us() / 1000000;
		for (int i = 0; i < g_nka; i++) {
			struct rs *rs = g_ka[i];
			if (rs->ka_next > now)
				continue;
			rs->ka_next = now + rs->keepalive_time;
			pthread_mutex_lock(&rs->mu);
			if ((rs->state & RS_CONNECTED) && ctrl_avail(rs)) {
				rs->ctrl_seqno++;
				post_write(rs, NULL, 0, RS_MSG_SET(RS_OP_CTRL, RS_CTRL_KEEPALIVE), 0, 0, 0, true);
			}
			pthread_mutex_unlock(&rs->mu);
		}
	}
	return NULL;
}

static int ka_add(struct rs *rs) {
	pthread_mutex_lock(&g_ka_mu);
	if (!g_ka_thread) {
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &a, ka_run, NULL)) {
			pthread_attr_destroy(&a);
			pthread_mutex_unlock(&g_ka_mu);
			return ERRNO(EAGAIN);
		}
		pthread_attr_destroy(&a);
		g_ka_thread = true;
	}
	if (g_nka == g_capka) {
		int cap = g_capka ? g_capka * 2 : 16;
		struct rs **n = realloc(g_ka, (size_t)cap * sizeof *n);
		if (!n) {
			pthread_mutex_unlock(&g_ka_mu);
			return ERRNO(ENOMEM);
		}
		g_ka = n;
		g_capka = cap;
	}
	g_ka[g_nka++] = rs;
	rs->ka_next = now_us() / 1000000 + rs->keepalive_time;
	rs->keepalive = true;
	pthread_mutex_unlock(&g_ka_mu);
	return 0;
}

static void ka_del(struct rs *rs) {
	pthread_mutex_lock(&g_ka_mu);
	for (int i = 0; i < g_nka; i++)
		if (g_ka[i] == rs) {
			g_ka[i] = g_ka[--g_nka];
			break;
		}
	rs->keepalive = false;
	pthread_mutex_unlock(&g_ka_mu);
}

static int set_keepalive(struct rs *rs, bool on) {
	if (on == rs->keepalive)
		return 0;
	if (!on) {
		ka_del(rs);
		return 0;
	}
	if (!rs->keepalive_time) {
		rs->keepalive_time = 7200;
		FILE *f = fopen("/proc/sys/net/ipv4/tcp_keepalive_time", "r");
		if (f) {
			if (fscanf(f, "%u", &rs->keepalive_time) != 1)
				rs->keepalive_time = 7200;
			fclose(f);
		}
	}
	return ka_add(rs);
}

/* --------------------------------------------------------- options */

static int int_opt(const void *v, socklen_t len, int *out) {
	if (!v || len < sizeof(int))
		return ERRNO(EINVAL);
	memcpy(out, v, sizeof *out);
	return 0;
}

VR_EXPORT int rsetsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	int v = 0;
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_REUSEADDR:
			if (int_opt(optval, optlen, &v))
				return -1;
			if (rdma_set_option(rs->cm_id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof v) &&
			    rs->state == RS_INIT)
				return -1;
			break;
		case SO_RCVBUF:
			if (int_opt(optval, optlen, &v))
				return -1;
			if (!rs->area)
				rs->rbuf_size = (uint32_t)v << 1;
			break;
		case SO_SNDBUF:
			if (int_opt(optval, optlen, &v))
				return -1;
			if (!rs->area)
				rs->sbuf_size = (uint32_t)v << 1;
			if (rs->sbuf_size < RS_SNDLOWAT)
				rs->sbuf_size = RS_SNDLOWAT << 1;
			break;
		case SO_LINGER:
			if (!optval || optlen < sizeof(struct linger))
				return ERRNO(EINVAL);
			memcpy(&rs->linger, optval, sizeof rs->linger);
			v = rs->linger.l_onoff;
			break;
		case SO_KEEPALIVE:
			if (int_opt(optval, optlen, &v) || set_keepalive(rs, v != 0))
				return -1;
			break;
		case SO_OOBINLINE:
			if (int_opt(optval, optlen, &v))
				return -1;
			break;
		default:
			return ERRNO(ENOTSUP);
		}
		if (optname < 32) {
			if (v)
				rs->so_opts |= 1u << optname;
			else
				rs->so_opts &= ~(1u << optname);
		}
		return 0;
	case IPPROTO_TCP:
		switch (optname) {
		case TCP_NODELAY:
		case TCP_MAXSEG:
			if (int_opt(optval, optlen, &v))
				return -1;
			if (v)
				rs->tcp_opts |= 1u << optname;
			else
				rs->tcp_opts &= ~(1u << optname);
			return 0;
		case TCP_KEEPIDLE:
			if (int_opt(optval, optlen, &v))
				return -1;
			if (v <= 0)
				return ERRNO(EINVAL);
			rs->keepalive_time = (unsigned)v;
			rs->ka_next = now_us() / 1000000 + rs->keepalive_time;
			return 0;
		default:
			return ERRNO(ENOTSUP);
		}
	case IPPROTO_IPV6:
		if (optname != IPV6_V6ONLY)
			return ERRNO(ENOTSUP);
		if (int_opt(optval, optlen, &v))
			return -1;
		return rdma_set_option(rs->cm_id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &v, sizeof v);
	case SOL_RDMA:
		if (rs->state >= RS_OPENING)
			return ERRNO(EINVAL);
		if (optname == RDMA_ROUTE)
			return 0; /* no IB path records on vrnic: the CM resolves the route */
		if (int_opt(optval, optlen, &v))
			return -1;
		if (v < 0)
			return ERRNO(EINVAL);
		switch (optname) {
		case RDMA_SQSIZE:
			rs->sq_size = (uint16_t)(v < RS_QP_MAX_SIZE ? v : RS_QP_MAX_SIZE);
			return 0;
		case RDMA_RQSIZE:
			rs->rq_size = (uint16_t)(v < RS_QP_MAX_SIZE ? v : RS_QP_MAX_SIZE);
			return 0;
		case RDMA_INLINE:
			rs->sq_inline = (uint32_t)(v < RS_QP_MAX_SIZE ? v : RS_QP_MAX_SIZE);
			return 0;
		case RDMA_IOMAPSIZE:
			rs->target_iomap_size = rs_scale_to_value((uint8_t)rs_value_to_scale(v, 8), 8);
			return 0;
		default:
			return ERRNO(ENOTSUP);
		}
	default:
		return ERRNO(ENOTSUP);
	}
}

static int put_int(void *optval, socklen_t *optlen, int v) {
	if (!optval || !optlen || *optlen < sizeof(int))
		return ERRNO(EINVAL);
	memcpy(optval, &v, sizeof v);
	*optlen = sizeof v;
	return 0;
}

VR_EXPORT int rgetsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	switch (level) {
	case SOL_SOCKET:
		switch (optname) {
		case SO_REUSEADDR:
		case SO_KEEPALIVE:
		case SO_OOBINLINE:
			return put_int(optval, optlen, !!(rs->so_opts & (1u << optname)));
		case SO_RCVBUF:
			return put_int(optval, optlen, (int)rs->rbuf_size);
		case SO_SNDBUF:
			return put_int(optval, optlen, (int)rs->sbuf_size);
		case SO_LINGER:
			if (!optval || !optlen || *optlen < sizeof(struct linger))
				return ERRNO(EINVAL);
			memcpy(optval, &rs->linger, sizeof rs->linger);
			*optlen = sizeof rs->linger;
			return 0;
		case SO_ERROR: {
			pthread_mutex_lock(&rs->mu);
			if (rs->state & RS_OPENING)
				do_connect(rs, true);
			int e = rs->err;
			if (rs->state & RS_OPENING)
				e = 0;
			rs->err = 0;
			pthread_mutex_unlock(&rs->mu);
			return put_int(optval, optlen, e);
		}
		case SO_TYPE:
			return put_int(optval, optlen, SOCK_STREAM);
		default:
			return ERRNO(ENOTSUP);
		}
	case IPPROTO_TCP:
		switch (optname) {
		case TCP_NODELAY:
			return put_int(optval, optlen, !!(rs->tcp_opts & (1u << TCP_NODELAY)));
		case TCP_MAXSEG: {
			int mss = 2048;
			struct ibv_port_attr pa;
			if (rs->cm_id->verbs && !ibv_query_port(rs->cm_id->verbs, rs->cm_id->port_num ? rs->cm_id->port_num : 1, &pa))
				mss = 128 << pa.active_mtu;
			return put_int(optval, optlen, mss);
		}
		case TCP_KEEPIDLE:
			return put_int(optval, optlen, (int)rs->keepalive_time);
		default:
			return ERRNO(ENOTSUP);
		}
	case SOL_RDMA:
		switch (optname) {
		case RDMA_SQSIZE:
			return put_int(optval, optlen, rs->sq_size);
		case RDMA_RQSIZE:
			return put_int(optval, optlen, rs->rq_size);
		case RDMA_INLINE:
			return put_int(optval, optlen, (int)rs->sq_inline);
		case RDMA_IOMAPSIZE:
			return put_int(optval, optlen, rs->target_iomap_size);
		case RDMA_ROUTE:
			if (!optlen)
				return ERRNO(EINVAL);
			*optlen = 0; /* no IB path records */
			return 0;
		default:
			return ERRNO(ENOTSUP);
		}
	default:
		return ERRNO(ENOTSUP);
	}
}

VR_EXPORT int rfcntl(int socket, int cmd, ... /* arg */) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	va_list ap;
	va_start(ap, cmd);
	int ret = 0;
	switch (cmd) {
	case F_GETFL:
		ret = rs->fs_flags | O_RDWR;
		break;
	case F_SETFL:
		rs->fs_flags = va_arg(ap, int) & O_NONBLOCK;
		break;
	case F_GETFD:
		ret = rs->fd_flags;
		break;
	case F_SETFD:
		rs->fd_flags = va_arg(ap, int);
		break;
	default:
		ret = ERRNO(ENOTSUP);
		break;
	}
	va_end(ap);
	return ret;
}

/* ------------------------------------------------------------ iomaps */

VR_EXPORT off_t riomap(int socket, void *buf, size_t len, int prot, int flags, off_t offset) {
	(void)flags;
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	if (!rs->cm_id->pd || (prot & ~(PROT_WRITE | PROT_NONE)))
		return ERRNO(EINVAL);
	pthread_mutex_lock(&rs->mu);
	struct rs_iomr *m = calloc(1, sizeof *m);
	if (!m) {
		pthread_mutex_unlock(&rs->mu);
		return ERRNO(ENOMEM);
	}
	m->index = -1;
	int access = IBV_ACCESS_LOCAL_WRITE;
	if (prot & PROT_WRITE) {
		if (!rs->remote_slot_used && rs->remote_iomap.length)
			rs->remote_slot_used = calloc(rs->remote_iomap.length, sizeof(bool));
		for (uint32_t i = 0; rs->remote_slot_used && i < rs->remote_iomap.length; i++)
			if (!rs->remote_slot_used[i]) {
				m->index = (int)i;
				break;
			}
		if (m->index < 0) {
			free(m);
			pthread_mutex_unlock(&rs->mu);
			return ERRNO(ENOMEM);
		}
		access |= IBV_ACCESS_REMOTE_WRITE;
	}
	m->mr = ibv_reg_mr(rs->cm_id->pd, buf, len, access);
	if (!m->mr) {
		int e = errno;
		free(m);
		pthread_mutex_unlock(&rs->mu);
		return ERRNO(e);
	}
	if (offset == -1)
		offset = (off_t)(uintptr_t)buf;
	m->offset = (uint64_t)offset;
	if (m->index >= 0) {
		rs->remote_slot_used[m->index] = true;
		m->pending = true;
		rs->iomap_pending = true;
	}
	/* Appended: entries go to the peer in the order they were mapped. */
	struct rs_iomr **pp = &rs->iomaps;
	while (*pp)
		pp = &(*pp)->next;
	*pp = m;
	pthread_mutex_unlock(&rs->mu);
	return offset;
}

VR_EXPORT int riounmap(int socket, void *buf, size_t len) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return ERRNO(EBADF);
	pthread_mutex_lock(&rs->mu);
	for (struct rs_iomr **pp = &rs->iomaps; *pp; pp = &(*pp)->next) {
		struct rs_iomr *m = *pp;
		if (m->mr->addr == buf && m->mr->length == len) {
			*pp = m->next;
			if (m->index >= 0)
				rs->remote_slot_used[m->index] = false;
			ibv_dereg_mr(m->mr);
			free(m);
			pthread_mutex_unlock(&rs->mu);
			return 0;
		}
	}
	pthread_mutex_unlock(&rs->mu);
	return ERRNO(EINVAL);
}

VR_EXPORT size_t riowrite(int socket, const void *buf, size_t count, off_t offset, int flags) {
	struct rs *rs = lookup(socket);
	if (!rs)
		return (size_t)ERRNO(EBADF);
	if (!(rs->state & (RS_CONNECTED | RS_DISCONNECTED | RS_ERROR)))
		return (size_t)ERRNO(ENOTCONN);
	if (!count)
		return 0;
	struct iovec v = { .iov_base = (void *)buf, .iov_len = count };
	return (size_t)do_send(rs, &v, 1, count, flags, true, offset);
}
