/* post.c - the data path: posting WQEs into the shared rings and polling
 * CQEs, with no system call while the daemon polls.
 *
 * Posting: write the WQE slots, store the new free-running producer index
 * in the doorbell record (sequentially consistent, which also orders the
 * slot writes before it), then kick the daemon only if its page header says
 * it sleeps. A ring slot may be reused once the daemon's consumer index has
 * passed it (the daemon copies each WQE when it consumes it).
 *
 * Polling: a CQE is ready when its owner bit matches the pass of the
 * consumer index; read the owner byte with acquire, then the rest, and
 * publish the consumer index once per poll. */
#include "vrnic_ibv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <string.h>

/* Empty polls of a CQ between two sched_yield calls, and between two looks
 * at the control socket (is the daemon still there?). */
#define VR_YIELD_EVERY 64u
#define VR_CHECK_EVERY 1024u

void vr_wq_init(struct vr_wq *q, struct vr_buf ring, uint32_t slots, uint32_t stride, uint32_t *pi_word,
		const uint32_t *ci_word, uint32_t max_sge) {
	q->ring = ring;
	q->slots = slots;
	q->mask = slots - 1;
	q->stride = stride;
	q->pi = 0;
	q->pi_word = pi_word;
	q->ci_word = ci_word;
	q->ci_seen = 0; /* the daemon starts the index at 0 */
	q->max_sge = max_sge;
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
}

static inline uint8_t *wq_slot(const struct vr_wq *q, uint32_t pi) {
	return q->ring.p + (size_t)(pi & q->mask) * q->stride;
}

static inline void wq_publish(struct vr_ctx *c, struct vr_wq *q, uint32_t pi) {
	q->pi = pi;
	__atomic_store_n(q->pi_word, pi, __ATOMIC_SEQ_CST);
	vr_db_mark(c, q->pi_word);
	vr_kick(c);
}

/* vr_opcode_ok says whether a QP of type t may post a WR with opcode op:
 * UC has SEND and RDMA WRITE (with and without immediate), UD SEND and
 * SEND with immediate; the others fail to post with EINVAL. (Soft-RoCE's
 * provider posts them, and the kernel completes them with
 * IBV_WC_LOC_QP_OP_ERR.) */
bool vr_opcode_ok(enum ibv_qp_type t, unsigned op) {
	switch (t) {
	case IBV_QPT_UD:
		return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
	case IBV_QPT_UC:
		return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
		       op == IBV_WR_RDMA_WRITE_WITH_IMM;
	case IBV_QPT_XRC_RECV: /* an XRC target QP has no send queue */
		return false;
	default:
		return true;
	}
}

