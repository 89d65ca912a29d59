/* mrdm.c - ibv_rereg_mr, ibv_resize_cq and device memory (ibv_alloc_dm,
 * ibv_free_dm, ibv_memcpy_to_dm, ibv_memcpy_from_dm, ibv_reg_dm_mr): the
 * ABI 1.4 commands REREG_MR, RESIZE_CQ, ALLOC_DM, FREE_DM, REG_DM_MR and
 * QUERY_DEVICE_EX. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- ibv_rereg_mr ---- */

/* Access bits as reg_mr takes them (objects.c): the kernel's, less the
 * optional range; ON_DEMAND and ZERO_BASED refused with EOPNOTSUPP. */
#define REREG_ACCESS_KERNEL 0xffu
#define REREG_ACCESS_NOTSUP (IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED)

/* ibv_rereg_mr: libibverbs' input checks (IBV_REREG_MR_ERR_INPUT), then
 * the command (IBV_REREG_MR_ERR_CMD with errno from the daemon). The
 * program's memory needs no fork protection here (vrnic's memory is
 * shared with the daemon, not pinned by a kernel), so the DONT_FORK and
 * DO_FORK codes never occur. */
VR_EXPORT int ibv_rereg_mr(struct ibv_mr *ibmr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access) {
	if (!ibmr) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	struct vr_mr *mr = (struct vr_mr *)ibmr;
	if (mr->dm) { /* not an IBV_MR_TYPE_MR */
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	if (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	bool trans = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
	if ((trans && (!length || !addr)) || (!trans && (addr || length))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	struct vr_ctx *c = vr_ctx(ibmr->context);
	struct vrnic_cmd_rereg_mr cmd = { .mr_handle = ibmr->handle, .flags = (uint32_t)flags };
	unsigned acc = mr->access;
	int ret = 0;
	if (flags & IBV_REREG_MR_CHANGE_PD) {
		if (!pd || pd->context != ibmr->context) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_CMD;
		}
		cmd.pd_handle = pd->handle;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
		acc = (unsigned)access & ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
		if (acc & ~REREG_ACCESS_KERNEL)
			ret = EINVAL;
		else if (acc & REREG_ACCESS_NOTSUP)
			ret = EOPNOTSUPP;
		if (ret) {
			errno = ret;
			return IBV_REREG_MR_ERR_CMD;
		}
		cmd.access = acc & 0xf;
	}
	uint64_t *pages = NULL;
	size_t npages = 0;
	if (trans) {
		uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(VR_PAGE - 1);
		uintptr_t end = ((uintptr_t)addr + length + VR_PAGE - 1) & ~(uintptr_t)(VR_PAGE - 1);
		if (end <= start || length > VRNIC_MAX_MR_SIZE) {
			errno = EINVAL;
			return IBV_REREG_MR_ERR_CMD;
		}
		npages = (end - start) / VR_PAGE;
		pages = calloc(npages, sizeof *pages);
		if (!pages) {
			errno = ENOMEM;
			return IBV_REREG_MR_ERR_CMD;
		}
		ret = vr_user_pages(c, start, npages, (acc & IBV_ACCESS_LOCAL_WRITE) != 0, pages);
		cmd.iova = (uintptr_t)addr;
		cmd.length = length;
		cmd.page_shift = VRNIC_PAGE_SHIFT_4K;
		cmd.npages = (uint32_t)npages;
	}
	struct vrnic_resp_reg_mr r;
	if (!ret)
		ret = vr_call_pages(c, VRNIC_CMD_REREG_MR, &cmd, sizeof cmd, &cmd.pbl_pa, pages, npages, &r, sizeof r);
	free(pages);
	if (ret) {
		errno = ret;
		return IBV_REREG_MR_ERR_CMD;
	}
	ibmr->lkey = r.lkey;
	ibmr->rkey = r.rkey;
	mr->access = acc;
	if (flags & IBV_REREG_MR_CHANGE_PD)
		ibmr->pd = pd;
	if (trans) {
		ibmr->addr = addr;
		ibmr->length = length;
	}
	return 0;
}

/* ---- ibv_resize_cq ---- */

/* The new ring is allocated, then, with the CQ's lock held (no poll
 * meanwhile, the RESIZE_CQ contract), the daemon moves the CQ to it
 * carrying the unpolled CQEs over at the same indices; polling goes on
 * from the same consumer index with the new size. The CQ holds at least
 * cqe entries (a power of two, at least 2: ibv_cq.cqe says how many).
 * Fewer than the CQEs not yet polled: EINVAL, as rxe. */
VR_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe) {
	if (!ibcq || cqe <= 0 || (uint32_t)cqe > VRNIC_MAX_CQE) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vr_cq *cq = vr_cq(ibcq);
	struct vr_ctx *c = vr_ctx(ibcq->context);
	uint32_t n = 2;
	while (n < (uint32_t)cqe)
		n <<= 1;
	/* A CQ on a parent domain takes its new ring from the domain's
	 * allocator too. */
	struct vr_buf ring;
	int ret = vr_alloc_in(c, cq->ring.domain ? &cq->ring.domain->pd : NULL, VRNIC_RES_TYPE_CQ,
			      (size_t)n * (sizeof(struct vrnic_cqe) + (cq->ts ? 8 : 0)), &ring);
	if (ret) {
		errno = ret;
		return ret;
	}
	struct vrnic_cmd_resize_cq cmd = { .ring_pa = ring.pa, .cq_handle = ibcq->handle, .cqe_count = n };
	struct vrnic_resp_resize_cq r;
	pthread_spin_lock(&cq->lock);
	ret = vr_call(c, VRNIC_CMD_RESIZE_CQ, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	if (!ret) {
		struct vr_buf old = cq->ring;
		cq->ring = ring;
		cq->cqes = (struct vrnic_cqe *)ring.p;
		if (cq->ts)
			cq->ts = (uint64_t *)(ring.p + (size_t)n * sizeof(struct vrnic_cqe));
		cq->n = n;
		cq->mask = n - 1;
		ibcq->cqe = (int)n;
		ring = old;
	}
	pthread_spin_unlock(&cq->lock);
	vr_free(c, &ring); /* the old ring, or the new one refused */
	if (ret) {
		errno = ret;
		return ret;
	}
	return 0;
}

/* vr_cq_clean drops the CQEs of QP qpn that the program has not polled
 * (a QP moved to RESET), as mlx5's provider does: the CQEs written and
 * not yet polled, [ci, pi), are compacted towards pi, keeping their
 * order, and the consumer index moves past the slots freed. Only ready
 * entries move, into slots that hold ready entries of the same index
 * (their owner bits stay right); the daemon writes beyond pi meanwhile,
 * untouched. */
void vr_cq_clean(struct vr_cq *cq, uint32_t qpn) {
	pthread_spin_lock(&cq->lock);
	uint32_t ci = cq->ci, pi = ci;
	while (pi - ci < cq->n) {
		uint8_t owner = __atomic_load_n(&cq->cqes[pi & cq->mask].owner, __ATOMIC_ACQUIRE);
		if ((owner & 1) != 1 - ((pi / cq->n) & 1))
			break;
		pi++;
	}
	uint32_t freed = 0;
	for (uint32_t i = pi; i-- != ci;) {
		struct vrnic_cqe *e = &cq->cqes[i & cq->mask];
		if ((e->qp_num & 0xffffff) == qpn) {
			freed++;
		} else if (freed) {
			struct vrnic_cqe *d = &cq->cqes[(i + freed) & cq->mask];
			uint8_t owner = d->owner;
			*d = *e;
			d->owner = owner;
			if (cq->ts)
				cq->ts[(i + freed) & cq->mask] = cq->ts[i & cq->mask];
		}
	}
	if (freed) {
		cq->ci = ci + freed;
		__atomic_store_n(&cq->rec->cq_ci, cq->ci, __ATOMIC_SEQ_CST);
	}
	pthread_spin_unlock(&cq->lock);
}

/* ---- device memory ---- */

struct vr_dm {
	struct ibv_dm dm;
	uint8_t *p;        /* the DM's memfd, mapped shared */
	uint64_t length;   /* as allocated */
	uint64_t map_len;
};

static inline struct vr_dm *vr_dm(struct ibv_dm *dm) { return (struct vr_dm *)dm; }

/* mlx5's rules: the range within the DM (else EFAULT), offset and length
 * multiples of 4 (else EINVAL). */
static int dm_range(const struct vr_dm *d, uint64_t off, size_t len) {
	if (off > d->length || len > d->length - off)
		return EFAULT;
	if ((off & 3) || (len & 3))
		return EINVAL;
	return 0;
}

static int dm_to(struct ibv_dm *dm, uint64_t off, const void *src, size_t len) {
	struct vr_dm *d = vr_dm(dm);
	int ret = dm_range(d, off, len);
	if (ret)
		return ret;
	memcpy(d->p + off, src, len);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	return 0;
}

static int dm_from(void *dst, struct ibv_dm *dm, uint64_t off, size_t len) {
	struct vr_dm *d = vr_dm(dm);
	int ret = dm_range(d, off, len);
	if (ret)
		return ret;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	memcpy(dst, d->p + off, len);
	return 0;
}

/* vr_call_fd is vr_call for a command whose reply carries one fd. */
static int vr_call_fd(struct vr_ctx *c, uint16_t op, const void *req, size_t req_len, void *resp, size_t resp_len,
		      int *fd) {
	int ret = EIO;
	vr_calls_lock(c);
	if (!vr_dead(c))
		ret = vr_call_sock(c->sock, &c->calls->seq, op, req, req_len, NULL, 0, resp, resp_len, fd, 1);
	vr_calls_unlock(c);
	if (ret == ECONNRESET || ret == EPIPE || ret == ENOTCONN) {
		vr_set_dead(c);
		ret = EIO;
	}
	if (!ret && *fd < 0)
		ret = EPROTO;
	return ret;
}

struct ibv_dm *vr_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *a) {
	if (!ctx || !a)
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(ctx);
	uint64_t max = 0;
	if (vr_max_dm_size(c, &max) || !max)
		VR_FAIL_NULL(EOPNOTSUPP);
	if (a->comp_mask || !a->length || a->length > max)
		VR_FAIL_NULL(EINVAL);
	struct vr_dm *d = calloc(1, sizeof *d);
	if (!d)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_cmd_alloc_dm cmd = { .length = a->length, .log_align = a->log_align_req };
	struct vrnic_resp_alloc_dm r;
	int fd = -1;
	int ret = vr_call_fd(c, VRNIC_CMD_ALLOC_DM, &cmd, sizeof cmd, &r, sizeof r, &fd);
	if (ret) {
		free(d);
		VR_FAIL_NULL(ret);
	}
	void *p = mmap(NULL, r.map_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int e = errno;
	close(fd);
	if (p == MAP_FAILED) {
		vr_destroy_handle(c, VRNIC_CMD_FREE_DM, r.dm_handle);
		free(d);
		VR_FAIL_NULL(e);
	}
	d->p = p;
	d->length = a->length;
	d->map_len = r.map_length;
	d->dm.context = ctx;
	d->dm.handle = r.dm_handle;
	d->dm.memcpy_to_dm = dm_to;
	d->dm.memcpy_from_dm = dm_from;
	return &d->dm;
}

int vr_free_dm(struct ibv_dm *dm) {
	if (!dm)
		return EINVAL;
	struct vr_dm *d = vr_dm(dm);
	int ret = vr_destroy_handle(vr_ctx(dm->context), VRNIC_CMD_FREE_DM, dm->handle);
	if (ret)
		return ret;
	munmap(d->p, d->map_len);
	free(d);
	return 0;
}

/* The access bits a DM MR may have (mlx5's MLX5_IB_DM_MEMIC_ALLOWED_ACCESS):
 * ZERO_BASED is required. */
#define DM_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		   IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED)

struct ibv_mr *vr_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t off, size_t length, unsigned int access) {
	if (!pd || !dm || dm->context != pd->context)
		VR_FAIL_NULL(EINVAL);
	access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
	if ((access & ~(unsigned)DM_ACCESS) || !(access & IBV_ACCESS_ZERO_BASED))
		VR_FAIL_NULL(EINVAL);
	struct vr_mr *mr = calloc(1, sizeof *mr);
	if (!mr)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_cmd_reg_dm_mr cmd = { .offset = off, .length = length, .dm_handle = dm->handle,
		.pd_handle = pd->handle, .access = access };
	struct vrnic_resp_reg_mr r;
	int ret = vr_call(vr_ctx(pd->context), VRNIC_CMD_REG_DM_MR, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		free(mr);
		VR_FAIL_NULL(ret);
	}
	mr->dm = dm;
	/* zero-based: the MR's address 0 is the DM's byte off */
	return vr_mr_init(mr, pd, NULL, length, &r, access);
}

/* vr_max_dm_size asks the daemon for its device memory once per context
 * (QUERY_DEVICE_EX); a daemon without the command has none. */
int vr_max_dm_size(struct vr_ctx *c, uint64_t *max) {
	uint64_t v = __atomic_load_n(&c->max_dm_size, __ATOMIC_ACQUIRE);
	if (v == 0) {
		struct vrnic_device_attr_ex a;
		int ret = vr_call(c, VRNIC_CMD_QUERY_DEVICE_EX, NULL, 0, NULL, 0, NULL, 0, &a, sizeof a);
		if (ret == EIO || ret == ENOTCONN || ret == EPIPE)
			return ret;
		v = ret ? 1 : a.max_dm_size + 1; /* stored + 1: 0 is "not asked yet" */
		__atomic_store_n(&c->max_dm_size, v, __ATOMIC_RELEASE);
	}
	*max = v - 1;
	return 0;
}
