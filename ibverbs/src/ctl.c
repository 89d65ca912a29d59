/* ctl.c - the control socket: one command datagram out, one reply in. */
#include "vrnic_ibv.h"

#include <sys/mman.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* A command that gets no reply in this time fails with ETIMEDOUT rather
 * than hanging the program (a wedged daemon). */
#define VR_REPLY_TIMEOUT_S 30

bool vr_debug(void) {
	const char *e = getenv("VRNIC_DEBUG");
	return e && *e && strcmp(e, "0") != 0;
}

int vr_connect(const char *path) {
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof a.sun_path) {
		close(s);
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(a.sun_path, path);
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		int e = errno;
		close(s);
		errno = e;
		return -1;
	}
	struct timeval tv = { .tv_sec = VR_REPLY_TIMEOUT_S };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	return s;
}

static const char *op_name(uint16_t op) {
	static const char *names[] = { "?", "OPEN_CONTEXT", "QUERY_DEVICE", "QUERY_PORT", "QUERY_GID",
		"ADD_HOST_MEM", "REMOVE_HOST_MEM", "ALLOC_PD", "DEALLOC_PD", "REG_MR", "DEREG_MR", "CREATE_CQ",
		"DESTROY_CQ", "CREATE_QP", "MODIFY_QP", "QUERY_QP", "DESTROY_QP", "CREATE_SRQ", "MODIFY_SRQ",
		"DESTROY_SRQ", "CREATE_AH", "DESTROY_AH", "QUERY_SRQ", "OPEN_EVENTS", "CM_CREATE_ID", "CM_DESTROY_ID",
		"CM_LISTEN", "CM_CONNECT", "CM_ACCEPT", "CM_REJECT", "CM_ESTABLISH", "CM_DISCONNECT", "CM_INIT_QP_ATTR" };
	static const char *abi14[] = { "REREG_MR", "RESIZE_CQ", "ALLOC_DM", "FREE_DM", "REG_DM_MR", "QUERY_DEVICE_EX" };
	if (op >= VRNIC_CMD_REREG_MR && op <= VRNIC_CMD_QUERY_DEVICE_EX)
		return abi14[op - VRNIC_CMD_REREG_MR];
	return op < sizeof names / sizeof names[0] ? names[op] : "?";
}

/* vr_call_sock sends command op (header, req, then the extra bytes already
 * appended to req by the caller) with nfds fds, and reads the reply: the
 * reply struct into resp (exactly resp_len bytes) and, if nrfds > 0, that
 * many fds into rfds. It returns 0 or an errno value (the daemon's status,
 * or the socket's error; EPROTO for a malformed reply). */
int vr_call_sock(int sock, uint32_t *seq, uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
		 void *resp, size_t resp_len, int *rfds, int nrfds) {
	uint8_t *buf = malloc(VRNIC_MAX_MSG_SIZE);
	if (!buf)
		return ENOMEM;
	int ret = 0;
	if (sizeof(struct vrnic_msg_hdr) + req_len > VRNIC_MAX_MSG_SIZE) {
		ret = EINVAL;
		goto out;
	}
	struct vrnic_msg_hdr h = { .opcode = op, .length = (uint32_t)(sizeof h + req_len), .seq = ++*seq };
	memcpy(buf, &h, sizeof h);
	if (req_len)
		memcpy(buf + sizeof h, req, req_len);
	struct iovec iov = { buf, h.length };
	union {
		struct cmsghdr c;
		char b[CMSG_SPACE(sizeof(int) * VRNIC_MAX_FDS)];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) {
		m.msg_control = cm.b;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		ret = errno == EAGAIN ? ETIMEDOUT : errno;
		goto out;
	}
	for (;;) {
		iov.iov_len = VRNIC_MAX_MSG_SIZE;
		m.msg_control = cm.b;
		m.msg_controllen = sizeof cm.b;
		m.msg_flags = 0;
		do
			n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
		while (n < 0 && errno == EINTR);
		if (n < 0) {
			ret = errno == EAGAIN ? ETIMEDOUT : errno;
			goto out;
		}
		if (n == 0) { /* the daemon closed the connection */
			ret = ECONNRESET;
			goto out;
		}
		/* Received fds are ours to close unless handed to the caller. */
		int got[VRNIC_MAX_FDS], ngot = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (int i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (ngot < (int)VRNIC_MAX_FDS)
					got[ngot++] = fd;
				else
					close(fd);
			}
		}
		struct vrnic_msg_hdr r;
		if ((size_t)n < sizeof r) {
			for (int i = 0; i < ngot; i++)
				close(got[i]);
			ret = EPROTO;
			goto out;
		}
		memcpy(&r, buf, sizeof r);
		if (r.seq != h.seq) { /* a stale reply of an earlier timed-out command */
			for (int i = 0; i < ngot; i++)
				close(got[i]);
			continue;
		}
		if (r.opcode != op || !(r.flags & VRNIC_MSG_F_REPLY)) {
			ret = EPROTO;
		} else if (r.status) {
			ret = (int)r.status;
			if (vr_debug()) {
				size_t ml = (size_t)n - sizeof r;
				fprintf(stderr, "vrnic: %s: %s: %.*s\n", op_name(op), strerror(ret), (int)ml,
					(const char *)buf + sizeof r);
			}
		} else if ((size_t)n != sizeof r + resp_len || ngot != nrfds) {
			ret = EPROTO;
		} else {
			if (resp_len)
				memcpy(resp, buf + sizeof r, resp_len);
			for (int i = 0; i < nrfds; i++)
				rfds[i] = got[i];
			ngot = 0;
		}
		for (int i = 0; i < ngot; i++)
			close(got[i]);
		break;
	}
