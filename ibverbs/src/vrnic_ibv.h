/* vrnic_ibv.h - internal declarations of vrnic's libibverbs.so.1.
 *
 * The library implements the public libibverbs API (<infiniband/verbs.h>)
 * on the vrnic client ABI (vrnic_abi.h): control commands over the
 * daemon's SOCK_SEQPACKET socket, rings and doorbell records in shared
 * memory for the data path. Nothing here is exported: every declaration is
 * hidden; the exported names and their versions come from the generated
 * version script (see README.md).
 *
 * Object layout: each verbs object is a struct of this library whose first
 * member is the libibverbs struct the application sees, so the pointer the
 * application holds converts back with a cast (vr_qp(qp) and so on). */
#ifndef VRNIC_IBV_H
#define VRNIC_IBV_H

#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vrnic_abi.h"

#define VR_HIDDEN __attribute__((visibility("hidden")))
#define VR_EXPORT __attribute__((visibility("default")))

#define VR_PAGE 4096u

/* A device: one reachable vrnicd control socket. Devices live for the
 * whole process (ibv_free_device_list frees only the array), so pointers
 * handed out stay valid after the list is freed, as with libibverbs. */
#define VR_DEVICE_MAGIC 0x7672646576696365ull /* "vrdevice" */

struct vr_device {
	struct ibv_device dev;
	uint64_t magic;         /* VR_DEVICE_MAGIC: librdmacm checks the device is ours */
	char sock[108];         /* control socket path */
	bool guid_known;
	__be64 guid;            /* node GUID, big-endian as ibv_get_device_guid returns it */
	struct vr_device *next; /* all devices ever found */
};

/* A ring allocator over host memory chunks (sealed memfds given to the
 * daemon with ADD_HOST_MEM), per context. Allocations are whole pages. */
struct vr_chunk {
	uint8_t *base;
	uint64_t pa;
	size_t pages;
	uint8_t *used; /* one byte per page: 1 in use */
	struct vr_chunk *next;
};

struct vr_buf {
	uint8_t *p;
	uint64_t pa;
	size_t len;
	struct vr_chunk *chunk;
	/* Memory a parent domain's allocator gave (chunk NULL): vr_free
	 * hands it back to the domain's free function. */
	struct vr_pd *domain;
	uint64_t res_type;
};

/* Host memory registered with this context for user memory (see mem.c):
 * segment id -> the PA base the daemon gave it. */
struct vr_seg_reg {
	uint64_t seg_id;
	uint64_t pa;
	uint32_t handle;
};

/* The lock of a context's control socket and its sequence numbers, in a
 * shared anonymous mapping: a child forked from the program shares the
 * socket, and the lock keeps one command of one process in flight at a
 * time, so each reads its own reply (ctl.c). */
struct vr_calls {
	pthread_mutex_t mu; /* process-shared, robust */
	uint32_t seq;
};

struct vr_ctx {
	struct verbs_context vctx; /* the ibv_context is its last member */
	struct vr_device *dev;
	int sock;
	struct vr_calls *calls; /* one command in flight on sock, across fork too (ctl.c) */
	uint8_t *db;
	uint32_t db_size;
	int kick_fd;
	bool db_summary; /* ABI 1.3: this context marks its posts in the page's summary */
	bool kick_gen;   /* ABI 1.4: kick_needed is a generation (VRNIC_DB_DF_KICK_GEN) */
	uint32_t kicked; /* the kick_needed value last kicked for (atomic; 0: none) */
	int async_ep; /* async_fd: an epoll fd over events_fd and sock's hang-up */
	int events_fd; /* the context's event socket (OPEN_EVENTS), or -1 */
	int fatal_sent; /* IBV_EVENT_DEVICE_FATAL reported */

	/* The objects async events name: QPs by QPN, CQs and SRQs by handle. */
	pthread_mutex_t obj_mu;
	struct vr_obj *objs;
	size_t nobjs, capobjs;
	int dead;     /* the daemon is gone: set once, read atomically (vr_dead) */
	struct vrnic_device_attr attr;

	pthread_mutex_t mem_mu; /* chunks and segs */
	struct vr_chunk *chunks;
	struct vr_seg_reg *segs;
	size_t nsegs, capsegs;

