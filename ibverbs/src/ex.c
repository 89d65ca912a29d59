/* ex.c - the extended verbs: ibv_qp_ex (the ibv_wr_* work request
 * builder), ibv_cq_ex (start/next/end_poll and ibv_wc_read_*) and
 * ibv_query_device_ex. They write and read the same rings as post.c. */
#include "vrnic_ibv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#define SEND_OPS_SUPPORTED \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND | \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV | \
	 IBV_QP_EX_WITH_ATOMIC_WRITE | VR_QP_EX_WITH_FLUSH | IBV_QP_EX_WITH_BIND_MW)

static inline struct vr_qp *qpx(struct ibv_qp_ex *q) { return (struct vr_qp *)q; }

static void wr_start(struct ibv_qp_ex *q) {
	struct vr_qp *qp = qpx(q);
	pthread_spin_lock(&qp->sq.lock);
	qp->wr_pi = qp->sq.pi;
	qp->wr_cur = NULL;
	qp->wr_err = vr_sq_state_check(&q->qp_base);
}

/* wr_new starts the next WQE of the batch: its control segment from the
 * application's wr_id and wr_flags. NULL after an error. */
static struct vrnic_send_wqe *wr_new(struct ibv_qp_ex *q, uint8_t opcode) {
	struct vr_qp *qp = qpx(q);
	qp->wr_cur = NULL;
	if (qp->wr_err)
		return NULL;
	if (vr_wq_full(&qp->sq, qp->wr_pi)) {
		qp->wr_err = ENOMEM;
		return NULL;
	}
	if (!vr_opcode_ok(q->qp_base.qp_type, opcode)) {
		qp->wr_err = EINVAL;
		return NULL;
	}
	uint8_t *slot = qp->sq.ring.p + (size_t)(qp->wr_pi & qp->sq.mask) * qp->sq.stride;
	struct vrnic_send_wqe *w = (struct vrnic_send_wqe *)slot;
	memset(w, 0, sizeof *w);
	w->wr_id = q->wr_id;
	w->opcode = opcode;
	w->flags = (uint8_t)(q->wr_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED));
	qp->wr_cur = slot;
	qp->wr_pi++;
	return w;
}

static void wr_rdma(struct ibv_qp_ex *q, uint8_t op, uint32_t rkey, uint64_t addr) {
	struct vrnic_send_wqe *w = wr_new(q, op);
	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
	}
}

static void wr_rdma_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr) {
	wr_rdma(q, VRNIC_WR_RDMA_WRITE, rkey, addr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, __be32 imm) {
	wr_rdma(q, VRNIC_WR_RDMA_WRITE_WITH_IMM, rkey, addr);
	if (qpx(q)->wr_cur)
		((struct vrnic_send_wqe *)qpx(q)->wr_cur)->imm_data = ntohl(imm);
}

static void wr_rdma_read(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr) {
	wr_rdma(q, VRNIC_WR_RDMA_READ, rkey, addr);
}

static void wr_atomic(struct ibv_qp_ex *q, uint8_t op, uint32_t rkey, uint64_t addr, uint64_t cmp_add,
		      uint64_t swap) {
	struct vrnic_send_wqe *w = wr_new(q, op);
	if (w) {
		w->rkey = rkey;
		w->remote_addr = addr;
		w->compare_add = cmp_add;
		w->swap = swap;
	}
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
	wr_atomic(q, VRNIC_WR_ATOMIC_CMP_AND_SWP, rkey, addr, compare, swap);
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, uint64_t add) {
	wr_atomic(q, VRNIC_WR_ATOMIC_FETCH_AND_ADD, rkey, addr, add, 0);
}

/* wr_atomic_write: ATOMIC WRITE (IBTA 1.5 Memory Placement Extensions):
 * the 8 bytes at atomic_wr, copied now, are stored at remote_addr (8-byte
 * aligned) at once. No SGE follows. */
static void wr_atomic_write(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, const void *atomic_wr) {
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_ATOMIC_WRITE);
	if (!w)
		return;
	if (!atomic_wr) {
		qpx(q)->wr_err = EINVAL;
		return;
	}
	w->rkey = rkey;
	w->remote_addr = addr;
	memcpy(&w->compare_add, atomic_wr, 8);
}

