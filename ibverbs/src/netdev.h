/*
 * The synthetic interfaces of libvrnic-netdev.so (netdev.c parses
 * VRNIC_NETDEVS; netdev_rtnl.c answers rtnetlink for them).
 */
#ifndef VRNIC_NETDEV_H
#define VRNIC_NETDEV_H

#include <net/if.h>
#include <stdbool.h>
#include <sys/socket.h>

#define EXPORT __attribute__((visibility("default")))

#define MAX_NETDEVS 16
#define MAX_ADDRS 8

/* IFF_UP|IFF_BROADCAST|IFF_RUNNING|IFF_MULTICAST, as an up Ethernet
 * interface; IFF_LOWER_UP (not in <net/if.h>) where the kernel adds it. */
#define ND_FLAGS (IFF_UP | IFF_BROADCAST | IFF_RUNNING | IFF_MULTICAST)
#define IFF_LOWER_UP_ 0x10000

struct nd_addr {
	int family;
	int prefix;
	struct sockaddr_storage addr, mask, brd;
};

struct netdev {
	char name[IFNAMSIZ];
	unsigned index;
	int mtu;
	unsigned char mac[6];
	int naddr;
	struct nd_addr addr[MAX_ADDRS];
};

extern struct netdev g_nd[MAX_NETDEVS];
extern int g_n;

/* nd_init parses VRNIC_NETDEVS once. */
void nd_init(void);
struct netdev *nd_by_name(const char *name);
struct netdev *nd_by_index(unsigned index);
/* nd_real is the next definition of sym (the C library's). */
void *nd_real(const char *sym);

#endif
