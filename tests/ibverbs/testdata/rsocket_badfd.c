/* rsocket_badfd: rsocket calls on fds that are not rsockets fail with
 * EBADF (and never touch the fd); an unsupported socket type fails as
 * librdmacm fails it. Prints OK or the first failure. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fails;

static void want(const char *what, long ret, int err) {
	if (ret != -1 || errno != err) {
		printf("FAIL %s: ret %ld errno %d (%s), want -1 errno %d\n", what, ret, errno, strerror(errno), err);
		fails++;
	}
}

int main(void) {
	int p[2];
	if (pipe(p))
		return 2;
	int fds[] = { p[0], -1, 1000 };
	char buf[16] = "x";
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(1), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof sin;
	int v = 1;
	for (unsigned i = 0; i < sizeof fds / sizeof fds[0]; i++) {
		int fd = fds[i];
		errno = 0; want("rsend", rsend(fd, buf, 1, 0), EBADF);
		errno = 0; want("rrecv", rrecv(fd, buf, 1, 0), EBADF);
		errno = 0; want("rread", rread(fd, buf, 1), EBADF);
		errno = 0; want("rwrite", rwrite(fd, buf, 1), EBADF);
		errno = 0; want("rbind", rbind(fd, (struct sockaddr *)&sin, sizeof sin), EBADF);
		errno = 0; want("rlisten", rlisten(fd, 1), EBADF);
		errno = 0; want("raccept", raccept(fd, NULL, NULL), EBADF);
		errno = 0; want("rconnect", rconnect(fd, (struct sockaddr *)&sin, sizeof sin), EBADF);
		errno = 0; want("rshutdown", rshutdown(fd, SHUT_RDWR), EBADF);
		errno = 0; want("rgetpeername", rgetpeername(fd, (struct sockaddr *)&sin, &len), EBADF);
		errno = 0; want("rgetsockname", rgetsockname(fd, (struct sockaddr *)&sin, &len), EBADF);
		errno = 0; want("rsetsockopt", rsetsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &v, sizeof v), EBADF);
		errno = 0; want("rgetsockopt", rgetsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &len), EBADF);
		errno = 0; want("rfcntl", rfcntl(fd, F_GETFL), EBADF);
		errno = 0; want("riomap", riomap(fd, buf, sizeof buf, PROT_WRITE, 0, -1), EBADF);
		errno = 0; want("riounmap", riounmap(fd, buf, sizeof buf), EBADF);
		errno = 0; want("riowrite", (long)riowrite(fd, buf, 1, 0, 0), EBADF);
		errno = 0; want("rclose", rclose(fd), EBADF);
	}
	/* The pipe is untouched: still open and working. */
	if (write(p[1], "y", 1) != 1 || read(p[0], buf, 1) != 1 || buf[0] != 'y') {
		printf("FAIL the pipe was touched\n");
		fails++;
	}
	/* rpoll over ordinary fds is poll. */
	struct pollfd pf = { .fd = p[1], .events = POLLOUT };
	if (rpoll(&pf, 1, 0) != 1 || !(pf.revents & POLLOUT)) {
		printf("FAIL rpoll on a pipe\n");
		fails++;
	}
	/* Unsupported: datagram rsockets, other families and protocols. */
	errno = 0; want("rsocket SOCK_DGRAM", rsocket(AF_INET, SOCK_DGRAM, 0), ENOTSUP);
	errno = 0; want("rsocket AF_UNIX", rsocket(AF_UNIX, SOCK_STREAM, 0), ENOTSUP);
	errno = 0; want("rsocket IPPROTO_UDP", rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP), ENOTSUP);
	if (!fails)
		printf("OK\n");
	return fails ? 1 : 0;
}