/* wr_flush: FLUSH (IBTA 1.5 Memory Placement Extensions) of len bytes at
 * remote_addr (level IBV_FLUSH_RANGE) or of the whole MR of rkey
 * (IBV_FLUSH_MR), to the placement types in type (IBV_FLUSH_GLOBAL,
 * IBV_FLUSH_PERSISTENT; at least one). The FETH bits go in the WQE's swap
 * field, the length in compare_add. */
static void wr_flush(struct ibv_qp_ex *q, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level) {
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_FLUSH);
	if (!w)
		return;
	if (!type || (type & ~(VRNIC_FLUSH_GLOBAL | VRNIC_FLUSH_PERSISTENT)) || level > VRNIC_FLUSH_MR ||
	    len > VRNIC_MAX_MSG_BYTES) {
		qpx(q)->wr_err = EINVAL;
		return;
	}
	w->rkey = rkey;
	w->remote_addr = addr;
	w->compare_add = len;
	w->swap = (uint64_t)type | (uint64_t)level << 4;
}

static void wr_send(struct ibv_qp_ex *q) { wr_new(q, VRNIC_WR_SEND); }

static void wr_send_imm(struct ibv_qp_ex *q, __be32 imm) {
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_SEND_WITH_IMM);
	if (w)
		w->imm_data = ntohl(imm);
}

static void wr_send_inv(struct ibv_qp_ex *q, uint32_t rkey) {
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_SEND_WITH_INV);
	if (w)
		w->invalidate_rkey = rkey;
}

static void wr_local_inv(struct ibv_qp_ex *q, uint32_t rkey) {
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_LOCAL_INV);
	if (w)
		w->invalidate_rkey = rkey;
}

/* wr_bind_mw: a BIND_MW WQE (type 1 or 2 window; the daemon checks). */
static void wr_bind_mw(struct ibv_qp_ex *q, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *info) {
	if (!mw || !info) {
		qpx(q)->wr_err = EINVAL;
		return;
	}
	struct vrnic_send_wqe *w = wr_new(q, VRNIC_WR_BIND_MW);
	if (w)
		vr_bind_wqe(w, mw, rkey, info);
}

static void wr_set_sge_list(struct ibv_qp_ex *q, size_t n, const struct ibv_sge *sg) {
	struct vr_qp *qp = qpx(q);
	if (!qp->wr_cur)
		return;
	if (n > qp->sq.max_sge) {
		qp->wr_err = EINVAL;
		return;
	}
	struct vrnic_sge *d = (struct vrnic_sge *)(qp->wr_cur + VRNIC_WQE_BLOCK);
	for (size_t i = 0; i < n; i++)
		d[i] = (struct vrnic_sge){ .addr = sg[i].addr, .length = sg[i].length, .lkey = sg[i].lkey };
	((struct vrnic_send_wqe *)qp->wr_cur)->num_sge = (uint8_t)n;
}

static void wr_set_sge(struct ibv_qp_ex *q, uint32_t lkey, uint64_t addr, uint32_t length) {
	struct ibv_sge sg = { .addr = addr, .length = length, .lkey = lkey };
	wr_set_sge_list(q, 1, &sg);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *q, size_t n, const struct ibv_data_buf *bufs) {
	struct vr_qp *qp = qpx(q);
	if (!qp->wr_cur)
		return;
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		if (bufs[i].length > qp->max_inline - total) {
			qp->wr_err = EINVAL;
			return;
		}
		memcpy(qp->wr_cur + VRNIC_WQE_BLOCK + total, bufs[i].addr, bufs[i].length);
		total += bufs[i].length;
	}
	struct vrnic_send_wqe *w = (struct vrnic_send_wqe *)qp->wr_cur;
	w->flags |= VRNIC_SEND_INLINE;
	w->inline_len = (uint32_t)total;
	w->num_sge = 0;
}

