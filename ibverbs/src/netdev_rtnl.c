/*
 * rtnetlink for the synthetic interfaces of libvrnic-netdev.so: programs
 * that ask the kernel about links and addresses over a NETLINK_ROUTE
 * socket themselves (iproute2's ip, libmnl, libnl, pyroute2) see the
 * interfaces of VRNIC_NETDEVS beside the real ones, with the index, name,
 * MTU, MAC, flags and addresses getifaddrs shows (netdev.c).
 *
 * The shim follows the sockets socket() creates with AF_NETLINK and
 * NETLINK_ROUTE (checked again by inode on each use: a closed and reused
 * descriptor is forgotten). On send it reads the requests:
 *
 *  - RTM_GETLINK dump: the kernel's answer, with a RTM_NEWLINK per
 *    synthetic interface before its NLMSG_DONE;
 *  - RTM_GETADDR dump: likewise with a RTM_NEWADDR per address of the
 *    dumped family; with NETLINK_GET_STRICT_CHK and ifa_index naming a
 *    synthetic interface (which the kernel would refuse, ENODEV), the
 *    request goes to the kernel for lo (ifindex 1) and lo's records are
 *    replaced by the interface's;
 *  - RTM_GETLINK get by ifi_index, IFLA_IFNAME or IFLA_ALT_IFNAME of a
 *    synthetic interface: sent to the kernel as a get of lo, whose
 *    RTM_NEWLINK is replaced by the interface's (and the ack, if asked
 *    for, carries the request's header), so that the reply arrives when
 *    the kernel's would, and poll() sees it.
 *
 * Everything else is sent as it is. On receive, while a request of the
 * socket is pending, the shim takes the kernel's datagram itself, makes
 * those changes (the kernel's records untouched, ours in a datagram of
 * their own before the one holding NLMSG_DONE) and hands the datagrams out
 * as the kernel would: one per call, MSG_PEEK and MSG_TRUNC honoured, the
 * rest of a datagram too large for the buffer dropped with MSG_TRUNC in
 * msg_flags. With nothing pending, calls go straight to the C library.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_addr.h>
#include <net/if_arp.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "netdev.h"

#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
#ifndef NETLINK_GET_STRICT_CHK
#define NETLINK_GET_STRICT_CHK 12
#endif
#ifndef NLM_F_CAPPED
#define NLM_F_CAPPED 0x100
#endif
#ifndef IFLA_ALT_IFNAME
#define IFLA_ALT_IFNAME 53
#endif

#define LO_IFINDEX 1 /* LOOPBACK_IFINDEX: lo in every network namespace */
#define MAX_FD 65536
#define MAX_SOCKS 64
#define MAX_PENDING 16
#define MAX_MSG (1 << 20)

enum pend_kind {
	P_LINK_DUMP,   /* append our links before DONE */
	P_ADDR_DUMP,   /* append our addresses (of family) before DONE */
	P_ADDR_LO,     /* drop lo's addresses, put nd's before DONE */
	P_LINK_GET_LO, /* replace lo's RTM_NEWLINK by nd's; fix the ack */
};

struct pending {
	enum pend_kind kind;
	uint32_t seq;
	int family;
	bool stats;	    /* link: IFLA_STATS/IFLA_STATS64 (no RTEXT_FILTER_SKIP_STATS) */
	bool ack;	    /* get: NLM_F_ACK asked for */
	bool replied;	    /* get: lo's RTM_NEWLINK seen */
	struct netdev *nd;  /* P_ADDR_LO, P_LINK_GET_LO */
	struct nlmsghdr req; /* get: the request's header, for the ack */
};

struct dgram {
	struct dgram *next;
	size_t len, clen;
	unsigned char *ctl;
	unsigned char data[];
};

