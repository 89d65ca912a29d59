/* ah.c - address handles: ibv_create_ah over the daemon's CREATE_AH, and
 * the address of a UD sender from its completion and the Global Route
 * Header in front of the received data (ibv_init_ah_from_wc,
 * ibv_create_ah_from_wc).
 *
 * The GRH area (VRNIC_GRH_LEN = 40 bytes) holds what Linux writes there on
 * RoCE v2: over IPv6 the packet's IPv6 header; over IPv4 20 zero bytes,
 * then the 20-byte IPv4 header. The two are told apart as rdma-core does
 * (get_grh_header_version): an IP version of 6 in the first word is an
 * IPv6 header unless the second half is an IPv4 header with a valid
 * checksum. */
#include "vrnic_ibv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <stdlib.h>
#include <string.h>

/* vr_ah_to_vr copies an address vector for the daemon, which checks it as
 * the kernel does (rdma_check_ah_attr, rdma_get_gid_attr): the values go
 * as given, a flow_label of 0xffffffff included (the IPv6 header takes its
 * low 20 bits). static_rate and the IB-only fields (dlid, src_path_bits)
 * are not passed: rxe ignores them on RoCE. */
void vr_ah_to_vr(const struct ibv_ah_attr *a, struct vrnic_ah_attr *v) {
	memcpy(v->dgid, a->grh.dgid.raw, 16);
	v->flow_label = a->grh.flow_label;
	v->sgid_index = a->grh.sgid_index;
	v->hop_limit = a->grh.hop_limit;
	v->traffic_class = a->grh.traffic_class;
	v->sl = a->sl;
	v->port_num = a->port_num;
}

/* ibv_create_ah: on RoCE an AH needs a GRH (there are no LIDs). On a TAP
 * link the daemon resolves the destination's MAC here and fails with
 * EHOSTUNREACH when nobody answers, as the kernel does on RoCE. */
VR_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr) {
	if (!pd || !attr || !attr->is_global)
		VR_FAIL_NULL(EINVAL);
	struct vr_ah *ah = calloc(1, sizeof *ah);
	if (!ah)
		VR_FAIL_NULL(ENOMEM);
	struct vrnic_cmd_create_ah cmd = { .pd_handle = pd->handle };
	vr_ah_to_vr(attr, &cmd.attr);
	struct vrnic_resp_create_ah r;
	int ret = vr_call(vr_ctx(pd->context), VRNIC_CMD_CREATE_AH, &cmd, sizeof cmd, NULL, 0, NULL, 0, &r, sizeof r);
	if (ret) {
		free(ah);
		VR_FAIL_NULL(ret);
	}
	ah->ah.context = pd->context;
	ah->ah.pd = pd;
	ah->ah.handle = r.ah_handle;
	ah->attr = *attr;
	return &ah->ah;
}

VR_EXPORT int ibv_destroy_ah(struct ibv_ah *ah) {
	if (!ah)
		return EINVAL;
	int ret = vr_destroy_handle(vr_ctx(ah->context), VRNIC_CMD_DESTROY_AH, ah->handle);
	if (ret) {
		errno = ret;
		return ret;
	}
	free(ah);
	return 0;
}

/* ipv4_csum is the IPv4 header checksum of the 20-byte header h with its
 * checksum field taken as zero. */