static void wr_set_inline_data(struct ibv_qp_ex *q, void *addr, size_t length) {
	struct ibv_data_buf b = { .addr = addr, .length = length };
	wr_set_inline_data_list(q, 1, &b);
}

/* wr_set_ud_addr sets the UD segment of the WQE being built (UD QPs). */
static void wr_set_ud_addr(struct ibv_qp_ex *q, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey) {
	struct vr_qp *qp = qpx(q);
	if (!qp->wr_cur)
		return;
	if (q->qp_base.qp_type != IBV_QPT_UD || !ah) {
		qp->wr_err = EINVAL;
		return;
	}
	struct vrnic_send_wqe *w = (struct vrnic_send_wqe *)qp->wr_cur;
	w->ah_handle = ah->handle;
	w->remote_qpn = qpn & 0xffffff;
	w->remote_qkey = qkey;
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *q, uint32_t srqn) {
	struct vr_qp *qp = qpx(q);
	if (q->qp_base.qp_type != IBV_QPT_XRC_SEND || !qp->wr_cur) {
		qp->wr_err = EINVAL;
		return;
	}
	((struct vrnic_send_wqe *)qp->wr_cur)->remote_qpn = srqn & 0xffffff;
}

static int wr_complete(struct ibv_qp_ex *q) {
	struct vr_qp *qp = qpx(q);
	int err = qp->wr_err;
	if (!err && qp->wr_pi != qp->sq.pi) {
		qp->sq.pi = qp->wr_pi;
		__atomic_store_n(qp->sq.pi_word, qp->wr_pi, __ATOMIC_SEQ_CST);
		vr_db_mark(vr_ctx(q->qp_base.context), qp->sq.pi_word);
		vr_kick(vr_ctx(q->qp_base.context));
	}
	qp->wr_cur = NULL;
	pthread_spin_unlock(&qp->sq.lock);
	if (err)
		errno = err;
	return err;
}

static void wr_abort(struct ibv_qp_ex *q) {
	struct vr_qp *qp = qpx(q);
	qp->wr_cur = NULL;
	pthread_spin_unlock(&qp->sq.lock);
}

void vr_qp_ex_init(struct vr_qp *qp, uint64_t send_ops_flags) {
	struct ibv_qp_ex *x = &qp->ex;
	(void)send_ops_flags;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_local_inv = wr_local_inv;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_atomic_write = wr_atomic_write;
	qp->wr_flush = wr_flush;
}

/* send_ops_supported is what a QP of type t may ask for in send_ops_flags
 * (as rdma-core's providers, an operation the type does not have is
 * EOPNOTSUPP). */
static uint64_t send_ops_supported(enum ibv_qp_type t) {
	switch (t) {
	case IBV_QPT_UD:
		return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	case IBV_QPT_UC:
		return IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
		       IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	case IBV_QPT_XRC_RECV:
		return 0;
	default:
		return SEND_OPS_SUPPORTED;
	}
}

struct ibv_qp *vr_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a) {
	if (a && a->qp_type == IBV_QPT_XRC_RECV)
		return vr_create_xrc_tgt(ctx, a);
	if (!a || !(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx)
		VR_FAIL_NULL(EINVAL);
	/* As rdma-core's rxe provider (check_qp_init_attr): CREATE_FLAGS may
	 * be in the mask, with no flag set. */
	if (a->comp_mask &
	    ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		VR_FAIL_NULL(EOPNOTSUPP);
	if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && a->create_flags)
		VR_FAIL_NULL(EOPNOTSUPP);
	if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~send_ops_supported(a->qp_type)))
		VR_FAIL_NULL(EOPNOTSUPP);
	return vr_create_qp(a->pd, a);
}

/* ---- ibv_cq_ex ---- */

