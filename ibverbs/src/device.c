/* device.c - devices (one per reachable vrnicd), contexts, device, port
 * and GID queries, and the sysfs files ibv_devinfo reads. */
#include "vrnic_ibv.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#undef ibv_query_port
#undef ibv_get_device_list

#define SOCK_SUFFIX ".sock"

static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
static struct vr_device *devices; /* every device ever listed; never freed */
static int next_index;

/* runtime_dir writes the directory holding the daemons' sockets: the one
 * vrnicd uses by default (admin.RuntimeDir), unless VRNIC_RUNTIME_DIR
 * names another. */
static void runtime_dir(char *out, size_t len) {
	const char *e = getenv("VRNIC_RUNTIME_DIR");
	if (e && *e) {
		snprintf(out, len, "%s", e);
		return;
	}
	if (geteuid() == 0) {
		snprintf(out, len, "/run/vrnic");
		return;
	}
	e = getenv("XDG_RUNTIME_DIR");
	if (e && *e) {
		snprintf(out, len, "%s/vrnic", e);
		return;
	}
	e = getenv("TMPDIR");
	snprintf(out, len, "%s/vrnic-%u", e && *e ? e : "/tmp", (unsigned)geteuid());
}

static bool reachable(const char *path) {
	int s = vr_connect(path);
	if (s < 0)
		return false;
	close(s);
	return true;
}

/* find_or_add returns the device of name and socket path, creating it. */
static struct vr_device *find_or_add(const char *name, const char *path) {
	for (struct vr_device *d = devices; d; d = d->next)
		if (strcmp(d->dev.name, name) == 0 && strcmp(d->sock, path) == 0)
			return d;
	struct vr_device *d = calloc(1, sizeof *d);
	if (!d)
		return NULL;
	d->magic = VR_DEVICE_MAGIC;
	d->dev.node_type = IBV_NODE_CA;
	d->dev.transport_type = IBV_TRANSPORT_IB;
	snprintf(d->dev.name, sizeof d->dev.name, "%s", name);
	int idx = next_index++;
	snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%d", idx);
	snprintf(d->dev.dev_path, sizeof d->dev.dev_path, "/sys/class/infiniband_verbs/uverbs%d", idx);
	snprintf(d->dev.ibdev_path, sizeof d->dev.ibdev_path, "/sys/class/infiniband/%s", name);
	snprintf(d->sock, sizeof d->sock, "%s", path);
	d->next = devices;
	devices = d;
	return d;
}

static int cmp_dev(const void *a, const void *b) {
	const struct vr_device *x = *(struct vr_device *const *)a, *y = *(struct vr_device *const *)b;
	return strcmp(x->dev.name, y->dev.name);
}

/* ibv_get_device_list returns one device per vrnicd socket in the runtime
 * directory that accepts a connection, sorted by name; or, with
 * VRNIC_DEVICE set, only that device (a daemon name, or a socket path). */