/* build_send writes wr into slot; it returns 0 or an errno value. */
static int build_send(struct vr_qp *qp, const struct ibv_send_wr *wr, uint8_t *slot) {
	struct vrnic_send_wqe w = { .wr_id = wr->wr_id };
	enum ibv_qp_type t = qp->ex.qp_base.qp_type;
	if (!vr_opcode_ok(t, wr->opcode))
		return EINVAL;
	if (t == IBV_QPT_UD) {
		/* The UD segment: the AH, the destination QP and its Q_Key
		 * (bit 31 set: this QP's own, which the daemon applies). */
		if (!wr->wr.ud.ah)
			return EINVAL;
		w.ah_handle = wr->wr.ud.ah->handle;
		w.remote_qpn = wr->wr.ud.remote_qpn & 0xffffff;
		w.remote_qkey = wr->wr.ud.remote_qkey;
	}
	if (t == IBV_QPT_XRC_SEND) /* the XRC SRQ at the target (the XRCETH) */
		w.remote_qpn = wr->qp_type.xrc.remote_srqn & 0xffffff;
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		w.remote_addr = wr->wr.rdma.remote_addr;
		w.rkey = wr->wr.rdma.rkey;
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		w.remote_addr = wr->wr.atomic.remote_addr;
		w.rkey = wr->wr.atomic.rkey;
		w.compare_add = wr->wr.atomic.compare_add;
		w.swap = wr->wr.atomic.swap;
		break;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
	case IBV_WR_LOCAL_INV:
		break;
	case IBV_WR_BIND_MW:
		/* verbs.h: ibv_post_send binds type 2 windows (type 1 comes
		 * here through ibv_bind_mw, as in rdma-core's rxe provider);
		 * no SGEs, no inline data. */
		if (!wr->bind_mw.mw || wr->num_sge != 0 || (wr->send_flags & IBV_SEND_INLINE))
			return EINVAL;
		vr_bind_wqe(&w, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info);
		break;
	case IBV_WR_ATOMIC_WRITE:
		/* ibv_post_send has no field for the value: it is the 8 bytes
		 * of the one SGE (or inline buffer), read now, at post time,
		 * into the WQE (the ibv_wr_atomic_write path takes them as an
		 * argument). The target in wr.rdma. */
		if (wr->num_sge != 1 || wr->sg_list[0].length != 8)
			return EINVAL;
		w.remote_addr = wr->wr.rdma.remote_addr;
		w.rkey = wr->wr.rdma.rkey;
		memcpy(&w.compare_add, (const void *)(uintptr_t)wr->sg_list[0].addr, 8);
		w.opcode = VRNIC_WR_ATOMIC_WRITE;
		w.flags = (uint8_t)(wr->send_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED));
		memcpy(slot, &w, sizeof w);
		return 0;
	default:
		/* IBV_WR_FLUSH has no ibv_send_wr form: ibv_wr_flush only. */
		return EINVAL;
	}
	w.opcode = (uint8_t)wr->opcode;
	/* Immediate data is big-endian in the WR and on the wire; the WQE
	 * holds the value. */
	if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IBV_WR_SEND_WITH_IMM)
		w.imm_data = ntohl(wr->imm_data);
	if (wr->opcode == IBV_WR_SEND_WITH_INV || wr->opcode == IBV_WR_LOCAL_INV)
		w.invalidate_rkey = wr->invalidate_rkey;
	w.flags = (uint8_t)(wr->send_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED));
	if (wr->num_sge < 0)
		return EINVAL;
	if (wr->send_flags & IBV_SEND_INLINE) {
		uint32_t total = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > qp->max_inline - total)
				return EINVAL;
			memcpy(slot + VRNIC_WQE_BLOCK + total, (const void *)(uintptr_t)wr->sg_list[i].addr,
			       wr->sg_list[i].length);
			total += wr->sg_list[i].length;
		}
		w.flags |= VRNIC_SEND_INLINE;
		w.inline_len = total;
	} else {
		if ((uint32_t)wr->num_sge > qp->sq.max_sge)
			return EINVAL;
		struct vrnic_sge *sg = (struct vrnic_sge *)(slot + VRNIC_WQE_BLOCK);
		for (int i = 0; i < wr->num_sge; i++)
			sg[i] = (struct vrnic_sge){ .addr = wr->sg_list[i].addr, .length = wr->sg_list[i].length,
				.lkey = wr->sg_list[i].lkey };
		w.num_sge = (uint8_t)wr->num_sge;
	}
	memcpy(slot, &w, sizeof w);
	return 0;
}

int vr_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct vr_qp *qp = vr_qp(ibqp);
	struct vr_ctx *c = vr_ctx(ibqp->context);
	int ret = vr_dead(c) ? EIO : vr_sq_state_check(ibqp);
	pthread_spin_lock(&qp->sq.lock);
	uint32_t pi = qp->sq.pi;
	for (; wr && !ret; wr = wr->next) {
		if (vr_wq_full(&qp->sq, pi)) {
			ret = ENOMEM;
			break;
		}
		if ((ret = build_send(qp, wr, wq_slot(&qp->sq, pi))))
			break;
		pi++;
	}
	if (pi != qp->sq.pi)
		wq_publish(c, &qp->sq, pi);
	pthread_spin_unlock(&qp->sq.lock);
	if (ret) {
		if (bad)
			*bad = wr;
		errno = ret;
	}
	return ret;
}

static int post_recv(struct vr_ctx *c, struct vr_wq *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	int ret = vr_dead(c) ? EIO : 0;
	pthread_spin_lock(&q->lock);
	uint32_t pi = q->pi;
	for (; wr && !ret; wr = wr->next) {
		if (vr_wq_full(q, pi)) {
			ret = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge) {
			ret = EINVAL;
			break;
		}
		uint8_t *slot = wq_slot(q, pi);
		struct vrnic_recv_wqe h = { .wr_id = wr->wr_id, .num_sge = (uint32_t)wr->num_sge };
		memcpy(slot, &h, sizeof h);
		struct vrnic_sge *sg = (struct vrnic_sge *)(slot + sizeof h);
		for (int i = 0; i < wr->num_sge; i++)
			sg[i] = (struct vrnic_sge){ .addr = wr->sg_list[i].addr, .length = wr->sg_list[i].length,
				.lkey = wr->sg_list[i].lkey };
		pi++;
	}
	if (pi != q->pi)
		wq_publish(c, q, pi);
	pthread_spin_unlock(&q->lock);
	if (ret) {
		if (bad)
			*bad = wr;
		errno = ret;
	}
	return ret;
}

