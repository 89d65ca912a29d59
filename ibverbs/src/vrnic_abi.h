/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * vrnic_abi.h - the client ABI of the vrnic virtual RDMA NIC.
 *
 * This header is the contract between vrnicd and its clients. A client written
 * in C from this file and libc alone can do everything the Go client (package
 * verbs) does. The Go mirror in the abi Go package is checked byte for byte against this
 * file by a test; this file wins when they disagree.
 *
 * Conventions
 *   - Every struct has a fixed size and a little-endian layout with natural
 *     alignment and explicit reserved fields: no implicit padding anywhere.
 *     Reserved fields must be written as zero; the daemon rejects non-zero
 *     reserved fields in commands (EINVAL) so they can be given meaning later.
 *   - Values on the wire (RoCE v2) are big-endian; values here are not.
 *   - Enumerations reuse the numbering of libibverbs (<infiniband/verbs.h>)
 *     wherever libibverbs has one, so code ported from verbs maps 1:1.
 *
 * The four shared things
 *   1. The control socket: a SOCK_SEQPACKET unix socket. One datagram is one
 *      command or one reply: struct vrnic_msg_hdr followed by the command's
 *      struct. File descriptors travel as SCM_RIGHTS ancillary data.
 *   2. Host memory: memfds the client creates (MFD_ALLOW_SEALING), seals
 *      against shrinking (F_SEAL_SHRINK) and hands to the daemon with
 *      VRNIC_CMD_ADD_HOST_MEM. The daemon maps each one and gives it a range
 *      of the device's physical address space ("PA"). Rings, page lists and
 *      data buffers all live in host memory and are named by PA.
 *   3. The doorbell page: a memfd the daemon creates per context and passes
 *      to the client in the OPEN_CONTEXT reply. It holds the page header
 *      (the "kick needed" word) and one 128-byte doorbell record per QP, CQ
 *      and SRQ.
 *   4. Eventfds: the kick eventfd (daemon-created, one per context, passed
 *      with OPEN_CONTEXT) and the completion eventfd of each CQ
 *      (client-created, passed with CREATE_CQ).
 *
 * Ringing a doorbell (posting work)
 *   1. Write the WQE(s) into the ring slot(s).
 *   2. Store the new free-running producer index into the doorbell record
 *      with a sequentially consistent store (__atomic_store_n(p, v,
 *      __ATOMIC_SEQ_CST)); it also orders the slot writes before it.
 *   3. (ABI 1.3, optional) Mark the record in the page's doorbell summary
 *      (struct vrnic_db_header, "Doorbell summary" there).
 *   4. Load the page's kick_needed word (__ATOMIC_SEQ_CST). Only if it is
 *      non-zero, write the 8-byte value 1 to the kick eventfd. (ABI 1.4)
 *      When the header's daemon_flags has VRNIC_DB_DF_KICK_GEN, the value
 *      is a generation, new each time the daemon prepares to sleep: the
 *      client may skip the write when it already wrote for that value
 *      (one write wakes the daemon; more, while it is still waking, only
 *      cost system calls). A client that keeps the value it kicked for
 *      forgets it whenever it loads 0.
 *   While the daemon polls, kick_needed is 0 and posting costs no system
 *   call. The daemon sets kick_needed before it sleeps and re-reads every
 *   record after setting it, so a post racing with it going to sleep is
 *   never lost (store/load on both sides are sequentially consistent).
 *
 * Never trusted: the daemon reads every index, WQE and ring byte the client
 * controls once into private memory, masks and validates it. A bad WQE fails
 * that WQE (a CQE with an error status) and moves the QP to ERROR; the daemon
 * never touches memory outside the client's host memory.
 */
#ifndef VRNIC_ABI_H
#define VRNIC_ABI_H

#include <stdint.h>

/* ABI version: OPEN_CONTEXT fails with EPROTO unless the major matches and
 * the client's minor is <= the daemon's. */
#define VRNIC_ABI_VERSION_MAJOR 1
#define VRNIC_ABI_VERSION_MINOR 5
#define VRNIC_ABI_VERSION ((VRNIC_ABI_VERSION_MAJOR << 16) | VRNIC_ABI_VERSION_MINOR)

/* ------------------------------------------------------------------------
 * Limits (also reported by QUERY_DEVICE)
 * ------------------------------------------------------------------------ */
#define VRNIC_MAX_MSG_SIZE      65536u   /* largest control datagram */
#define VRNIC_MAX_ERR_MSG       256u     /* error text in a reply, NUL included */
#define VRNIC_MAX_FDS           4u       /* fds on one control datagram */
#define VRNIC_MAX_SGE           32u      /* SGEs per send WQE / RQE */
#define VRNIC_MAX_INLINE        512u     /* inline bytes per send WQE */
#define VRNIC_MAX_CQE           262144u  /* CQEs per CQ */
#define VRNIC_MAX_QP_WR         16384u   /* WRs per SQ or RQ */
#define VRNIC_MAX_SRQ_WR        16384u   /* WRs per SRQ */
#define VRNIC_MAX_RD_ATOMIC     16u      /* max_rd_atomic / max_dest_rd_atomic by default (QUERY_DEVICE: the device's) */
#define VRNIC_MAX_MR_SIZE       (1ull << 40)
#define VRNIC_MAX_MSG_BYTES     (1u << 31) /* largest RDMA message */
#define VRNIC_INLINE_PAGES      64u      /* page list inline in REG_MR */
#define VRNIC_GID_TABLE_LEN     16u
#define VRNIC_PKEY_DEFAULT      0xffffu

#define VRNIC_PAGE_SHIFT_4K     12u
#define VRNIC_PAGE_SHIFT_2M     21u

/* ------------------------------------------------------------------------
 * Control messages
 * ------------------------------------------------------------------------ */

/* Every datagram starts with this header. A reply echoes opcode and seq,
 * sets VRNIC_MSG_F_REPLY and carries status 0 and the reply struct, or a
 * positive errno value in status and a NUL-terminated message (at most
 * VRNIC_MAX_ERR_MSG bytes) after the header. length counts the header. */
struct vrnic_msg_hdr {
	uint16_t opcode;   /* enum vrnic_cmd */
	uint16_t flags;    /* VRNIC_MSG_F_* */
	uint32_t length;   /* bytes in this datagram, header included */
	uint32_t seq;      /* chosen by the client, echoed in the reply */
	uint32_t status;   /* replies: 0 or an errno value (EINVAL, EBUSY, ...) */
};

#define VRNIC_MSG_F_REPLY 0x0001u

enum vrnic_cmd {
	VRNIC_CMD_OPEN_CONTEXT    = 1,  /* must be first on a connection */
	VRNIC_CMD_QUERY_DEVICE    = 2,
	VRNIC_CMD_QUERY_PORT      = 3,
	VRNIC_CMD_QUERY_GID       = 4,
	VRNIC_CMD_ADD_HOST_MEM    = 5,  /* 1 fd: the memfd */
	VRNIC_CMD_REMOVE_HOST_MEM = 6,
	VRNIC_CMD_ALLOC_PD        = 7,
	VRNIC_CMD_DEALLOC_PD      = 8,
	VRNIC_CMD_REG_MR          = 9,
	VRNIC_CMD_DEREG_MR        = 10,
	VRNIC_CMD_CREATE_CQ       = 11, /* 0 or 1 fd: the completion eventfd */
	VRNIC_CMD_DESTROY_CQ      = 12,
	VRNIC_CMD_CREATE_QP       = 13,
	VRNIC_CMD_MODIFY_QP       = 14,
	VRNIC_CMD_QUERY_QP        = 15,
	VRNIC_CMD_DESTROY_QP      = 16,
	VRNIC_CMD_CREATE_SRQ      = 17,
	VRNIC_CMD_MODIFY_SRQ      = 18,
	VRNIC_CMD_DESTROY_SRQ     = 19,
	VRNIC_CMD_CREATE_AH       = 20,
	VRNIC_CMD_DESTROY_AH      = 21,
	VRNIC_CMD_QUERY_SRQ       = 22,
	VRNIC_CMD_OPEN_EVENTS     = 23, /* ABI 1.1; reply: 1 fd, the event socket */
	/* Communication manager, ABI 1.2 (see "Communication manager" below) */
	VRNIC_CMD_CM_CREATE_ID    = 24,
	VRNIC_CMD_CM_DESTROY_ID   = 25,
	VRNIC_CMD_CM_LISTEN       = 26,
	VRNIC_CMD_CM_CONNECT      = 27,
	VRNIC_CMD_CM_ACCEPT       = 28,
	VRNIC_CMD_CM_REJECT       = 29,
	VRNIC_CMD_CM_ESTABLISH    = 30,
	VRNIC_CMD_CM_DISCONNECT   = 31,
	VRNIC_CMD_CM_INIT_QP_ATTR = 32,
	/* Memory windows, ABI 1.4 (see "Memory windows" below) */
	VRNIC_CMD_ALLOC_MW        = 40,
	VRNIC_CMD_DEALLOC_MW      = 41, /* struct vrnic_cmd_handle: the mw_handle */
	/* Memory and CQ changes, device memory: ABI 1.4 (see "Rereg MR,
	 * resize CQ, device memory" below) */
	VRNIC_CMD_REREG_MR        = 45,
	VRNIC_CMD_RESIZE_CQ       = 46,
	VRNIC_CMD_ALLOC_DM        = 47, /* reply: 1 fd, the DM's memfd */
	VRNIC_CMD_FREE_DM         = 48,
	VRNIC_CMD_REG_DM_MR       = 49,
	VRNIC_CMD_QUERY_DEVICE_EX = 50,
	/* On-demand paging, ABI 1.4 (see "On-demand paging" below) */
	VRNIC_CMD_ODP_ATTACH      = 53,
	VRNIC_CMD_REG_MR_ODP      = 54,
	VRNIC_CMD_ADVISE_MR       = 55,
	/* XRC (ABI 1.4): see "XRC" below */
	VRNIC_CMD_OPEN_XRCD       = 57, /* 0 or 1 fd: the file naming the domain */
	VRNIC_CMD_CLOSE_XRCD      = 58,
	VRNIC_CMD_CREATE_XRC_SRQ  = 59,
	VRNIC_CMD_CREATE_XRC_QP   = 60,
	/* 0x100..0x1ff: operator commands (vrnicctl); 0x200..0x2ff: fault
	 * injection. Their structs are defined with the features. */
	VRNIC_CMD_ADMIN_BASE      = 0x100,
	VRNIC_CMD_FAULT_BASE      = 0x200,
};

/* OPEN_CONTEXT. Reply fds: [0] the doorbell page memfd (map it shared,
 * read/write, db_page_size bytes), [1] the kick eventfd. */
struct vrnic_cmd_open_context {
	uint32_t abi_version;    /* VRNIC_ABI_VERSION */
	uint32_t flags;          /* reserved, 0 */
	char     client_name[32];/* for vrnicctl; NUL-padded, need not be terminated */
};