VR_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices) {
	char dir[4096];
	runtime_dir(dir, sizeof dir);
	struct vr_device **found = NULL;
	size_t n = 0, cap = 0;
	pthread_mutex_lock(&devices_mu);
	const char *want = getenv("VRNIC_DEVICE");
	char **paths = NULL, **names = NULL;
	size_t np = 0;
	if (want && *want) {
		paths = calloc(1, sizeof *paths);
		names = calloc(1, sizeof *names);
		if (paths && names) {
			char p[8192], nm[256];
			if (strchr(want, '/')) {
				snprintf(p, sizeof p, "%s", want);
				const char *base = strrchr(want, '/') + 1;
				snprintf(nm, sizeof nm, "%s", base);
				size_t l = strlen(nm);
				if (l > strlen(SOCK_SUFFIX) && strcmp(nm + l - strlen(SOCK_SUFFIX), SOCK_SUFFIX) == 0)
					nm[l - strlen(SOCK_SUFFIX)] = 0;
			} else {
				snprintf(p, sizeof p, "%s/%s%s", dir, want, SOCK_SUFFIX);
				snprintf(nm, sizeof nm, "%s", want);
			}
			paths[0] = strdup(p);
			names[0] = strdup(nm);
			np = paths[0] && names[0] ? 1 : 0;
		}
	} else {
		DIR *dh = opendir(dir);
		if (dh) {
			struct dirent *e;
			while ((e = readdir(dh))) {
				size_t l = strlen(e->d_name);
				if (l <= strlen(SOCK_SUFFIX) || strcmp(e->d_name + l - strlen(SOCK_SUFFIX), SOCK_SUFFIX) != 0)
					continue;
				char **np2 = realloc(paths, (np + 1) * sizeof *paths);
				if (!np2)
					break;
				paths = np2;
				char **nn2 = realloc(names, (np + 1) * sizeof *names);
				if (!nn2)
					break;
				names = nn2;
				char p[4096 + 256];
				snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
				paths[np] = strdup(p);
				names[np] = strndup(e->d_name, l - strlen(SOCK_SUFFIX));
				if (!paths[np] || !names[np]) {
					free(paths[np]);
					free(names[np]);
					break;
				}
				np++;
			}
			closedir(dh);
		}
	}
	/* Sorted by name, so that a device's uverbsN is its place among the
	 * daemons answering when first listed (vrnic-run's /dev and /sys view). */
	for (size_t i = 1; i < np; i++)
		for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
			char *t = names[j];
			names[j] = names[j - 1];
			names[j - 1] = t;
			t = paths[j];
			paths[j] = paths[j - 1];
			paths[j - 1] = t;
		}
	for (size_t i = 0; i < np; i++) {
		if (reachable(paths[i])) {
			struct vr_device *d = find_or_add(names[i], paths[i]);
			if (d) {
				if (n == cap) {
					cap = cap ? 2 * cap : 8;
					struct vr_device **f2 = realloc(found, cap * sizeof *found);
					if (!f2)
						break;
					found = f2;
				}
				found[n++] = d;
			}
		}
	}
	for (size_t i = 0; i < np; i++) {
		free(paths[i]);
		free(names[i]);
	}
	free(paths);
	free(names);
	pthread_mutex_unlock(&devices_mu);
	if (n > 1)
		qsort(found, n, sizeof *found, cmp_dev);
	struct ibv_device **list = calloc(n + 1, sizeof *list);
	if (!list) {
		free(found);
		errno = ENOMEM;
		if (num_devices)
			*num_devices = 0;
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		list[i] = &found[i]->dev;
	free(found);
	if (num_devices)
		*num_devices = (int)n;
	return list;
}

VR_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

VR_EXPORT const char *ibv_get_device_name(struct ibv_device *device) {
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	return device->name;
}

VR_EXPORT int ibv_get_device_index(struct ibv_device *device) {
	if (!device)
		return -1;
	return atoi(device->dev_name + strlen("uverbs"));
}

/* open_session connects to the device and opens a context; it returns the
 * socket and fills the reply and its two fds (doorbell page, kick). */
static int open_session(struct vr_device *d, struct vrnic_resp_open_context *r, int fds[2], uint32_t *seq) {
	int s = vr_connect(d->sock);
	if (s < 0)
		return -1;
	struct vrnic_cmd_open_context oc = { .abi_version = VRNIC_ABI_VERSION };
	const char *prog = program_invocation_short_name;
	snprintf(oc.client_name, sizeof oc.client_name, "ibv:%.26s", prog ? prog : "?");
	int ret = vr_call_sock(s, seq, VRNIC_CMD_OPEN_CONTEXT, &oc, sizeof oc, NULL, 0, r, sizeof *r, fds, 2);
	if (ret) {
		close(s);
		errno = ret;
		return -1;
	}
	return s;
}

