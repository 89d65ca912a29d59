/* cma_addr.c - addresses: sockaddr helpers, GIDs, rdma_getaddrinfo,
 * ports, event names (rsockets and rpoll: cma_rsocket.c). */
#include "cma.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

socklen_t cma_addrlen(const struct sockaddr *a) {
	if (!a)
		return 0;
	switch (a->sa_family) {
	case AF_INET:
		return sizeof(struct sockaddr_in);
	case AF_INET6:
		return sizeof(struct sockaddr_in6);
	default:
		return 0;
	}
}

bool cma_any(const struct sockaddr *a) {
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr == htonl(INADDR_ANY);
	if (a->sa_family == AF_INET6)
		return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return true;
}

/* cma_loopback is the kernel's cma_loopback_addr: 127.0.0.0/8 or ::1. */
bool cma_loopback(const struct sockaddr *a) {
	if (a->sa_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
	if (a->sa_family == AF_INET6)
		return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
	return false;
}

/* cma_local_addr: a is an address of this host (a socket can bind to
 * it). */
bool cma_local_addr(const struct sockaddr *a) {
	int saved = errno, s = socket(a->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	bool ok = false;
	if (s >= 0) {
		struct sockaddr_storage b;
		memset(&b, 0, sizeof b);
		memcpy(&b, a, cma_addrlen(a));
		cma_set_port((struct sockaddr *)&b, 0);
		ok = bind(s, (struct sockaddr *)&b, cma_addrlen(a)) == 0;
		close(s);
	}
	errno = saved;
	return ok;
}

/* cma_addr_eq compares the addresses (not the ports), as the kernel's
 * cma_addr_cmp. */
bool cma_addr_eq(const struct sockaddr *a, const struct sockaddr *b) {
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->sa_family == AF_INET6)
		return IN6_ARE_ADDR_EQUAL(&((const struct sockaddr_in6 *)a)->sin6_addr,
					  &((const struct sockaddr_in6 *)b)->sin6_addr);
	return false;
}

uint16_t cma_port(const struct sockaddr *a) {
	if (a->sa_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)a)->sin_port);
	if (a->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
	return 0;
}

void cma_set_port(struct sockaddr *a, uint16_t port) {
	if (a->sa_family == AF_INET)
		((struct sockaddr_in *)a)->sin_port = htons(port);
	else if (a->sa_family == AF_INET6)
		((struct sockaddr_in6 *)a)->sin6_port = htons(port);
}

/* cma_addr_to_gid: an IPv4 address becomes the IPv4-mapped GID
 * ::ffff:a.b.c.d (RoCE v2), an IPv6 address is the GID. */
void cma_addr_to_gid(const struct sockaddr *a, union ibv_gid *g) {
	memset(g, 0, sizeof *g);
	if (a->sa_family == AF_INET) {
		g->raw[10] = 0xff;
		g->raw[11] = 0xff;
		memcpy(&g->raw[12], &((const struct sockaddr_in *)a)->sin_addr, 4);
	} else if (a->sa_family == AF_INET6) {
		memcpy(g->raw, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
	}
}

bool cma_gid_to_addr(const union ibv_gid *g, struct sockaddr_storage *out) {
	static const uint8_t v4mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	memset(out, 0, sizeof *out);
	if (memcmp(g->raw, v4mapped, sizeof v4mapped) == 0) {
		struct sockaddr_in *s = (struct sockaddr_in *)out;
		s->sin_family = AF_INET;
		memcpy(&s->sin_addr, &g->raw[12], 4);
		return true;
	}
	static const uint8_t zero[16];
	if (memcmp(g->raw, zero, 16) == 0)
		return false;
	struct sockaddr_in6 *s = (struct sockaddr_in6 *)out;
	s->sin6_family = AF_INET6;
	memcpy(&s->sin6_addr, g->raw, 16);
	return true;
}

VR_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id) {
	return htons(cma_port(&id->route.addr.src_addr));
}