out:
	free(buf);
	return ret;
}

/* vr_calls_init maps the context's call lock shared, so that a child the
 * program forks (pyverbs' multi-process tests, any fork after
 * ibv_open_device) and its parent take turns on the socket they share:
 * each process then reads the reply to its own command. Robust: a process
 * that dies holding it does not stop the others. */
int vr_calls_init(struct vr_ctx *c) {
	void *p = mmap(NULL, sizeof *c->calls, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return errno;
	c->calls = p;
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&c->calls->mu, &a);
	pthread_mutexattr_destroy(&a);
	return 0;
}

void vr_calls_free(struct vr_ctx *c) {
	if (c->calls)
		munmap(c->calls, sizeof *c->calls);
	c->calls = NULL;
}

void vr_calls_lock(struct vr_ctx *c) {
	if (pthread_mutex_lock(&c->calls->mu) == EOWNERDEAD)
		pthread_mutex_consistent(&c->calls->mu);
}

void vr_calls_unlock(struct vr_ctx *c) { pthread_mutex_unlock(&c->calls->mu); }

/* vr_call sends a command on the context's socket: req followed by extra. */
int vr_call(struct vr_ctx *c, uint16_t op, const void *req, size_t req_len, const void *extra, size_t extra_len,
	    const int *fds, int nfds, void *resp, size_t resp_len) {
	const void *body = req;
	uint8_t *joined = NULL;
	if (extra_len) {
		joined = malloc(req_len + extra_len);
		if (!joined)
			return ENOMEM;
		memcpy(joined, req, req_len);
		memcpy(joined + req_len, extra, extra_len);
		body = joined;
	}
	int ret = EIO;
	vr_calls_lock(c);
	if (!vr_dead(c))
		ret = vr_call_sock(c->sock, &c->calls->seq, op, body, req_len + extra_len, fds, nfds, resp, resp_len,
				   NULL, 0);
	vr_calls_unlock(c);
	free(joined);
	if (ret == ECONNRESET || ret == EPIPE || ret == ENOTCONN) {
		vr_set_dead(c);
		ret = EIO;
	}
	return ret;
}

/* vr_destroy_handle destroys a daemon object. Once the daemon is gone it
 * succeeds: the daemon's end of the context, and everything in it, went
 * with it, and the program must be able to free its objects (as after a
 * device is disassociated from the kernel). */
int vr_destroy_handle(struct vr_ctx *c, uint16_t op, uint32_t handle) {
	struct vrnic_cmd_handle h = { .handle = handle };
	int ret = vr_call(c, op, &h, sizeof h, NULL, 0, NULL, 0, NULL, 0);
	return ret == EIO && vr_dead(c) ? 0 : ret;
}

/* The daemon is gone when its end of the control socket closed (it
 * exited or was killed): every command then fails with EIO (as verbs
 * commands on a disassociated device do), posting fails with EIO, polling
 * an empty CQ returns -1, ibv_get_cq_event returns -1 and
 * ibv_get_async_event reports IBV_EVENT_DEVICE_FATAL once. */
void vr_set_dead(struct vr_ctx *c) {
	if (!__atomic_exchange_n(&c->dead, 1, __ATOMIC_SEQ_CST) && vr_debug())
		fprintf(stderr, "vrnic: %s: the daemon closed the connection\n", c->dev->dev.name);
}

/* vr_check_dead looks at the control socket without waiting (one system
 * call) and reports whether the daemon is gone. */
bool vr_check_dead(struct vr_ctx *c) {
	if (vr_dead(c))
		return true;
	struct pollfd p = { .fd = c->sock, .events = POLLRDHUP };
	if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)))
		vr_set_dead(c);
	return vr_dead(c);
}

/* vr_kick wakes the daemon if it sleeps (kick_needed); the caller has
 * stored a producer index or arm word with a sequentially consistent
 * store. With a daemon that numbers its sleeps (kick_gen) it writes once
 * per generation: a post that finds the value this context already kicked
 * for knows the daemon is woken, and will read its record, because the
 * daemon clears kick_needed only after it woke and before it reads the
 * records again (the value was still there after the post's store). */
void vr_kick(struct vr_ctx *c) {
	struct vrnic_db_header *h = (struct vrnic_db_header *)c->db;
	uint32_t k = __atomic_load_n(&h->kick_needed, __ATOMIC_SEQ_CST);
	if (!k) {
		if (c->kick_gen && __atomic_load_n(&c->kicked, __ATOMIC_RELAXED))
			__atomic_store_n(&c->kicked, 0, __ATOMIC_RELAXED);
		return;
	}
	if (c->kick_gen && __atomic_load_n(&c->kicked, __ATOMIC_RELAXED) == k)
		return;
	uint64_t one = 1;
	ssize_t n = write(c->kick_fd, &one, sizeof one);
	(void)n; /* EAGAIN: the counter is already non-zero, the daemon will wake */
	if (c->kick_gen)
		__atomic_store_n(&c->kicked, k, __ATOMIC_RELAXED);
}
