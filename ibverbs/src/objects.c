/* objects.c - PDs, MRs, completion channels, CQs, QPs and SRQs: command
 * round trips to the daemon (AHs are in ah.c). */
#include "vrnic_ibv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

static uint32_t pow2(uint32_t v) {
	uint32_t n = 1;
	while (n < v)
		n <<= 1;
	return n;
}

/* ---- PD ---- */

VR_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
	if (!ctx)
		VR_FAIL_NULL(EINVAL);
	struct vr_pd *pd = calloc(1, sizeof *pd);
	if (!pd)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_resp_alloc_pd r;
	int ret = vr_call(vr_ctx(ctx), VRNIC_CMD_ALLOC_PD, NULL, 0, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		free(pd);
		VR_FAIL_NULL(ret);
	}
	pd->pd.context = ctx;
	pd->pd.handle = r.pd_handle;
	return &pd->pd;
}

VR_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
	if (!pd)
		return EINVAL;
	if (vr_pd(pd)->protection)
		return vr_dealloc_parent_domain(vr_pd(pd));
	/* A protection domain under a parent domain is in use (EBUSY, as
	 * the kernel's for a PD that objects still use). */
	if (__atomic_load_n(&vr_pd(pd)->refs, __ATOMIC_ACQUIRE))
		return EBUSY;
	int ret = vr_destroy_handle(vr_ctx(pd->context), VRNIC_CMD_DEALLOC_PD, pd->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	free(pd);
	return 0;
}

/* ---- MR ---- */

/* The access bits Linux knows (IB_ACCESS_SUPPORTED less the optional
 * range): LOCAL_WRITE up to HUGETLB, and FLUSH_GLOBAL and FLUSH_PERSISTENT
 * (Linux 6.2). Any other bit fails with EINVAL in ib_check_mr_access. Bits
 * from IBV_ACCESS_OPTIONAL_FIRST up are hints a device may ignore
 * (RELAXED_ORDERING): dropped, as rxe ignores them. FLUSH_PERSISTENT goes
 * to the daemon, which refuses it with EOPNOTSUPP: its memory has no
 * persistence domain (the device does not report FLUSH_PERSISTENT). */
#define ACCESS_KERNEL (0xffu | IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT)
/* The bits the daemon's REG_MR takes (enum vrnic_access): MW_BIND too
 * (ABI 1.4: windows may be bound to the MR). */
#define ACCESS_DAEMON                                                                                              \
	(VRNIC_ACCESS_LOCAL_WRITE | VRNIC_ACCESS_REMOTE_WRITE | VRNIC_ACCESS_REMOTE_READ | VRNIC_ACCESS_REMOTE_ATOMIC | \
	 VRNIC_ACCESS_MW_BIND | VRNIC_ACCESS_FLUSH_GLOBAL | VRNIC_ACCESS_FLUSH_PERSISTENT)
/* Accepted and ignored, as rxe on Linux 6.1 does: HUGETLB (a hint about
 * the pages). Refused with EOPNOTSUPP: ZERO_BASED (vrnic does not address
 * an MR from 0;
 * rxe of 6.1 ignores the bit and goes on addressing by iova, rxe from 6.4
 * refuses it with EOPNOTSUPP as vrnic does). */
#define ACCESS_NOTSUP IBV_ACCESS_ZERO_BASED

/* vr_call_pages sends command op (cmd, with its page-list address at
 * *pbl_pa) and an MR's npages physical page addresses: inline after the
 * command when they fit (VRNIC_INLINE_PAGES), else in a page list in ring
 * memory the daemon copies (REG_MR, REREG_MR). */