VR_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device) {
	if (!device)
		return 0;
	struct vr_device *d = (struct vr_device *)device;
	pthread_mutex_lock(&devices_mu);
	bool known = d->guid_known;
	pthread_mutex_unlock(&devices_mu);
	if (known)
		return d->guid;
	struct vrnic_resp_open_context r;
	int fds[2];
	uint32_t seq = 0;
	int s = open_session(d, &r, fds, &seq);
	if (s < 0)
		return 0;
	close(fds[0]);
	close(fds[1]);
	struct vrnic_device_attr a;
	int ret = vr_call_sock(s, &seq, VRNIC_CMD_QUERY_DEVICE, NULL, 0, NULL, 0, &a, sizeof a, NULL, 0);
	close(s);
	if (ret) {
		errno = ret;
		return 0;
	}
	pthread_mutex_lock(&devices_mu);
	d->guid = htobe64(a.node_guid);
	d->guid_known = true;
	pthread_mutex_unlock(&devices_mu);
	return d->guid;
}

VR_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
	if (!device)
		VR_FAIL_NULL(EINVAL);
	struct vr_device *d = (struct vr_device *)device;
	struct vr_ctx *c = calloc(1, sizeof *c);
	if (!c)
		VR_FAIL_NULL(ENOMEM);
	c->dev = d;
	c->async_ep = -1;
	c->events_fd = -1;
	c->kick_fd = -1;
	pthread_mutex_init(&c->obj_mu, NULL);
	pthread_mutex_init(&c->mem_mu, NULL);
	struct vrnic_resp_open_context r;
	int fds[2], e;
	if ((e = vr_calls_init(c))) {
		free(c);
		VR_FAIL_NULL(e);
	}
	c->sock = open_session(d, &r, fds, &c->calls->seq);
	if (c->sock < 0) {
		e = errno;
		goto fail;
	}
	c->kick_fd = fds[1];
	c->db = mmap(NULL, r.db_page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	e = errno;
	close(fds[0]);
	if (c->db == MAP_FAILED) {
		c->db = NULL;
		goto fail;
	}
	c->db_size = r.db_page_size;
	if (((struct vrnic_db_header *)c->db)->magic != VRNIC_DB_MAGIC) {
		e = EPROTO;
		goto fail;
	}
	/* ABI 1.3: mark posts in the page's summary, so that the daemon reads
	 * only the records that changed. */
	if ((r.abi_version >> 16) == VRNIC_ABI_VERSION_MAJOR && (r.abi_version & 0xffff) >= 3) {
		__atomic_fetch_or(&((struct vrnic_db_header *)c->db)->client_flags, VRNIC_DB_F_SUMMARY, __ATOMIC_SEQ_CST);
		c->db_summary = true;
	}
	c->kick_gen = __atomic_load_n(&((struct vrnic_db_header *)c->db)->daemon_flags, __ATOMIC_ACQUIRE) &
		      VRNIC_DB_DF_KICK_GEN;
	if ((e = vr_call(c, VRNIC_CMD_QUERY_DEVICE, NULL, 0, NULL, 0, NULL, 0, &c->attr, sizeof c->attr)))
		goto fail;
	/* async_fd is an epoll fd over the context's event socket (the
	 * daemon's asynchronous events, ABI 1.1) and the control socket's
	 * hang-up (the daemon went away: IBV_EVENT_DEVICE_FATAL). */
	if ((e = vr_events_open(c)))
		goto fail;

	struct verbs_context *v = &c->vctx;
	struct ibv_context *ctx = &v->context;
	ctx->device = device;
	ctx->cmd_fd = c->sock;
	ctx->async_fd = c->async_ep;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	v->sz = sizeof *v;
	ctx->ops.poll_cq = vr_poll_cq;
	ctx->ops.req_notify_cq = vr_req_notify_cq;
	ctx->ops.post_send = vr_post_send;
	ctx->ops.post_recv = vr_post_recv;
	ctx->ops.post_srq_recv = vr_post_srq_recv;
	ctx->ops.alloc_mw = vr_alloc_mw;
	ctx->ops.dealloc_mw = vr_dealloc_mw;
	ctx->ops.bind_mw = vr_bind_mw;
	v->query_port = vr_query_port;
	v->query_device_ex = vr_query_device_ex;
	v->create_cq_ex = vr_create_cq_ex;
	v->create_qp_ex = vr_create_qp_ex;
	v->create_srq_ex = vr_create_srq_ex;
	vr_domain_ops(v);
	v->query_rt_values = vr_query_rt_values;
	v->advise_mr = vr_advise_mr;
	v->open_xrcd = vr_open_xrcd;
	v->close_xrcd = vr_close_xrcd;
	v->get_srq_num = vr_get_srq_num;
	v->alloc_dm = vr_alloc_dm;
	v->free_dm = vr_free_dm;
	v->reg_dm_mr = vr_reg_dm_mr;
	return ctx;
fail:
	if (c->db)
		munmap(c->db, c->db_size);
	if (c->kick_fd >= 0)
		close(c->kick_fd);
	if (c->async_ep >= 0)
		close(c->async_ep);
	if (c->events_fd >= 0)
		close(c->events_fd);
	if (c->sock >= 0)
		close(c->sock);
	vr_calls_free(c);
	free(c);
	VR_FAIL_NULL(e);
}

