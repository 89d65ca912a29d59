/*
 * rtnl_probe NAME: what a program sees of the network interfaces through
 * getifaddrs(3) and through its own NETLINK_ROUTE socket, one line each:
 *
 *   ifl NAME INDEX MAC                       getifaddrs, AF_PACKET entries
 *   ifa NAME ADDR/PREFIX FLAGS               getifaddrs, AF_INET entries
 *   link INDEX NAME MTU MAC FLAGS            RTM_GETLINK dump (recvmsg, MSG_PEEK|MSG_TRUNC sizing)
 *   linkdone                                 its NLMSG_DONE
 *   addr INDEX ADDR/PREFIX LABEL SCOPE       RTM_GETADDR AF_INET dump (recv into 8 KiB)
 *   addrdone                                 its NLMSG_DONE
 *   get INDEX NAME MTU MAC FLAGS             RTM_GETLINK by IFLA_IFNAME NAME, NLM_F_ACK (sendto, poll, recvfrom)
 *   getack ERR SEQOK LEN                     its ack: error, whether it echoes the request's seq and length
 *   getidx INDEX NAME                        RTM_GETLINK by ifi_index of NAME (sendmsg, recvmsg)
 *   filtered INDEX ADDR/PREFIX               RTM_GETADDR dump with NETLINK_GET_STRICT_CHK, ifa_index of NAME
 *   filtereddone ERR
 *   bogus ERRNO                              RTM_GETLINK by IFLA_IFNAME of an interface nobody has
 *   trunc PEEK GOT TRUNC ACK                 the same get of NAME read into 16 bytes: a MSG_PEEK recv,
 *                                            a recvmsg (its length, MSG_TRUNC in msg_flags), then the ack's error
 *
 * Every reply must carry the request's sequence number and the socket's
 * port id; the probe fails (exit 1) otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef NETLINK_GET_STRICT_CHK
#define NETLINK_GET_STRICT_CHK 12
#endif

static uint32_t g_pid;

static void die(const char *what) {
	fprintf(stderr, "rtnl_probe: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void mac_str(const unsigned char *m, size_t n, char *out) {
	out[0] = 0;
	for (size_t i = 0; i < n; i++)
		sprintf(out + strlen(out), i ? ":%02x" : "%02x", m[i]);
}

static int open_rtnl(int strict) {
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (fd < 0)
		die("socket");
	struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa))
		die("bind");
	socklen_t l = sizeof sa;
	if (getsockname(fd, (struct sockaddr *)&sa, &l))
		die("getsockname");
	g_pid = sa.nl_pid;
	if (strict && setsockopt(fd, SOL_NETLINK, NETLINK_GET_STRICT_CHK, &strict, sizeof strict))
		die("NETLINK_GET_STRICT_CHK");
	return fd;
}

static void check_hdr(const struct nlmsghdr *h, uint32_t seq) {
	if (h->nlmsg_seq != seq || h->nlmsg_pid != g_pid) {
		fprintf(stderr, "rtnl_probe: reply type %u seq %u pid %u, want seq %u pid %u\n", h->nlmsg_type,
			h->nlmsg_seq, h->nlmsg_pid, seq, g_pid);
		exit(1);
	}
}

/* print_link prints a RTM_NEWLINK as tag INDEX NAME MTU MAC FLAGS. */
static void print_link(const char *tag, struct nlmsghdr *h) {
	struct ifinfomsg *ifi = NLMSG_DATA(h);
	int len = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof *ifi);
	const char *name = "?";
	unsigned mtu = 0;
	char mac[64] = "-";
	for (struct rtattr *ra = IFLA_RTA(ifi); RTA_OK(ra, len); ra = RTA_NEXT(ra, len)) {
		if (ra->rta_type == IFLA_IFNAME)
			name = RTA_DATA(ra);
		else if (ra->rta_type == IFLA_MTU)
			memcpy(&mtu, RTA_DATA(ra), 4);
		else if (ra->rta_type == IFLA_ADDRESS && RTA_PAYLOAD(ra) <= 16)
			mac_str(RTA_DATA(ra), RTA_PAYLOAD(ra), mac);
	}
	printf("%s %d %s %u %s 0x%x\n", tag, ifi->ifi_index, name, mtu, mac, ifi->ifi_flags);
}

