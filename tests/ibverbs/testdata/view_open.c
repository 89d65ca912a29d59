/* view_open lists the devices and, as UCX does before using one, opens
 * /dev/infiniband/<dev_name> read-write and checks it is a character
 * device; it prints one line per device: name, dev_name, node GUID (as
 * sysfs writes it), the ibdev its infiniband_verbs directory names, and
 * "open-ok". */
#include <endian.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

int main(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	int bad = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_device *d = list[i];
		char path[512], ibdev[64] = "";
		snprintf(path, sizeof path, "/dev/infiniband/%s", d->dev_name);
		const char *st = "open-ok";
		int fd = open(path, O_RDWR | O_CLOEXEC);
		struct stat sb;
		if (fd < 0) {
			st = "open-failed";
			bad = 1;
		} else {
			if (fstat(fd, &sb) != 0 || !S_ISCHR(sb.st_mode)) {
				st = "not-a-char-device";
				bad = 1;
			}
			close(fd);
		}
		snprintf(path, sizeof path, "%s/ibdev", d->dev_path);
		FILE *f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%63s", ibdev) != 1)
				ibdev[0] = 0;
			fclose(f);
		}
		uint64_t g = be64toh(ibv_get_device_guid(d));
		printf("%s %s %04x:%04x:%04x:%04x %s %s\n", ibv_get_device_name(d), d->dev_name, (unsigned)(g >> 48),
		       (unsigned)(g >> 32) & 0xffff, (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff,
		       ibdev[0] ? ibdev : "-", st);
	}
	ibv_free_device_list(list);
	return bad;
}