VR_EXPORT int ibv_close_device(struct ibv_context *ctx) {
	if (!ctx)
		return EINVAL;
	struct vr_ctx *c = vr_ctx(ctx);
	/* Closing the socket makes the daemon destroy everything the context
	 * owned; ring memory is unmapped here. User memory stays mapped: the
	 * program still owns it. */
	close(c->sock);
	close(c->kick_fd);
	close(c->async_ep);
	if (c->events_fd >= 0)
		close(c->events_fd);
	munmap(c->db, c->db_size);
	free(c->objs);
	vr_free_chunks(c);
	free(c->segs);
	vr_calls_free(c);
	free(c);
	return 0;
}

VR_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
	if (!ctx || !a)
		return EINVAL;
	struct vr_ctx *c = vr_ctx(ctx);
	struct vrnic_device_attr d;
	int ret = vr_call(c, VRNIC_CMD_QUERY_DEVICE, NULL, 0, NULL, 0, NULL, 0, &d, sizeof d);
	if (ret) {
		errno = ret;
		return ret;
	}
	memset(a, 0, sizeof *a);
	snprintf(a->fw_ver, sizeof a->fw_ver, "%.*s", (int)sizeof d.fw_ver, d.fw_ver);
	a->node_guid = htobe64(d.node_guid);
	a->sys_image_guid = htobe64(d.sys_image_guid);
	a->max_mr_size = d.max_mr_size;
	a->page_size_cap = d.page_size_cap;
	a->vendor_id = d.vendor_id;
	a->vendor_part_id = d.vendor_part_id;
	a->hw_ver = d.hw_ver;
	a->max_qp = (int)d.max_qp;
	a->max_qp_wr = (int)d.max_qp_wr;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_CURR_QP_STATE_MOD | IBV_DEVICE_SYS_IMAGE_GUID;
	if (d.device_cap_flags & VRNIC_DEVICE_XRC)
		a->device_cap_flags |= IBV_DEVICE_XRC;
	/* ABI 1.4: memory windows, type 1 and 2B (what the daemon says). */
	if (d.device_cap_flags & VRNIC_DEVICE_MEM_WINDOW)
		a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW;
	if (d.device_cap_flags & VRNIC_DEVICE_MEM_WINDOW_TYPE_2B)
		a->device_cap_flags |= IBV_DEVICE_MEM_WINDOW_TYPE_2B;
	a->max_mw = (int)d.max_mw;
	a->max_sge = (int)d.max_sge;
	a->max_sge_rd = (int)d.max_sge;
	a->max_cq = (int)d.max_cq;
	a->max_cqe = (int)d.max_cqe;
	a->max_mr = (int)d.max_mr;
	a->max_pd = (int)d.max_pd;
	a->max_qp_rd_atom = (int)d.max_qp_rd_atom;
	a->max_res_rd_atom = (int)(d.max_qp_rd_atom * d.max_qp);
	a->max_qp_init_rd_atom = (int)d.max_qp_init_rd_atom;
	a->atomic_cap = d.atomic_cap;
	a->max_ah = (int)d.max_ah;
	a->max_srq = (int)d.max_srq;
	a->max_srq_wr = (int)d.max_srq_wr;
	a->max_srq_sge = (int)d.max_srq_sge;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = d.phys_port_cnt;
	return 0;
}