struct nlsock {
	int fd; /* -1: free */
	dev_t dev;
	ino_t ino;
	int npend;
	struct pending pend[MAX_PENDING];
	struct dgram *head, *tail;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char g_mark[MAX_FD]; /* fd -> 1 + slot in g_socks, 0: not ours */
static struct nlsock g_socks[MAX_SOCKS];

/* ---- the C library's functions ---- */

#define NEXT(name, type)                                                                                               \
	static type next_##name;                                                                                       \
	if (!next_##name)                                                                                              \
		next_##name = (type)nd_real(#name);                                                                    \
	if (!next_##name) {                                                                                            \
		errno = ENOSYS;                                                                                        \
		return -1;                                                                                             \
	}

typedef int (*socket_fn)(int, int, int);
typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);

static ssize_t real_sendmsg(int fd, const struct msghdr *m, int flags) {
	NEXT(sendmsg, sendmsg_fn);
	return next_sendmsg(fd, m, flags);
}

static ssize_t real_recvmsg(int fd, struct msghdr *m, int flags) {
	NEXT(recvmsg, recvmsg_fn);
	return next_recvmsg(fd, m, flags);
}

/* ---- the sockets we follow ---- */

static void free_queue(struct nlsock *s) {
	while (s->head) {
		struct dgram *d = s->head;
		s->head = d->next;
		free(d);
	}
	s->tail = NULL;
}

static void forget(struct nlsock *s) {
	free_queue(s);
	if (s->fd >= 0 && s->fd < MAX_FD)
		g_mark[s->fd] = 0;
	s->fd = -1;
	s->npend = 0;
}

/* track starts following fd, a new NETLINK_ROUTE socket. */
static void track(int fd) {
	struct stat st;
	if (fd < 0 || fd >= MAX_FD || fstat(fd, &st))
		return;
	pthread_mutex_lock(&g_mu);
	if (g_mark[fd])
		forget(&g_socks[g_mark[fd] - 1]);
	for (int i = 0; i < MAX_SOCKS; i++) {
		struct nlsock *s = &g_socks[i];
		if (s->fd >= 0 && s->fd < MAX_FD && g_mark[s->fd] != i + 1)
			s->fd = -1; /* stale slot */
		if (s->fd < 0) {
			memset(s, 0, sizeof *s);
			s->fd = fd;
			s->dev = st.st_dev;
			s->ino = st.st_ino;
			__atomic_store_n(&g_mark[fd], (unsigned char)(i + 1), __ATOMIC_RELAXED);
			break;
		}
	}
	pthread_mutex_unlock(&g_mu);
}

static bool marked(int fd) { return fd >= 0 && fd < MAX_FD && __atomic_load_n(&g_mark[fd], __ATOMIC_RELAXED); }

/* lookup returns fd's state with g_mu held, or NULL (g_mu not held). */
static struct nlsock *lookup(int fd) {
	if (!marked(fd))
		return NULL;
	struct stat st;
	bool same = !fstat(fd, &st);
	pthread_mutex_lock(&g_mu);
	int slot = g_mark[fd];
	if (!slot) {
		pthread_mutex_unlock(&g_mu);
		return NULL;
	}
	struct nlsock *s = &g_socks[slot - 1];
	if (!same || s->fd != fd || st.st_dev != s->dev || st.st_ino != s->ino) {
		forget(s);
		pthread_mutex_unlock(&g_mu);
		return NULL;
	}
	return s;
}

EXPORT int socket(int domain, int type, int protocol) {
	NEXT(socket, socket_fn);
	int fd = next_socket(domain, type, protocol);
	if (fd >= 0 && domain == AF_NETLINK && protocol == NETLINK_ROUTE) {
		nd_init();
		if (g_n)
			track(fd);
	}
	return fd;
}

/* ---- building messages ---- */

struct buf {
	unsigned char *p;
	size_t len, cap;
	bool bad;
};

static void *put(struct buf *b, const void *data, size_t n) {
	size_t al = NLMSG_ALIGN(n);
	if (b->bad || b->len + al > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 1024;
		while (cap < b->len + al)
			cap *= 2;
		unsigned char *p = b->bad ? NULL : realloc(b->p, cap);
		if (!p) {
			b->bad = true;
			return NULL;
		}
		b->p = p;
		b->cap = cap;
	}
	void *at = b->p + b->len;
	memset(at, 0, al);
	if (data)
		memcpy(at, data, n);
	b->len += al;
	return at;
}

static void attr(struct buf *b, unsigned short type, const void *data, size_t n) {
	struct rtattr ra = {.rta_len = (unsigned short)RTA_LENGTH(n), .rta_type = type};
	unsigned char tmp[RTA_LENGTH(sizeof(struct rtnl_link_stats64))];
	if (n > sizeof tmp - sizeof ra) {
		b->bad = true;
		return;
	}
	memcpy(tmp, &ra, sizeof ra);
	memcpy(tmp + RTA_LENGTH(0), data, n);
	put(b, tmp, RTA_LENGTH(n));
}

static void attr_u32(struct buf *b, unsigned short type, uint32_t v) { attr(b, type, &v, sizeof v); }
static void attr_u8(struct buf *b, unsigned short type, uint8_t v) { attr(b, type, &v, sizeof v); }

/* begin starts a message; end sets its length. */
static size_t begin(struct buf *b, uint16_t type, uint16_t flags, uint32_t seq, uint32_t pid) {
	size_t at = b->len;
	struct nlmsghdr h = {.nlmsg_type = type, .nlmsg_flags = flags, .nlmsg_seq = seq, .nlmsg_pid = pid};
	put(b, &h, sizeof h);
	return at;
}

static void end(struct buf *b, size_t at) {
	if (!b->bad)
		((struct nlmsghdr *)(b->p + at))->nlmsg_len = (uint32_t)(b->len - at);
}

/* link_msg writes nd's RTM_NEWLINK, as rtnl_fill_ifinfo does for an up
 * Ethernet interface without a driver of its own. */
static void link_msg(struct buf *b, const struct netdev *nd, uint16_t flags, uint32_t seq, uint32_t pid, bool stats) {
	size_t at = begin(b, RTM_NEWLINK, flags, seq, pid);
	struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC,
				.ifi_type = ARPHRD_ETHER,
				.ifi_index = (int)nd->index,
				.ifi_flags = ND_FLAGS | IFF_LOWER_UP_};
	put(b, &ifi, sizeof ifi);
	attr(b, IFLA_IFNAME, nd->name, strlen(nd->name) + 1);
	attr_u32(b, IFLA_TXQLEN, 1000);
	attr_u8(b, IFLA_OPERSTATE, 6); /* IF_OPER_UP */
	attr_u8(b, IFLA_LINKMODE, 0);
	attr_u32(b, IFLA_MTU, (uint32_t)nd->mtu);
	attr_u32(b, IFLA_MIN_MTU, 68);
	attr_u32(b, IFLA_MAX_MTU, 65535);
	attr_u32(b, IFLA_GROUP, 0);
	attr_u32(b, IFLA_PROMISCUITY, 0);
	attr_u32(b, IFLA_NUM_TX_QUEUES, 1);
	attr_u32(b, IFLA_GSO_MAX_SEGS, 65535);
	attr_u32(b, IFLA_GSO_MAX_SIZE, 65536);
	attr_u32(b, IFLA_NUM_RX_QUEUES, 1);
	attr_u8(b, IFLA_CARRIER, 1);
	attr(b, IFLA_QDISC, "noqueue", sizeof "noqueue");
	attr_u32(b, IFLA_CARRIER_CHANGES, 0);
	attr_u8(b, IFLA_PROTO_DOWN, 0);
	attr_u32(b, IFLA_CARRIER_UP_COUNT, 0);
	attr_u32(b, IFLA_CARRIER_DOWN_COUNT, 0);
	attr(b, IFLA_ADDRESS, nd->mac, 6);
	static const unsigned char bcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
	attr(b, IFLA_BROADCAST, bcast, 6);
	if (stats) {
		struct rtnl_link_stats64 s64 = {0};
		struct rtnl_link_stats s32 = {0};
		attr(b, IFLA_STATS64, &s64, sizeof s64);
		attr(b, IFLA_STATS, &s32, sizeof s32);
	}
	end(b, at);
}