int vr_call_pages(struct vr_ctx *c, uint16_t op, void *cmd, size_t cmd_len, uint64_t *pbl_pa, const uint64_t *pages,
		  size_t npages, void *resp, size_t resp_len) {
	if (npages <= VRNIC_INLINE_PAGES)
		return vr_call(c, op, cmd, cmd_len, pages, npages * sizeof *pages, NULL, 0, resp, resp_len);
	struct vr_buf pbl;
	int ret = vr_alloc(c, npages * sizeof *pages, &pbl);
	if (ret)
		return ret;
	memcpy(pbl.p, pages, npages * sizeof *pages);
	*pbl_pa = pbl.pa;
	ret = vr_call(c, op, cmd, cmd_len, NULL, 0, NULL, 0, resp, resp_len);
	vr_free(c, &pbl);
	return ret;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access) {
	if (!pd || !length)
		VR_FAIL_NULL(EINVAL);
	access &= ~(unsigned)IBV_ACCESS_OPTIONAL_RANGE;
	if (access & ~ACCESS_KERNEL)
		VR_FAIL_NULL(EINVAL);
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
		VR_FAIL_NULL(EINVAL);
	if (access & ACCESS_NOTSUP) {
		if (vr_debug())
			fprintf(stderr, "vrnic: REG_MR: access %#x: ZERO_BASED (zero-based addressing) is not supported\n",
				access);
		VR_FAIL_NULL(EOPNOTSUPP);
	}
	if (access & IBV_ACCESS_ON_DEMAND) /* on-demand paging: odp.c */
		return vr_reg_mr_odp(pd, addr, length, iova, access);
	/* The page list maps IOVA pages to the pages of addr: same offset in
	 * the page. */
	if ((iova & (VR_PAGE - 1)) != ((uintptr_t)addr & (VR_PAGE - 1)))
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(pd->context);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(VR_PAGE - 1);
	uintptr_t end = ((uintptr_t)addr + length + VR_PAGE - 1) & ~(uintptr_t)(VR_PAGE - 1);
	if (end <= start || length > VRNIC_MAX_MR_SIZE)
		VR_FAIL_NULL(EINVAL);
	size_t npages = (end - start) / VR_PAGE;
	struct vr_mr *mr = calloc(1, sizeof *mr);
	uint64_t *pages = calloc(npages, sizeof *pages);
	if (!mr || !pages) {
		free(mr);
		free(pages);
		VR_FAIL_NULL(ENOMEM);
	}
	int ret = vr_user_pages(c, start, npages, (access & IBV_ACCESS_LOCAL_WRITE) != 0, pages);
	struct vrnic_cmd_reg_mr cmd = { .iova = iova, .length = length, .pd_handle = pd->handle,
		.access = access & ACCESS_DAEMON, .page_shift = VRNIC_PAGE_SHIFT_4K, .npages = (uint32_t)npages };
	struct vrnic_resp_reg_mr r;
	if (!ret)
		ret = vr_call_pages(c, VRNIC_CMD_REG_MR, &cmd, sizeof cmd, &cmd.pbl_pa, pages, npages, &r, sizeof r);
	free(pages);
	if (ret) {
		free(mr);
		VR_FAIL_NULL(ret);
	}
	return vr_mr_init(mr, pd, addr, length, &r, access);
}

VR_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
	return reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

VR_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
	return reg_mr(pd, addr, length, iova, (unsigned)access);
}

VR_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					  unsigned int access) {
	return reg_mr(pd, addr, length, iova, access);
}

VR_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
	if (!mr)
		return EINVAL;
	int ret = vr_destroy_handle(vr_ctx(mr->context), VRNIC_CMD_DEREG_MR, mr->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	free(mr);
	return 0;
}

/* ---- completion channels ---- */

VR_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
	if (!ctx)
		VR_FAIL_NULL(EINVAL);
	struct vr_channel *ch = calloc(1, sizeof *ch);
	if (!ch)
		VR_FAIL_NULL(ENOMEM);
	/* The control socket's hang-up (data NULL) wakes a waiter when the
	 * daemon goes away. */
	ch->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = { .events = EPOLLRDHUP, .data.ptr = NULL };
	if (ch->ch.fd < 0 || epoll_ctl(ch->ch.fd, EPOLL_CTL_ADD, vr_ctx(ctx)->sock, &ev) < 0) {
		int e = errno;
		if (ch->ch.fd >= 0)
			close(ch->ch.fd);
		free(ch);
		VR_FAIL_NULL(e);
	}
	ch->ch.context = ctx;
	return &ch->ch;
}

VR_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch) {
	if (!ch)
		return EINVAL;
	if (__atomic_load_n(&ch->refcnt, __ATOMIC_SEQ_CST)) {
		errno = EBUSY;
		return EBUSY;
	}
	close(ch->fd);
	free(ch);
	return 0;
}

/* ibv_get_cq_event waits on the channel's epoll fd for a CQ's eventfd,
 * consumes it and returns that CQ. With O_NONBLOCK set on the channel's fd
 * it fails with EAGAIN instead of waiting; once the daemon is gone, with
 * EIO. */