	/* On-demand paging (odp.c), under mem_mu: 0 not tried, 1 attached,
	 * -errno refused; odp_caps valid when attached. */
	int odp_state;
	struct vrnic_resp_odp_attach odp_caps;
	uint8_t odp_nonce[16];
	uint64_t max_dm_size; /* QUERY_DEVICE_EX's + 1; 0: not asked yet (mrdm.c) */
	uint64_t ece_caps;    /* QUERY_DEVICE_EX's ece_options + 1; 0: not asked yet (misc.c) */
};

enum vr_obj_kind { VR_OBJ_QP = 1, VR_OBJ_CQ, VR_OBJ_SRQ };

struct vr_obj {
	uint32_t kind, id;
	void *obj; /* struct ibv_qp *, ibv_cq *, ibv_srq * */
};

struct vr_pd {
	struct ibv_pd pd;
	/* A parent domain (domain.c): protection is the PD it wraps (whose
	 * handle pd.handle repeats), td its thread domain or NULL, and the
	 * allocators for the rings of the objects created on it. A protection
	 * domain counts the parent domains over it in refs. */
	struct vr_pd *protection;
	struct vr_td *td;
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type);
	void *pd_context;
	uint32_t refs;
};

struct vr_td {
	struct ibv_td td;
	uint32_t refs; /* parent domains using it */
};

/* The resource_type a parent domain's allocator is called with: which
 * ring of which object the memory is for (README, "Parent and thread
 * domains"). */
enum {
	VRNIC_RES_TYPE_CQ = (0x7672ULL << 32) + 1, /* "vr" */
	VRNIC_RES_TYPE_SQ,
	VRNIC_RES_TYPE_RQ,
	VRNIC_RES_TYPE_SRQ,
};

struct vr_mr {
	struct ibv_mr mr;
	unsigned access;   /* IBV_ACCESS_* as registered (ibv_rereg_mr) */
	struct ibv_dm *dm; /* a device memory MR's DM (ibv_reg_dm_mr), else NULL */
};

/* vr_mr_init fills mr from a REG_MR-style reply (REG_MR, REG_MR_ODP,
 * REG_DM_MR): what ibv_mr shows of the registration. */
static inline struct ibv_mr *vr_mr_init(struct vr_mr *mr, struct ibv_pd *pd, void *addr, size_t length,
					const struct vrnic_resp_reg_mr *r, unsigned access) {
	mr->mr.context = pd->context;
	mr->mr.pd = pd;
	mr->mr.addr = addr;
	mr->mr.length = length;
	mr->mr.handle = r->mr_handle;
	mr->mr.lkey = r->lkey;
	mr->mr.rkey = r->rkey;
	mr->access = access;
	return &mr->mr;
}

struct vr_ah {
	struct ibv_ah ah;
	struct ibv_ah_attr attr;
};

struct vr_channel {
	struct ibv_comp_channel ch; /* ch.fd is an epoll fd over the CQs' eventfds */
};

struct vr_cq {
	struct ibv_cq_ex ex; /* ex starts with the fields of struct ibv_cq */
	struct vr_buf ring;
	struct vrnic_cqe *cqes;
	uint32_t n, mask, ci;
	uint32_t arm_sn;
	uint32_t empty_polls;
	struct vrnic_db_cq *rec;
	int event_fd; /* -1 without a completion channel */
	pthread_spinlock_t lock;
	/* completion timestamps (VRNIC_CQ_F_TIMESTAMP): n after the CQEs in
	 * the ring, else NULL */
	uint64_t *ts;
	/* extended polling (ibv_cq_ex): the CQE being read, its timestamp */
	struct vrnic_cqe cur;
	uint64_t cur_ts;
	uint64_t wc_flags; /* what the application asked to read */
};

/* A work ring: SQ, RQ or SRQ. */
struct vr_wq {
	struct vr_buf ring;
	uint32_t slots, mask, stride;
	uint32_t pi;
	uint32_t *pi_word;       /* doorbell record: our producer index */
	const uint32_t *ci_word; /* doorbell record: the daemon's consumer index */
	uint32_t ci_seen;        /* *ci_word when last read (it only grows) */
	uint32_t max_sge;
	pthread_spinlock_t lock;
};

/* vr_wq_full says whether slot pi is still the daemon's (the ring full
 * there), with q's lock held. The consumer index is read from the doorbell
 * record only when the copy last read says full: a post then reads no
 * cache line the daemon writes while the ring has room by that copy. The
 * index only grows, so the copy can only make the ring look fuller than it
 * is, never let a slot the daemon has not consumed be overwritten. */