/* addr_msg writes a RTM_NEWADDR for a, as inet_fill_ifaddr and
 * inet6_fill_ifaddr do for a permanent address. */
static void addr_msg(struct buf *b, const struct netdev *nd, const struct nd_addr *a, uint16_t flags, uint32_t seq,
		     uint32_t pid) {
	size_t at = begin(b, RTM_NEWADDR, flags, seq, pid);
	struct ifaddrmsg ifa = {.ifa_family = (unsigned char)a->family,
				.ifa_prefixlen = (unsigned char)a->prefix,
				.ifa_flags = IFA_F_PERMANENT,
				.ifa_index = nd->index};
	struct ifa_cacheinfo ci = {.ifa_prefered = 0xffffffffu, .ifa_valid = 0xffffffffu};
	if (a->family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)&a->addr;
		const struct sockaddr_in *brd = (const struct sockaddr_in *)&a->brd;
		/* 127/8 is host scope, as ip(8) gives it and lo has it. */
		ifa.ifa_scope = (ntohl(s->sin_addr.s_addr) >> 24) == 127 ? RT_SCOPE_HOST : RT_SCOPE_UNIVERSE;
		put(b, &ifa, sizeof ifa);
		attr(b, IFA_ADDRESS, &s->sin_addr, 4);
		attr(b, IFA_LOCAL, &s->sin_addr, 4);
		if (a->prefix < 31)
			attr(b, IFA_BROADCAST, &brd->sin_addr, 4);
		attr(b, IFA_LABEL, nd->name, strlen(nd->name) + 1);
	} else {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)&a->addr;
		ifa.ifa_scope = IN6_IS_ADDR_LINKLOCAL(&s->sin6_addr) ? RT_SCOPE_LINK
				: IN6_IS_ADDR_LOOPBACK(&s->sin6_addr) ? RT_SCOPE_HOST
									: RT_SCOPE_UNIVERSE;
		put(b, &ifa, sizeof ifa);
		attr(b, IFA_ADDRESS, &s->sin6_addr, 16);
	}
	attr_u32(b, IFA_FLAGS, IFA_F_PERMANENT);
	attr(b, IFA_CACHEINFO, &ci, sizeof ci);
	end(b, at);
}