VR_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context) {
	if (!ch || !cq || !cq_context) {
		errno = EINVAL;
		return -1;
	}
	int fl = fcntl(ch->fd, F_GETFL);
	int timeout = fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1;
	for (;;) {
		struct epoll_event ev;
		int n = epoll_wait(ch->fd, &ev, 1, timeout);
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		struct vr_cq *c = ev.data.ptr;
		if (!c) { /* the control socket hung up */
			vr_set_dead(vr_ctx(ch->context));
			errno = EIO;
			return -1;
		}
		uint64_t v;
		if (read(c->event_fd, &v, sizeof v) != sizeof v)
			continue; /* another thread took it */
		*cq = ibv_cq_ex_to_cq(&c->ex);
		*cq_context = c->ex.cq_context;
		return 0;
	}
}

VR_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
	if (!cq)
		return;
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- CQ ---- */

struct ibv_cq *vr_create_cq(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
			    uint64_t wc_flags, struct ibv_pd *domain) {
	if (!ctx || cqe <= 0 || (uint32_t)cqe > VRNIC_MAX_CQE)
		VR_FAIL_NULL(EINVAL);
	if (channel && channel->context != ctx)
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(ctx);
	struct vr_cq *cq = calloc(1, sizeof *cq);
	if (!cq)
		VR_FAIL_NULL(ENOMEM);
	cq->event_fd = -1;
	uint32_t n = pow2((uint32_t)cqe < 2 ? 2 : (uint32_t)cqe);
	/* Completion timestamps: n of them after the CQEs (the ring layout of
	 * VRNIC_CQ_F_TIMESTAMP). */
	bool ts = wc_flags & (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
	int ret = vr_alloc_in(c, domain, VRNIC_RES_TYPE_CQ, n * (sizeof(struct vrnic_cqe) + (ts ? 8 : 0)), &cq->ring);
	if (ret)
		goto fail;
	if (channel) {
		cq->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (cq->event_fd < 0) {
			ret = errno;
			goto fail;
		}
	}
	struct vrnic_cmd_create_cq cmd = { .ring_pa = cq->ring.pa, .cqe_count = n, .flags = ts ? VRNIC_CQ_F_TIMESTAMP : 0 };
	struct vrnic_resp_create_cq r;
	ret = vr_call(c, VRNIC_CMD_CREATE_CQ, &cmd, sizeof cmd, NULL, 0, &cq->event_fd, channel ? 1 : 0, &r, sizeof r);
	if (ret)
		goto fail;
	if (channel) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = cq };
		if (epoll_ctl(channel->fd, EPOLL_CTL_ADD, cq->event_fd, &ev) < 0) {
			ret = errno;
			vr_destroy_handle(c, VRNIC_CMD_DESTROY_CQ, r.cq_handle);
			goto fail;
		}
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	cq->cqes = (struct vrnic_cqe *)cq->ring.p;
	cq->ts = ts ? (uint64_t *)(cq->ring.p + (size_t)n * sizeof(struct vrnic_cqe)) : NULL;
	cq->n = n;
	cq->mask = n - 1;
	cq->rec = (struct vrnic_db_cq *)(c->db + (size_t)r.db_index * VRNIC_DB_RECORD_SIZE);
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	struct ibv_cq_ex *x = &cq->ex;
	x->context = ctx;
	x->channel = channel;
	x->cq_context = cq_context;
	x->handle = r.cq_handle;
	x->cqe = (int)n;
	pthread_mutex_init(&x->mutex, NULL);
	pthread_cond_init(&x->cond, NULL);
	vr_cq_ex_init(cq, wc_flags);
	vr_obj_add(c, VR_OBJ_CQ, r.cq_handle, ibv_cq_ex_to_cq(x));
	return ibv_cq_ex_to_cq(x);
fail:
	if (cq->event_fd >= 0)
		close(cq->event_fd);
	vr_free(c, &cq->ring);
	free(cq);
	VR_FAIL_NULL(ret);
}