struct vrnic_resp_open_context {
	uint32_t abi_version;    /* the daemon's */
	uint32_t ctx_handle;
	uint32_t db_page_size;   /* bytes of the doorbell page memfd */
	uint32_t db_records;     /* records in it (record 0 is the page header) */
};

/* OPEN_EVENTS (ABI 1.1): no command struct, no reply struct. Reply fds:
 * [0] the context's asynchronous event socket, a SOCK_SEQPACKET socket the
 * client only reads: one datagram per event, struct vrnic_async_event. One
 * per context (a second OPEN_EVENTS fails with EBUSY); it lives as long as
 * the context. The daemon never waits on it: when its receive buffer is
 * full, events wait in the daemon, in order, and are sent as the client
 * reads; beyond 4 MiB waiting per context an event is dropped (and
 * counted: vrnicctl counters, async_events_dropped). End of file on it
 * means the daemon is gone (what libibverbs reports as
 * IBV_EVENT_DEVICE_FATAL).
 *
 * The QP events are the affiliated asynchronous errors of IBTA 11.6.3.1
 * and C9-222.1.1, as Linux drivers raise them: an error that a completion
 * reports (the error completion of the WR that failed: LOC_PROT_ERR,
 * RETRY_EXC_ERR, REM_ACCESS_ERR, ...) raises none, though the QP goes to
 * ERR; QP_FATAL (local work queue catastrophic error) is an error no
 * completion can report: a completion its CQ refused (with CQ_ERR on the
 * CQ), a broken ring (an impossible producer index), a change the daemon
 * could not apply; QP_REQ_ERR and QP_ACCESS_ERR are an RC responder's
 * class C errors (an invalid request; an R_Key or access violation) on a
 * request that consumed no receive WQE (RDMA WRITE, READ, atomic). A
 * client's own MODIFY_QP to ERR raises none. A library that does not know
 * an event type skips it. */
enum vrnic_event_type {               /* = enum ibv_event_type */
	VRNIC_EVENT_CQ_ERR                = 0,  /* element: CQ handle; the CQ overflowed */
	VRNIC_EVENT_QP_FATAL              = 1,  /* element: QPN; in ERR, an error no completion can report (see below) */
	VRNIC_EVENT_QP_REQ_ERR            = 2,  /* element: QPN; RC responder, invalid request, no receive completion; in ERR */
	VRNIC_EVENT_QP_ACCESS_ERR         = 3,  /* element: QPN; RC responder, access violation, no receive completion; in ERR */
	VRNIC_EVENT_DEVICE_FATAL          = 8,  /* never sent: end of file on the socket */
	VRNIC_EVENT_PORT_ACTIVE           = 9,  /* element: port number */
	VRNIC_EVENT_PORT_ERR              = 10, /* element: port number */
	VRNIC_EVENT_SRQ_LIMIT_REACHED     = 15, /* element: SRQ handle; the limit is disarmed (0) */
	VRNIC_EVENT_QP_LAST_WQE_REACHED   = 16, /* element: QPN of a QP with an SRQ, now in ERR */
};

struct vrnic_async_event {
	uint32_t event_type;     /* enum vrnic_event_type */
	uint32_t reserved;
	uint64_t element;        /* see enum vrnic_event_type */
};

/* ------------------------------------------------------------------------
 * Communication manager (ABI 1.2)
 *
 * The daemon runs the InfiniBand CM (IBTA vol. 1 ch. 12) on its own QP1
 * (a UD QP numbered 1, P_Key 0xFFFF, Q_Key 0x80010000) and carries its
 * MADs for the client, as the kernel's ucma does for librdmacm. The
 * client keeps its QPs: it moves them to INIT, RTR and RTS itself
 * (MODIFY_QP) with the attributes CM_INIT_QP_ATTR (or the event) gives,
 * exactly as librdmacm does with rdma_init_qp_attr; the daemon never
 * modifies a client's QP.
 *
 * A CM ID (an rdma_cm_id) is a handle of the context (its own handle
 * space, not the verbs objects'; 0 is never used) and goes with it: when
 * the context closes, each of its connections is ended as rdma_destroy_id
 * ends it (a handshake in progress is rejected, an established connection
 * gets a DREQ) and its listeners stop. Every command fails with ENOENT for
 * a CM ID the context does not own; a command the ID's state does not
 * allow fails with EINVAL.
 *
 * Active side:  CM_CREATE_ID, CM_CONNECT -> event CONNECT_RESPONSE (the
 *   REP: RTR and RTS the QP from the event's qp_attr, then CM_ESTABLISH,
 *   which sends the RTU) -> ESTABLISHED; or REJECTED / UNREACHABLE.
 * Passive side: CM_CREATE_ID, CM_LISTEN -> event CONNECT_REQUEST on a new
 *   CM ID (cm_id; listen_id is the listener): INIT and RTR the QP, then
 *   CM_ACCEPT (REP) or CM_REJECT -> ESTABLISHED when the RTU arrives (or
 *   when the client says the QP received something: CM_ESTABLISH).
 * Either side: CM_DISCONNECT (DREQ; or, after a DISCONNECTED event for a
 *   DREQ received, the DREP) -> DISCONNECTED -> TIMEWAIT_EXIT.
 * UD (SIDR): CM_CREATE_ID with VRNIC_QPT_UD, CM_CONNECT sends a SIDR_REQ
 *   -> CONNECT_RESPONSE with status 0 (peer_qpn, peer_qkey) or
 *   UNREACHABLE (status: the SIDR status, or ETIMEDOUT); a listening UD
 *   ID gets CONNECT_REQUEST and answers with CM_ACCEPT (qpn, qkey: a
 *   SIDR_REP of status 0) or CM_REJECT (status 2, rejected).
 *
 * Events travel on the context's event socket (OPEN_EVENTS), which must
 * be open before CM_LISTEN or CM_CONNECT (else EINVAL). A CM event is one
 * datagram holding a struct vrnic_cm_event; its first four bytes are the
 * event type, as in struct vrnic_async_event, and CM event types are
 * VRNIC_CM_EVENT_BASE (0x100) + enum rdma_cm_event_type, distinct from
 * every enum vrnic_event_type value. A reader that may see CM events
 * reads with a buffer of at least sizeof(struct vrnic_cm_event) (ABI 1.5:
 * of struct vrnic_cm_event_ece, for IDs created with VRNIC_CM_ID_F_ECE,
 * whose events carry the peer's ECE after it) and tells
 * the two apart by the type (or the datagram's length: 16 bytes for
 * struct vrnic_async_event). Only a context that created a CM ID gets CM
 * events. The daemon never waits on the socket: a CM event that does not
 * fit waits in the daemon with the others (see OPEN_EVENTS). While a
 * CONNECT_REQUEST is not answered, the daemon answers the peer's repeated
 * REQs with an MRA (service timeout 24, about 69 s), as rdma_cm does, so a
 * listener that falls behind is not taken for an unreachable one.
 * ------------------------------------------------------------------------ */

#define VRNIC_CM_MAX_PRIVATE_DATA 224 /* bytes of private_data below */
/* Largest private data per message (IBTA 12.6): what the peer sees. */
#define VRNIC_CM_REQ_PRIVATE_DATA      92
#define VRNIC_CM_REP_PRIVATE_DATA      196
#define VRNIC_CM_REJ_PRIVATE_DATA      148
#define VRNIC_CM_DREQ_PRIVATE_DATA     220
#define VRNIC_CM_SIDR_REQ_PRIVATE_DATA 216
#define VRNIC_CM_SIDR_REP_PRIVATE_DATA 136

/* CM_CREATE_ID. Reply: struct vrnic_resp_cm_id. */
struct vrnic_cmd_cm_create_id {
	uint32_t qp_type;        /* enum vrnic_qp_type of the QP it will connect: RC, UC or UD (SIDR) */
	uint32_t flags;          /* ABI 1.5: VRNIC_CM_ID_F_*; 0 before */
};

/* ABI 1.5: the ID (and, for a listener, its connection requests' IDs)
 * negotiates ECE (see "Enhanced Connection Establishment" below). */
#define VRNIC_CM_ID_F_ECE 0x1u

struct vrnic_resp_cm_id {
	uint32_t cm_id;          /* the new CM ID, never 0 */
	uint32_t reserved;
};

/* CM_DESTROY_ID: struct vrnic_cmd_handle (handle: the CM ID). No reply
 * struct. Ends the ID's connection as the context's close does; no event
 * is reported for it afterwards. */

/* CM_LISTEN. No reply struct. Connection requests (REQ; SIDR_REQ for a
 * UD ID) for service_id raise CONNECT_REQUEST on a new CM ID. At most
 * backlog requests (0: 128) are half open at a time: waiting for
 * CM_ACCEPT or CM_REJECT, or accepted and waiting for the peer's RTU. A
 * request beyond that is admitted and the oldest half-open one is shed:
 * one accepted and still without its RTU first (its peer gets a REJ, no
 * resources), else the oldest unanswered one (its peer repeats its REQ);
 * its CM ID gets REJECTED (status 3, no resources). A request still
 * unanswered when its peer has given up on it (at most 2 minutes) gets
 * REJECTED (status 4, timeout). One listener per service ID per daemon
 * (EADDRINUSE). service_id is rdma_cm's (port space << 16 | port:
 * 0x0106xxxx for TCP). */
struct vrnic_cmd_cm_listen {
	uint32_t cm_id;
	uint32_t backlog;
	uint64_t service_id;
};

/* CM_CONNECT. No reply struct. Sends the REQ (RC, UC) or the SIDR_REQ
 * (UD) to the CM of the port with GID dgid. The REQ carries the QP's
 * number, starting_psn (the first PSN this QP expects to receive: its
 * rq_psn in the RTR attributes, and the peer's sq_psn; each side
 * announces the PSN it expects and sends from the peer's, as Linux's CM
 * and rdma_cm do), the path (the device's GID sgid_index, dgid,
 * hop_limit, traffic_class, flow_label, path_mtu: 0 means the port's
 * active MTU, and the REQ offers at most the port's active MTU), responder
 * resources, initiator depth, retry_count, rnr_retry_count, srq and
 * private data (REQ: at most 92 bytes, SIDR_REQ 216; librdmacm puts a
 * cma_hdr first). cm_response_timeout is the CM response timeout exponent
 * (4.096 us * 2^t; 0: 20, rdma_cm's), max_cm_retries the REQ's retries
 * (0: 15); with the packet life time of 16 rdma_cm uses on RoCE, a REQ
 * waits 2 * 2^(16-8) ms + 2^max(t-8,0) ms per attempt (a SIDR_REQ
 * 2^max(t-8,0) ms), and the peer is unreachable after max_cm_retries + 1
 * attempts. */