static void addr_msgs(struct buf *b, const struct netdev *nd, int family, uint16_t flags, uint32_t seq, uint32_t pid) {
	for (int j = 0; j < nd->naddr; j++)
		if (family == AF_UNSPEC || nd->addr[j].family == family)
			addr_msg(b, nd, &nd->addr[j], flags, seq, pid);
}

/* ---- requests ---- */

/* find_attr returns the payload of attribute type in the attributes at
 * p (n bytes), or NULL. */
static const struct rtattr *find_attr(const void *p, size_t n, unsigned short type) {
	const struct rtattr *ra = p;
	int len = (int)n;
	for (; RTA_OK(ra, len); ra = RTA_NEXT(ra, len))
		if ((ra->rta_type & NLA_TYPE_MASK) == type)
			return ra;
	return NULL;
}

static bool strict(int fd) {
	int v = 0;
	socklen_t l = sizeof v;
	return !getsockopt(fd, SOL_NETLINK, NETLINK_GET_STRICT_CHK, &v, &l) && v;
}

static struct netdev *named(const struct rtattr *ra) {
	if (!ra)
		return NULL;
	char name[IFNAMSIZ + 1] = {0};
	size_t n = RTA_PAYLOAD(ra);
	if (n > IFNAMSIZ)
		return NULL;
	memcpy(name, RTA_DATA(ra), n);
	return nd_by_name(name);
}

static void add_pending(struct nlsock *s, struct pending p) {
	if (s->npend == MAX_PENDING) {
		memmove(&s->pend[0], &s->pend[1], (MAX_PENDING - 1) * sizeof p);
		s->npend--;
	}
	s->pend[s->npend++] = p;
}

/* request reads one request h (whole, n bytes) sent on s; it returns
 * true if it rewrote h in place (to a request for lo, never longer). */