#define WC_FLAGS_SUPPORTED \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP | \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS |                       \
	 IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK)

static inline struct vr_cq *cqx(struct ibv_cq_ex *c) { return (struct vr_cq *)c; }

/* take copies the CQE at the consumer index into cur and consumes it,
 * if it is ready; end_poll publishes the consumer index. */
static int take(struct vr_cq *cq) {
	struct vrnic_cqe *e = &cq->cqes[cq->ci & cq->mask];
	uint8_t owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
	if ((owner & 1) != 1 - ((cq->ci / cq->n) & 1))
		return ENOENT;
	cq->cur = *e;
	if (cq->ts)
		cq->cur_ts = cq->ts[cq->ci & cq->mask];
	cq->ci++;
	cq->ex.wr_id = cq->cur.wr_id;
	cq->ex.status = (enum ibv_wc_status)cq->cur.status;
	return 0;
}

static int start_poll(struct ibv_cq_ex *c, struct ibv_poll_cq_attr *attr) {
	struct vr_cq *cq = cqx(c);
	if (attr && attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	int ret = take(cq);
	if (ret)
		pthread_spin_unlock(&cq->lock); /* no end_poll follows ENOENT */
	return ret;
}

static int next_poll(struct ibv_cq_ex *c) { return take(cqx(c)); }

static void end_poll(struct ibv_cq_ex *c) {
	struct vr_cq *cq = cqx(c);
	__atomic_store_n(&cq->rec->cq_ci, cq->ci, __ATOMIC_SEQ_CST);
	pthread_spin_unlock(&cq->lock);
}

static enum ibv_wc_opcode read_opcode(struct ibv_cq_ex *c) { return (enum ibv_wc_opcode)cqx(c)->cur.opcode; }
static uint32_t read_vendor_err(struct ibv_cq_ex *c) { return cqx(c)->cur.vendor_err; }
static uint32_t read_byte_len(struct ibv_cq_ex *c) { return cqx(c)->cur.byte_len; }
static __be32 read_imm_data(struct ibv_cq_ex *c) {
	const struct vrnic_cqe *e = &cqx(c)->cur;
	return (e->wc_flags & VRNIC_WC_WITH_IMM) ? htonl(e->imm_or_inv) : e->imm_or_inv;
}
static uint32_t read_qp_num(struct ibv_cq_ex *c) { return cqx(c)->cur.qp_num; }
static uint32_t read_src_qp(struct ibv_cq_ex *c) { return cqx(c)->cur.src_qp; }
static unsigned int read_wc_flags(struct ibv_cq_ex *c) { return cqx(c)->cur.wc_flags; }
static uint32_t read_slid(struct ibv_cq_ex *c) {
	(void)c;
	return 0;
}
static uint8_t read_sl(struct ibv_cq_ex *c) { return cqx(c)->cur.sl; }
static uint8_t read_dlid_path_bits(struct ibv_cq_ex *c) {
	(void)c;
	return 0;
}

/* The device's clock is the host's CLOCK_REALTIME in nanoseconds (its
 * hca_core_clock is 1 GHz): a completion's raw timestamp and its wall
 * clock time are the same number. */
static uint64_t read_completion_ts(struct ibv_cq_ex *c) { return cqx(c)->cur_ts; }
static uint64_t read_completion_wallclock_ns(struct ibv_cq_ex *c) { return cqx(c)->cur_ts; }

int vr_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *v) {
	(void)ctx;
	if (!v || (v->comp_mask & ~(uint32_t)IBV_VALUES_MASK_RAW_CLOCK))
		return EINVAL;
	if (v->comp_mask & IBV_VALUES_MASK_RAW_CLOCK)
		clock_gettime(CLOCK_REALTIME, &v->raw_clock);
	return 0;
}