struct vrnic_cmd_cm_connect {
	uint32_t cm_id;
	uint32_t qpn;                 /* RC, UC: the local QP; UD: ignored */
	uint32_t starting_psn;        /* 24 bits */
	uint32_t flow_label;          /* 20 bits */
	uint64_t service_id;
	uint8_t  dgid[16];
	uint8_t  sgid_index;
	uint8_t  hop_limit;           /* 0: 64 */
	uint8_t  traffic_class;
	uint8_t  path_mtu;            /* enum vrnic_mtu; 0: the port's */
	uint8_t  responder_resources;
	uint8_t  initiator_depth;
	uint8_t  retry_count;         /* 0..7 */
	uint8_t  rnr_retry_count;     /* 0..7 */
	uint8_t  srq;                 /* 1: the QP has an SRQ */
	uint8_t  cm_response_timeout; /* 0..31; 0: 20 */
	uint8_t  max_cm_retries;      /* 0..15; 0: 15 */
	uint8_t  private_data_len;
	uint8_t  private_data[VRNIC_CM_MAX_PRIVATE_DATA];
	uint32_t ece_options;         /* ABI 1.5, VRNIC_CM_ID_F_ECE: the ECE options the REQ offers; 0: none (before 1.5: reserved, 0) */
};

/* CM_ACCEPT. No reply struct. For a CONNECT_REQUEST's CM ID: sends the
 * REP with the QP's number, starting_psn (the first PSN it expects to
 * receive: the rq_psn of the RTR attributes, which the daemon drew when
 * the REQ arrived; the sq_psn of the RTS attributes is the REQ's
 * starting PSN), responder resources, initiator depth, rnr_retry_count, srq and private
 * data (at most 196 bytes). For a UD ID: the SIDR_REP, status 0, with qpn
 * and qkey (private data at most 136 bytes). */
struct vrnic_cmd_cm_accept {
	uint32_t cm_id;
	uint32_t qpn;
	uint32_t starting_psn;
	uint32_t qkey;                /* UD only */
	uint8_t  responder_resources;
	uint8_t  initiator_depth;
	uint8_t  rnr_retry_count;
	uint8_t  srq;
	uint8_t  reserved[3];
	uint8_t  private_data_len;
	uint8_t  private_data[VRNIC_CM_MAX_PRIVATE_DATA];
	/* ABI 1.5 (a 1.4 client sends the command without these 8 bytes):
	 * VRNIC_CM_ID_F_ECE, RC: the ECE options the QP took at RTR. */
	uint32_t ece_options;
	uint32_t reserved2;
};

/* CM_REJECT (a CONNECT_REQUEST, or a CONNECT_RESPONSE not yet answered):
 * the REJ, reason 28 (consumer defined) with the private data (at most
 * 148 bytes); a UD ID's SIDR_REP, status 2. CM_DISCONNECT: the DREQ (at
 * most 220 bytes) of an established connection, or the DREP answering a
 * DREQ received (DISCONNECTED with status 0 reported it). No reply
 * struct. */
struct vrnic_cmd_cm_private {
	uint32_t cm_id;
	uint8_t  reserved[3];
	uint8_t  private_data_len;
	uint8_t  private_data[VRNIC_CM_MAX_PRIVATE_DATA];
};

/* CM_ESTABLISH: struct vrnic_cmd_handle (handle: the CM ID). No reply
 * struct. Active side, after CONNECT_RESPONSE: sends the RTU (the
 * connection is ESTABLISHED; the event follows). Passive side, after
 * CM_ACCEPT: the QP received a packet before the RTU arrived (IBTA
 * 12.9.8.4; ib_cm_notify IB_EVENT_COMM_EST). */

/* CM_INIT_QP_ATTR: struct vrnic_cmd_cm_init_qp_attr. Reply: struct
 * vrnic_cm_qp_attr, the attributes MODIFY_QP needs to move the ID's QP to
 * qp_state (INIT, RTR or RTS), what rdma_init_qp_attr returns:
 * attr_mask says which fields are set (enum vrnic_qp_attr_mask bits;
 * VRNIC_QP_STATE is always set). RTR and RTS need the peer's QPN (after
 * CONNECT_REQUEST on the passive side, CONNECT_RESPONSE on the active
 * side; else EINVAL). */
struct vrnic_cmd_cm_init_qp_attr {
	uint32_t cm_id;
	uint32_t qp_state;       /* enum vrnic_qp_state: INIT, RTR or RTS */
};

struct vrnic_cm_qp_attr {
	uint32_t attr_mask;          /* enum vrnic_qp_attr_mask: the fields set */
	uint32_t qp_state;           /* enum vrnic_qp_state */
	uint32_t qp_access_flags;    /* INIT: enum vrnic_access (remote bits) */
	uint32_t path_mtu;           /* RTR: enum vrnic_mtu */
	uint32_t dest_qp_num;        /* RTR */
	uint32_t rq_psn;             /* RTR */
	uint32_t sq_psn;             /* RTS */
	uint32_t flow_label;         /* RTR: ah_attr.grh.flow_label */
	uint8_t  dgid[16];           /* RTR: ah_attr.grh.dgid */
	uint8_t  sgid_index;         /* RTR: ah_attr.grh.sgid_index */
	uint8_t  hop_limit;          /* RTR: ah_attr.grh.hop_limit */
	uint8_t  traffic_class;      /* RTR: ah_attr.grh.traffic_class */
	uint8_t  sl;                 /* RTR: ah_attr.sl */
	uint8_t  max_dest_rd_atomic; /* RTR, RC */
	uint8_t  min_rnr_timer;      /* RTR, RC */
	uint8_t  timeout;            /* RTS: local ACK timeout exponent */
	uint8_t  retry_cnt;          /* RTS, RC */
	uint8_t  rnr_retry;          /* RTS, RC */
	uint8_t  max_rd_atomic;      /* RTS, RC */
	uint8_t  port_num;           /* INIT: 1 */
	uint8_t  reserved;
	uint16_t pkey_index;         /* INIT: 0 (P_Key 0xFFFF) */
	uint16_t ece_options;        /* ABI 1.5, RTR with VRNIC_QP_ECE (VRNIC_CM_ID_F_ECE, RC): the agreed ECE options */
};

enum vrnic_cm_event_type {   /* VRNIC_CM_EVENT_BASE + enum rdma_cm_event_type */
	VRNIC_CM_EVENT_BASE             = 0x100,
	VRNIC_CM_EVENT_CONNECT_REQUEST  = 0x104, /* passive: a REQ (SIDR_REQ) on a listener; cm_id is new */
	VRNIC_CM_EVENT_CONNECT_RESPONSE = 0x105, /* active: the REP (RTR/RTS, then CM_ESTABLISH); UD: the SIDR_REP */
	VRNIC_CM_EVENT_UNREACHABLE      = 0x107, /* no answer after the retries (status ETIMEDOUT), or a SIDR_REP status != 0 (status) */
	VRNIC_CM_EVENT_REJECTED         = 0x108, /* a REJ: status = reason (28: by the peer's consumer), private data */
	VRNIC_CM_EVENT_ESTABLISHED      = 0x109,
	VRNIC_CM_EVENT_DISCONNECTED     = 0x10a, /* status 0: the peer's DREQ (answer with CM_DISCONNECT); 1: the DREP to ours; 2: ours timed out */
	VRNIC_CM_EVENT_TIMEWAIT_EXIT    = 0x10f, /* the connection is gone; the QP may be reused */
};

/* One datagram on the event socket per CM event. Fields not listed for
 * an event are 0. peer_* are the peer's values from the message the
 * event reports (CONNECT_REQUEST: the REQ or SIDR_REQ; CONNECT_RESPONSE:
 * the REP or SIDR_REP); peer_psn is its starting PSN, the PSN the peer
 * expects to receive: this side's sq_psn. qp_attr holds the attributes
 * of the ID's QP (CONNECT_REQUEST of RC/UC and CONNECT_RESPONSE: INIT,
 * RTR and RTS; rq_psn is this side's own receive PSN, which a
 * CONNECT_REQUEST's CM_ACCEPT passes as starting_psn); its attr_mask says
 * which are set. The path MTU is at most the port's active MTU, and
 * max_dest_rd_atomic and max_rd_atomic at most the device's
 * max_qp_rd_atom and max_qp_init_rd_atom, whatever the peer offered.
 * private_data_len is the message's whole private data field (the wire
 * carries no length). */
struct vrnic_cm_event {
	uint32_t event_type;          /* enum vrnic_cm_event_type */
	uint32_t cm_id;
	uint32_t listen_id;           /* CONNECT_REQUEST: the listening ID */
	uint32_t status;              /* see enum vrnic_cm_event_type (errno values positive) */
	uint64_t service_id;
	uint8_t  peer_gid[16];        /* the peer port's GID */
	uint32_t peer_qpn;
	uint32_t peer_psn;            /* the peer's starting PSN: the PSN it expects, this side's sq_psn */
	uint32_t peer_qkey;           /* SIDR_REP */
	uint8_t  responder_resources; /* the peer's */
	uint8_t  initiator_depth;     /* the peer's */
	uint8_t  retry_count;         /* REQ */
	uint8_t  rnr_retry_count;
	uint8_t  srq;                 /* the peer's QP has an SRQ */
	uint8_t  qp_type;             /* enum vrnic_qp_type */
	uint8_t  private_data_len;
	uint8_t  reserved;
	struct vrnic_cm_qp_attr qp_attr;
	uint8_t  private_data[VRNIC_CM_MAX_PRIVATE_DATA];
	uint8_t  reserved2[4];
};                                    /* 352 bytes */

/* QUERY_DEVICE: no command struct. Reply: */
struct vrnic_device_attr {
	char     fw_ver[32];
	uint64_t node_guid;
	uint64_t sys_image_guid;
	uint64_t max_mr_size;
	uint64_t page_size_cap;      /* bit n set: pages of 2^n bytes accepted */
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	uint32_t max_qp;
	uint32_t max_qp_wr;
	uint32_t device_cap_flags;   /* ABI 1.4: enum vrnic_device_cap, and VRNIC_DEVICE_XRC (= IBV_DEVICE_XRC) */
	uint32_t max_sge;
	uint32_t max_inline;
	uint32_t max_cq;
	uint32_t max_cqe;
	uint32_t max_mr;
	uint32_t max_pd;
	uint32_t max_qp_rd_atom;
	uint32_t max_qp_init_rd_atom;
	uint32_t max_srq;
	uint32_t max_srq_wr;
	uint32_t max_srq_sge;
	uint32_t max_ah;
	uint32_t max_host_mem;       /* host memory regions per context */
	uint32_t num_workers;
	uint8_t  atomic_cap;         /* enum ibv_atomic_cap: 1 = HCA-atomic */
	uint8_t  phys_port_cnt;
	uint8_t  placement_caps;     /* ABI 1.4: enum vrnic_placement_caps */
	uint8_t  reserved[1];
	uint32_t max_mw;             /* ABI 1.4: memory windows per device (0 before) */
};

/* device_cap_flags (ABI 1.4) */
enum vrnic_device_cap {
	VRNIC_DEVICE_MEM_WINDOW         = 1u << 0, /* type 1 memory windows (IBV_DEVICE_MEM_WINDOW) */
	VRNIC_DEVICE_MEM_WINDOW_TYPE_2B = 1u << 1, /* type 2B memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B) */
};

/* ABI 1.4: the IBTA 1.5 Memory Placement Extensions the device executes
 * (IB_UVERBS_DEVICE_ATOMIC_WRITE, _FLUSH_GLOBAL, _FLUSH_PERSISTENT in
 * device_cap_flags_ex). */