static void print_addr(const char *tag, struct nlmsghdr *h, int full) {
	struct ifaddrmsg *ifa = NLMSG_DATA(h);
	int len = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof *ifa);
	char a[INET6_ADDRSTRLEN] = "?";
	const char *label = "-";
	for (struct rtattr *ra = IFA_RTA(ifa); RTA_OK(ra, len); ra = RTA_NEXT(ra, len)) {
		if (ra->rta_type == IFA_LOCAL || (ra->rta_type == IFA_ADDRESS && !strcmp(a, "?")))
			inet_ntop(ifa->ifa_family, RTA_DATA(ra), a, sizeof a);
		else if (ra->rta_type == IFA_LABEL)
			label = RTA_DATA(ra);
	}
	if (full)
		printf("%s %u %s/%u %s %u\n", tag, ifa->ifa_index, a, ifa->ifa_prefixlen, label, ifa->ifa_scope);
	else
		printf("%s %u %s/%u\n", tag, ifa->ifa_index, a, ifa->ifa_prefixlen);
}

/* dump_links: RTM_GETLINK dump, each datagram sized with
 * MSG_PEEK|MSG_TRUNC first, as iproute2 does. */
static void dump_links(int fd) {
	struct {
		struct nlmsghdr h;
		struct ifinfomsg ifi;
	} req = {.h = {.nlmsg_len = sizeof req, .nlmsg_type = RTM_GETLINK, .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = 101},
		 .ifi = {.ifi_family = AF_UNSPEC}};
	if (send(fd, &req, sizeof req, 0) != sizeof req)
		die("send RTM_GETLINK dump");
	for (;;) {
		struct iovec iov = {0};
		struct sockaddr_nl from;
		struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1};
		ssize_t n = recvmsg(fd, &m, MSG_PEEK | MSG_TRUNC);
		if (n <= 0)
			die("recvmsg peek");
		char *buf = malloc((size_t)n);
		iov.iov_base = buf;
		iov.iov_len = (size_t)n;
		ssize_t got = recvmsg(fd, &m, 0);
		if (got != n || (m.msg_flags & MSG_TRUNC) || from.nl_pid != 0) {
			fprintf(stderr, "rtnl_probe: peeked %zd, got %zd, flags 0x%x, from %u\n", n, got, m.msg_flags, from.nl_pid);
			exit(1);
		}
		int len = (int)got;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			check_hdr(h, 101);
			if (h->nlmsg_type == NLMSG_DONE) {
				printf("linkdone\n");
				free(buf);
				return;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				errno = -((struct nlmsgerr *)NLMSG_DATA(h))->error;
				die("RTM_GETLINK dump");
			}
			if (h->nlmsg_type == RTM_NEWLINK)
				print_link("link", h);
		}
		free(buf);
	}
}

/* dump_addrs: RTM_GETADDR dump of family AF_INET (index 0: all) with
 * recv into a fixed buffer, as libmnl does. */
static void dump_addrs(int fd, unsigned index, const char *tag, uint32_t seq) {
	struct {
		struct nlmsghdr h;
		struct ifaddrmsg ifa;
	} req = {.h = {.nlmsg_len = sizeof req, .nlmsg_type = RTM_GETADDR, .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = seq},
		 .ifa = {.ifa_family = AF_INET, .ifa_index = index}};
	struct sockaddr_nl to = {.nl_family = AF_NETLINK};
	if (sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&to, sizeof to) != sizeof req)
		die("sendto RTM_GETADDR dump");
	static char buf[8192];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n <= 0)
			die("recv");
		int len = (int)n;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			check_hdr(h, seq);
			if (h->nlmsg_type == NLMSG_DONE) {
				printf("%sdone %d\n", tag, *(int *)NLMSG_DATA(h));
				return;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				printf("%sdone %d\n", tag, ((struct nlmsgerr *)NLMSG_DATA(h))->error);
				return;
			}
			if (h->nlmsg_type == RTM_NEWADDR)
				print_addr(tag, h, index == 0);
		}
	}
}