void vr_cq_ex_init(struct vr_cq *cq, uint64_t wc_flags) {
	struct ibv_cq_ex *x = &cq->ex;
	cq->wc_flags = wc_flags;
	x->start_poll = start_poll;
	x->next_poll = next_poll;
	x->end_poll = end_poll;
	x->read_opcode = read_opcode;
	x->read_vendor_err = read_vendor_err;
	x->read_byte_len = read_byte_len;
	x->read_imm_data = read_imm_data;
	x->read_qp_num = read_qp_num;
	x->read_src_qp = read_src_qp;
	x->read_wc_flags = read_wc_flags;
	x->read_slid = read_slid;
	x->read_sl = read_sl;
	x->read_dlid_path_bits = read_dlid_path_bits;
	x->read_completion_ts = read_completion_ts;
	x->read_completion_wallclock_ns = read_completion_wallclock_ns;
}

struct ibv_cq_ex *vr_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a) {
	if (!a)
		VR_FAIL_NULL(EINVAL);
	if (a->comp_vector >= (uint32_t)ctx->num_comp_vectors)
		VR_FAIL_NULL(EINVAL);
	if (a->wc_flags & ~(uint64_t)WC_FLAGS_SUPPORTED)
		VR_FAIL_NULL(EOPNOTSUPP);
	if (a->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
		VR_FAIL_NULL(EOPNOTSUPP);
	struct ibv_pd *domain = NULL;
	if (a->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
		/* Only a parent domain: it gives the CQ its ring memory. */
		domain = a->parent_domain;
		if (!domain || domain->context != ctx || !vr_pd(domain)->protection)
			VR_FAIL_NULL(EINVAL);
	}
	struct ibv_cq *cq = vr_create_cq(ctx, (int)a->cqe, a->cq_context, a->channel, a->wc_flags, domain);
	return cq ? &vr_cq(cq)->ex : NULL;
}

int vr_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
		       struct ibv_device_attr_ex *attr, size_t size) {
	if (in && in->comp_mask)
		return EINVAL;
	if (size < sizeof attr->orig_attr)
		return EINVAL;
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof a);
	int ret = ibv_query_device(ctx, &a.orig_attr);
	if (ret)
		return ret;
	if ((ret = vr_max_dm_size(vr_ctx(ctx), &a.max_dm_size)))
		return ret;
	a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;
	/* Completion timestamps: 64 bits of a 1 GHz clock (in kHz). */
	a.completion_timestamp_mask = UINT64_MAX;
	a.hca_core_clock = 1000000;
	a.device_cap_flags_ex = (uint64_t)(uint32_t)a.orig_attr.device_cap_flags;
	/* On-demand paging as this process can have it (odp.c): none when
	 * the daemon may not reach its memory. */
	struct vr_ctx *c = vr_ctx(ctx);
	if (vr_odp_attach(c) == 0) {
		a.odp_caps.general_caps = c->odp_caps.general_caps;
		a.odp_caps.per_transport_caps.rc_odp_caps = c->odp_caps.rc_odp_caps;
		a.odp_caps.per_transport_caps.uc_odp_caps = c->odp_caps.uc_odp_caps;
		a.odp_caps.per_transport_caps.ud_odp_caps = c->odp_caps.ud_odp_caps;
		a.xrc_odp_caps = c->odp_caps.xrc_odp_caps;
	}
	/* The IBTA 1.5 Memory Placement Extensions the daemon executes (its
	 * QUERY_DEVICE reply of the context's opening). */
	if (c->attr.placement_caps & VRNIC_PLACEMENT_ATOMIC_WRITE)
		a.device_cap_flags_ex |= VR_DEVICE_ATOMIC_WRITE;
	if (c->attr.placement_caps & VRNIC_PLACEMENT_FLUSH_GLOBAL)
		a.device_cap_flags_ex |= VR_DEVICE_FLUSH_GLOBAL;
	if (c->attr.placement_caps & VRNIC_PLACEMENT_FLUSH_PERSISTENT)
		a.device_cap_flags_ex |= VR_DEVICE_FLUSH_PERSISTENT;
	memcpy(attr, &a, size < sizeof a ? size : sizeof a);
	return 0;
}