enum vrnic_placement_caps {
	VRNIC_PLACEMENT_ATOMIC_WRITE     = 1u << 0,
	VRNIC_PLACEMENT_FLUSH_GLOBAL     = 1u << 1,
	VRNIC_PLACEMENT_FLUSH_PERSISTENT = 1u << 2,
};

#define VRNIC_DEVICE_XRC (1u << 20) /* ABI 1.4: XRC domains, SRQs and QPs */

/* QUERY_PORT: command struct selects the port (1). */
struct vrnic_cmd_query_port {
	uint32_t port_num;
	uint32_t reserved;
};

struct vrnic_port_attr {
	uint32_t state;          /* enum ibv_port_state: 4 = ACTIVE */
	uint32_t max_mtu;        /* enum vrnic_mtu */
	uint32_t active_mtu;     /* enum vrnic_mtu */
	uint32_t gid_tbl_len;
	uint32_t max_msg_sz;
	uint32_t link_layer;     /* 2 = Ethernet (IBV_LINK_LAYER_ETHERNET) */
	uint32_t link_type;      /* enum vrnic_link_type */
	uint32_t reserved;
	uint8_t  mac[6];
	uint8_t  reserved2[2];
	uint64_t active_speed_mbps;
};

enum vrnic_link_type {
	VRNIC_LINK_MEM = 0, /* in-memory, tests */
	VRNIC_LINK_UDP = 1, /* UDP sockets, no privileges */
	VRNIC_LINK_TAP = 2, /* multi-queue TAP, Ethernet frames */
};

/* QUERY_GID */
struct vrnic_cmd_query_gid {
	uint32_t port_num;
	uint32_t index;
};

struct vrnic_resp_query_gid {
	uint8_t  gid[16];        /* IPv6 or IPv4-mapped (::ffff:a.b.c.d) */
	uint32_t gid_type;       /* 2 = RoCE v2 (IBV_GID_TYPE_ROCE_V2) */
	uint32_t valid;          /* 0: empty slot */
};

/* ADD_HOST_MEM: one fd attached, a memfd created with MFD_ALLOW_SEALING and
 * sealed with F_SEAL_SHRINK, at least length bytes long. length must be a
 * multiple of 4096 (of 2 MiB for 2 MiB pages). The reply names the base of
 * its range in the device physical address space: PA base+x is byte x of
 * the memfd. */
struct vrnic_cmd_add_host_mem {
	uint64_t length;
	uint32_t flags;          /* reserved, 0 */
	uint32_t reserved;
};

struct vrnic_resp_add_host_mem {
	uint64_t pa_base;
	uint32_t handle;
	uint32_t locked;         /* 1: what MRs and rings pin is mlock()ed as they pin it, 0: never locked */
};

/* Commands that take one handle (REMOVE_HOST_MEM, DEALLOC_PD, DEREG_MR,
 * DESTROY_CQ, DESTROY_QP (qpn), DESTROY_SRQ, DESTROY_AH, QUERY_QP (qpn),
 * QUERY_SRQ). */
struct vrnic_cmd_handle {
	uint32_t handle;
	uint32_t reserved;
};

/* ALLOC_PD reply */
struct vrnic_resp_alloc_pd {
	uint32_t pd_handle;
	uint32_t reserved;
};

/* Access flags (IBV_ACCESS_*). Remote write and remote atomic require local
 * write (IBTA 10.6.3.1 / C10-83). */
enum vrnic_access {
	VRNIC_ACCESS_LOCAL_WRITE   = 1u << 0,
	VRNIC_ACCESS_REMOTE_WRITE  = 1u << 1,
	VRNIC_ACCESS_REMOTE_READ   = 1u << 2,
	VRNIC_ACCESS_REMOTE_ATOMIC = 1u << 3,
	VRNIC_ACCESS_MW_BIND       = 1u << 4, /* ABI 1.4: REG_MR: memory windows may be bound to the MR */
	VRNIC_ACCESS_ZERO_BASED    = 1u << 5, /* ABI 1.4: BIND_MW of a type 2 window: remote addresses are offsets into it */
	/* ABI 1.4: FLUSH (IBTA 1.5 Memory Placement Extensions) with the
	 * global visibility / persistence placement type may target the MR
	 * (IBV_ACCESS_FLUSH_GLOBAL, IBV_ACCESS_FLUSH_PERSISTENT). */
	VRNIC_ACCESS_FLUSH_GLOBAL     = 1u << 8,
	VRNIC_ACCESS_FLUSH_PERSISTENT = 1u << 9,
};

/* ------------------------------------------------------------------------
 * Memory windows (ABI 1.4), IBTA 10.6.7, as Linux rxe.
 *
 * ALLOC_MW allocates a window of type 1 or 2 in a PD; any other type is
 * EINVAL. The reply's rkey is the window's key before its first bind; its
 * upper 24 bits never change, the consumer chooses the low 8 at each bind
 * (ibv_inc_rkey). mw_handle names the window in DEALLOC_MW and in a BIND_MW
 * WQE. DEALLOC_MW of a bound window unbinds it first.
 *
 * A window is bound by a VRNIC_WR_BIND_MW send WQE (below), executed in
 * order with the QP's other WQEs: a type 1 window by any QP of its PD
 * (length 0 unbinds it), a type 2 window only when free, to a non-empty
 * range, and then only the QP that bound it may use its rkey. The MR must
 * be of the QP's PD, registered with VRNIC_ACCESS_MW_BIND (and local write
 * for a window with remote write or atomic rights), and contain the range.
 * A refused bind completes with VRNIC_WC_MW_BIND_ERR and the QP goes to
 * ERR. LOCAL_INV and SEND_WITH_INV of a type 2 window's rkey free it (a
 * type 1 window's: refused, VRNIC_WC_LOC_PROT_ERR / NAK Invalid Request).
 * DEREG_MR of an MR with windows bound fails with EINVAL. A remote access
 * through an unbound, freed or deallocated window's rkey is NAKed with a
 * Remote Access Error (VRNIC_WC_REM_ACCESS_ERR at the requester).
 * ------------------------------------------------------------------------ */
enum vrnic_mw_type {
	VRNIC_MW_TYPE_1 = 1,
	VRNIC_MW_TYPE_2 = 2,
};

struct vrnic_cmd_alloc_mw {
	uint32_t pd_handle;
	uint32_t type;           /* enum vrnic_mw_type */
};

struct vrnic_resp_alloc_mw {
	uint32_t mw_handle;
	uint32_t rkey;
};

/* REG_MR: the page table a kernel driver would build after pinning. The MR
 * covers [iova, iova+length). Page i of the MR (iova rounded down to the page
 * size, plus i pages) lives at physical address pages[i]; each must be
 * aligned to the page size and lie wholly inside host memory of this
 * context. npages must equal the number of pages [iova, iova+length) touches.
 * If npages <= VRNIC_INLINE_PAGES, pbl_pa is 0 and npages u64 physical
 * addresses follow this struct in the datagram; otherwise pbl_pa is the PA of
 * an array of npages u64 physical addresses in host memory (the daemon copies
 * it at registration; the client may reuse the memory afterwards). */
struct vrnic_cmd_reg_mr {
	uint64_t iova;
	uint64_t length;
	uint64_t pbl_pa;
	uint32_t pd_handle;
	uint32_t access;         /* enum vrnic_access */
	uint32_t page_shift;     /* VRNIC_PAGE_SHIFT_4K or VRNIC_PAGE_SHIFT_2M */
	uint32_t npages;
	/* uint64_t pages[npages] when pbl_pa == 0 */
};

/* lkey and rkey: (index << 8) | variant. The 8-bit variant changes every
 * time an index is reused, so a stale key never matches a new MR. Every
 * MR has an rkey, as on Linux (ABI 1.4; it was 0 without remote access):
 * a remote access to an MR without the remote right fails its access
 * check. */
struct vrnic_resp_reg_mr {
	uint32_t mr_handle;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t reserved;
};

/* ------------------------------------------------------------------------
 * On-demand paging (ABI 1.4)
 *
 * An ODP MR names a range of the client process's virtual memory instead
 * of host memory: nothing is shared, pinned or remapped at registration.
 * The daemon reads and writes the process's memory when traffic touches
 * it (process_vm_readv/process_vm_writev on the client's pid, which needs
 * ptrace access: the same uid or CAP_SYS_PTRACE, and under Yama
 * ptrace_scope 1 the client's PR_SET_PTRACER naming the daemon), so what
 * the program maps, unmaps or remaps in the range later is what the device
 * sees. An address not mapped (or not writable for a write) when it is
 * accessed fails that access: a local SGE completes with
 * IBV_WC_LOC_PROT_ERR, a remote request is NAKed (remote access error).
 * Atomics on ODP memory are atomic against the device's other atomics
 * (IBV_ATOMIC_HCA), not against the CPU's stores.
 * ------------------------------------------------------------------------ */

/* ODP_ATTACH: proves the connection's peer pid (SO_PEERCRED) is this
 * client: the client writes nonce (random bytes) at nonce_addr in its own
 * memory and keeps it there until the reply. The daemon reads it back
 * through the pid. Fails with EPERM when the daemon may not access the
 * process, EACCES when the nonce is not there, EOPNOTSUPP when the pid is
 * not visible to the daemon (another pid namespace). Again on an attached
 * context: the same reply. Reply: */
struct vrnic_cmd_odp_attach {
	uint64_t nonce_addr;
	uint8_t  nonce[16];
	uint32_t flags;          /* reserved, 0 */
	uint32_t reserved;
};

/* What ODP covers (struct ibv_odp_caps): general_caps VRNIC_ODP_SUPPORT*,
 * per transport VRNIC_ODP_SUPPORT_SEND.. bits. */
struct vrnic_resp_odp_attach {
	uint64_t general_caps;
	uint32_t rc_odp_caps;
	uint32_t uc_odp_caps;
	uint32_t ud_odp_caps;
	uint32_t xrc_odp_caps;
};

enum vrnic_odp_general_caps {
	VRNIC_ODP_SUPPORT          = 1u << 0, /* IBV_ODP_SUPPORT */
	VRNIC_ODP_SUPPORT_IMPLICIT = 1u << 1, /* IBV_ODP_SUPPORT_IMPLICIT */
};

enum vrnic_odp_transport_caps {
	VRNIC_ODP_SUPPORT_SEND     = 1u << 0,
	VRNIC_ODP_SUPPORT_RECV     = 1u << 1,
	VRNIC_ODP_SUPPORT_WRITE    = 1u << 2,
	VRNIC_ODP_SUPPORT_READ     = 1u << 3,
	VRNIC_ODP_SUPPORT_ATOMIC   = 1u << 4,
	VRNIC_ODP_SUPPORT_SRQ_RECV = 1u << 5,
};