/* get_by_name: RTM_GETLINK with IFLA_IFNAME and NLM_F_ACK, sent with
 * sendto, waited for with poll and read with recvfrom. Returns 0 or the
 * error the kernel answered. */
static int get_by_name(int fd, const char *name, const char *tag, uint32_t seq) {
	struct {
		struct nlmsghdr h;
		struct ifinfomsg ifi;
		char attrs[64];
	} req = {.h = {.nlmsg_type = RTM_GETLINK, .nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK, .nlmsg_seq = seq},
		 .ifi = {.ifi_family = AF_UNSPEC}};
	struct rtattr *ra = (struct rtattr *)req.attrs;
	ra->rta_type = IFLA_IFNAME;
	ra->rta_len = (unsigned short)RTA_LENGTH(strlen(name) + 1);
	strcpy(RTA_DATA(ra), name);
	req.h.nlmsg_len = (uint32_t)(NLMSG_LENGTH(sizeof req.ifi) + RTA_ALIGN(ra->rta_len));
	uint32_t reqlen = req.h.nlmsg_len;
	if (sendto(fd, &req, reqlen, 0, NULL, 0) != (ssize_t)reqlen)
		die("sendto RTM_GETLINK");
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, 5000) != 1) {
			fprintf(stderr, "rtnl_probe: no reply to RTM_GETLINK %s in 5 s\n", name);
			exit(1);
		}
		static char buf[32768];
		struct sockaddr_nl from;
		socklen_t fl = sizeof from;
		ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
		if (n <= 0)
			die("recvfrom");
		int len = (int)n;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
			check_hdr(h, seq);
			if (h->nlmsg_type == RTM_NEWLINK) {
				print_link(tag, h);
			} else if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);
				if (e->error)
					return e->error;
				printf("%sack %d %d %d\n", tag, e->error, e->msg.nlmsg_seq == seq, e->msg.nlmsg_len == reqlen);
				return 0;
			}
		}
	}
}

/* truncated: RTM_GETLINK of name with NLM_F_ACK, its reply read into 16
 * bytes: the rest of a datagram too long for the buffer is dropped, and
 * the next read is the ack. */
static void truncated(int fd, const char *name) {
	struct {
		struct nlmsghdr h;
		struct ifinfomsg ifi;
		char attrs[64];
	} req = {.h = {.nlmsg_type = RTM_GETLINK, .nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK, .nlmsg_seq = 501},
		 .ifi = {.ifi_family = AF_UNSPEC}};
	struct rtattr *ra = (struct rtattr *)req.attrs;
	ra->rta_type = IFLA_IFNAME;
	ra->rta_len = (unsigned short)RTA_LENGTH(strlen(name) + 1);
	strcpy(RTA_DATA(ra), name);
	req.h.nlmsg_len = (uint32_t)(NLMSG_LENGTH(sizeof req.ifi) + RTA_ALIGN(ra->rta_len));
	if (send(fd, &req, req.h.nlmsg_len, 0) != (ssize_t)req.h.nlmsg_len)
		die("send RTM_GETLINK");
	char small[16];
	ssize_t peek = recv(fd, small, sizeof small, MSG_PEEK);
	struct iovec iov = {.iov_base = small, .iov_len = sizeof small};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t got = recvmsg(fd, &m, 0);
	check_hdr((struct nlmsghdr *)small, 501);
	static char buf[4096];
	ssize_t n = recv(fd, buf, sizeof buf, 0);
	struct nlmsghdr *h = (struct nlmsghdr *)buf;
	if (n < (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr)) || h->nlmsg_type != NLMSG_ERROR) {
		fprintf(stderr, "rtnl_probe: after the truncated reply: %zd bytes, type %u\n", n, h->nlmsg_type);
		exit(1);
	}
	check_hdr(h, 501);
	printf("trunc %zd %zd %d %d\n", peek, got, !!(m.msg_flags & MSG_TRUNC), ((struct nlmsgerr *)NLMSG_DATA(h))->error);
}