static bool request(struct nlsock *s, int fd, struct nlmsghdr *h) {
	size_t n = h->nlmsg_len;
	bool dump = h->nlmsg_flags & NLM_F_DUMP;
	struct pending p = {.seq = h->nlmsg_seq, .req = *h, .ack = h->nlmsg_flags & NLM_F_ACK};
	if (h->nlmsg_type == RTM_GETLINK && n >= NLMSG_LENGTH(sizeof(struct ifinfomsg))) {
		struct ifinfomsg *ifi = NLMSG_DATA(h);
		const void *attrs = (const char *)ifi + NLMSG_ALIGN(sizeof *ifi);
		size_t alen = n - NLMSG_LENGTH(NLMSG_ALIGN(sizeof *ifi));
		if (n < NLMSG_LENGTH(NLMSG_ALIGN(sizeof *ifi)))
			alen = 0;
		const struct rtattr *em = find_attr(attrs, alen, IFLA_EXT_MASK);
		uint32_t mask = 0;
		if (em && RTA_PAYLOAD(em) >= 4)
			memcpy(&mask, RTA_DATA(em), 4);
		p.stats = !(mask & RTEXT_FILTER_SKIP_STATS);
		if (dump) {
			if (ifi->ifi_family == AF_BRIDGE)
				return false; /* the bridge's own dump */
			if (strict(fd)) {
				const struct rtattr *m = find_attr(attrs, alen, IFLA_MASTER);
				uint32_t master = 0;
				if (m && RTA_PAYLOAD(m) >= 4)
					memcpy(&master, RTA_DATA(m), 4);
				if (master || find_attr(attrs, alen, IFLA_LINKINFO))
					return false; /* no master, no kind */
			}
			p.kind = P_LINK_DUMP;
			add_pending(s, p);
			return false;
		}
		struct netdev *nd = ifi->ifi_index > 0 ? nd_by_index((unsigned)ifi->ifi_index) : NULL;
		if (!nd && ifi->ifi_index == 0) {
			nd = named(find_attr(attrs, alen, IFLA_IFNAME));
			if (!nd)
				nd = named(find_attr(attrs, alen, IFLA_ALT_IFNAME));
		}
		if (!nd)
			return false;
		/* Ask for lo instead, keeping the extension mask. */
		p.kind = P_LINK_GET_LO;
		p.nd = nd;
		add_pending(s, p);
		ifi->ifi_index = LO_IFINDEX;
		size_t len = NLMSG_LENGTH(NLMSG_ALIGN(sizeof *ifi));
		if (em) {
			struct rtattr *dst = (struct rtattr *)((char *)h + len);
			memmove(dst, em, RTA_ALIGN(em->rta_len));
			len += RTA_ALIGN(em->rta_len);
		}
		h->nlmsg_len = (uint32_t)len;
		return true;
	}
	if (h->nlmsg_type == RTM_GETADDR && dump && n >= NLMSG_LENGTH(sizeof(struct ifaddrmsg))) {
		struct ifaddrmsg *ifa = NLMSG_DATA(h);
		p.family = ifa->ifa_family;
		if (p.family != AF_UNSPEC && p.family != AF_INET && p.family != AF_INET6)
			return false;
		if (ifa->ifa_index && strict(fd)) {
			struct netdev *nd = nd_by_index(ifa->ifa_index);
			if (!nd)
				return false; /* a real interface's: the kernel filters */
			p.kind = P_ADDR_LO;
			p.nd = nd;
			add_pending(s, p);
			ifa->ifa_index = LO_IFINDEX;
			return true;
		}
		p.kind = P_ADDR_DUMP;
		add_pending(s, p);
		return false;
	}
	return false;
}

/* do_send sends m on s's fd, reading (and where needed rewriting) the
 * requests it holds; g_mu is held on entry and released here. */
static ssize_t do_send(struct nlsock *s, int fd, const struct msghdr *m, int flags) {
	const struct sockaddr_nl *to = m->msg_name;
	size_t total = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++)
		total += m->msg_iov[i].iov_len;
	if ((to && (m->msg_namelen < sizeof *to || to->nl_family != AF_NETLINK || to->nl_pid != 0)) ||
	    total < sizeof(struct nlmsghdr) || total > MAX_MSG) {
		pthread_mutex_unlock(&g_mu);
		return real_sendmsg(fd, m, flags);
	}
	unsigned char *buf = malloc(total);
	if (!buf) {
		pthread_mutex_unlock(&g_mu);
		return real_sendmsg(fd, m, flags);
	}
	size_t off = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++) {
		if (m->msg_iov[i].iov_len)
			memcpy(buf + off, m->msg_iov[i].iov_base, m->msg_iov[i].iov_len);
		off += m->msg_iov[i].iov_len;
	}
	/* Each request in turn; rewritten ones (never longer) are compacted
	 * in place. */
	bool changed = false;
	size_t in = 0, out = 0;
	while (in + sizeof(struct nlmsghdr) <= total) {
		struct nlmsghdr *h = (struct nlmsghdr *)(buf + in);
		size_t len = h->nlmsg_len;
		if (len < sizeof *h || len > total - in)
			break;
		size_t step = NLMSG_ALIGN(len) < total - in ? NLMSG_ALIGN(len) : total - in;
		bool rw = (h->nlmsg_flags & NLM_F_REQUEST) && request(s, fd, h);
		size_t nlen = rw ? NLMSG_ALIGN(h->nlmsg_len) : step;
		if (nlen > step)
			nlen = step;
		changed |= rw;
		if (out != in)
			memmove(buf + out, h, nlen);
		out += nlen;
		in += step;
	}
	pthread_mutex_unlock(&g_mu);
	ssize_t r;
	if (!changed) {
		r = real_sendmsg(fd, m, flags);
	} else {
		if (in < total) { /* a trailing partial message, as it came */
			memmove(buf + out, buf + in, total - in);
			out += total - in;
		}
		struct iovec iov = {.iov_base = buf, .iov_len = out};
		struct msghdr mm = *m;
		mm.msg_iov = &iov;
		mm.msg_iovlen = 1;
		r = real_sendmsg(fd, &mm, flags);
		if (r == (ssize_t)out)
			r = (ssize_t)total;
	}
	free(buf);
	return r;
}