/* speed_of maps a link speed in Mbit/s to the IB width and speed codes
 * whose product is closest below it (4X lanes). */
static void speed_of(uint64_t mbps, uint8_t *width, uint8_t *speed) {
	*width = 2; /* IBV_WIDTH_4X */
	uint64_t lane = mbps / 4;
	if (lane >= 50000)
		*speed = 64; /* HDR */
	else if (lane >= 25000)
		*speed = 32; /* EDR */
	else if (lane >= 10000)
		*speed = 16; /* FDR */
	else if (lane >= 5000)
		*speed = 4; /* QDR */
	else if (lane >= 2500)
		*speed = 2; /* DDR */
	else
		*speed = 1; /* SDR */
}

int vr_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *out, size_t len) {
	if (!ctx || !out)
		return EINVAL;
	struct vr_ctx *c = vr_ctx(ctx);
	struct vrnic_cmd_query_port q = { .port_num = port };
	struct vrnic_port_attr p;
	int ret = vr_call(c, VRNIC_CMD_QUERY_PORT, &q, sizeof q, NULL, 0, NULL, 0, &p, sizeof p);
	if (ret) {
		errno = ret;
		return ret;
	}
	struct ibv_port_attr a = { 0 };
	a.state = (enum ibv_port_state)p.state;
	a.max_mtu = (enum ibv_mtu)p.max_mtu;
	a.active_mtu = (enum ibv_mtu)p.active_mtu;
	a.gid_tbl_len = (int)p.gid_tbl_len;
	a.max_msg_sz = p.max_msg_sz;
	a.pkey_tbl_len = 1;
	a.max_vl_num = 1;
	speed_of(p.active_speed_mbps, &a.active_width, &a.active_speed);
	a.phys_state = p.state == IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
	a.link_layer = (uint8_t)p.link_layer;
	memcpy(out, &a, len < sizeof a ? len : sizeof a);
	return 0;
}

/* ibv_query_port as exported: old binaries and the inline verb without a
 * query_port op pass a struct ibv_port_attr up to port_cap_flags2 at most. */
VR_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr) {
	return vr_query_port(ctx, port, (struct ibv_port_attr *)attr, offsetof(struct ibv_port_attr, port_cap_flags2));
}

static int query_gid(struct ibv_context *ctx, uint32_t port, uint32_t index, struct vrnic_resp_query_gid *g) {
	if (!ctx)
		return EINVAL;
	struct vrnic_cmd_query_gid q = { .port_num = port, .index = index };
	return vr_call(vr_ctx(ctx), VRNIC_CMD_QUERY_GID, &q, sizeof q, NULL, 0, NULL, 0, g, sizeof *g);
}

VR_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
	struct vrnic_resp_query_gid g;
	if (!gid || index < 0) {
		errno = EINVAL;
		return -1;
	}
	int ret = query_gid(ctx, port, (uint32_t)index, &g);
	if (ret) {
		errno = ret;
		return -1;
	}
	/* An empty slot reads as the zero GID, as with libibverbs. */
	memset(gid, 0, sizeof *gid);
	if (g.valid)
		memcpy(gid->raw, g.gid, 16);
	return 0;
}

VR_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
				uint32_t flags, size_t entry_size) {
	if (!entry || flags || entry_size < sizeof *entry) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vrnic_resp_query_gid g;
	int ret = query_gid(ctx, port, index, &g);
	if (!ret && !g.valid)
		ret = ENODATA;
	if (ret) {
		errno = ret;
		return ret;
	}
	memset(entry, 0, sizeof *entry);
	memcpy(entry->gid.raw, g.gid, 16);
	entry->gid_index = index;
	entry->port_num = port;
	entry->gid_type = g.gid_type == 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	return 0;
}