/* get_by_index: RTM_GETLINK by ifi_index, no ack, sendmsg and recvmsg. */
static void get_by_index(int fd, int index) {
	struct {
		struct nlmsghdr h;
		struct ifinfomsg ifi;
	} req = {.h = {.nlmsg_len = sizeof req, .nlmsg_type = RTM_GETLINK, .nlmsg_flags = NLM_F_REQUEST, .nlmsg_seq = 301},
		 .ifi = {.ifi_family = AF_UNSPEC, .ifi_index = index}};
	struct iovec iov = {.iov_base = &req, .iov_len = sizeof req};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (sendmsg(fd, &m, 0) != sizeof req)
		die("sendmsg RTM_GETLINK");
	static char buf[32768];
	iov.iov_base = buf;
	iov.iov_len = sizeof buf;
	ssize_t n = recvmsg(fd, &m, 0);
	if (n <= 0)
		die("recvmsg");
	struct nlmsghdr *h = (struct nlmsghdr *)buf;
	check_hdr(h, 301);
	if (h->nlmsg_type != RTM_NEWLINK) {
		fprintf(stderr, "rtnl_probe: RTM_GETLINK %d: reply type %u\n", index, h->nlmsg_type);
		exit(1);
	}
	struct ifinfomsg *ifi = NLMSG_DATA(h);
	int len = (int)h->nlmsg_len - (int)NLMSG_LENGTH(sizeof *ifi);
	for (struct rtattr *ra = IFLA_RTA(ifi); RTA_OK(ra, len); ra = RTA_NEXT(ra, len))
		if (ra->rta_type == IFLA_IFNAME)
			printf("getidx %d %s\n", ifi->ifi_index, (char *)RTA_DATA(ra));
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: rtnl_probe NAME\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs))
		die("getifaddrs");
	for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		if (!i->ifa_addr)
			continue;
		if (i->ifa_addr->sa_family == AF_PACKET) {
			struct sockaddr_ll *ll = (struct sockaddr_ll *)i->ifa_addr;
			char mac[64];
			mac_str(ll->sll_addr, ll->sll_halen, mac);
			printf("ifl %s %d %s\n", i->ifa_name, ll->sll_ifindex, mac);
		} else if (i->ifa_addr->sa_family == AF_INET) {
			char a[INET_ADDRSTRLEN];
			inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof a);
			uint32_t mask = ntohl(((struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr);
			printf("ifa %s %s/%d 0x%x\n", i->ifa_name, a, __builtin_popcount(mask), i->ifa_flags);
		}
	}
	freeifaddrs(ifs);

	int fd = open_rtnl(0);
	dump_links(fd);
	dump_addrs(fd, 0, "addr", 102);
	int err = get_by_name(fd, argv[1], "get", 201);
	if (err) {
		errno = -err;
		die("RTM_GETLINK by name");
	}
	unsigned index = if_nametoindex(argv[1]);
	if (!index)
		die("if_nametoindex");
	get_by_index(fd, (int)index);
	err = get_by_name(fd, "vrnic-bogus0", "bogus", 202);
	printf("bogus %s\n", err ? strerrorname_np(-err) : "OK");
	truncated(fd, argv[1]);
	close(fd);

	fd = open_rtnl(1);
	dump_addrs(fd, index, "filtered", 401);
	close(fd);
	return 0;
}