/* REG_MR_ODP (after ODP_ATTACH; else EOPNOTSUPP): the MR covers [iova,
 * iova+length), which is [addr, addr+length) of the client's memory (iova
 * and addr at the same offset in a 4 KiB page; length 1..VRNIC_MAX_MR_SIZE).
 * With VRNIC_ODP_F_IMPLICIT, iova and addr are 0 and length is UINT64_MAX:
 * the implicit MR over the whole address space. Access flags as REG_MR.
 * Reply: struct vrnic_resp_reg_mr; DEREG_MR releases it. */
struct vrnic_cmd_reg_mr_odp {
	uint64_t addr;
	uint64_t iova;
	uint64_t length;
	uint32_t pd_handle;
	uint32_t access;         /* enum vrnic_access */
	uint32_t flags;          /* VRNIC_ODP_F_* */
	uint32_t reserved;
};

#define VRNIC_ODP_F_IMPLICIT 0x1u

/* ADVISE_MR (ibv_advise_mr): num_sge (1..VRNIC_MAX_SGE) struct vrnic_sge
 * follow, each naming by lkey an ODP MR of this context in pd_handle.
 * advice: enum ibv_advise_mr_advice (PREFETCH 0, PREFETCH_WRITE 1,
 * PREFETCH_NO_FAULT 2; others EOPNOTSUPP); flags: VRNIC_ADVISE_MR_F_FLUSH
 * or 0 (others EINVAL). With FLUSH the pages are faulted in before the
 * reply, and an SGE naming no ODP MR of the PD (or one without local write
 * for PREFETCH_WRITE) fails with ENOENT, one outside its MR or on unmapped
 * memory with EFAULT; without it only the MRs are checked (EINVAL) and the
 * fault-in's errors are not reported, as the kernel's asynchronous
 * prefetch. No reply struct. */
struct vrnic_cmd_advise_mr {
	uint32_t pd_handle;
	uint32_t advice;
	uint32_t flags;
	uint32_t num_sge;
	/* struct vrnic_sge sges[num_sge] */
};

#define VRNIC_ADVISE_MR_F_FLUSH 0x1u

/* CREATE_CQ: the ring is cqe_count entries of struct vrnic_cqe at ring_pa
 * (cqe_count a power of two, 2..VRNIC_MAX_CQE; the ring 64-byte aligned and
 * zeroed by the client). Optional fd: the completion eventfd, written (8-byte
 * value 1) when the CQ is armed and a matching completion arrives. */
struct vrnic_cmd_create_cq {
	uint64_t ring_pa;
	uint32_t cqe_count;
	uint32_t flags;          /* enum vrnic_cq_flags (ABI 1.4; 0 before) */
};

/* CREATE_CQ flags (ABI 1.4). VRNIC_CQ_F_TIMESTAMP: completion timestamps.
 * The ring is then cqe_count CQEs followed by cqe_count uint64_t, the
 * timestamp of CQE i at index i mod cqe_count: the device's clock, in
 * nanoseconds of the host's CLOCK_REALTIME (the device clock ticks at
 * 1 GHz), written before the CQE's owner byte. RESIZE_CQ keeps the flag:
 * the new ring has the same layout, timestamps carried over with their
 * CQEs. */
enum vrnic_cq_flags {
	VRNIC_CQ_F_TIMESTAMP = 1u << 0,
};

struct vrnic_resp_create_cq {
	uint32_t cq_handle;
	uint32_t db_index;       /* record index in the doorbell page */
};

/* QP types (IBV_QPT_*).
 *   RC: SEND (with immediate, with invalidate), RDMA WRITE (with immediate),
 *       RDMA READ, atomics, LOCAL_INV; acknowledged, retried.
 *   UC: SEND and RDMA WRITE (with and without immediate); no
 *       acknowledgements: a send WR completes once its last packet left the
 *       device. The receiver drops the rest of a message after a lost packet
 *       (silently: nothing completes for it; a receive WR a dropped SEND had
 *       taken is used by the next SEND) and resumes with the next message.
 *   UD: SEND and SEND with immediate, one packet (at most the port's
 *       active_mtu bytes) per message, each WR naming its destination (the
 *       UD segment of struct vrnic_send_wqe). Receives get the GRH first
 *       (VRNIC_GRH_LEN, struct vrnic_cqe). QP numbers 0 and 1 are never
 *       handed out.
 * A UD or UC QP whose send WR completes in error goes to SQE: later send WRs
 * complete with VRNIC_WC_WR_FLUSH_ERR, receives go on, and MODIFY_QP
 * SQE -> RTS resumes sending. An RC QP goes to ERR instead. */
enum vrnic_qp_type {
	VRNIC_QPT_RC = 2,
	VRNIC_QPT_UC = 3,
	VRNIC_QPT_UD = 4,
	VRNIC_QPT_XRC_SEND = 9,  /* ABI 1.4: XRC initiator (CREATE_QP): send only */
	VRNIC_QPT_XRC_RECV = 10, /* ABI 1.4: XRC target (CREATE_XRC_QP): no queues */
};

struct vrnic_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
	uint32_t reserved;
};

/* Send WQE slot size in 64-byte blocks: the control block plus room for the
 * larger of the SGE list and the inline data. */
#define VRNIC_WQE_BLOCK 64u
#define VRNIC_SGES_PER_BLOCK 4u
#define VRNIC_DIV_UP(a, b) (((a) + (b) - 1) / (b))
#define VRNIC_SQ_WQE_BLOCKS(max_sge, max_inline) \
	(1u + (VRNIC_DIV_UP((max_sge), VRNIC_SGES_PER_BLOCK) > \
	       VRNIC_DIV_UP((max_inline), VRNIC_WQE_BLOCK) ? \
	       VRNIC_DIV_UP((max_sge), VRNIC_SGES_PER_BLOCK) : \
	       VRNIC_DIV_UP((max_inline), VRNIC_WQE_BLOCK)))
/* Receive WQE slot size in bytes: the 16-byte RQE header plus the SGEs,
 * rounded up to 64 bytes. */
#define VRNIC_RQ_WQE_SIZE(max_sge) \
	(VRNIC_DIV_UP(16u + 16u * (max_sge), 64u) * 64u)

/* CREATE_QP. max_send_wr and max_recv_wr are the slot counts of the rings
 * and must be powers of two (1..VRNIC_MAX_QP_WR); the SQ ring is
 * max_send_wr * VRNIC_SQ_WQE_BLOCKS(max_send_sge, max_inline_data) * 64
 * bytes, the RQ ring max_recv_wr * VRNIC_RQ_WQE_SIZE(max_recv_sge) bytes,
 * both 64-byte aligned, each inside one host memory region. With an SRQ the
 * RQ is absent (rq_pa 0, max_recv_wr 0). */
struct vrnic_cmd_create_qp {
	uint64_t sq_pa;
	uint64_t rq_pa;
	uint32_t qp_type;        /* enum vrnic_qp_type */
	uint32_t pd_handle;
	uint32_t send_cq;
	uint32_t recv_cq;
	uint32_t srq_handle;     /* VRNIC_NO_SRQ for none */
	uint32_t sq_sig_all;     /* 1: every send WR completes signaled */
	struct vrnic_qp_cap cap;
};

#define VRNIC_NO_SRQ 0xffffffffu

struct vrnic_resp_create_qp {
	uint32_t qpn;            /* also the handle for QP commands */
	uint32_t db_index;       /* record index in the doorbell page */
	uint32_t sq_wqe_blocks;  /* VRNIC_SQ_WQE_BLOCKS(...) as the daemon computed */
	uint32_t rq_wqe_size;    /* VRNIC_RQ_WQE_SIZE(...) */
	struct vrnic_qp_cap cap; /* as granted */
};

/* QP states (IBV_QPS_*) */
enum vrnic_qp_state {
	VRNIC_QPS_RESET = 0,
	VRNIC_QPS_INIT  = 1,
	VRNIC_QPS_RTR   = 2,
	VRNIC_QPS_RTS   = 3,
	VRNIC_QPS_SQD   = 4,
	VRNIC_QPS_SQE   = 5,
	VRNIC_QPS_ERR   = 6,
};

/* Path MTU (IBV_MTU_*) */
enum vrnic_mtu {
	VRNIC_MTU_256  = 1,
	VRNIC_MTU_512  = 2,
	VRNIC_MTU_1024 = 3,
	VRNIC_MTU_2048 = 4,
	VRNIC_MTU_4096 = 5,
};

/* MODIFY_QP attribute mask (IBV_QP_*) */
enum vrnic_qp_attr_mask {
	VRNIC_QP_STATE              = 1u << 0,
	VRNIC_QP_CUR_STATE          = 1u << 1,
	VRNIC_QP_EN_SQD_ASYNC_NOTIFY = 1u << 2,
	VRNIC_QP_ACCESS_FLAGS       = 1u << 3,
	VRNIC_QP_PKEY_INDEX         = 1u << 4,
	VRNIC_QP_PORT               = 1u << 5,
	VRNIC_QP_QKEY               = 1u << 6,
	VRNIC_QP_AV                 = 1u << 7,
	VRNIC_QP_PATH_MTU           = 1u << 8,
	VRNIC_QP_TIMEOUT            = 1u << 9,
	VRNIC_QP_RETRY_CNT          = 1u << 10,
	VRNIC_QP_RNR_RETRY          = 1u << 11,
	VRNIC_QP_RQ_PSN             = 1u << 12,
	VRNIC_QP_MAX_QP_RD_ATOMIC   = 1u << 13,
	VRNIC_QP_ALT_PATH           = 1u << 14,
	VRNIC_QP_MIN_RNR_TIMER      = 1u << 15,
	VRNIC_QP_SQ_PSN             = 1u << 16,
	VRNIC_QP_MAX_DEST_RD_ATOMIC = 1u << 17,
	VRNIC_QP_PATH_MIG_STATE     = 1u << 18,
	VRNIC_QP_CAP                = 1u << 19,
	VRNIC_QP_DEST_QPN           = 1u << 20,
	/* ABI 1.5, vrnic's own (beyond the IBV_QP_* bits): ece_options of
	 * struct vrnic_cmd_modify_qp ("ECE" below). */
	VRNIC_QP_ECE                = 1u << 30,
};

/* Address vector (RoCE v2: the GRH fields become the IP header). */
struct vrnic_ah_attr {
	uint8_t  dgid[16];       /* peer GID: IPv6 or IPv4-mapped */
	uint32_t flow_label;
	uint8_t  sgid_index;     /* into the port's GID table */
	uint8_t  hop_limit;      /* IP TTL / hop limit; 0 means 64 */
	uint8_t  traffic_class;  /* IP DSCP/ECN byte */
	uint8_t  sl;
	uint8_t  port_num;
	uint8_t  reserved[7];
};