VR_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector) {
	/* As the kernel's create_cq: a vector the device does not have. */
	if (!ctx || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	return vr_create_cq(ctx, cqe, cq_context, channel, IBV_WC_STANDARD_FLAGS, NULL);
}

VR_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq) {
	if (!ibcq)
		return EINVAL;
	struct vr_cq *cq = vr_cq(ibcq);
	struct vr_ctx *c = vr_ctx(ibcq->context);
	int ret = vr_destroy_handle(c, VRNIC_CMD_DESTROY_CQ, ibcq->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	vr_obj_del(c, VR_OBJ_CQ, ibcq->handle);
	if (ibcq->channel) {
		epoll_ctl(ibcq->channel->fd, EPOLL_CTL_DEL, cq->event_fd, NULL);
		__atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_SEQ_CST);
	}
	if (cq->event_fd >= 0)
		close(cq->event_fd);
	vr_free(c, &cq->ring);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

/* ---- QP ---- */

static uint32_t ibv_to_vr_type(enum ibv_qp_type t) {
	switch (t) {
	case IBV_QPT_RC:
		return VRNIC_QPT_RC;
	case IBV_QPT_UC:
		return VRNIC_QPT_UC;
	case IBV_QPT_UD:
		return VRNIC_QPT_UD;
	case IBV_QPT_XRC_SEND:
		return VRNIC_QPT_XRC_SEND;
	case IBV_QPT_XRC_RECV:
		return VRNIC_QPT_XRC_RECV;
	default:
		return 0; /* XRC, raw packet, driver QPs */
	}
}

struct ibv_qp *vr_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr_ex *a) {
	if (a && a->qp_type == IBV_QPT_XRC_RECV)
		VR_FAIL_NULL(EINVAL); /* needs an XRC domain: vr_create_xrc_tgt */
	return vr_create_qp_xrcd(pd, a, 0);
}

/* vr_create_qp_xrcd creates a QP; with xrcd (a domain's handle) an XRC
 * target QP of that domain (CREATE_XRC_QP). */