static ssize_t nl_sendmsg(int fd, const struct msghdr *m, int flags) {
	struct nlsock *s = lookup(fd);
	if (!s)
		return real_sendmsg(fd, m, flags);
	return do_send(s, fd, m, flags);
}

/* ---- replies ---- */

static void push(struct nlsock *s, const void *data, size_t len, const void *ctl, size_t clen) {
	struct dgram *d = malloc(sizeof *d + len + clen);
	if (!d)
		return;
	d->next = NULL;
	d->len = len;
	d->clen = clen;
	memcpy(d->data, data, len);
	d->ctl = d->data + len;
	if (clen)
		memcpy(d->ctl, ctl, clen);
	if (s->tail)
		s->tail->next = d;
	else
		s->head = d;
	s->tail = d;
}

static struct pending *pending_of(struct nlsock *s, uint32_t seq) {
	for (int i = 0; i < s->npend; i++)
		if (s->pend[i].seq == seq)
			return &s->pend[i];
	return NULL;
}

static void done_pending(struct nlsock *s, struct pending *p) {
	int i = (int)(p - s->pend);
	memmove(&s->pend[i], &s->pend[i + 1], (size_t)(s->npend - i - 1) * sizeof *p);
	s->npend--;
}

/* transform queues what the kernel's datagram (data, len; control ctl,
 * clen) becomes: itself when no pending request is concerned, else its
 * records with lo's replaced or dropped and ours, each group of our
 * records in a datagram of its own followed by the NLMSG_DONE it
 * precedes. */