static inline bool vr_wq_full(struct vr_wq *q, uint32_t pi) {
	if (pi - q->ci_seen <= q->mask)
		return false;
	q->ci_seen = __atomic_load_n(q->ci_word, __ATOMIC_ACQUIRE);
	return pi - q->ci_seen > q->mask;
}

/* The ibv_qp_ex operation rdma-core added after the installed headers'
 * last one (wr_atomic_write): ibv_wr_flush (rdma-core 45), appended to
 * struct ibv_qp_ex. A program built against newer headers calls it at this
 * offset. */
typedef void (*vr_wr_flush_fn)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr, size_t len, uint8_t type,
			       uint8_t level);

struct vr_qp {
	struct ibv_qp_ex ex; /* ex.qp_base is the struct ibv_qp */
	vr_wr_flush_fn wr_flush; /* ibv_qp_ex.wr_flush of newer headers */
	struct vrnic_db_qp *rec;
	struct vr_wq sq, rq;
	bool has_rq;
	uint32_t max_inline;
	uint32_t sq_sig_all;
	struct ibv_qp_cap cap;
	/* ibv_wr_* state (between wr_start and wr_complete/abort) */
	uint32_t wr_pi;     /* producer index of the next WQE to build */
	uint8_t *wr_cur;    /* the WQE being built, NULL if none */
	int wr_err;         /* first error of this batch */
	/* ECE (misc.c): the options ibv_query_ece reports (valid once
	 * ece_known; until then the device's), whether ibv_set_ece stored
	 * them for the next MODIFY_QP to INIT or RTR, and whether the QP has
	 * options of its own (set, or agreed by librdmacm), which VRNIC_ECE
	 * leaves alone. */
	uint32_t ece;
	bool ece_known, ece_pending, ece_own;
};

_Static_assert(offsetof(struct vr_qp, wr_flush) == sizeof(struct ibv_qp_ex),
	       "wr_flush must follow struct ibv_qp_ex, as in rdma-core 45 and later");

/* IBTA 1.5 Memory Placement Extensions, as rdma-core 45 and later name
 * them (the installed headers may predate them). */
#ifndef IBV_ACCESS_FLUSH_GLOBAL
#define IBV_ACCESS_FLUSH_GLOBAL (1 << 8)
#define IBV_ACCESS_FLUSH_PERSISTENT (1 << 9)
#endif
#define VR_WR_FLUSH 14
#define VR_WC_FLUSH 8
#define VR_QP_EX_WITH_FLUSH (1ULL << 13)
#define VR_DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define VR_DEVICE_FLUSH_PERSISTENT (1ULL << 39)
#define VR_DEVICE_ATOMIC_WRITE (1ULL << 40)

struct vr_srq {
	struct ibv_srq srq;
	struct vrnic_db_srq *rec;
	struct vr_wq wq;
	uint32_t handle;
	uint32_t limit;
	uint32_t srq_num; /* XRC SRQs: the number initiators name; 0 otherwise */
};

/* An XRC domain (xrc.c): the daemon's handle, and the PD and CQ a target
 * QP's CREATE_XRC_QP names (the verbs give a target QP neither). */