VR_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max_entries,
				       uint32_t flags, size_t entry_size) {
	if (!ctx || (!entries && max_entries) || flags || entry_size < sizeof *entries) {
		errno = EINVAL;
		return -EINVAL;
	}
	struct ibv_port_attr pa;
	int ret = vr_query_port(ctx, 1, &pa, sizeof pa);
	if (ret)
		return -ret;
	size_t n = 0;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		ret = _ibv_query_gid_ex(ctx, 1, (uint32_t)i, &e, 0, sizeof e);
		if (ret == ENODATA)
			continue;
		if (ret)
			return -ret;
		if (n == max_entries) {
			errno = EINVAL;
			return -EINVAL;
		}
		memcpy((uint8_t *)entries + n * entry_size, &e, sizeof e);
		n++;
	}
	return (ssize_t)n;
}

/* ibv_query_gid_type (private ABI, used by ibv_devinfo): 1 is
 * IBV_GID_TYPE_SYSFS_ROCE_V2, 0 IB/RoCE v1. */
VR_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type) {
	struct vrnic_resp_query_gid g;
	if (!type)
		return -1;
	int ret = query_gid(ctx, port, index, &g);
	if (ret || !g.valid) {
		errno = ret ? ret : ENODATA;
		return -1;
	}
	*type = g.gid_type == 2 ? 1 : 0;
	return 0;
}

VR_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey) {
	if (!ctx || !pkey || port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(VRNIC_PKEY_DEFAULT);
	return 0;
}

VR_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey) {
	if (!ctx || port != 1)
		return -EINVAL;
	return be16toh(pkey) == VRNIC_PKEY_DEFAULT ? 0 : -ENOENT;
}

/* sysfs_value serves the files libibverbs users read under a vrnic
 * device's ibdev_path; it returns false for anything else. */
static bool sysfs_value(const char *dir, const char *file, char *val, size_t len) {
	struct vr_device *d = NULL;
	pthread_mutex_lock(&devices_mu);
	for (struct vr_device *x = devices; x; x = x->next)
		if (strcmp(x->dev.ibdev_path, dir) == 0 || strcmp(x->dev.dev_path, dir) == 0)
			d = x;
	pthread_mutex_unlock(&devices_mu);
	if (!d)
		return false;
	if (strcmp(file, "board_id") == 0)
		snprintf(val, len, "VRNIC0001");
	else if (strcmp(file, "hca_type") == 0)
		snprintf(val, len, "vrnic");
	else if (strcmp(file, "hw_rev") == 0)
		snprintf(val, len, "0");
	else if (strcmp(file, "node_type") == 0)
		snprintf(val, len, "1: CA");
	else if (strcmp(file, "node_desc") == 0)
		snprintf(val, len, "vrnic %s", d->dev.name);
	else if (strcmp(file, "ibdev") == 0)
		snprintf(val, len, "%s", d->dev.name);
	else if (strcmp(file, "abi_version") == 0)
		snprintf(val, len, "1");
	else if (strcmp(file, "fw_ver") == 0 || strcmp(file, "node_guid") == 0 || strcmp(file, "sys_image_guid") == 0) {
		uint64_t g = be64toh(ibv_get_device_guid(&d->dev));
		if (file[0] == 'f')
			snprintf(val, len, "1.0");
		else
			snprintf(val, len, "%04x:%04x:%04x:%04x", (unsigned)(g >> 48), (unsigned)(g >> 32) & 0xffff,
				 (unsigned)(g >> 16) & 0xffff, (unsigned)g & 0xffff);
	} else
		return false;
	return true;
}

/* ibv_read_sysfs_file reads dir/file (its content without the trailing
 * newline, NUL-terminated) into buf; under a vrnic device's paths it serves
 * the values above. It returns the length or -1. */
VR_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size) {
	if (!dir || !file || !buf || !size) {
		errno = EINVAL;
		return -1;
	}
	char val[256];
	if (sysfs_value(dir, file, val, sizeof val)) {
		size_t l = strlen(val);
		if (l >= size)
			l = size - 1;
		memcpy(buf, val, l);
		buf[l] = 0;
		return (int)l;
	}
	char *path;
	if (asprintf(&path, "%s/%s", dir, file) < 0)
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	close(fd);
	if (n <= 0)
		return -1;
	if ((size_t)n == size)
		n--;
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	buf[n] = 0;
	return (int)n;
}

VR_EXPORT const char *ibv_get_sysfs_path(void) { return "/sys"; }