static void transform(struct nlsock *s, unsigned char *data, size_t len, const void *ctl, size_t clen) {
	struct buf keep = {0};
	bool changed = false, ctl_given = false;
	size_t off = 0;
#define FLUSH()                                                                                                        \
	do {                                                                                                           \
		if (keep.len && !keep.bad) {                                                                           \
			push(s, keep.p, keep.len, ctl_given ? NULL : ctl, ctl_given ? 0 : clen);                       \
			ctl_given = true;                                                                              \
		}                                                                                                      \
		keep.len = 0;                                                                                          \
	} while (0)
	while (off + sizeof(struct nlmsghdr) <= len) {
		struct nlmsghdr *h = (struct nlmsghdr *)(data + off);
		size_t mlen = h->nlmsg_len;
		if (mlen < sizeof *h || mlen > len - off)
			break;
		size_t step = NLMSG_ALIGN(mlen) < len - off ? NLMSG_ALIGN(mlen) : len - off;
		off += step;
		struct pending *p = pending_of(s, h->nlmsg_seq);
		if (!p) {
			put(&keep, h, mlen);
			continue;
		}
		int err = 0;
		if ((h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) && mlen >= NLMSG_LENGTH(sizeof err))
			memcpy(&err, NLMSG_DATA(h), sizeof err);
		switch (h->nlmsg_type) {
		case NLMSG_DONE: {
			if (p->kind == P_LINK_GET_LO || (err && p->kind != P_ADDR_LO)) {
				done_pending(s, p);
				put(&keep, h, mlen);
				continue;
			}
			FLUSH();
			struct buf syn = {0};
			uint16_t fl = h->nlmsg_flags;
			for (int i = 0; i < g_n; i++) {
				if (p->kind == P_LINK_DUMP)
					link_msg(&syn, &g_nd[i], fl, h->nlmsg_seq, h->nlmsg_pid, p->stats);
				else if (p->kind == P_ADDR_DUMP)
					addr_msgs(&syn, &g_nd[i], p->family, fl, h->nlmsg_seq, h->nlmsg_pid);
			}
			if (p->kind == P_ADDR_LO)
				addr_msgs(&syn, p->nd, p->family, fl, h->nlmsg_seq, h->nlmsg_pid);
			size_t at = syn.len;
			struct nlmsghdr *d = put(&syn, h, mlen);
			if (d && p->kind == P_ADDR_LO && err) { /* lo cannot fail; the interface does not */
				memset(NLMSG_DATA((struct nlmsghdr *)(syn.p + at)), 0, sizeof err);
			}
			if (!syn.bad)
				push(s, syn.p, syn.len, ctl_given ? NULL : ctl, ctl_given ? 0 : clen);
			ctl_given = true;
			free(syn.p);
			done_pending(s, p);
			changed = true;
			continue;
		}
		case NLMSG_ERROR:
			if (p->kind == P_LINK_GET_LO && !err && mlen >= NLMSG_LENGTH(sizeof(struct nlmsgerr))) {
				/* The ack: of the request as it was sent. */
				struct nlmsgerr *e = put(&keep, h, mlen);
				if (e) {
					e = NLMSG_DATA((struct nlmsghdr *)((unsigned char *)e));
					e->msg = p->req;
					if (h->nlmsg_flags & NLM_F_CAPPED)
						e->msg.nlmsg_len = p->req.nlmsg_len;
				}
				changed = true;
			} else {
				put(&keep, h, mlen);
			}
			done_pending(s, p);
			continue;
		case RTM_NEWADDR:
			if (p->kind == P_ADDR_LO) {
				changed = true;
				continue;
			}
			break;
		case RTM_NEWLINK:
			if (p->kind == P_LINK_GET_LO && !p->replied) {
				link_msg(&keep, p->nd, h->nlmsg_flags, h->nlmsg_seq, h->nlmsg_pid, p->stats);
				changed = true;
				if (p->ack)
					p->replied = true;
				else
					done_pending(s, p);
				continue;
			}
			break;
		}
		put(&keep, h, mlen);
	}
	if (!changed) {
		/* Untouched: the datagram as the kernel sent it. */
		free(keep.p);
		push(s, data, len, ctl, clen);
		return;
	}
	if (off < len)
		put(&keep, data + off, len - off);
	FLUSH();
	free(keep.p);
#undef FLUSH
}

static size_t iov_room(const struct msghdr *m) {
	size_t n = 0;
	for (size_t i = 0; i < m->msg_iovlen; i++)
		n += m->msg_iov[i].iov_len;
	return n;
}

/* serve hands the first queued datagram to m as recvmsg would. */
static ssize_t serve(struct nlsock *s, struct msghdr *m, int flags) {
	struct dgram *d = s->head;
	size_t room = iov_room(m), n = d->len < room ? d->len : room, off = 0;
	for (size_t i = 0; i < m->msg_iovlen && off < n; i++) {
		size_t c = m->msg_iov[i].iov_len < n - off ? m->msg_iov[i].iov_len : n - off;
		memcpy(m->msg_iov[i].iov_base, d->data + off, c);
		off += c;
	}
	m->msg_flags = d->len > room ? MSG_TRUNC : 0;
	if (m->msg_name && m->msg_namelen >= sizeof(struct sockaddr_nl)) {
		struct sockaddr_nl from = {.nl_family = AF_NETLINK};
		memcpy(m->msg_name, &from, sizeof from);
		m->msg_namelen = sizeof from;
	}
	if (m->msg_control) {
		if (d->clen <= m->msg_controllen) {
			memcpy(m->msg_control, d->ctl, d->clen);
			m->msg_controllen = d->clen;
		} else {
			m->msg_controllen = 0;
			m->msg_flags |= MSG_CTRUNC;
		}
	} else {
		m->msg_controllen = 0;
	}
	ssize_t r = (ssize_t)((flags & MSG_TRUNC) ? d->len : n);
	if (!(flags & MSG_PEEK)) {
		s->head = d->next;
		if (!s->head)
			s->tail = NULL;
		free(d);
	}
	return r;
}

#define RECV_FLAGS (MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT | MSG_WAITALL | MSG_CMSG_CLOEXEC)

