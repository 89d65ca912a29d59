/* cma.h - internal declarations of vrnic's librdmacm.so.1.
 *
 * The library implements the public librdmacm API (<rdma/rdma_cma.h>) on
 * the daemon's communication manager (the CM commands of vrnic_abi.h, ABI
 * 1.2) and on vrnic's libibverbs.so.1 for the verbs objects. Like the
 * kernel's ucma, the CM runs elsewhere (in the daemon); this library keeps
 * the rdma_cm_id and event objects, maps IP addresses to devices through
 * the daemons' GIDs and moves the QPs through INIT, RTR and RTS with the
 * attributes the CM gives (rdma_init_qp_attr).
 *
 * Per device the library opens its own CM context on the daemon (a second
 * control connection with its own event socket): CM IDs and CM events live
 * there, so they never mix with the program's verbs context and its
 * asynchronous events. A dispatcher thread reads the event sockets and
 * queues each event on the event channel of its rdma_cm_id; an event
 * channel's fd is an eventfd that is readable while events are queued. */
#ifndef VRNIC_CMA_H
#define VRNIC_CMA_H

#include "vrnic_ibv.h"

#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#define CMA_MAX_GIDS 16

/* struct cma_hdr of the kernel's rdma_cm (drivers/infiniband/core/cma.c):
 * the first 36 bytes of a REQ's or SIDR_REQ's private data. */
struct cma_hdr {
	uint8_t cma_version; /* 0 */
	uint8_t ip_version;  /* 4 or 6, in bits 7:4 */
	uint16_t port;       /* the active side's port, big-endian */
	uint8_t src[16];     /* IPv4: 12 zero bytes, then the address */
	uint8_t dst[16];
} __attribute__((packed));

#define CMA_HDR_LEN ((int)sizeof(struct cma_hdr))

/* A device as librdmacm sees it: the program's verbs context (id->verbs)
 * and a default PD, plus the CM context on the daemon. */
struct cma_dev {
	struct ibv_device *ibdev;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	union ibv_gid gids[CMA_MAX_GIDS];
	int ngids;
	enum ibv_mtu active_mtu;
	uint8_t max_qp_rd_atom;      /* responder resources */
	uint8_t max_qp_init_rd_atom; /* initiator depth */
	/* The CM context: opened at the first CM command. */
	pthread_mutex_t call_mu;
	int sock;
	uint32_t seq;
	int ev_fd;
	bool dead;
	struct cma_dev *next;
};

/* A listener on one device (wildcard listeners have one per device). */
/* A daemon CM handle on a device, indexed for the dispatcher (the
 * handle table in cma.c): an ID's connection handle, or one of a
 * listener's. */
struct cma_hent {
	struct cma_dev *dev;
	uint32_t handle;
	bool listener;
	struct cma_id *id;
	struct cma_hent *next; /* in its bucket */
};

struct cma_listen {
	struct cma_dev *dev;
	uint32_t handle;
	struct cma_hent h;
};

struct cma_chan {
	struct rdma_event_channel ch; /* first: ch.fd is an eventfd */
	struct cma_event *head, *tail;
};

struct cma_id {
	struct rdma_cm_id id; /* first */
	struct cma_dev *dev;
	uint32_t handle; /* the daemon's CM ID on dev (connections), 0 none */
	struct cma_listen *listens;
	int nlistens;
	bool sync;
	bool bound;               /* it owns its source port in its port space */
	bool reuseaddr;           /* RDMA_OPTION_ID_REUSEADDR */
	int8_t afonly;            /* RDMA_OPTION_ID_AFONLY: -1 unset */
	bool connected_once;      /* a CONNECT_REQUEST or CONNECT sent: the CM has attributes */
	bool active;              /* rdma_connect called: the active side */
	bool swallow_established; /* the daemon's ESTABLISHED was reported from CONNECT_RESPONSE */
	bool freeing;
	uint8_t sgid_index;
	uint8_t tos;
	bool tos_set;
	uint8_t ack_timeout;
	bool ack_timeout_set;
	uint8_t initiator_depth;
	uint8_t responder_resources;
	uint32_t psn;              /* the first PSN our QP expects (its rq_psn), which our REQ or REP announces */
	/* ECE (cma_ece.c): what rdma_set_local_ece set (an ID without a QP
	 * of its own offers and accepts these), and what the peer's REQ or
	 * REP carried (rdma_get_remote_ece). */
	struct ibv_ece local_ece, remote_ece;
	int delivered, acked;      /* events handed to the program, and acked */
	struct ibv_qp_init_attr *qp_init_attr; /* rdma_create_ep, passive */
	struct cma_hent hconn;  /* handle's entry in the handle table, while handle != 0 */
	struct cma_id *next, **pprev; /* every ID (g_ids) */
};

struct cma_event {
	struct rdma_cm_event ev; /* first */
	struct cma_id *owner;    /* the ID whose channel it is on (the listener for CONNECT_REQUEST) */
	struct cma_id *child;    /* CONNECT_REQUEST: the new ID */
	bool synth;              /* made by the library (ADDR/ROUTE_*, DEVICE_REMOVAL) */
	struct vrnic_cm_event raw;
	struct vrnic_cm_ece peer_ece; /* the REQ's or REP's ECE (struct vrnic_cm_event_ece) */
	uint8_t pd[VRNIC_CM_MAX_PRIVATE_DATA];
	struct cma_event *next;
};

/* cma.c */
VR_HIDDEN int cma_complete(struct cma_id *id);

/* cma_ece.c */
VR_HIDDEN uint32_t cma_offer_ece(struct cma_id *id);
VR_HIDDEN uint32_t cma_accept_ece(struct cma_id *id);
VR_HIDDEN void cma_apply_ece(struct cma_id *id, uint32_t agreed);

/* cma_addr.c */
VR_HIDDEN socklen_t cma_addrlen(const struct sockaddr *a);
VR_HIDDEN bool cma_any(const struct sockaddr *a);
VR_HIDDEN bool cma_loopback(const struct sockaddr *a);
VR_HIDDEN bool cma_local_addr(const struct sockaddr *a);
VR_HIDDEN bool cma_addr_eq(const struct sockaddr *a, const struct sockaddr *b);
VR_HIDDEN uint16_t cma_port(const struct sockaddr *a); /* host order */
VR_HIDDEN void cma_set_port(struct sockaddr *a, uint16_t port);
VR_HIDDEN void cma_addr_to_gid(const struct sockaddr *a, union ibv_gid *g);
VR_HIDDEN bool cma_gid_to_addr(const union ibv_gid *g, struct sockaddr_storage *out);

#endif /* VRNIC_CMA_H */