VR_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id) {
	return htons(cma_port(&id->route.addr.dst_addr));
}

VR_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event) {
	static const char *names[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR", "RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR", "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE", "RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED", "RDMA_CM_EVENT_DISCONNECTED", "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof names / sizeof names[0])
		return names[event];
	return "UNKNOWN EVENT";
}

static struct sockaddr *dup_addr(const struct sockaddr *a, socklen_t len) {
	struct sockaddr *d = calloc(1, sizeof(struct sockaddr_storage));
	if (d)
		memcpy(d, a, len);
	return d;
}

VR_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res) {
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = next;
	}
}

/* rdma_getaddrinfo resolves node and service with getaddrinfo(3). With
 * RAI_PASSIVE the address is the source (to bind: "localhost" gives a
 * loopback address, which binds to a device, and no node the wildcard
 * address); otherwise it is the destination, and the hints' source
 * address (if any) is copied. Without node and service the hints'
 * addresses are the answer, as librdmacm's (EINVAL without hints). The
 * port space follows the hints, else the QP type (UD: RDMA_PS_UDP, else
 * RDMA_PS_TCP). */
VR_EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			       struct rdma_addrinfo **res) {
	if (!res || (!node && !service && !hints)) {
		errno = EINVAL;
		return -1;
	}
	struct rdma_addrinfo *r = calloc(1, sizeof *r);
	if (!r) {
		errno = ENOMEM;
		return -1;
	}
	int flags = hints ? hints->ai_flags : 0;
	r->ai_flags = flags;
	r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
	r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space
			   : r->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP
							 : RDMA_PS_TCP;
	if (node || service) {
		struct addrinfo h = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
		if (flags & RAI_PASSIVE)
			h.ai_flags |= AI_PASSIVE;
		if (flags & RAI_NUMERICHOST)
			h.ai_flags |= AI_NUMERICHOST;
		if (hints && hints->ai_family)
			h.ai_family = hints->ai_family;
		int e = getaddrinfo(node, service, &h, &ai);
		if (e) {
			free(r);
			errno = e == EAI_SYSTEM ? errno : EADDRNOTAVAIL;
			return e;
		}
		/* Prefer IPv4 (RoCE v2 GIDs of the daemons' links are IPv4-mapped
		 * unless the link is IPv6). */
		struct addrinfo *pick = ai;
		for (struct addrinfo *p = ai; p; p = p->ai_next)
			if (p->ai_family == AF_INET) {
				pick = p;
				break;
			}
		r->ai_family = pick->ai_family;
		struct sockaddr *a = dup_addr(pick->ai_addr, pick->ai_addrlen);
		if (!a) {
			freeaddrinfo(ai);
			rdma_freeaddrinfo(r);
			errno = ENOMEM;
			return -1;
		}
		if (flags & RAI_PASSIVE) {
			r->ai_src_addr = a;
			r->ai_src_len = pick->ai_addrlen;
		} else {
			r->ai_dst_addr = a;
			r->ai_dst_len = pick->ai_addrlen;
		}
		freeaddrinfo(ai);
	}
	if (hints && hints->ai_src_addr && !r->ai_src_addr) {
		socklen_t l = cma_addrlen(hints->ai_src_addr);
		if (l) {
			r->ai_src_addr = dup_addr(hints->ai_src_addr, l);
			r->ai_src_len = l;
		}
	}
	if (hints && hints->ai_dst_addr && !r->ai_dst_addr) {
		socklen_t l = cma_addrlen(hints->ai_dst_addr);
		if (l) {
			r->ai_dst_addr = dup_addr(hints->ai_dst_addr, l);
			r->ai_dst_len = l;
		}
	}
	if (!r->ai_family)
		r->ai_family = r->ai_src_addr ? r->ai_src_addr->sa_family
			       : r->ai_dst_addr ? r->ai_dst_addr->sa_family
						: AF_INET;
	*res = r;
	return 0;
}