static ssize_t nl_recvmsg(int fd, struct msghdr *m, int flags) {
	struct nlsock *s = lookup(fd);
	if (!s)
		return real_recvmsg(fd, m, flags);
	if (flags & ~RECV_FLAGS) {
		pthread_mutex_unlock(&g_mu);
		return real_recvmsg(fd, m, flags);
	}
	for (;;) {
		if (s->head) {
			ssize_t r = serve(s, m, flags);
			pthread_mutex_unlock(&g_mu);
			return r;
		}
		if (!s->npend) {
			pthread_mutex_unlock(&g_mu);
			return real_recvmsg(fd, m, flags);
		}
		pthread_mutex_unlock(&g_mu);
		/* The kernel's next datagram, whole, taken from the socket. */
		int wait = flags & MSG_DONTWAIT;
		struct iovec none = {0};
		struct msghdr pm = {.msg_iov = &none, .msg_iovlen = 1};
		ssize_t len = real_recvmsg(fd, &pm, MSG_PEEK | MSG_TRUNC | wait);
		if (len <= 0)
			return len;
		unsigned char *data = malloc((size_t)len);
		if (!data) {
			errno = ENOMEM;
			return -1;
		}
		unsigned char ctl[512];
		struct sockaddr_nl from;
		struct iovec iov = {.iov_base = data, .iov_len = (size_t)len};
		struct msghdr rm = {.msg_name = &from,
				    .msg_namelen = sizeof from,
				    .msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = m->msg_control ? ctl : NULL,
				    .msg_controllen = m->msg_control ? sizeof ctl : 0};
		ssize_t got = real_recvmsg(fd, &rm, wait | (flags & MSG_CMSG_CLOEXEC));
		if (got <= 0) {
			int e = errno;
			free(data);
			errno = e;
			return got;
		}
		s = lookup(fd);
		if (!s) {
			free(data);
			errno = EBADF;
			return -1;
		}
		transform(s, data, (size_t)got, ctl, m->msg_control ? rm.msg_controllen : 0);
		free(data);
	}
}

/* ---- the C library's entry points ---- */

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
	if (!marked(fd))
		return real_sendmsg(fd, m, flags);
	return nl_sendmsg(fd, m, flags);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t tolen) {
	NEXT(sendto, sendto_fn);
	if (!marked(fd))
		return next_sendto(fd, buf, len, flags, to, tolen);
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr m = {.msg_name = (void *)to, .msg_namelen = to ? tolen : 0, .msg_iov = &iov, .msg_iovlen = 1};
	return nl_sendmsg(fd, &m, flags);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags) {
	NEXT(send, send_fn);
	if (!marked(fd))
		return next_send(fd, buf, len, flags);
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	return nl_sendmsg(fd, &m, flags);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags) {
	if (!marked(fd))
		return real_recvmsg(fd, m, flags);
	return nl_recvmsg(fd, m, flags);
}

static ssize_t nl_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen) {
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr m = {.msg_name = from, .msg_namelen = from && fromlen ? *fromlen : 0, .msg_iov = &iov, .msg_iovlen = 1};
	ssize_t r = nl_recvmsg(fd, &m, flags);
	if (r >= 0 && from && fromlen)
		*fromlen = m.msg_namelen;
	return r;
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen) {
	NEXT(recvfrom, recvfrom_fn);
	if (!marked(fd))
		return next_recvfrom(fd, buf, len, flags, from, fromlen);
	return nl_recvfrom(fd, buf, len, flags, from, fromlen);
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags) {
	NEXT(recv, recv_fn);
	if (!marked(fd))
		return next_recv(fd, buf, len, flags);
	return nl_recvfrom(fd, buf, len, flags, NULL, NULL);
}

/* _FORTIFY_SOURCE's checked forms. */
typedef ssize_t (*recv_chk_fn)(int, void *, size_t, size_t, int);
typedef ssize_t (*recvfrom_chk_fn)(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags) {
	NEXT(__recv_chk, recv_chk_fn);
	if (!marked(fd) || len > buflen)
		return next___recv_chk(fd, buf, len, buflen, flags);
	return nl_recvfrom(fd, buf, len, flags, NULL, NULL);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *from,
			      socklen_t *fromlen) {
	NEXT(__recvfrom_chk, recvfrom_chk_fn);
	if (!marked(fd) || len > buflen)
		return next___recvfrom_chk(fd, buf, len, buflen, flags, from, fromlen);
	return nl_recvfrom(fd, buf, len, flags, from, fromlen);
}