struct ibv_qp *vr_create_qp_xrcd(struct ibv_pd *pd, struct ibv_qp_init_attr_ex *a, uint32_t xrcd) {
	bool xrc = a && (a->qp_type == IBV_QPT_XRC_SEND || a->qp_type == IBV_QPT_XRC_RECV);
	if (!pd || !a || !a->send_cq || (!a->recv_cq && !a->srq && !xrc))
		VR_FAIL_NULL(EINVAL);
	if (!ibv_to_vr_type(a->qp_type))
		VR_FAIL_NULL(EOPNOTSUPP);
	if (xrc && a->srq)
		VR_FAIL_NULL(EINVAL);
	struct ibv_qp_cap *cap = &a->cap;
	if (cap->max_send_wr > VRNIC_MAX_QP_WR || cap->max_send_sge > VRNIC_MAX_SGE ||
	    cap->max_inline_data > VRNIC_MAX_INLINE)
		VR_FAIL_NULL(EINVAL);
	/* With an SRQ the receive capabilities are not the QP's: ignored, as
	 * rxe_qp_chk_cap ignores them. */
	if (!a->srq && (cap->max_recv_wr > VRNIC_MAX_QP_WR || cap->max_recv_sge > VRNIC_MAX_SGE))
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(pd->context);
	struct vr_qp *qp = calloc(1, sizeof *qp);
	if (!qp)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_qp_cap vc = {
		.max_send_wr = pow2(cap->max_send_wr ? cap->max_send_wr : 1),
		.max_send_sge = cap->max_send_sge ? cap->max_send_sge : 1,
		.max_inline_data = cap->max_inline_data,
	};
	qp->has_rq = a->srq == NULL && !xrc;
	if (qp->has_rq) {
		vc.max_recv_wr = pow2(cap->max_recv_wr ? cap->max_recv_wr : 1);
		vc.max_recv_sge = cap->max_recv_sge ? cap->max_recv_sge : 1;
	}
	uint32_t sq_stride = VRNIC_SQ_WQE_BLOCKS(vc.max_send_sge, vc.max_inline_data) * VRNIC_WQE_BLOCK;
	uint32_t rq_stride = VRNIC_RQ_WQE_SIZE(vc.max_recv_sge);
	struct vr_buf sq = { 0 }, rq = { 0 };
	int ret = vr_alloc_in(c, pd, VRNIC_RES_TYPE_SQ, (size_t)vc.max_send_wr * sq_stride, &sq);
	if (!ret && qp->has_rq)
		ret = vr_alloc_in(c, pd, VRNIC_RES_TYPE_RQ, (size_t)vc.max_recv_wr * rq_stride, &rq);
	if (ret)
		goto fail;
	struct vrnic_cmd_create_qp cmd = {
		.sq_pa = sq.pa,
		.rq_pa = qp->has_rq ? rq.pa : 0,
		.qp_type = ibv_to_vr_type(a->qp_type),
		.pd_handle = pd->handle,
		.send_cq = a->send_cq->handle,
		.recv_cq = (a->recv_cq ? a->recv_cq : a->send_cq)->handle,
		.srq_handle = a->srq ? vr_srq(a->srq)->handle : VRNIC_NO_SRQ,
		.sq_sig_all = a->sq_sig_all ? 1 : 0,
		.cap = vc,
	};
	if (xrc)
		cmd.recv_cq = cmd.send_cq;
	struct vrnic_resp_create_qp r;
	if (xrcd) {
		struct vrnic_cmd_create_xrc_qp xc = { .qp = cmd, .xrcd_handle = xrcd };
		ret = vr_call(c, VRNIC_CMD_CREATE_XRC_QP, &xc, sizeof xc, NULL, 0, NULL, 0, &r, sizeof r);
	} else {
		ret = vr_call(c, VRNIC_CMD_CREATE_QP, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	}
	if (ret)
		goto fail;
	qp->rec = (struct vrnic_db_qp *)(c->db + (size_t)r.db_index * VRNIC_DB_RECORD_SIZE);
	vr_wq_init(&qp->sq, sq, r.cap.max_send_wr, r.sq_wqe_blocks * VRNIC_WQE_BLOCK, &qp->rec->sq_pi,
		   &qp->rec->sq_ci, r.cap.max_send_sge);
	if (qp->has_rq)
		vr_wq_init(&qp->rq, rq, r.cap.max_recv_wr, r.rq_wqe_size, &qp->rec->rq_pi, &qp->rec->rq_ci,
			   r.cap.max_recv_sge);
	qp->max_inline = r.cap.max_inline_data;
	qp->sq_sig_all = cmd.sq_sig_all;
	qp->cap = (struct ibv_qp_cap){ .max_send_wr = r.cap.max_send_wr, .max_recv_wr = r.cap.max_recv_wr,
		.max_send_sge = r.cap.max_send_sge, .max_recv_sge = r.cap.max_recv_sge,
		.max_inline_data = r.cap.max_inline_data };
	*cap = qp->cap;
	struct ibv_qp *q = &qp->ex.qp_base;
	q->context = pd->context;
	q->qp_context = a->qp_context;
	q->pd = pd;
	q->send_cq = a->send_cq;
	q->recv_cq = a->recv_cq ? a->recv_cq : a->send_cq;
	if (xrc) {
		/* As libibverbs shows them: an initiator has no receive CQ, a
		 * target neither PD nor CQs. */
		q->recv_cq = NULL;
		if (xrcd)
			q->pd = NULL, q->send_cq = NULL;
	}
	q->srq = a->srq;
	q->handle = r.qpn;
	q->qp_num = r.qpn;
	q->state = IBV_QPS_RESET;
	q->qp_type = a->qp_type;
	pthread_mutex_init(&q->mutex, NULL);
	pthread_cond_init(&q->cond, NULL);
	vr_qp_ex_init(qp, (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ? a->send_ops_flags : 0);
	vr_obj_add(c, VR_OBJ_QP, r.qpn, q);
	return q;
fail:
	vr_free(c, &sq);
	vr_free(c, &rq);
	free(qp);
	VR_FAIL_NULL(ret);
}

VR_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
	if (!attr)
		VR_FAIL_NULL(EINVAL);
	struct ibv_qp_init_attr_ex a = { .qp_context = attr->qp_context, .send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq, .srq = attr->srq, .cap = attr->cap, .qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all, .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd };
	struct ibv_qp *qp = vr_create_qp(pd, &a);
	if (qp)
		attr->cap = a.cap;
	return qp;
}

VR_EXPORT int ibv_destroy_qp(struct ibv_qp *q) {
	if (!q)
		return EINVAL;
	struct vr_qp *qp = vr_qp(q);
	struct vr_ctx *c = vr_ctx(q->context);
	int ret = vr_destroy_handle(c, VRNIC_CMD_DESTROY_QP, q->qp_num);
	if (ret) {
		errno = ret;
		return ret;
	}
	vr_obj_del(c, VR_OBJ_QP, q->qp_num);
	vr_free(c, &qp->sq.ring);
	vr_free(c, &qp->rq.ring);
	free(qp);
	return 0;
}

/* The ABI's attribute mask bits are IBV_QP_* bits 0..20. */
#define QP_MASK_KNOWN ((1u << 21) - 1)

static void ah_from_vr(const struct vrnic_ah_attr *v, struct ibv_ah_attr *a) {
	memset(a, 0, sizeof *a);
	memcpy(a->grh.dgid.raw, v->dgid, 16);
	a->grh.flow_label = v->flow_label;
	a->grh.sgid_index = v->sgid_index;
	a->grh.hop_limit = v->hop_limit;
	a->grh.traffic_class = v->traffic_class;
	a->sl = v->sl;
	a->port_num = v->port_num;
	a->is_global = 1;
}

VR_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
	if (!qp || !attr) {
		errno = EINVAL;
		return EINVAL;
	}
	if ((unsigned)mask & ~QP_MASK_KNOWN) {
		errno = EOPNOTSUPP;
		return EOPNOTSUPP;
	}
	/* RoCE has no LIDs: an address vector needs a GRH. */
	if ((mask & IBV_QP_AV) && !attr->ah_attr.is_global) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vrnic_cmd_modify_qp m = { .qpn = qp->qp_num, .attr_mask = (uint32_t)mask };
	struct vrnic_qp_attr *v = &m.attr;
	v->qp_state = attr->qp_state;
	v->cur_qp_state = attr->cur_qp_state;
	v->path_mtu = attr->path_mtu;
	v->qkey = attr->qkey;
	v->rq_psn = attr->rq_psn & 0xffffff;
	v->sq_psn = attr->sq_psn & 0xffffff;
	v->dest_qp_num = attr->dest_qp_num & 0xffffff;
	v->qp_access_flags = (uint32_t)attr->qp_access_flags &
			     (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
			      IBV_ACCESS_FLUSH_GLOBAL | IBV_ACCESS_FLUSH_PERSISTENT);
	v->pkey_index = attr->pkey_index;
	v->max_rd_atomic = attr->max_rd_atomic;
	v->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	v->min_rnr_timer = attr->min_rnr_timer;
	v->timeout = attr->timeout;
	v->retry_cnt = attr->retry_cnt;
	v->rnr_retry = attr->rnr_retry;
	v->port_num = attr->port_num;
	v->en_sqd_async_notify = attr->en_sqd_async_notify;
	v->sq_draining = attr->sq_draining;
	if (mask & IBV_QP_AV)
		vr_ah_to_vr(&attr->ah_attr, &v->ah_attr);
	if (mask & IBV_QP_CAP)
		v->cap = (struct vrnic_qp_cap){ .max_send_wr = attr->cap.max_send_wr,
			.max_recv_wr = attr->cap.max_recv_wr, .max_send_sge = attr->cap.max_send_sge,
			.max_recv_sge = attr->cap.max_recv_sge, .max_inline_data = attr->cap.max_inline_data };
	/* The daemon checks both path migration attributes against the
	 * transition table as the kernel does (EINVAL where not allowed); it
	 * keeps no alternate path, so ALT_PATH, and a migration state other
	 * than MIGRATED, then fail with EOPNOTSUPP. */
	if (mask & IBV_QP_PATH_MIG_STATE)
		v->path_mig_state = (unsigned)attr->path_mig_state > 0xff ? 0xff : (uint8_t)attr->path_mig_state;
	/* ECE options stored by ibv_set_ece, or VRNIC_ECE's (misc.c). */
	uint32_t ece = 0;
	bool with_ece = vr_modify_ece(qp, attr, mask, &ece);
	if (with_ece) {
		m.attr_mask |= VRNIC_QP_ECE;
		m.ece_options = ece;
	}
	int ret = vr_call(vr_ctx(qp->context), VRNIC_CMD_MODIFY_QP, &m, sizeof m, NULL, 0, NULL, 0, NULL, 0);
	if (ret) {
		errno = ret;
		return ret;
	}
	vr_modified_ece(qp, attr, mask, with_ece, ece);
	if (mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	/* A QP back in RESET leaves nothing in its CQs, as with mlx5 (its
	 * provider cleans the CQs of the QP's CQEs): a program that restarts
	 * a QP after an error does not poll the old flush completions. */
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RESET) {
		if (qp->recv_cq)
			vr_cq_clean(vr_cq(qp->recv_cq), qp->qp_num);
		if (qp->send_cq && qp->send_cq != qp->recv_cq)
			vr_cq_clean(vr_cq(qp->send_cq), qp->qp_num);
	}
	return 0;
}