int vr_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	struct vr_qp *qp = vr_qp(ibqp);
	if (!qp->has_rq || vr_rq_state_check(ibqp)) {
		if (bad)
			*bad = wr;
		errno = EINVAL;
		return EINVAL;
	}
	return post_recv(vr_ctx(ibqp->context), &qp->rq, wr, bad);
}

int vr_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	return post_recv(vr_ctx(srq->context), &vr_srq(srq)->wq, wr, bad);
}

static inline void cqe_to_wc(const struct vrnic_cqe *e, struct ibv_wc *wc) {
	wc->wr_id = e->wr_id;
	wc->status = (enum ibv_wc_status)e->status;
	wc->opcode = (enum ibv_wc_opcode)e->opcode;
	wc->vendor_err = e->vendor_err;
	wc->byte_len = e->byte_len;
	if (e->wc_flags & VRNIC_WC_WITH_IMM)
		wc->imm_data = htonl(e->imm_or_inv);
	else
		wc->invalidated_rkey = (e->wc_flags & VRNIC_WC_WITH_INV) ? e->imm_or_inv : 0;
	wc->qp_num = e->qp_num;
	wc->src_qp = e->src_qp;
	wc->wc_flags = e->wc_flags;
	wc->pkey_index = e->pkey_index;
	wc->slid = 0;
	wc->sl = e->sl;
	wc->dlid_path_bits = 0;
}

int vr_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc) {
	struct vr_cq *cq = vr_cq(ibcq);
	int got = 0;
	pthread_spin_lock(&cq->lock);
	uint32_t ci = cq->ci;
	while (got < n) {
		struct vrnic_cqe *e = &cq->cqes[ci & cq->mask];
		uint8_t owner = __atomic_load_n(&e->owner, __ATOMIC_ACQUIRE);
		if ((owner & 1) != 1 - ((ci / cq->n) & 1))
			break;
		cqe_to_wc(e, &wc[got]);
		ci++;
		got++;
	}
	if (ci != cq->ci) {
		cq->ci = ci;
		__atomic_store_n(&cq->rec->cq_ci, ci, __ATOMIC_SEQ_CST);
		cq->empty_polls = 0;
	} else if (got == 0 && vr_dead(vr_ctx(ibcq->context))) {
		/* Nothing will ever come: an error rather than 0 forever. */
		pthread_spin_unlock(&cq->lock);
		errno = EIO;
		return -1;
	} else if (++cq->empty_polls % VR_YIELD_EVERY == 0) {
		/* A program spinning on an empty CQ competes for the CPU with
		 * the daemon that is to fill it: give the CPU away now and
		 * then (hardware RNICs need no CPU; this one does). */
		bool check = cq->empty_polls % VR_CHECK_EVERY == 0;
		pthread_spin_unlock(&cq->lock);
		if (check && vr_check_dead(vr_ctx(ibcq->context))) {
			errno = EIO;
			return -1;
		}
		sched_yield();
		return 0;
	}
	pthread_spin_unlock(&cq->lock);
	return got;
}

int vr_req_notify_cq(struct ibv_cq *ibcq, int solicited_only) {
	struct vr_cq *cq = vr_cq(ibcq);
	pthread_spin_lock(&cq->lock);
	cq->arm_sn = (cq->arm_sn + 1) & 0xffffff;
	uint32_t w = VRNIC_CQ_ARM_ARMED | (solicited_only ? VRNIC_CQ_ARM_SOLICITED : 0) |
		     (cq->arm_sn << VRNIC_CQ_ARM_SN_SHIFT);
	__atomic_store_n(&cq->rec->arm, w, __ATOMIC_SEQ_CST);
	pthread_spin_unlock(&cq->lock);
	vr_kick(vr_ctx(ibcq->context));
	return 0;
}