struct vr_xrcd {
	struct ibv_xrcd xrcd;
	uint32_t handle;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

static inline struct vr_ctx *vr_ctx(struct ibv_context *c) {
	return (struct vr_ctx *)((uint8_t *)c - offsetof(struct vr_ctx, vctx.context));
}
static inline struct vr_cq *vr_cq(struct ibv_cq *cq) { return (struct vr_cq *)cq; }
static inline struct vr_qp *vr_qp(struct ibv_qp *qp) { return (struct vr_qp *)qp; }
static inline struct vr_pd *vr_pd(struct ibv_pd *pd) { return (struct vr_pd *)pd; }
static inline struct vr_srq *vr_srq(struct ibv_srq *s) { return (struct vr_srq *)s; }

/* odp.c */
VR_HIDDEN int vr_odp_attach(struct vr_ctx *c);
VR_HIDDEN struct ibv_mr *vr_reg_mr_odp(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned access);
VR_HIDDEN int vr_advise_mr(struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
			   struct ibv_sge *sg_list, uint32_t num_sge);

/* events.c */
VR_HIDDEN int vr_events_open(struct vr_ctx *c);
VR_HIDDEN void vr_obj_add(struct vr_ctx *c, uint32_t kind, uint32_t id, void *obj);
VR_HIDDEN void vr_obj_del(struct vr_ctx *c, uint32_t kind, uint32_t id);

/* ctl.c */
VR_HIDDEN int vr_call(struct vr_ctx *c, uint16_t op, const void *req, size_t req_len, const void *extra,
		      size_t extra_len, const int *fds, int nfds, void *resp, size_t resp_len);
VR_HIDDEN int vr_call_sock(int sock, uint32_t *seq, uint16_t op, const void *req, size_t req_len, const int *fds,
			   int nfds, void *resp, size_t resp_len, int *rfds, int nrfds);
VR_HIDDEN int vr_connect(const char *path);
VR_HIDDEN bool vr_debug(void);
VR_HIDDEN void vr_kick(struct vr_ctx *c);
VR_HIDDEN void vr_set_dead(struct vr_ctx *c);
VR_HIDDEN bool vr_check_dead(struct vr_ctx *c);
static inline bool vr_dead(struct vr_ctx *c) { return __atomic_load_n(&c->dead, __ATOMIC_RELAXED); }

/* Posting in a state that takes no work requests is an immediate error
 * (IBTA 10.3.1; the kernel's rxe_post_send/rxe_post_recv): the SQ takes
 * them from RTS on (RTS, SQD, SQE, ERR), the RQ from INIT on. qp->state is
 * what this process last set or queried; the states the device enters by
 * itself (SQE, ERR) take work requests too. */
static inline int vr_sq_state_check(struct ibv_qp *qp) {
	enum ibv_qp_state s = __atomic_load_n(&qp->state, __ATOMIC_RELAXED);
	return s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_RTR ? EINVAL : 0;
}
static inline int vr_rq_state_check(struct ibv_qp *qp) {
	return __atomic_load_n(&qp->state, __ATOMIC_RELAXED) == IBV_QPS_RESET ? EINVAL : 0;
}

/* vr_db_mark marks the doorbell record holding pi_word in the page's
 * summary (ABI 1.3), after the producer index store and before the
 * kick_needed check (vrnic_abi.h, "Doorbell summary"). */
static inline void vr_db_mark(struct vr_ctx *c, const uint32_t *pi_word) {
	if (!c->db_summary)
		return;
	uint32_t i = (uint32_t)(((const uint8_t *)pi_word - c->db) / VRNIC_DB_RECORD_SIZE);
	uint32_t g = i / VRNIC_DB_SUMMARY_GROUP, bit = 1u << (g % 32);
	if (g / 32 >= VRNIC_DB_SUMMARY_WORDS)
		return;
	uint32_t *w = &((struct vrnic_db_header *)c->db)->summary[g / 32];
	if (!(__atomic_load_n(w, __ATOMIC_SEQ_CST) & bit))
		__atomic_fetch_or(w, bit, __ATOMIC_SEQ_CST);
}
VR_HIDDEN int vr_destroy_handle(struct vr_ctx *c, uint16_t op, uint32_t handle);
VR_HIDDEN int vr_calls_init(struct vr_ctx *c);
VR_HIDDEN void vr_calls_free(struct vr_ctx *c);
VR_HIDDEN void vr_calls_lock(struct vr_ctx *c);
VR_HIDDEN void vr_calls_unlock(struct vr_ctx *c);

/* mem.c */
VR_HIDDEN int vr_alloc(struct vr_ctx *c, size_t len, struct vr_buf *b);
VR_HIDDEN void vr_free(struct vr_ctx *c, struct vr_buf *b);
VR_HIDDEN int vr_call_pages(struct vr_ctx *c, uint16_t op, void *cmd, size_t cmd_len, uint64_t *pbl_pa,
			    const uint64_t *pages, size_t npages, void *resp, size_t resp_len);
VR_HIDDEN int vr_alloc_in(struct vr_ctx *c, struct ibv_pd *pd, uint64_t type, size_t len, struct vr_buf *b);
VR_HIDDEN void vr_free_domain_buf(struct vr_buf *b);
VR_HIDDEN int vr_dealloc_parent_domain(struct vr_pd *pd);
VR_HIDDEN void vr_domain_ops(struct verbs_context *v);
VR_HIDDEN void vr_free_chunks(struct vr_ctx *c);
VR_HIDDEN int vr_user_pages(struct vr_ctx *c, uintptr_t start, size_t npages, bool write, uint64_t *pages);

/* post.c */
VR_HIDDEN int vr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
VR_HIDDEN int vr_req_notify_cq(struct ibv_cq *cq, int solicited_only);
VR_HIDDEN int vr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
VR_HIDDEN int vr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
VR_HIDDEN int vr_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
VR_HIDDEN bool vr_opcode_ok(enum ibv_qp_type t, unsigned op);
VR_HIDDEN void vr_wq_init(struct vr_wq *q, struct vr_buf ring, uint32_t slots, uint32_t stride, uint32_t *pi_word,
			  const uint32_t *ci_word, uint32_t max_sge);

/* ex.c */
VR_HIDDEN void vr_qp_ex_init(struct vr_qp *qp, uint64_t send_ops_flags);
VR_HIDDEN void vr_cq_ex_init(struct vr_cq *cq, uint64_t wc_flags);
VR_HIDDEN int vr_query_rt_values(struct ibv_context *ctx, struct ibv_values_ex *v);
VR_HIDDEN struct ibv_cq_ex *vr_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a);
VR_HIDDEN struct ibv_qp *vr_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a);
VR_HIDDEN int vr_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
				 struct ibv_device_attr_ex *attr, size_t size);