VR_EXPORT int ibv_query_qp(struct ibv_qp *q, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init) {
	(void)mask;
	if (!q || !attr || !init) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vr_qp *qp = vr_qp(q);
	struct vrnic_cmd_handle h = { .handle = q->qp_num };
	struct vrnic_resp_query_qp r;
	int ret = vr_call(vr_ctx(q->context), VRNIC_CMD_QUERY_QP, &h, sizeof h, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		errno = ret;
		return ret;
	}
	const struct vrnic_qp_attr *v = &r.attr;
	memset(attr, 0, sizeof *attr);
	attr->qp_state = (enum ibv_qp_state)v->qp_state;
	attr->cur_qp_state = (enum ibv_qp_state)v->qp_state;
	attr->path_mtu = (enum ibv_mtu)v->path_mtu;
	attr->path_mig_state = IBV_MIG_MIGRATED;
	attr->qkey = v->qkey;
	attr->rq_psn = v->rq_psn;
	attr->sq_psn = v->sq_psn;
	attr->dest_qp_num = v->dest_qp_num;
	attr->qp_access_flags = (unsigned)v->qp_access_flags;
	attr->cap = qp->cap;
	if (q->qp_type != IBV_QPT_UD) /* a UD QP has no address vector: each send names one */
		ah_from_vr(&v->ah_attr, &attr->ah_attr);
	attr->pkey_index = v->pkey_index;
	attr->en_sqd_async_notify = v->en_sqd_async_notify;
	attr->sq_draining = v->sq_draining;
	attr->max_rd_atomic = v->max_rd_atomic;
	attr->max_dest_rd_atomic = v->max_dest_rd_atomic;
	attr->min_rnr_timer = v->min_rnr_timer;
	attr->port_num = v->port_num;
	attr->timeout = v->timeout;
	attr->retry_cnt = v->retry_cnt;
	attr->rnr_retry = v->rnr_retry;
	memset(init, 0, sizeof *init);
	init->qp_context = q->qp_context;
	init->send_cq = q->send_cq;
	init->recv_cq = q->recv_cq;
	init->srq = q->srq;
	init->cap = qp->cap;
	init->qp_type = q->qp_type;
	init->sq_sig_all = (int)qp->sq_sig_all;
	q->state = attr->qp_state;
	return 0;
}

