/* events.c - asynchronous events: ibv_get_async_event.
 *
 * The context's async_fd is an epoll fd over two things: the event socket
 * the daemon hands out with OPEN_EVENTS (ABI 1.1), which carries one
 * struct vrnic_async_event per event (QP_FATAL, QP_REQ_ERR,
 * QP_ACCESS_ERR, QP_LAST_WQE_REACHED, CQ_ERR, SRQ_LIMIT_REACHED: the
 * numbering of enum ibv_event_type), and the
 * control socket's hang-up. End of file on the event socket, or the
 * hang-up, means the daemon went away: IBV_EVENT_DEVICE_FATAL, once. An
 * event naming an object the program has destroyed meanwhile is skipped.
 * A daemon older than ABI 1.1 has no event socket: then only the hang-up
 * is reported. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int vr_events_open(struct vr_ctx *c) {
	c->async_ep = epoll_create1(EPOLL_CLOEXEC);
	if (c->async_ep < 0)
		return errno;
	struct epoll_event ev = { .events = EPOLLRDHUP, .data.fd = c->sock };
	if (epoll_ctl(c->async_ep, EPOLL_CTL_ADD, c->sock, &ev) < 0)
		return errno;
	int fd = -1;
	vr_calls_lock(c);
	int ret = vr_call_sock(c->sock, &c->calls->seq, VRNIC_CMD_OPEN_EVENTS, NULL, 0, NULL, 0, NULL, 0, &fd, 1);
	vr_calls_unlock(c);
	if (ret) {
		/* A daemon without OPEN_EVENTS (it answers an unknown opcode
		 * with EINVAL or EOPNOTSUPP): the hang-up alone. */
		if (ret == EINVAL || ret == EOPNOTSUPP || ret == ENOSYS)
			return 0;
		return ret;
	}
	c->events_fd = fd;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	ev = (struct epoll_event){ .events = EPOLLIN, .data.fd = fd };
	if (epoll_ctl(c->async_ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		return errno;
	return 0;
}

void vr_obj_add(struct vr_ctx *c, uint32_t kind, uint32_t id, void *obj) {
	pthread_mutex_lock(&c->obj_mu);
	if (c->nobjs == c->capobjs) {
		size_t cap = c->capobjs ? 2 * c->capobjs : 16;
		struct vr_obj *n = realloc(c->objs, cap * sizeof *n);
		if (!n) {
			/* Without room the object's events are not delivered;
			 * everything else works. */
			pthread_mutex_unlock(&c->obj_mu);
			return;
		}
		c->objs = n;
		c->capobjs = cap;
	}
	c->objs[c->nobjs++] = (struct vr_obj){ .kind = kind, .id = id, .obj = obj };
	pthread_mutex_unlock(&c->obj_mu);
}

void vr_obj_del(struct vr_ctx *c, uint32_t kind, uint32_t id) {
	pthread_mutex_lock(&c->obj_mu);
	for (size_t i = 0; i < c->nobjs; i++) {
		if (c->objs[i].kind == kind && c->objs[i].id == id) {
			c->objs[i] = c->objs[--c->nobjs];
			break;
		}
	}
	pthread_mutex_unlock(&c->obj_mu);
}

static void *obj_find(struct vr_ctx *c, uint32_t kind, uint32_t id) {
	void *o = NULL;
	pthread_mutex_lock(&c->obj_mu);
	for (size_t i = 0; i < c->nobjs; i++) {
		if (c->objs[i].kind == kind && c->objs[i].id == id) {
			o = c->objs[i].obj;
			break;
		}
	}
	pthread_mutex_unlock(&c->obj_mu);
	return o;
}

/* The daemon numbers its events as enum ibv_event_type: fill passes the
 * number through. */
_Static_assert((int)VRNIC_EVENT_CQ_ERR == (int)IBV_EVENT_CQ_ERR, "CQ_ERR");
_Static_assert((int)VRNIC_EVENT_QP_FATAL == (int)IBV_EVENT_QP_FATAL, "QP_FATAL");
_Static_assert((int)VRNIC_EVENT_QP_REQ_ERR == (int)IBV_EVENT_QP_REQ_ERR, "QP_REQ_ERR");
_Static_assert((int)VRNIC_EVENT_QP_ACCESS_ERR == (int)IBV_EVENT_QP_ACCESS_ERR, "QP_ACCESS_ERR");
_Static_assert((int)VRNIC_EVENT_DEVICE_FATAL == (int)IBV_EVENT_DEVICE_FATAL, "DEVICE_FATAL");
_Static_assert((int)VRNIC_EVENT_PORT_ACTIVE == (int)IBV_EVENT_PORT_ACTIVE, "PORT_ACTIVE");
_Static_assert((int)VRNIC_EVENT_PORT_ERR == (int)IBV_EVENT_PORT_ERR, "PORT_ERR");
_Static_assert((int)VRNIC_EVENT_QP_LAST_WQE_REACHED == (int)IBV_EVENT_QP_LAST_WQE_REACHED, "QP_LAST_WQE_REACHED");
_Static_assert((int)VRNIC_EVENT_SRQ_LIMIT_REACHED == (int)IBV_EVENT_SRQ_LIMIT_REACHED, "SRQ_LIMIT_REACHED");

/* fill maps a daemon event onto ev; 0 when the object it names is gone. */
static int fill(struct vr_ctx *c, const struct vrnic_async_event *e, struct ibv_async_event *ev) {
	memset(ev, 0, sizeof *ev);
	ev->event_type = (enum ibv_event_type)e->event_type;
	uint32_t id = (uint32_t)e->element;
	switch (e->event_type) {
	case VRNIC_EVENT_QP_FATAL:
	case VRNIC_EVENT_QP_REQ_ERR:
	case VRNIC_EVENT_QP_ACCESS_ERR:
	case VRNIC_EVENT_QP_LAST_WQE_REACHED:
		return (ev->element.qp = obj_find(c, VR_OBJ_QP, id)) != NULL;
	case VRNIC_EVENT_CQ_ERR:
		return (ev->element.cq = obj_find(c, VR_OBJ_CQ, id)) != NULL;
	case VRNIC_EVENT_SRQ_LIMIT_REACHED:
		return (ev->element.srq = obj_find(c, VR_OBJ_SRQ, id)) != NULL;
	case VRNIC_EVENT_PORT_ACTIVE:
	case VRNIC_EVENT_PORT_ERR:
		ev->element.port_num = (int)e->element;
		return 1;
	default:
		return 0; /* an event this library does not know: skipped */
	}
}

/* fatal reports IBV_EVENT_DEVICE_FATAL once and takes the sources out of
 * async_fd, so that later calls wait (or fail with EAGAIN when async_fd
 * was made non-blocking) as they would with nothing to report. */
static int fatal(struct vr_ctx *c, struct ibv_async_event *ev) {
	vr_set_dead(c);
	epoll_ctl(c->async_ep, EPOLL_CTL_DEL, c->sock, NULL);
	if (c->events_fd >= 0)
		epoll_ctl(c->async_ep, EPOLL_CTL_DEL, c->events_fd, NULL);
	if (__atomic_exchange_n(&c->fatal_sent, 1, __ATOMIC_SEQ_CST))
		return 1;
	memset(ev, 0, sizeof *ev);
	ev->event_type = IBV_EVENT_DEVICE_FATAL;
	return 0;
}

VR_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event) {
	if (!ctx || !event) {
		errno = EINVAL;
		return -1;
	}
	struct vr_ctx *c = vr_ctx(ctx);
	int fl = fcntl(ctx->async_fd, F_GETFL);
	int wait = fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1;
	for (;;) {
		/* What the daemon sent comes first, the hang-up after it. */
		if (c->events_fd >= 0) {
			struct vrnic_async_event e;
			ssize_t n = recv(c->events_fd, &e, sizeof e, MSG_DONTWAIT);
			if (n == (ssize_t)sizeof e) {
				if (fill(c, &e, event))
					return 0;
				continue;
			}
			if (n == 0) {
				if (!fatal(c, event))
					return 0;
			} else if (n > 0) {
				continue; /* a malformed datagram: skipped */
			} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				if (!fatal(c, event))
					return 0;
			}
		}
		struct epoll_event ev;
		int n;
		do
			n = epoll_wait(ctx->async_fd, &ev, 1, wait);
		while (n < 0 && errno == EINTR);
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		if (c->events_fd >= 0 && ev.data.fd == c->events_fd)
			continue; /* read it above */
		if (ev.events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
			/* The control socket hung up: read what the event socket
			 * still holds first, then report the daemon gone. */
			if (c->events_fd >= 0) {
				struct vrnic_async_event e;
				ssize_t m = recv(c->events_fd, &e, sizeof e, MSG_DONTWAIT | MSG_PEEK);
				if (m > 0)
					continue;
			}
			if (!fatal(c, event))
				return 0;
		}
	}
}

VR_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) { (void)event; }