struct vrnic_qp_attr {
	uint32_t qp_state;       /* enum vrnic_qp_state */
	uint32_t cur_qp_state;
	uint32_t path_mtu;       /* enum vrnic_mtu */
	uint32_t qkey;
	uint32_t rq_psn;         /* 24 bits */
	uint32_t sq_psn;         /* 24 bits */
	uint32_t dest_qp_num;    /* 24 bits */
	uint32_t qp_access_flags;/* enum vrnic_access (remote bits) */
	uint16_t pkey_index;
	uint8_t  max_rd_atomic;
	uint8_t  max_dest_rd_atomic;
	uint8_t  min_rnr_timer;  /* 5-bit IBTA RNR timer code */
	uint8_t  timeout;        /* 5 bits: 4.096 us * 2^timeout, 0 = infinite */
	uint8_t  retry_cnt;      /* 3 bits */
	uint8_t  rnr_retry;      /* 3 bits, 7 = infinite */
	uint8_t  sq_draining;
	uint8_t  port_num;
	uint8_t  en_sqd_async_notify;
	uint8_t  path_mig_state; /* enum ibv_mig_state; 0 (MIGRATED) unless PATH_MIG_STATE is in the mask */
	struct vrnic_ah_attr ah_attr;
	struct vrnic_qp_cap cap;
};

/* MODIFY_QP. ABI 1.5 added ece_options and reserved: the daemon also
 * takes the command of a 1.4 client, the first
 * offsetof(struct vrnic_cmd_modify_qp, ece_options) bytes (without
 * VRNIC_QP_ECE, which needs the whole struct). */
struct vrnic_cmd_modify_qp {
	uint32_t qpn;
	uint32_t attr_mask;      /* enum vrnic_qp_attr_mask */
	struct vrnic_qp_attr attr;
	uint32_t ece_options;    /* ABI 1.5, with VRNIC_QP_ECE: enum vrnic_ece_option bits ("ECE" below) */
	uint32_t reserved;       /* ABI 1.5: 0 */
};

/* QUERY_QP reply */
struct vrnic_resp_query_qp {
	struct vrnic_qp_attr attr;
	uint32_t qp_type;
	uint32_t sq_sig_all;
	uint32_t send_cq;
	uint32_t recv_cq;
	uint32_t srq_handle;
	uint32_t pd_handle;
	uint32_t ece_options;    /* ABI 1.5: the ECE options in force (enum vrnic_ece_option; 0 before 1.5) */
	uint64_t packets_sent;
	uint64_t packets_received;
	uint64_t retransmits;
	uint64_t rnr_naks_received;
};

/* CREATE_SRQ: max_wr slots (power of two) of VRNIC_RQ_WQE_SIZE(max_sge)
 * bytes at ring_pa. */
struct vrnic_cmd_create_srq {
	uint64_t ring_pa;
	uint32_t pd_handle;
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;      /* 0: not armed */
};

struct vrnic_resp_create_srq {
	uint32_t srq_handle;
	uint32_t db_index;
	uint32_t rq_wqe_size;
	uint32_t reserved;
};

/* MODIFY_SRQ: only the limit may change (IBV_SRQ_LIMIT). */
struct vrnic_cmd_modify_srq {
	uint32_t srq_handle;
	uint32_t srq_limit;
};

struct vrnic_resp_query_srq {
	uint32_t max_wr;
	uint32_t max_sge;
	uint32_t srq_limit;
	uint32_t reserved;
};

/* CREATE_AH (for UD sends). The AH is usable by the UD QPs of the same PD
 * of this context. On a device whose link addresses peers by MAC (link type
 * TAP) the daemon resolves the destination's MAC here (ARP or neighbour
 * discovery, a few seconds at most) and fails with EHOSTUNREACH if it gets no
 * answer, as ib_create_ah does on RoCE. On the other links any destination
 * is accepted; sends to a GID nobody has complete successfully and are lost
 * (UD is unreliable). hop_limit, traffic_class and flow_label go into the IP
 * header on links whose frames the daemon builds (TAP); sl is not carried by
 * RoCE without VLANs. */
struct vrnic_cmd_create_ah {
	uint32_t pd_handle;
	uint32_t reserved;
	struct vrnic_ah_attr attr;
};

struct vrnic_resp_create_ah {
	uint32_t ah_handle;
	uint32_t reserved;
};

/* ------------------------------------------------------------------------
 * XRC (ABI 1.4; IBTA vol. 1 XRC, libibverbs ibv_open_xrcd,
 * ibv_create_srq_ex with IBV_SRQT_XRC, ibv_create_qp_ex with
 * IBV_QPT_XRC_SEND / IBV_QPT_XRC_RECV).
 *
 * An XRC domain groups XRC SRQs and XRC target QPs. OPEN_XRCD with an fd
 * names the domain by the file's inode, as the kernel's ib_uverbs_open_xrcd
 * does: the contexts that open the same file share one domain (with
 * O_CREAT it is made if it does not exist yet; without, ENOENT; O_EXCL and
 * an existing domain, EEXIST); without an fd the domain is the context's
 * alone. Each OPEN_XRCD gives the context a handle; CLOSE_XRCD drops it
 * (EBUSY while the context still has XRC SRQs or target QPs in it), and the
 * domain goes with its last handle.
 *
 * An XRC SRQ (CREATE_XRC_SRQ) is an SRQ of a domain with its own CQ: every
 * receive it takes completes there. Its srq_num (device-wide, 24 bits)
 * is what initiators name in their WQEs (remote_qpn of the send WQE).
 * MODIFY_SRQ, QUERY_SRQ, DESTROY_SRQ take its handle as any SRQ's.
 *
 * An initiator QP (CREATE_QP, VRNIC_QPT_XRC_SEND) has a send queue only
 * (rq_pa 0, no SRQ, max_recv_wr 0; recv_cq is ignored). A target QP
 * (CREATE_XRC_QP) has no queues a client posts to: its SQ ring and CQs
 * exist for the command's sake only (the daemon never reads the ring);
 * a request it receives lands in the XRC SRQ its XRCETH names, which must
 * be of the target QP's domain (else NAK Invalid Request: the requester's
 * WR completes with VRNIC_WC_REM_INV_REQ_ERR). RDMA WRITE, READ and
 * atomics are checked against the PD of that SRQ.
 * ------------------------------------------------------------------------ */
#define VRNIC_XRCD_O_CREAT 0x40u /* = O_CREAT */
#define VRNIC_XRCD_O_EXCL  0x80u /* = O_EXCL */

struct vrnic_cmd_open_xrcd {
	uint32_t oflags;         /* VRNIC_XRCD_O_*; with an fd only */
	uint32_t reserved;
};

struct vrnic_resp_open_xrcd {
	uint32_t xrcd_handle;
	uint32_t reserved;
};

/* CREATE_XRC_SRQ: as CREATE_SRQ, plus the domain and the CQ. */
struct vrnic_cmd_create_xrc_srq {
	struct vrnic_cmd_create_srq srq;
	uint32_t xrcd_handle;
	uint32_t cq_handle;
};

struct vrnic_resp_create_xrc_srq {
	struct vrnic_resp_create_srq srq;
	uint32_t srq_num;        /* 24 bits: what initiators name */
	uint32_t reserved;
};

/* CREATE_XRC_QP: a target QP of a domain; qp as for CREATE_QP with
 * qp_type VRNIC_QPT_XRC_RECV. Reply: struct vrnic_resp_create_qp. */
struct vrnic_cmd_create_xrc_qp {
	struct vrnic_cmd_create_qp qp;
	uint32_t xrcd_handle;
	uint32_t reserved;
};

/* ------------------------------------------------------------------------
 * Send WQE: a slot of sq_wqe_blocks 64-byte blocks. Block 0 is
 * struct vrnic_send_wqe; the following blocks hold num_sge struct vrnic_sge
 * (four per block), or inline_len bytes of inline data.
 * ------------------------------------------------------------------------ */

/* Send opcodes (IBV_WR_*) */
enum vrnic_wr_opcode {
	VRNIC_WR_RDMA_WRITE           = 0,
	VRNIC_WR_RDMA_WRITE_WITH_IMM  = 1,
	VRNIC_WR_SEND                 = 2,
	VRNIC_WR_SEND_WITH_IMM        = 3,
	VRNIC_WR_RDMA_READ            = 4,
	VRNIC_WR_ATOMIC_CMP_AND_SWP   = 5,
	VRNIC_WR_ATOMIC_FETCH_AND_ADD = 6,
	VRNIC_WR_LOCAL_INV            = 7,
	VRNIC_WR_BIND_MW              = 8, /* ABI 1.4, see struct vrnic_send_wqe */
	VRNIC_WR_SEND_WITH_INV        = 9,
	/* ABI 1.4, IBTA 1.5 Memory Placement Extensions (RC only):
	 * FLUSH: remote_addr, rkey; compare_add is the length (ignored with
	 * the whole-region selectivity level); swap holds the FETH bits:
	 * placement type in bits 0-3 (VRNIC_FLUSH_GLOBAL,
	 * VRNIC_FLUSH_PERSISTENT, at least one), selectivity level in bits
	 * 4-5 (VRNIC_FLUSH_RANGE, VRNIC_FLUSH_MR); no SGE, no inline data.
	 * ATOMIC_WRITE: remote_addr (8-byte aligned), rkey; the 8 bytes of
	 * compare_add, as they lie in the WQE, are what the responder stores
	 * at once; no SGE, no inline data. */
	VRNIC_WR_FLUSH                = 14,
	VRNIC_WR_ATOMIC_WRITE         = 15,
};

/* FLUSH placement types and selectivity levels (ABI 1.4; the FETH's PLT
 * and SEL, IBV_FLUSH_*). */
enum vrnic_flush {
	VRNIC_FLUSH_GLOBAL     = 1u << 0,
	VRNIC_FLUSH_PERSISTENT = 1u << 1,
	VRNIC_FLUSH_RANGE      = 0,
	VRNIC_FLUSH_MR         = 1,
};

/* Send flags (IBV_SEND_*) */
enum vrnic_send_flags {
	VRNIC_SEND_FENCE     = 1u << 0,
	VRNIC_SEND_SIGNALED  = 1u << 1,
	VRNIC_SEND_SOLICITED = 1u << 2,
	VRNIC_SEND_INLINE    = 1u << 3,
};

struct vrnic_sge {
	uint64_t addr;           /* virtual address inside the MR of lkey */
	uint32_t length;
	uint32_t lkey;
};