static uint16_t ipv4_csum(const struct iphdr *h) {
	uint16_t w[10];
	memcpy(w, h, sizeof w);
	w[5] = 0;
	uint32_t sum = 0;
	for (int i = 0; i < 10; i++)
		sum += w[i];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/* grh_version says which header the GRH area holds: 4, 6, or -1 (errno
 * EPROTONOSUPPORT) for neither. */
static int grh_version(const struct ibv_grh *grh, struct iphdr *ip4) {
	memcpy(ip4, (const uint8_t *)grh + 20, sizeof *ip4);
	if (((ntohl(grh->version_tclass_flow) >> 28) & 0xf) != 6) {
		if (ip4->version == 4)
			return 4;
		errno = EPROTONOSUPPORT;
		return -1;
	}
	/* Version 6 in the first word: still IPv4 if the second half is a
	 * 20-byte IPv4 header whose checksum is right. */
	if (ip4->ihl != 5)
		return 6;
	return ip4->check == ipv4_csum(ip4) ? 4 : 6;
}

/* find_gid returns the index of the RoCE v2 GID gid in port's GID table,
 * or -1 with errno ENOENT (ibv_find_gid_index). */
static int find_gid(struct ibv_context *ctx, uint8_t port, const union ibv_gid *gid) {
	struct ibv_port_attr pa;
	int ret = vr_query_port(ctx, port, &pa, sizeof pa);
	if (ret) {
		errno = ret;
		return -1;
	}
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		ret = _ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0, sizeof e);
		if (ret == ENODATA)
			continue;
		if (ret)
			return -1;
		if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && !memcmp(&e.gid, gid, sizeof *gid))
			return i;
	}
	errno = ENOENT;
	return -1;
}

static void v4_mapped(uint32_t addr_be, union ibv_gid *gid) {
	memset(gid, 0, sizeof *gid);
	gid->raw[10] = 0xff;
	gid->raw[11] = 0xff;
	memcpy(gid->raw + 12, &addr_be, 4);
}

/* ibv_init_ah_from_wc fills ah with the address to answer the sender of
 * the UD receive completion wc whose buffer began with grh: its GID as the
 * destination, the local GID the packet was sent to as the source, its
 * hop limit (TTL) and traffic class. Without IBV_WC_GRH the AH is LID-only,
 * which RoCE cannot use (ibv_create_ah then fails with EINVAL). */
VR_EXPORT int ibv_init_ah_from_wc(struct ibv_context *ctx, uint8_t port, struct ibv_wc *wc, struct ibv_grh *grh,
				  struct ibv_ah_attr *ah) {
	if (!ctx || !wc || !ah || ((wc->wc_flags & IBV_WC_GRH) && !grh)) {
		errno = EINVAL;
		return -1;
	}
	memset(ah, 0, sizeof *ah);
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	ah->port_num = port;
	if (!(wc->wc_flags & IBV_WC_GRH))
		return 0;
	ah->is_global = 1;
	uint32_t flow = ntohl(grh->version_tclass_flow);
	ah->grh.flow_label = flow & 0xfffff;
	struct iphdr ip4;
	int idx;
	switch (grh_version(grh, &ip4)) {
	case 4: {
		/* No point looking for a multicast address in the GID table. */
		if (IN_CLASSD(ntohl(ip4.daddr))) {
			errno = EINVAL;
			return -1;
		}
		union ibv_gid local;
		v4_mapped(ip4.daddr, &local);
		if ((idx = find_gid(ctx, port, &local)) < 0)
			return -1;
		v4_mapped(ip4.saddr, &ah->grh.dgid);
		ah->grh.hop_limit = ip4.ttl;
		ah->grh.traffic_class = ip4.tos;
		break;
	}
	case 6:
		if (grh->dgid.raw[0] == 0xff) {
			errno = EINVAL;
			return -1;
		}
		/* RoCE v2 (UDP) only: an IB next header would name a RoCE v1
		 * GID, which vrnic does not have. */
		if (grh->next_hdr != IPPROTO_UDP) {
			errno = EPROTONOSUPPORT;
			return -1;
		}
		if ((idx = find_gid(ctx, port, &grh->dgid)) < 0)
			return -1;
		ah->grh.dgid = grh->sgid;
		ah->grh.hop_limit = grh->hop_limit;
		ah->grh.traffic_class = (uint8_t)(flow >> 20);
		break;
	default:
		return -1;
	}
	ah->grh.sgid_index = (uint8_t)idx;
	return 0;
}

VR_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
					       uint8_t port) {
	if (!pd)
		VR_FAIL_NULL(EINVAL);
	struct ibv_ah_attr a;
	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}
