/* domain.c - thread domains and parent domains (ibv_alloc_td,
 * ibv_alloc_parent_domain), and ring memory from a parent domain's
 * allocators.
 *
 * A parent domain stands for its protection domain wherever a PD is
 * taken: it carries the same handle, so the daemon sees the protection
 * domain. What it adds is the allocators: the rings of the QPs, SRQs and
 * CQs created on it are memory its alloc function returns (unless that
 * says IBV_ALLOCATOR_USE_DEFAULT), made reachable by the daemon as
 * registered memory is (mem.c), and handed back to its free function when
 * the object is destroyed. A thread domain promises that one thread uses
 * the objects; the library keeps its locks anyway (they are uncontended
 * then), as the promise is the application's to break. */
#include "vrnic_ibv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static struct ibv_td *alloc_td(struct ibv_context *ctx, struct ibv_td_init_attr *a) {
	if (!ctx || !a || a->comp_mask)
		VR_FAIL_NULL(EINVAL);
	struct vr_td *td = calloc(1, sizeof *td);
	if (!td)
		VR_FAIL_NULL(ENOMEM);
	td->td.context = ctx;
	return &td->td;
}

static int dealloc_td(struct ibv_td *ibtd) {
	struct vr_td *td = (struct vr_td *)ibtd;
	if (__atomic_load_n(&td->refs, __ATOMIC_ACQUIRE))
		return EBUSY;
	free(td);
	return 0;
}

static struct ibv_pd *alloc_parent_domain(struct ibv_context *ctx, struct ibv_parent_domain_init_attr *a) {
	if (!ctx || !a || !a->pd || a->pd->context != ctx ||
	    (a->comp_mask & ~(uint32_t)(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)))
		VR_FAIL_NULL(EINVAL);
	struct vr_pd *prot = vr_pd(a->pd);
	if (prot->protection || (a->td && a->td->context != ctx))
		VR_FAIL_NULL(EINVAL);
	if ((a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (!a->alloc || !a->free))
		VR_FAIL_NULL(EINVAL);
	struct vr_pd *pd = calloc(1, sizeof *pd);
	if (!pd)
		VR_FAIL_NULL(ENOMEM);
	pd->pd.context = ctx;
	pd->pd.handle = a->pd->handle;
	pd->protection = prot;
	if (a->td) {
		pd->td = (struct vr_td *)a->td;
		__atomic_add_fetch(&pd->td->refs, 1, __ATOMIC_ACQ_REL);
	}
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		pd->alloc = a->alloc;
		pd->free = a->free;
	}
	if (a->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		pd->pd_context = a->pd_context;
	__atomic_add_fetch(&prot->refs, 1, __ATOMIC_ACQ_REL);
	return &pd->pd;
}

int vr_dealloc_parent_domain(struct vr_pd *pd) {
	if (__atomic_load_n(&pd->refs, __ATOMIC_ACQUIRE))
		return EBUSY;
	__atomic_sub_fetch(&pd->protection->refs, 1, __ATOMIC_ACQ_REL);
	if (pd->td)
		__atomic_sub_fetch(&pd->td->refs, 1, __ATOMIC_ACQ_REL);
	free(pd);
	return 0;
}

void vr_domain_ops(struct verbs_context *v) {
	v->alloc_td = alloc_td;
	v->dealloc_td = dealloc_td;
	v->alloc_parent_domain = alloc_parent_domain;
}

/* vr_alloc_in allocates len bytes of ring memory for an object created on
 * pd (NULL or a plain PD: the context's chunks). With a parent domain's
 * allocator the memory is what it returns: zeroed, backed for the daemon,
 * and one contiguous run of the daemon's address space (a ring has one
 * address; else the library's own memory, see below). */
int vr_alloc_in(struct vr_ctx *c, struct ibv_pd *ibpd, uint64_t type, size_t len, struct vr_buf *b) {
	struct vr_pd *pd = ibpd ? vr_pd(ibpd) : NULL;
	memset(b, 0, sizeof *b);
	if (!pd || !pd->protection || !pd->alloc)
		return vr_alloc(c, len, b);
	size_t pages = (len + VR_PAGE - 1) / VR_PAGE;
	if (!pages)
		pages = 1;
	void *p = pd->alloc(ibpd, pd->pd_context, pages * VR_PAGE, VR_PAGE, type);
	if (p == IBV_ALLOCATOR_USE_DEFAULT)
		return vr_alloc(c, len, b);
	if (!p)
		return ENOMEM;
	int ret = 0;
	uint64_t *pa = NULL;
	if ((uintptr_t)p % VR_PAGE) {
		ret = EINVAL;
		goto fail;
	}
	if (!(pa = malloc(pages * sizeof *pa))) {
		ret = ENOMEM;
		goto fail;
	}
	memset(p, 0, pages * VR_PAGE);
	if ((ret = vr_user_pages(c, (uintptr_t)p, pages, true, pa)))
		goto fail;
	/* A ring is one run of the daemon's address space. Pages the
	 * program registered before (in parts) lie in several runs: that
	 * memory goes back to the free function and the ring takes the
	 * library's own, as with IBV_ALLOCATOR_USE_DEFAULT. */
	for (size_t i = 1; i < pages; i++)
		if (pa[i] != pa[0] + i * VR_PAGE) {
			free(pa);
			pd->free(ibpd, pd->pd_context, p, type);
			return vr_alloc(c, len, b);
		}
	b->p = p;
	b->pa = pa[0];
	b->len = pages * VR_PAGE;
	b->domain = pd;
	b->res_type = type;
	__atomic_add_fetch(&pd->refs, 1, __ATOMIC_ACQ_REL);
	free(pa);
	return 0;
fail:
	free(pa);
	pd->free(ibpd, pd->pd_context, p, type);
	return ret;
}

/* vr_free_domain_buf returns b's memory to its parent domain. */
void vr_free_domain_buf(struct vr_buf *b) {
	struct vr_pd *pd = b->domain;
	pd->free(&pd->pd, pd->pd_context, b->p, b->res_type);
	__atomic_sub_fetch(&pd->refs, 1, __ATOMIC_ACQ_REL);
	b->domain = NULL;
	b->p = NULL;
}
