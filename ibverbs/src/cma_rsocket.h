/* cma_rsocket.h - the rsockets wire format (librdmacm's rsocket protocol).
 *
 * Self-contained (stdint and endian only) so that a test can compile it
 * alone and check the layout and encodings against values derived from
 * the protocol.
 *
 * A stream rsocket is an RC QP. Each side gives the other, in the CM
 * private data of the REQ and REP, a struct rs_conn_data: the address and
 * rkey of its "target SGL" (an array of RS_SGL_SIZE struct rs_sge into
 * which the peer writes the location of free receive buffer space,
 * followed by the iomap table) and the first half of its receive buffer.
 * Everything moves by RDMA WRITE WITH IMMEDIATE: the immediate (32 bits,
 * big-endian on the wire) carries an op in bits 31:29 and a value in bits
 * 28:0. Plain RDMA WRITE (no immediate) is used only by riowrite. */
#ifndef VRNIC_CMA_RSOCKET_H
#define VRNIC_CMA_RSOCKET_H

#include <endian.h>
#include <stdint.h>

#define RS_PROTO_VERSION 1

/* Ops of the immediate's bits 31:29. */
enum {
	RS_OP_DATA = 0,      /* value: bytes written into the receive buffer */
	RS_OP_RSVD_DATA_MORE = 1,
	RS_OP_WRITE = 2,     /* riowrite; never on the wire (no immediate) */
	RS_OP_RSVD_DRA_MORE = 3,
	RS_OP_SGL = 4,       /* value: the sender's receive sequence number + its RQ size (credits) */
	RS_OP_RSVD = 5,
	RS_OP_IOMAP_SGL = 6, /* value: index of the iomap entry written */
	RS_OP_CTRL = 7,      /* value: RS_CTRL_* */
};

enum {
	RS_CTRL_DISCONNECT = 0,
	RS_CTRL_KEEPALIVE = 1,
	RS_CTRL_SHUTDOWN = 2,
};

#define RS_MSG_SET(op, data) ((((uint32_t)(op)) << 29) | ((uint32_t)(data) & 0x1FFFFFFFu))
#define RS_MSG_OP(m) ((uint32_t)(m) >> 29)
#define RS_MSG_DATA(m) ((uint32_t)(m) & 0x1FFFFFFFu)

/* A remote buffer: in the CM private data big-endian; written in-band in
 * the writer's byte order (RS_CONN_FLAG_NET tells the peer which). */
struct rs_sge {
	uint64_t addr;
	uint32_t key;
	uint32_t length;
};

/* An entry of the iomap table (riomap'd memory of the peer). */
struct rs_iomap {
	uint64_t offset;
	struct rs_sge sge;
};

#define RS_CONN_FLAG_NET (1 << 0)   /* the sender is big-endian */
#define RS_CONN_FLAG_IOMAP (1 << 1) /* an iomap table follows the target SGL */

/* The CM private data of the REQ and of the REP (40 bytes). */
struct rs_conn_data {
	uint8_t version;           /* RS_PROTO_VERSION */
	uint8_t flags;             /* RS_CONN_FLAG_* */
	uint16_t credits;          /* big-endian: the sender's RQ size */
	uint8_t reserved[3];
	uint8_t target_iomap_size; /* rs_value_to_scale(entries, 8) */
	struct rs_sge target_sgl;  /* big-endian; length = RS_SGL_SIZE entries */
	struct rs_sge data_buf;    /* big-endian; the first half of the receive buffer */
};

#define RS_SGL_SIZE 2
#define RS_QP_CTRL_SIZE 4 /* control messages in flight */
#define RS_MAX_CTRL_MSG ((int)sizeof(struct rs_sge))
#define RS_SNDLOWAT 2048
#define RS_OLAP_START_SIZE 2048
#define RS_MAX_TRANSFER 65536
#define RS_QP_MIN_SIZE 16
#define RS_QP_MAX_SIZE 0xFFFE

/* Sizes above 2^(bits-1) travel as a mantissa flag and the value >> bits. */
static inline int rs_value_to_scale(int value, int bits) {
	return value <= (1 << (bits - 1)) ? value : (1 << (bits - 1)) | (value >> bits);
}

static inline int rs_scale_to_value(int value, int bits) {
	return value <= (1 << (bits - 1)) ? value : (value & ~(1 << (bits - 1))) << bits;
}

/* rs_conn_data_put fills c as the wire wants it. */
static inline void rs_conn_data_put(struct rs_conn_data *c, uint16_t credits, int iomap_entries, uint64_t sgl_addr,
				    uint32_t sgl_key, uint64_t buf_addr, uint32_t buf_key, uint32_t buf_len) {
	c->version = RS_PROTO_VERSION;
	c->flags = RS_CONN_FLAG_IOMAP | (__BYTE_ORDER == __BIG_ENDIAN ? RS_CONN_FLAG_NET : 0);
	c->credits = htobe16(credits);
	c->reserved[0] = c->reserved[1] = c->reserved[2] = 0;
	c->target_iomap_size = (uint8_t)rs_value_to_scale(iomap_entries, 8);
	c->target_sgl.addr = htobe64(sgl_addr);
	c->target_sgl.key = htobe32(sgl_key);
	c->target_sgl.length = htobe32(RS_SGL_SIZE);
	c->data_buf.addr = htobe64(buf_addr);
	c->data_buf.key = htobe32(buf_key);
	c->data_buf.length = htobe32(buf_len);
}

#endif /* VRNIC_CMA_RSOCKET_H */