VR_HIDDEN struct ibv_srq *vr_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a);

/* objects.c */
VR_HIDDEN struct ibv_cq *vr_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, uint64_t wc_flags, struct ibv_pd *domain);
VR_HIDDEN struct ibv_qp *vr_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr_ex *a);
VR_HIDDEN struct ibv_qp *vr_create_qp_xrcd(struct ibv_pd *pd, struct ibv_qp_init_attr_ex *a, uint32_t xrcd);
VR_HIDDEN struct ibv_srq *vr_create_srq_xrc(struct ibv_pd *pd, void *srq_context, struct ibv_srq_attr *a,
					    uint32_t xrcd, uint32_t cq);
/* xrc.c */
VR_HIDDEN struct ibv_xrcd *vr_open_xrcd(struct ibv_context *ctx, struct ibv_xrcd_init_attr *a);
VR_HIDDEN int vr_close_xrcd(struct ibv_xrcd *x);
VR_HIDDEN int vr_get_srq_num(struct ibv_srq *srq, uint32_t *num);
VR_HIDDEN struct ibv_qp *vr_create_xrc_tgt(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a);
VR_HIDDEN struct ibv_srq *vr_create_xrc_srq(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a);

/* mw.c */
VR_HIDDEN struct ibv_mw *vr_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
VR_HIDDEN int vr_dealloc_mw(struct ibv_mw *mw);
VR_HIDDEN int vr_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b);
VR_HIDDEN void vr_bind_wqe(struct vrnic_send_wqe *w, const struct ibv_mw *mw, uint32_t rkey,
			   const struct ibv_mw_bind_info *info);

/* mrdm.c */
VR_HIDDEN struct ibv_dm *vr_alloc_dm(struct ibv_context *ctx, struct ibv_alloc_dm_attr *a);
VR_HIDDEN int vr_free_dm(struct ibv_dm *dm);
VR_HIDDEN struct ibv_mr *vr_reg_dm_mr(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t off, size_t length,
				      unsigned int access);
VR_HIDDEN int vr_max_dm_size(struct vr_ctx *c, uint64_t *max);
VR_HIDDEN void vr_cq_clean(struct vr_cq *cq, uint32_t qpn);

/* misc.c */
VR_HIDDEN uint32_t vr_ece_caps(struct vr_ctx *c);
VR_HIDDEN uint32_t vr_parse_ece(const char *s, const char **bad);
VR_HIDDEN bool vr_modify_ece(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask, uint32_t *opts);
VR_HIDDEN void vr_modified_ece(struct ibv_qp *qp, const struct ibv_qp_attr *attr, int mask, bool sent, uint32_t opts);

/* ah.c */
VR_HIDDEN void vr_ah_to_vr(const struct ibv_ah_attr *a, struct vrnic_ah_attr *v);

/* device.c */
VR_HIDDEN int vr_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len);

/* errors: set errno and return NULL, or return the errno value. */
#define VR_FAIL_NULL(e) \
	do { \
		errno = (e); \
		return NULL; \
	} while (0)

#endif /* VRNIC_IBV_H */
