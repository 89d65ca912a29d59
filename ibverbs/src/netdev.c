/*
 * libvrnic-netdev.so: network interfaces for vrnic devices whose address
 * no real interface shows (a daemon on 127.0.0.x: the address is routed
 * through lo, which interface scans skip as IFF_LOOPBACK). vrnic-run puts
 * it in LD_PRELOAD and describes the interfaces in VRNIC_NETDEVS:
 *
 *	NAME,IFINDEX,MTU,MAC,ADDR/PREFIX[,ADDR/PREFIX...][;NAME,...]
 *
 * It adds them to what getifaddrs, if_nametoindex, if_indextoname,
 * if_nameindex and the SIOCGIF* ioctls report, as the kernel would report
 * an up Ethernet interface holding those addresses. Every other name,
 * index and request goes to the C library unchanged. A request the kernel
 * would serve for a real interface but that makes no sense here
 * (SIOCETHTOOL, any set) fails with EOPNOTSUPP. See
 * kernel-notes/vrnic-run-view.md.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/if_link.h>
#include <linux/if_packet.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "netdev.h"

struct netdev g_nd[MAX_NETDEVS];
int g_n;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void set_mask(struct nd_addr *a, int prefix) {
	if (a->family == AF_INET) {
		struct sockaddr_in *m = (struct sockaddr_in *)&a->mask, *b = (struct sockaddr_in *)&a->brd;
		const struct sockaddr_in *s = (const struct sockaddr_in *)&a->addr;
		uint32_t bits = prefix ? 0xffffffffu << (32 - prefix) : 0;
		m->sin_family = AF_INET;
		m->sin_addr.s_addr = htonl(bits);
		b->sin_family = AF_INET;
		b->sin_addr.s_addr = s->sin_addr.s_addr | htonl(~bits);
	} else {
		struct sockaddr_in6 *m = (struct sockaddr_in6 *)&a->mask;
		m->sin6_family = AF_INET6;
		for (int i = 0; i < 16; i++) {
			int n = prefix - 8 * i;
			m->sin6_addr.s6_addr[i] = n >= 8 ? 0xff : n <= 0 ? 0 : (unsigned char)(0xff << (8 - n));
		}
	}
}

static int parse_addr(struct nd_addr *a, char *s) {
	char *slash = strchr(s, '/');
	int prefix = -1;
	if (slash) {
		*slash = 0;
		prefix = atoi(slash + 1);
	}
	memset(a, 0, sizeof *a);
	struct sockaddr_in *s4 = (struct sockaddr_in *)&a->addr;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&a->addr;
	if (inet_pton(AF_INET, s, &s4->sin_addr) == 1) {
		a->family = s4->sin_family = AF_INET;
		if (prefix < 0 || prefix > 32)
			prefix = 32;
	} else if (inet_pton(AF_INET6, s, &s6->sin6_addr) == 1) {
		a->family = s6->sin6_family = AF_INET6;
		if (prefix < 0 || prefix > 128)
			prefix = 128;
	} else {
		return -1;
	}
	a->prefix = prefix;
	set_mask(a, prefix);
	return 0;
}

/* load parses VRNIC_NETDEVS; a malformed interface is left out. */
static void load(void) {
	const char *env = getenv("VRNIC_NETDEVS");
	if (!env || !*env)
		return;
	char *copy = strdup(env), *save = NULL;
	if (!copy)
		return;
	for (char *dev = strtok_r(copy, ";", &save); dev && g_n < MAX_NETDEVS; dev = strtok_r(NULL, ";", &save)) {
		struct netdev *d = &g_nd[g_n];
		char *s2 = NULL, *f;
		memset(d, 0, sizeof *d);
		int field = 0;
		bool ok = true;
		for (f = strtok_r(dev, ",", &s2); f && ok; f = strtok_r(NULL, ",", &s2), field++) {
			unsigned m[6];
			switch (field) {
			case 0:
				ok = *f && strlen(f) < IFNAMSIZ;
				if (ok)
					strcpy(d->name, f);
				break;
			case 1:
				d->index = (unsigned)strtoul(f, NULL, 10);
				ok = d->index > 0;
				break;
			case 2:
				d->mtu = atoi(f);
				break;
			case 3:
				ok = sscanf(f, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6;
				for (int i = 0; ok && i < 6; i++)
					d->mac[i] = (unsigned char)m[i];
				break;
			default:
				if (d->naddr < MAX_ADDRS && !parse_addr(&d->addr[d->naddr], f))
					d->naddr++;
			}
		}
		if (ok && field >= 4)
			g_n++;
	}
	free(copy);
}

void nd_init(void) { pthread_once(&g_once, load); }

static void init(void) { nd_init(); }

struct netdev *nd_by_name(const char *name) {
	for (int i = 0; i < g_n; i++)
		if (!strncmp(g_nd[i].name, name, IFNAMSIZ))
			return &g_nd[i];
	return NULL;
}

struct netdev *nd_by_index(unsigned index) {
	for (int i = 0; i < g_n; i++)
		if (g_nd[i].index == index)
			return &g_nd[i];
	return NULL;
}

static const struct nd_addr *first_addr(const struct netdev *d, int family) {
	for (int i = 0; i < d->naddr; i++)
		if (d->addr[i].family == family)
			return &d->addr[i];
	return NULL;
}


void *nd_real(const char *sym) {
	void *p = dlsym(RTLD_NEXT, sym);
	return p;
}

/* ---- getifaddrs ---- */

/* One block per list we extend, holding our entries; registered by the
 * list's head so that freeifaddrs frees it too. */
union nd_sa {
	struct sockaddr sa;
	struct sockaddr_ll ll;
	struct sockaddr_in in;
	struct sockaddr_in6 in6;
};

struct nd_ifa {
	struct ifaddrs ifa;
	union nd_sa addr, mask, brd;
	char name[IFNAMSIZ];
	struct rtnl_link_stats stats;
};

struct nd_block {
	struct ifaddrs *head;
	int n;
	struct nd_block *next;
	struct nd_ifa ent[];
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct nd_block *g_blocks;

EXPORT int getifaddrs(struct ifaddrs **ifap) {
	init();
	int (*next)(struct ifaddrs **) = (int (*)(struct ifaddrs **))nd_real("getifaddrs");
	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	struct ifaddrs *list = NULL;
	if (next(&list))
		return -1;
	int n = 0;
	for (int i = 0; i < g_n; i++)
		n += 1 + g_nd[i].naddr;
	if (!n) {
		*ifap = list;
		return 0;
	}
	struct nd_block *b = calloc(1, sizeof *b + (size_t)n * sizeof(struct nd_ifa));
	if (!b) {
		void (*nfree)(struct ifaddrs *) = (void (*)(struct ifaddrs *))nd_real("freeifaddrs");
		if (nfree)
			nfree(list);
		errno = ENOMEM;
		return -1;
	}
	/* As the kernel lists them: every link (AF_PACKET) first, then the
	 * addresses; ours after the real ones of each kind. */
	int k = 0;
	for (int i = 0; i < g_n; i++) {
		struct netdev *d = &g_nd[i];
		struct nd_ifa *e = &b->ent[k++];
		strcpy(e->name, d->name);
		e->ifa.ifa_name = e->name;
		e->ifa.ifa_flags = ND_FLAGS | IFF_LOWER_UP_;
		e->addr.ll.sll_family = AF_PACKET;
		e->addr.ll.sll_ifindex = (int)d->index;
		e->addr.ll.sll_hatype = ARPHRD_ETHER;
		e->addr.ll.sll_halen = 6;
		memcpy(e->addr.ll.sll_addr, d->mac, 6);
		e->brd.ll = e->addr.ll;
		memset(e->brd.ll.sll_addr, 0xff, 6);
		e->ifa.ifa_addr = &e->addr.sa;
		e->ifa.ifa_broadaddr = &e->brd.sa;
		e->ifa.ifa_data = &e->stats;
	}
	for (int i = 0; i < g_n; i++) {
		struct netdev *d = &g_nd[i];
		for (int j = 0; j < d->naddr; j++) {
			struct nd_ifa *e = &b->ent[k++];
			const struct nd_addr *a = &d->addr[j];
			size_t len = a->family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
			strcpy(e->name, d->name);
			e->ifa.ifa_name = e->name;
			e->ifa.ifa_flags = ND_FLAGS | IFF_LOWER_UP_;
			memcpy(&e->addr, &a->addr, len);
			memcpy(&e->mask, &a->mask, len);
			e->ifa.ifa_addr = &e->addr.sa;
			e->ifa.ifa_netmask = &e->mask.sa;
			if (a->family == AF_INET) {
				memcpy(&e->brd, &a->brd, len);
				e->ifa.ifa_broadaddr = &e->brd.sa;
			} else {
				struct sockaddr_in6 *s6 = &e->addr.in6;
				if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
					s6->sin6_scope_id = d->index;
			}
		}
	}
	/* Link the entries: real links, our links, real addresses, ours. */
	struct ifaddrs *head = NULL, **tail = &head, *p = list, *rest;
	while (p && p->ifa_addr && p->ifa_addr->sa_family == AF_PACKET) {
		*tail = p;
		tail = &p->ifa_next;
		p = p->ifa_next;
	}
	rest = p;
	for (int i = 0; i < g_n; i++) {
		*tail = &b->ent[i].ifa;
		tail = &b->ent[i].ifa.ifa_next;
	}
	*tail = rest;
	while (*tail)
		tail = &(*tail)->ifa_next;
	for (int i = g_n; i < n; i++) {
		*tail = &b->ent[i].ifa;
		tail = &b->ent[i].ifa.ifa_next;
	}
	*tail = NULL;
	b->head = head;
	b->n = n;
	pthread_mutex_lock(&g_mu);
	b->next = g_blocks;
	g_blocks = b;
	pthread_mutex_unlock(&g_mu);
	*ifap = head;
	return 0;
}

EXPORT void freeifaddrs(struct ifaddrs *ifa) {
	if (!ifa)
		return;
	struct nd_block *b = NULL;
	pthread_mutex_lock(&g_mu);
	for (struct nd_block **pp = &g_blocks; *pp; pp = &(*pp)->next) {
		if ((*pp)->head == ifa) {
			b = *pp;
			*pp = b->next;
			break;
		}
	}
	pthread_mutex_unlock(&g_mu);
	struct ifaddrs *real_head = ifa;
	if (b) {
		/* The C library's block starts at its list's first entry: the
		 * first entry here that is not ours (order is kept). */
		real_head = NULL;
		for (struct ifaddrs *p = ifa; p && !real_head; p = p->ifa_next)
			if ((char *)p < (char *)b->ent || (char *)p >= (char *)(b->ent + b->n))
				real_head = p;
		free(b);
	}
	if (real_head) {
		void (*next)(struct ifaddrs *) = (void (*)(struct ifaddrs *))nd_real("freeifaddrs");
		if (next)
			next(real_head);
	}
}

/* ---- if_nametoindex and friends ---- */

EXPORT unsigned if_nametoindex(const char *name) {
	init();
	struct netdev *d = name ? nd_by_name(name) : NULL;
	if (d)
		return d->index;
	unsigned (*next)(const char *) = (unsigned (*)(const char *))nd_real("if_nametoindex");
	if (!next) {
		errno = ENOSYS;
		return 0;
	}
	return next(name);
}

EXPORT char *if_indextoname(unsigned index, char name[IF_NAMESIZE]) {
	init();
	struct netdev *d = nd_by_index(index);
	if (d)
		return memcpy(name, d->name, IFNAMSIZ);
	char *(*next)(unsigned, char *) = (char *(*)(unsigned, char *))nd_real("if_indextoname");
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	return next(index, name);
}

/* if_nameindex: the C library's array with ours added; every name is its
 * own allocation, so either if_freenameindex frees it. */
EXPORT struct if_nameindex *if_nameindex(void) {
	init();
	struct if_nameindex *(*next)(void) = (struct if_nameindex * (*)(void)) nd_real("if_nameindex");
	if (!next) {
		errno = ENOSYS;
		return NULL;
	}
	struct if_nameindex *r = next();
	if (!r || !g_n)
		return r;
	size_t n = 0;
	while (r[n].if_index || r[n].if_name)
		n++;
	struct if_nameindex *out = calloc(n + (size_t)g_n + 1, sizeof *out);
	if (!out)
		return r;
	memcpy(out, r, n * sizeof *out);
	size_t k = n;
	for (int i = 0; i < g_n; i++) {
		out[k].if_name = strdup(g_nd[i].name);
		if (out[k].if_name)
			out[k++].if_index = g_nd[i].index;
	}
	free(r);
	return out;
}

/* ---- ioctl ---- */

static void put_addr(struct sockaddr *dst, const struct sockaddr_storage *src) {
	memcpy(dst, src, sizeof(struct sockaddr_in));
}

/* nd_ioctl serves req for our interface d; it returns the result. */
static int nd_ioctl(struct netdev *d, unsigned long req, struct ifreq *r) {
	const struct nd_addr *a4 = first_addr(d, AF_INET);
	switch (req) {
	case SIOCGIFFLAGS:
		r->ifr_flags = (short)ND_FLAGS;
		return 0;
	case SIOCGIFINDEX:
		r->ifr_ifindex = (int)d->index;
		return 0;
	case SIOCGIFMTU:
		r->ifr_mtu = d->mtu;
		return 0;
	case SIOCGIFMETRIC:
		r->ifr_metric = 0;
		return 0;
	case SIOCGIFTXQLEN:
		r->ifr_qlen = 1000;
		return 0;
	case SIOCGIFHWADDR:
		memset(&r->ifr_hwaddr, 0, sizeof r->ifr_hwaddr);
		r->ifr_hwaddr.sa_family = ARPHRD_ETHER;
		memcpy(r->ifr_hwaddr.sa_data, d->mac, 6);
		return 0;
	case SIOCGIFADDR:
	case SIOCGIFNETMASK:
	case SIOCGIFBRDADDR:
	case SIOCGIFDSTADDR:
		if (!a4) {
			errno = EADDRNOTAVAIL;
			return -1;
		}
		put_addr(&r->ifr_addr, req == SIOCGIFADDR      ? &a4->addr
					: req == SIOCGIFNETMASK ? &a4->mask
					: req == SIOCGIFBRDADDR ? &a4->brd
								: &a4->addr);
		return 0;
	default:
		errno = EOPNOTSUPP;
		return -1;
	}
}

static bool ifreq_request(unsigned long req) { return req >= 0x8900 && req <= 0x89ff; }

EXPORT int ioctl(int fd, unsigned long req, ...) {
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	static int (*next)(int, unsigned long, ...);
	if (!next)
		next = (int (*)(int, unsigned long, ...))nd_real("ioctl");
	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	if (!arg || !ifreq_request(req))
		return next(fd, req, arg);
	init();
	if (!g_n)
		return next(fd, req, arg);
	if (req == SIOCGIFNAME) {
		struct ifreq *r = arg;
		struct netdev *d = nd_by_index((unsigned)r->ifr_ifindex);
		if (!d)
			return next(fd, req, arg);
		memcpy(r->ifr_name, d->name, IFNAMSIZ);
		return 0;
	}
	if (req == SIOCGIFCONF) {
		/* The kernel's list of IPv4 addresses, ours added while room
		 * remains (or counted, for a length query). */
		struct ifconf *c = arg;
		int room = c->ifc_len;
		int ret = next(fd, req, arg);
		if (ret)
			return ret;
		for (int i = 0; i < g_n; i++) {
			for (int j = 0; j < g_nd[i].naddr; j++) {
				if (g_nd[i].addr[j].family != AF_INET)
					continue;
				if (!c->ifc_req) {
					c->ifc_len += (int)sizeof(struct ifreq);
					continue;
				}
				if (c->ifc_len + (int)sizeof(struct ifreq) > room)
					return 0;
				struct ifreq *r = (struct ifreq *)(c->ifc_buf + c->ifc_len);
				memset(r, 0, sizeof *r);
				memcpy(r->ifr_name, g_nd[i].name, IFNAMSIZ);
				put_addr(&r->ifr_addr, &g_nd[i].addr[j].addr);
				c->ifc_len += (int)sizeof(struct ifreq);
			}
		}
		return 0;
	}
	if (req == SIOCETHTOOL || (req >= SIOCGIFFLAGS && req <= SIOCGIFCOUNT) || req == SIOCGIFINDEX ||
	    req == SIOCSIFFLAGS || req == SIOCSIFADDR || req == SIOCSIFMTU || req == SIOCSIFNETMASK ||
	    req == SIOCSIFHWADDR || req == SIOCSIFNAME || req == SIOCSIFTXQLEN || req == SIOCGIFTXQLEN) {
		struct ifreq *r = arg;
		char name[IFNAMSIZ];
		memcpy(name, r->ifr_name, IFNAMSIZ);
		name[IFNAMSIZ - 1] = 0;
		struct netdev *d = nd_by_name(name);
		if (d)
			return nd_ioctl(d, req, r);
	}
	return next(fd, req, arg);
}