struct vrnic_send_wqe {
	/* control segment */
	uint64_t wr_id;
	uint8_t  opcode;         /* enum vrnic_wr_opcode */
	uint8_t  flags;          /* enum vrnic_send_flags */
	uint8_t  num_sge;        /* SGEs that follow (0 with VRNIC_SEND_INLINE) */
	uint8_t  reserved0;
	uint32_t imm_data;       /* *_WITH_IMM: the value; sent big-endian */
	uint32_t invalidate_rkey;/* SEND_WITH_INV, LOCAL_INV */
	uint32_t inline_len;     /* with VRNIC_SEND_INLINE */
	/* remote address segment: RDMA WRITE/READ, atomics */
	uint64_t remote_addr;
	uint32_t rkey;
	/* UD segment (UD QPs only; ignored otherwise) */
	uint32_t remote_qpn;     /* destination QP, 24 bits; ABI 1.4, XRC_SEND
	                          * QPs: the remote XRC SRQ number (the XRCETH) */
	uint32_t remote_qkey;    /* its Q_Key; bit 31 set: the sending QP's own
	                          * Q_Key (IBTA 10.2.5) */
	uint32_t ah_handle;      /* an AH of this context and the QP's PD: else
	                          * VRNIC_WC_LOC_QP_OP_ERR (unknown handle) or
	                          * VRNIC_WC_LOC_PROT_ERR (another PD); a message
	                          * longer than the port's MTU completes with
	                          * VRNIC_WC_LOC_LEN_ERR */
	/* atomic segment */
	uint64_t compare_add;    /* CMP_AND_SWP: compare; FETCH_AND_ADD: add */
	uint64_t swap;
};
/* VRNIC_WR_BIND_MW (ABI 1.4) uses the fields above as:
 *   invalidate_rkey  the window's mw_handle (ALLOC_MW)
 *   rkey             the window's rkey after the bind (same upper 24 bits)
 *   imm_data         the MR's lkey (ignored when length is 0)
 *   remote_addr      the window's first byte, a virtual address of the MR
 *   compare_add      the window's length (0: unbind a type 1 window)
 *   swap             the window's access: enum vrnic_access bits REMOTE_*,
 *                    ZERO_BASED and LOCAL_WRITE (ignored), the rest 0
 * with num_sge 0 and no inline data; it completes with VRNIC_WC_BIND_MW. */

/* ------------------------------------------------------------------------
 * Receive WQE (RQ and SRQ): a slot of rq_wqe_size bytes.
 * ------------------------------------------------------------------------ */
struct vrnic_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t reserved;
	/* struct vrnic_sge sg_list[num_sge]; */
};

/* ------------------------------------------------------------------------
 * CQE: the CQ ring holds cqe_count of these. Entry i is valid when its
 * owner bit (bit 0 of owner) equals 1 - ((i / cqe_count) & 1), i being the
 * free-running consumer index: the first pass writes 1, the second 0, and
 * so on. The daemon writes every other field first and the owner byte last
 * (release); a client reads the owner byte (acquire) before the rest.
 * ------------------------------------------------------------------------ */

/* Completion opcodes (IBV_WC_*) */
enum vrnic_wc_opcode {
	VRNIC_WC_SEND               = 0,
	VRNIC_WC_RDMA_WRITE         = 1,
	VRNIC_WC_RDMA_READ          = 2,
	VRNIC_WC_COMP_SWAP          = 3,
	VRNIC_WC_FETCH_ADD          = 4,
	VRNIC_WC_BIND_MW            = 5,
	VRNIC_WC_LOCAL_INV          = 6,
	VRNIC_WC_FLUSH              = 8,  /* ABI 1.4 */
	VRNIC_WC_ATOMIC_WRITE       = 9,  /* ABI 1.4 */
	VRNIC_WC_RECV               = 128,
	VRNIC_WC_RECV_RDMA_WITH_IMM = 129,
};

/* Completion status (IBV_WC_*, same meaning as enum ibv_wc_status) */
enum vrnic_wc_status {
	VRNIC_WC_SUCCESS            = 0,
	VRNIC_WC_LOC_LEN_ERR        = 1,
	VRNIC_WC_LOC_QP_OP_ERR      = 2,
	VRNIC_WC_LOC_EEC_OP_ERR     = 3,
	VRNIC_WC_LOC_PROT_ERR       = 4,
	VRNIC_WC_WR_FLUSH_ERR       = 5,
	VRNIC_WC_MW_BIND_ERR        = 6,
	VRNIC_WC_BAD_RESP_ERR       = 7,
	VRNIC_WC_LOC_ACCESS_ERR     = 8,
	VRNIC_WC_REM_INV_REQ_ERR    = 9,
	VRNIC_WC_REM_ACCESS_ERR     = 10,
	VRNIC_WC_REM_OP_ERR         = 11,
	VRNIC_WC_RETRY_EXC_ERR      = 12,
	VRNIC_WC_RNR_RETRY_EXC_ERR  = 13,
	VRNIC_WC_LOC_RDD_VIOL_ERR   = 14,
	VRNIC_WC_REM_INV_RD_REQ_ERR = 15,
	VRNIC_WC_REM_ABORT_ERR      = 16,
	VRNIC_WC_INV_EECN_ERR       = 17,
	VRNIC_WC_INV_EEC_STATE_ERR  = 18,
	VRNIC_WC_FATAL_ERR          = 19,
	VRNIC_WC_RESP_TIMEOUT_ERR   = 20,
	VRNIC_WC_GENERAL_ERR        = 21,
};

/* Completion flags (IBV_WC_*) */
enum vrnic_wc_flags {
	VRNIC_WC_GRH          = 1u << 0,
	VRNIC_WC_WITH_IMM     = 1u << 1,
	VRNIC_WC_IP_CSUM_OK   = 1u << 2,
	VRNIC_WC_WITH_INV     = 1u << 3,
};

/* UD receives: the receive buffer starts with VRNIC_GRH_LEN bytes of Global
 * Route Header, then the payload; byte_len counts both, wc_flags has
 * VRNIC_WC_GRH and src_qp is the sender's QP. RoCE v2 carries the GRH as the
 * IP header, and the 40 bytes hold it as Linux writes them: over IPv6 the
 * packet's IPv6 header; over IPv4 20 zero bytes, then the packet's 20-byte
 * IPv4 header (with a valid header checksum, which is how ibverbs'
 * ibv_create_ah_from_wc tells the two apart). On the UDP link the kernel
 * consumed the IP header: the daemon writes one with the packet's addresses
 * and length and TTL/hop limit 64, traffic class 0, flow label 0,
 * identification 0, don't fragment. A UD (or UC) message longer than the
 * receive buffers completes with VRNIC_WC_LOC_LEN_ERR and the QP goes on. A
 * UD packet with another Q_Key than the QP's, or arriving with no receive
 * WR posted, is dropped (UD has no RNR) and counted. */
#define VRNIC_GRH_LEN 40u

struct vrnic_cqe {
	uint64_t wr_id;
	uint32_t byte_len;
	uint32_t imm_or_inv;     /* WITH_IMM: imm_data; WITH_INV: invalidated rkey */
	uint32_t qp_num;
	uint32_t src_qp;         /* UD receives: the sender's QP number */
	uint8_t  status;         /* enum vrnic_wc_status */
	uint8_t  opcode;         /* enum vrnic_wc_opcode (low 8 bits; RECV=128) */
	uint8_t  wc_flags;       /* enum vrnic_wc_flags */
	uint8_t  vendor_err;     /* daemon-specific detail of an error status */
	uint16_t pkey_index;
	uint8_t  sl;
	uint8_t  owner;          /* bit 0: phase, written last */
};

/* ------------------------------------------------------------------------
 * Doorbell page: db_page_size bytes, an array of db_records 128-byte
 * records. Record 0 is the page header; the others are handed out by
 * CREATE_QP, CREATE_CQ and CREATE_SRQ (db_index). In each record the first
 * 64-byte line is written only by the client and the second only by the
 * daemon, so the two never share a cache line. All indices are free-running
 * u32 counters; the ring slot is index & (slots - 1).
 * ------------------------------------------------------------------------ */
#define VRNIC_DB_RECORD_SIZE 128u
#define VRNIC_DB_PAGE_SIZE   262144u /* 2048 records */

#define VRNIC_DB_MAGIC 0x76726e63u /* "vrnc" */

/* Doorbell summary (ABI 1.3). The daemon's doorbell poller need not read
 * every record of a page on every pass: a client that sets
 * VRNIC_DB_F_SUMMARY in client_flags (once, after mapping the page and
 * before its first post) promises to mark every producer index it stores
 * (sq_pi, rq_pi, srq_pi) in summary[], and the daemon then reads only the
 * records of marked groups. Record i is in group g = i / VRNIC_DB_SUMMARY_GROUP,
 * which is bit (g % 32) of summary[g / 32]. After the producer index
 * store of step 2 above:
 *
 *	uint32_t g = i / VRNIC_DB_SUMMARY_GROUP, bit = 1u << (g % 32);
 *	uint32_t *w = &hdr->summary[g / 32];
 *	if (!(__atomic_load_n(w, __ATOMIC_SEQ_CST) & bit))
 *		__atomic_fetch_or(w, bit, __ATOMIC_SEQ_CST);
 *
 * then step 4 (kick_needed) as before. The daemon exchanges a non-zero
 * summary word with 0 and only then reads the producer indices of its
 * groups: a store it misses is after the exchange, and so is the mark
 * that follows it (or the mark was still set: the load-before-or above is
 * safe for the same reason). A client that does not set the flag (any
 * ABI 1.2 client) still works: the daemon reads its records without the
 * summary, at most a bounded number per pass, so a post to a QP that had
 * no work for a while is noticed later the more QPs such clients have.
 * The summary never replaces the kick: with kick_needed set the client
 * kicks as always. */
#define VRNIC_DB_F_SUMMARY     0x1u
#define VRNIC_DB_DF_KICK_GEN   0x1u /* daemon_flags: kick_needed is a generation (step 4) */
#define VRNIC_DB_SUMMARY_GROUP 8u   /* records per summary bit */
#define VRNIC_DB_SUMMARY_WORDS 8u   /* 8 x 32 bits x 8 records = 2048 */

struct vrnic_db_header {
	/* daemon-written line */
	uint32_t magic;          /* VRNIC_DB_MAGIC */
	uint32_t abi_version;
	uint32_t kick_needed;    /* non-zero: the daemon sleeps; kick after posting */
	uint32_t daemon_flags;   /* ABI 1.4: VRNIC_DB_DF_* */
	uint32_t reserved0[12];
	/* client-written line */
	uint32_t client_flags;   /* ABI 1.3: VRNIC_DB_F_* */
	uint32_t reserved1[7];
	uint32_t summary[VRNIC_DB_SUMMARY_WORDS]; /* ABI 1.3: see above */
};

/* QP record: SQ and RQ producer indices (client), consumer indices
 * (daemon: how far it has consumed the rings, for information). */
struct vrnic_db_qp {
	uint32_t sq_pi;          /* client: WQEs posted to the SQ */
	uint32_t rq_pi;          /* client: RQEs posted to the RQ */
	uint32_t reserved0[14];
	uint32_t sq_ci;          /* daemon: SQ WQEs consumed */
	uint32_t rq_ci;          /* daemon: RQ WQEs consumed */
	uint32_t reserved1[14];
};

/* CQ arm word (written by the client): bit 0 armed, bit 1 solicited only,
 * bits 8..31 the arm sequence. To arm, write the word with a sequence one
 * greater than the last one written; the daemon writes the completion
 * eventfd once for a sequence, for the first CQE written after it saw it
 * that the client has not consumed yet (cq_ci <= its index; only a
 * solicited or error CQE when solicited only is set).
 * Order on the client (all __ATOMIC_SEQ_CST): store cq_ci for the CQEs
 * consumed, then store the arm word, then poll the CQ once more, and sleep
 * on the completion eventfd only if that poll found nothing. The daemon
 * writes a CQE's owner word, then loads the arm word, then cq_ci; so either
 * it notifies or the last poll sees the CQE. An event can be stale (its CQE
 * already polled): after an event, re-arm and poll again. */