/* ---- SRQ ---- */

static struct ibv_srq *create_srq(struct ibv_pd *pd, void *srq_context, struct ibv_srq_attr *a) {
	return vr_create_srq_xrc(pd, srq_context, a, 0, 0);
}

/* vr_create_srq_xrc creates an SRQ; with xrcd (a domain's handle) an XRC
 * SRQ of that domain completing in the CQ of handle cq. */
struct ibv_srq *vr_create_srq_xrc(struct ibv_pd *pd, void *srq_context, struct ibv_srq_attr *a, uint32_t xrcd,
				  uint32_t cq) {
	/* srq_limit is not checked: rxe_srq_chk_init does not, and arms the
	 * SRQ with it; so does the daemon. */
	if (!pd || !a || a->max_wr > VRNIC_MAX_SRQ_WR || a->max_sge > VRNIC_MAX_SGE)
		VR_FAIL_NULL(EINVAL);
	struct vr_ctx *c = vr_ctx(pd->context);
	struct vr_srq *s = calloc(1, sizeof *s);
	if (!s)
		VR_FAIL_NULL(ENOMEM);
	uint32_t slots = pow2(a->max_wr ? a->max_wr : 1), sge = a->max_sge ? a->max_sge : 1;
	struct vr_buf ring;
	int ret = vr_alloc_in(c, pd, VRNIC_RES_TYPE_SRQ, (size_t)slots * VRNIC_RQ_WQE_SIZE(sge), &ring);
	if (ret) {
		free(s);
		VR_FAIL_NULL(ret);
	}
	struct vrnic_cmd_create_srq cmd = { .ring_pa = ring.pa, .pd_handle = pd->handle, .max_wr = slots,
		.max_sge = sge, .srq_limit = a->srq_limit };
	struct vrnic_resp_create_srq r;
	if (xrcd) {
		struct vrnic_cmd_create_xrc_srq xc = { .srq = cmd, .xrcd_handle = xrcd, .cq_handle = cq };
		struct vrnic_resp_create_xrc_srq xr;
		ret = vr_call(c, VRNIC_CMD_CREATE_XRC_SRQ, &xc, sizeof xc, NULL, 0, NULL, 0, &xr, sizeof xr);
		r = xr.srq;
		s->srq_num = xr.srq_num;
	} else {
		ret = vr_call(c, VRNIC_CMD_CREATE_SRQ, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	}
	if (ret) {
		vr_free(c, &ring);
		free(s);
		VR_FAIL_NULL(ret);
	}
	s->rec = (struct vrnic_db_srq *)(c->db + (size_t)r.db_index * VRNIC_DB_RECORD_SIZE);
	vr_wq_init(&s->wq, ring, slots, r.rq_wqe_size, &s->rec->srq_pi, &s->rec->srq_ci, sge);
	s->handle = r.srq_handle;
	s->limit = a->srq_limit;
	a->max_wr = slots;
	a->max_sge = sge;
	s->srq.context = pd->context;
	s->srq.srq_context = srq_context;
	s->srq.pd = pd;
	s->srq.handle = r.srq_handle;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	vr_obj_add(vr_ctx(pd->context), VR_OBJ_SRQ, r.srq_handle, &s->srq);
	return &s->srq;
}

VR_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *init) {
	if (!init)
		VR_FAIL_NULL(EINVAL);
	return create_srq(pd, init->srq_context, &init->attr);
}

