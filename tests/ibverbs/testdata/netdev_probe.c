/* netdev_probe: what a program sees of the network interfaces, through the
 * C library's interfaces only (getifaddrs, if_nametoindex, if_indextoname,
 * if_nameindex, SIOCGIF* ioctls, /sys/class/net). Argument: an interface
 * name. Prints one line per finding:
 *
 *   ifaddr NAME FAMILY ADDR/PREFIX FLAGS   every address entry (AF_INET,
 *                                          AF_INET6), flags in hex
 *   link NAME INDEX                        every AF_PACKET entry
 *   nametoindex INDEX / indextoname NAME   for the argument
 *   nameindex NAME INDEX                   the argument's if_nameindex entry
 *   ioctl REQ OK VALUE | ioctl REQ ERRNO   SIOCGIFFLAGS, SIOCGIFINDEX,
 *                                          SIOCGIFADDR, SIOCGIFMTU,
 *                                          SIOCETHTOOL, SIOCGIFNAME by index
 *   sysfs ERRNO|OK                         stat of /sys/class/net/NAME
 *   bogus ...                              the same probes for an interface
 *                                          no one has ("vrnic-nosuch0")
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int prefix_of(const struct sockaddr *m) {
	int n = 0;
	const unsigned char *b;
	size_t len;
	if (!m)
		return -1;
	if (m->sa_family == AF_INET) {
		b = (const unsigned char *)&((const struct sockaddr_in *)m)->sin_addr;
		len = 4;
	} else {
		b = ((const struct sockaddr_in6 *)m)->sin6_addr.s6_addr;
		len = 16;
	}
	for (size_t i = 0; i < len; i++)
		n += __builtin_popcount(b[i]);
	return n;
}

static void probe_ioctls(const char *tag, const char *name) {
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0) {
		perror("socket");
		exit(1);
	}
	struct ifreq r;
	const struct {
		unsigned long req;
		const char *name;
	} reqs[] = { { SIOCGIFFLAGS, "SIOCGIFFLAGS" }, { SIOCGIFINDEX, "SIOCGIFINDEX" },
		     { SIOCGIFADDR, "SIOCGIFADDR" },   { SIOCGIFMTU, "SIOCGIFMTU" } };
	for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
		memset(&r, 0, sizeof r);
		snprintf(r.ifr_name, sizeof r.ifr_name, "%s", name);
		if (ioctl(s, reqs[i].req, &r)) {
			printf("%sioctl %s %s\n", tag, reqs[i].name, strerrorname_np(errno));
			continue;
		}
		char v[64];
		switch (reqs[i].req) {
		case SIOCGIFFLAGS:
			snprintf(v, sizeof v, "0x%x", (unsigned)(unsigned short)r.ifr_flags);
			break;
		case SIOCGIFINDEX:
			snprintf(v, sizeof v, "%d", r.ifr_ifindex);
			break;
		case SIOCGIFADDR:
			inet_ntop(AF_INET, &((struct sockaddr_in *)&r.ifr_addr)->sin_addr, v, sizeof v);
			break;
		default:
			snprintf(v, sizeof v, "%d", r.ifr_mtu);
		}
		printf("%sioctl %s OK %s\n", tag, reqs[i].name, v);
	}
	struct ethtool_cmd ec = { .cmd = ETHTOOL_GSET };
	memset(&r, 0, sizeof r);
	snprintf(r.ifr_name, sizeof r.ifr_name, "%s", name);
	r.ifr_data = (void *)&ec;
	if (ioctl(s, SIOCETHTOOL, &r))
		printf("%sioctl SIOCETHTOOL %s\n", tag, strerrorname_np(errno));
	else
		printf("%sioctl SIOCETHTOOL OK\n", tag);
	unsigned idx = if_nametoindex(name);
	if (idx) {
		memset(&r, 0, sizeof r);
		r.ifr_ifindex = (int)idx;
		if (ioctl(s, SIOCGIFNAME, &r))
			printf("%sioctl SIOCGIFNAME %s\n", tag, strerrorname_np(errno));
		else
			printf("%sioctl SIOCGIFNAME OK %s\n", tag, r.ifr_name);
	}
	close(s);
}

static void probe(const char *tag, const char *name) {
	errno = 0;
	unsigned idx = if_nametoindex(name);
	if (idx)
		printf("%snametoindex %u\n", tag, idx);
	else
		printf("%snametoindex %s\n", tag, strerrorname_np(errno));
	if (idx) {
		char buf[IF_NAMESIZE];
		printf("%sindextoname %s\n", tag, if_indextoname(idx, buf) ? buf : "-");
	}
	struct if_nameindex *ni = if_nameindex();
	for (struct if_nameindex *p = ni; p && (p->if_index || p->if_name); p++)
		if (!strcmp(p->if_name, name))
			printf("%snameindex %s %u\n", tag, p->if_name, p->if_index);
	if_freenameindex(ni);
	probe_ioctls(tag, name);
	char path[128];
	struct stat st;
	snprintf(path, sizeof path, "/sys/class/net/%s", name);
	if (stat(path, &st))
		printf("%ssysfs %s\n", tag, strerrorname_np(errno));
	else
		printf("%ssysfs OK\n", tag);
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: netdev_probe IFNAME\n");
		return 2;
	}
	struct ifaddrs *ifa;
	if (getifaddrs(&ifa)) {
		perror("getifaddrs");
		return 1;
	}
	for (struct ifaddrs *p = ifa; p; p = p->ifa_next) {
		if (!p->ifa_addr)
			continue;
		int fam = p->ifa_addr->sa_family;
		if (fam == AF_PACKET) {
			printf("link %s %u\n", p->ifa_name, if_nametoindex(p->ifa_name));
			continue;
		}
		if (fam != AF_INET && fam != AF_INET6)
			continue;
		char a[INET6_ADDRSTRLEN];
		const void *ip = fam == AF_INET ? (const void *)&((struct sockaddr_in *)p->ifa_addr)->sin_addr
						: (const void *)&((struct sockaddr_in6 *)p->ifa_addr)->sin6_addr;
		inet_ntop(fam, ip, a, sizeof a);
		printf("ifaddr %s %s %s/%d 0x%x\n", p->ifa_name, fam == AF_INET ? "inet" : "inet6", a,
		       prefix_of(p->ifa_netmask), p->ifa_flags);
	}
	freeifaddrs(ifa);
	probe("", argv[1]);
	probe("bogus ", "vrnic-nosuch0");
	return 0;
}