#define VRNIC_CQ_ARM_ARMED     0x1u
#define VRNIC_CQ_ARM_SOLICITED 0x2u
#define VRNIC_CQ_ARM_SN_SHIFT  8u

struct vrnic_db_cq {
	uint32_t cq_ci;          /* client: CQEs consumed (frees ring slots) */
	uint32_t arm;            /* client: arm word */
	uint32_t reserved0[14];
	uint32_t cq_pi;          /* daemon: CQEs written */
	uint32_t arm_sn_done;    /* daemon: last arm sequence notified */
	uint32_t overflow;       /* daemon: non-zero once the CQ overflowed */
	uint32_t reserved1[13];
};

struct vrnic_db_srq {
	uint32_t srq_pi;         /* client: RQEs posted */
	uint32_t reserved0[15];
	uint32_t srq_ci;         /* daemon: RQEs consumed */
	uint32_t reserved1[15];
};

/* ------------------------------------------------------------------------
 * Rereg MR, resize CQ, device memory (ABI 1.4)
 * ------------------------------------------------------------------------ */

/* REREG_MR: ibv_rereg_mr. flags is a non-empty set of VRNIC_REREG_* (any
 * other bit, or none: EINVAL). With CHANGE_TRANSLATION the MR covers
 * [iova, iova+length) over a new page list, given as in REG_MR (page_shift,
 * npages, inline pages or pbl_pa); without it those fields are 0. With
 * CHANGE_PD the MR moves to pd_handle; with CHANGE_ACCESS it gets access
 * (enum vrnic_access; remote write or atomic need local write). A DM MR
 * cannot be re-registered (EINVAL). The keys stay, as Linux rxe reports
 * them: the lkey (the MR's handle) and the rkey are unchanged (every MR
 * has an rkey; remote access to an MR without the right fails). When
 * the reply is sent the daemon no longer touches the old translation:
 * copies that looked the MR up before the change have finished. */
enum vrnic_rereg_flags {              /* = enum ibv_rereg_mr_flags */
	VRNIC_REREG_CHANGE_TRANSLATION = 1u << 0,
	VRNIC_REREG_CHANGE_PD          = 1u << 1,
	VRNIC_REREG_CHANGE_ACCESS      = 1u << 2,
};

struct vrnic_cmd_rereg_mr {
	uint32_t mr_handle;
	uint32_t flags;          /* enum vrnic_rereg_flags */
	uint64_t iova;           /* CHANGE_TRANSLATION */
	uint64_t length;         /* CHANGE_TRANSLATION */
	uint64_t pbl_pa;         /* CHANGE_TRANSLATION, as REG_MR */
	uint32_t pd_handle;      /* CHANGE_PD */
	uint32_t access;         /* CHANGE_ACCESS */
	uint32_t page_shift;     /* CHANGE_TRANSLATION */
	uint32_t npages;         /* CHANGE_TRANSLATION */
	/* uint64_t pages[npages] when pbl_pa == 0 */
};
/* Reply: struct vrnic_resp_reg_mr. */

/* RESIZE_CQ: moves the CQ to a new ring of cqe_count entries (a power of
 * two, 2..VRNIC_MAX_CQE, 64-byte aligned, in this context's host memory).
 * The client must not poll the CQ (nor write cq_ci) from sending the
 * command to reading the reply. The daemon reads cq_ci once and fails
 * with EINVAL when the CQEs not yet consumed (cq_pi - cq_ci) do not fit in
 * cqe_count (or cq_ci is ahead of cq_pi); else, with no completion
 * written meanwhile, it copies them into the new ring at the same
 * free-running indices (entry i at slot i mod cqe_count, its owner bit
 * that of index i in a ring of cqe_count entries) and writes every other
 * slot of the new ring as not ready, then writes later CQEs into the new
 * ring only. Indices, cq_pi, cq_ci and the arm state carry over: after
 * the reply the client polls the new ring from its consumer index with
 * the new count. The old ring is no longer touched once the reply is
 * sent. */
struct vrnic_cmd_resize_cq {
	uint64_t ring_pa;
	uint32_t cq_handle;
	uint32_t cqe_count;
};

struct vrnic_resp_resize_cq {
	uint32_t cqe_count;      /* as granted (the command's) */
	uint32_t outstanding;    /* CQEs carried over */
};

/* ALLOC_DM: device memory (ibv_alloc_dm). length 1..max_dm_size of
 * QUERY_DEVICE_EX; log_align at most VRNIC_DM_MAX_LOG_ALIGN (the memory
 * starts on a page); flags 0 (ibv_alloc_dm_attr.comp_mask): else EINVAL.
 * The device's DM is max_dm_size bytes in all, shared by its contexts:
 * an allocation beyond what is left fails with ENOMEM. Reply fds: [0] a
 * memfd of map_length bytes (length rounded up to a page) that the
 * client maps shared to read and write the memory (ibv_memcpy_to_dm,
 * ibv_memcpy_from_dm); it starts zeroed. */
#define VRNIC_DM_MAX_LOG_ALIGN 12u

struct vrnic_cmd_alloc_dm {
	uint64_t length;
	uint32_t log_align;
	uint32_t flags;          /* reserved, 0 */
};

struct vrnic_resp_alloc_dm {
	uint32_t dm_handle;
	uint32_t reserved;
	uint64_t map_length;
};

/* FREE_DM: struct vrnic_cmd_handle (handle: the DM). EBUSY while an MR
 * is registered on it. */

/* REG_DM_MR: ibv_reg_dm_mr. An MR over [offset, offset+length) of the DM
 * (length may be 0; the range must lie within the DM's length: else
 * EINVAL), addressed from 0: access must hold VRNIC_DM_MR_ZERO_BASED
 * (else EINVAL), and a WQE or a peer names its byte x as address x.
 * Reply: struct vrnic_resp_reg_mr. */
/* = IBV_ACCESS_ZERO_BASED, the access bit REG_DM_MR requires (the bit a
 * type 2 memory window's bind uses the same way) */
#define VRNIC_DM_MR_ZERO_BASED (1u << 5)

struct vrnic_cmd_reg_dm_mr {
	uint64_t offset;
	uint64_t length;
	uint32_t dm_handle;
	uint32_t pd_handle;
	uint32_t access;         /* enum vrnic_access | VRNIC_DM_MR_ZERO_BASED */
	uint32_t reserved;
};

/* QUERY_DEVICE_EX: no command struct. Reply: */
struct vrnic_device_attr_ex {
	uint64_t max_dm_size;    /* bytes of device memory (ALLOC_DM) */
	uint32_t dm_max_log_align; /* VRNIC_DM_MAX_LOG_ALIGN */
	uint32_t ece_options;    /* ABI 1.5: the ECE options the device supports (enum
				  * vrnic_ece_option); 0: none (vrnicd -ece=false, or a
				  * daemon before 1.5) */
};

/* ------------------------------------------------------------------------
 * Enhanced Connection Establishment (ECE, ABI 1.5)
 *
 * vrnic's own transport options for RC (and XRC) QPs. They change what
 * the QP puts on the wire, so an option is only ever in force when both
 * ends of the connection are vrnic devices that agreed on it; a peer that
 * does not know them (any other RoCE v2 device) never sees anything but
 * the standard transport.
 *
 * The agreement: as Linux's CM carries struct ib_cm_ece (drivers/
 * infiniband/core/cm.c), a REQ offers the options with vrnic's PCI vendor
 * ID in its Vendor ID field (24 bits) and the options in the MAD header's
 * attribute modifier; the REP answers with the options the passive side
 * takes, the intersection of the offer and its own, in the same two
 * places. A REQ without ECE (a Linux peer), with another vendor ID, or a
 * REP without it agrees on none, and then the REP is exactly the REP
 * without ECE. Programs that connect their QPs out of band agree over
 * their own channel (vrnic-perf), or the operator says the peer is a
 * vrnic device (the drop-in library's VRNIC_ECE).
 *
 * MODIFY_QP sets the options of a QP with VRNIC_QP_ECE and ece_options:
 * on an RC or XRC QP, in the RESET->INIT, INIT->INIT and INIT->RTR
 * transitions only (else EINVAL); a bit outside enum vrnic_ece_option is
 * EINVAL, an option the device does not support (QUERY_DEVICE_EX
 * ece_options) EOPNOTSUPP. RESET clears them. QUERY_QP reports those in
 * force.
 *
 * The CM (ABI 1.5): a CM ID created with VRNIC_CM_ID_F_ECE takes part
 * (without it, the ID's REQ and REP carry no ECE and nothing below
 * changes, as for a client of ABI 1.4); a listener's connection requests
 * inherit the flag. CM_CONNECT's ece_options are offered in the REQ (at
 * most those the device supports; 0: the REQ carries none). Every event
 * of such an ID is a struct vrnic_cm_event_ece: the event followed by the
 * ECE of the message it reports (CONNECT_REQUEST: the REQ's;
 * CONNECT_RESPONSE: the REP's; zero otherwise), what rdma_get_remote_ece
 * returns. The RTR attributes (the events' qp_attr and CM_INIT_QP_ATTR)
 * of an RC connection then carry VRNIC_QP_ECE and the agreed options in
 * qp_attr.ece_options: on the passive side the options of a REQ carrying
 * vrnic's vendor ID that the device supports, on the active side those of
 * a REP carrying vrnic's vendor ID among the ones offered; none in any
 * other case (UC connections have none).
 * CM_ACCEPT's ece_options are those the passive side's QP takes (the
 * client applied them at RTR); the REP carries the agreed options among
 * them, or no ECE when that leaves none.
 * ------------------------------------------------------------------------ */

#define VRNIC_ECE_VENDOR_ID 0x1ded /* = vrnic_device_attr.vendor_id */

enum vrnic_ece_option {
	/* The responder keeps out-of-order packets and names each gap with
	 * a selective NAK; the requester resends only the gaps. */
	VRNIC_ECE_SELECTIVE_REPEAT = 1u << 0,
	/* The requester's retransmission timer follows the measured round
	 * trip (RFC 6298) instead of the ACK timeout, which still bounds
	 * the retries. */
	VRNIC_ECE_ADAPTIVE_RTO     = 1u << 1,
};

#define VRNIC_ECE_OPTIONS 0x3u /* every enum vrnic_ece_option bit */

/* The ECE of a REQ or REP (Linux's struct rdma_ucm_ece). */
struct vrnic_cm_ece {
	uint32_t vendor_id;      /* the Vendor ID field (24 bits); 0: the message carried none */
	uint32_t options;        /* the MAD header's attribute modifier */
};

/* One datagram on the event socket per CM event of a CM ID created with
 * VRNIC_CM_ID_F_ECE (a reader of such events reads with a buffer of at
 * least this size). */
struct vrnic_cm_event_ece {
	struct vrnic_cm_event ev;
	struct vrnic_cm_ece peer_ece; /* CONNECT_REQUEST: the REQ's; CONNECT_RESPONSE: the REP's */
};                                    /* 360 bytes */

#endif /* VRNIC_ABI_H */