struct ibv_srq *vr_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a) {
	if (!a || !(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
		VR_FAIL_NULL(EINVAL);
	if ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type == IBV_SRQT_XRC)
		return vr_create_xrc_srq(ctx, a);
	if ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type != IBV_SRQT_BASIC)
		VR_FAIL_NULL(EOPNOTSUPP);
	return create_srq(a->pd, a->srq_context, &a->attr);
}

VR_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask) {
	if (!srq || !attr) {
		errno = EINVAL;
		return EINVAL;
	}
	if (mask & ~IBV_SRQ_LIMIT) {
		/* Resizing (IBV_SRQ_MAX_WR) is not supported: EINVAL, as from
		 * drivers without it (mlx5). rxe resizes. */
		if (vr_debug())
			fprintf(stderr, "vrnic: MODIFY_SRQ: mask %#x: only IBV_SRQ_LIMIT is supported (no resizing)\n",
				(unsigned)mask);
		errno = EINVAL;
		return EINVAL;
	}
	if (!(mask & IBV_SRQ_LIMIT))
		return 0;
	struct vrnic_cmd_modify_srq m = { .srq_handle = vr_srq(srq)->handle, .srq_limit = attr->srq_limit };
	int ret = vr_call(vr_ctx(srq->context), VRNIC_CMD_MODIFY_SRQ, &m, sizeof m, NULL, 0, NULL, 0, NULL, 0);
	if (ret) {
		errno = ret;
		return ret;
	}
	vr_srq(srq)->limit = attr->srq_limit;
	return 0;
}

VR_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr) {
	if (!srq || !attr) {
		errno = EINVAL;
		return EINVAL;
	}
	struct vrnic_cmd_handle h = { .handle = vr_srq(srq)->handle };
	struct vrnic_resp_query_srq r;
	int ret = vr_call(vr_ctx(srq->context), VRNIC_CMD_QUERY_SRQ, &h, sizeof h, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		errno = ret;
		return ret;
	}
	attr->max_wr = r.max_wr;
	attr->max_sge = r.max_sge;
	attr->srq_limit = r.srq_limit;
	return 0;
}

VR_EXPORT int ibv_destroy_srq(struct ibv_srq *srq) {
	if (!srq)
		return EINVAL;
	struct vr_srq *s = vr_srq(srq);
	struct vr_ctx *c = vr_ctx(srq->context);
	int ret = vr_destroy_handle(c, VRNIC_CMD_DESTROY_SRQ, s->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	vr_obj_del(c, VR_OBJ_SRQ, s->handle);
	vr_free(c, &s->wq.ring);
	free(s);
	return 0;
}
