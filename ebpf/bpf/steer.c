// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * vrnic TAP steering program (TUNSETSTEERINGEBPF).
 *
 * For every frame the kernel transmits to the multi-queue TAP device, the
 * tun driver (drivers/net/tun.c, tun_ebpf_select_queue) runs this program
 * and uses (u16)return % numqueues as the queue the frame is put on. vrnic
 * worker i reads queue i and owns the QPs with roce.SteerQueue(qpn, n) == i,
 * so the program returns roce.SteerHash(BTH destination QP) for RoCE v2
 * frames, which is below 2^16 and therefore survives the u16 truncation.
 * Everything else (ARP, neighbour discovery, other traffic) returns 0:
 * queue 0's worker answers ARP and ND.
 *
 * Parsed: Ethernet, at most one 802.1Q tag, IPv4 with any header length
 * (fragments are not RoCE: queue 0), IPv6 whose next header is UDP (no
 * extension headers), UDP destination port 4791, BTH.
 */
#include "vrnic_bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_config);
} steer_conf SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STEER_MAX_QUEUES + 1);
	__type(key, __u32);
	__type(value, __u64);
} steer_stats SEC(".maps");

/* roce_dest_qpn extracts the BTH destination QP of a RoCE v2 frame.
 * Returns 0 and sets *qpn, or -1 when the frame is not RoCE v2. */
static __always_inline int roce_dest_qpn(struct __sk_buff *skb, __u32 *qpn)
{
	__u32 l3, l4;
	__u16 proto;
	struct udp_hdr udp;
	__u8 dqp[4];

	if (parse_l2(skb, &l3, &proto))
		return -1;

	if (proto == ETH_P_IP) {
		struct ipv4_hdr ip;
		__u32 ihl;

		if (load(skb, l3, &ip, sizeof(ip)))
			return -1;
		if ((ip.ver_ihl >> 4) != 4)
			return -1;
		ihl = (ip.ver_ihl & 0xf) * 4;
		if (ihl < IPV4_MIN_HLEN)
			return -1;
		if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
			return -1;
		if (ip.protocol != IPPROTO_UDP)
			return -1;
		l4 = l3 + ihl;
	} else if (proto == ETH_P_IPV6) {
		struct ipv6_hdr ip6;

		if (load(skb, l3, &ip6, sizeof(ip6)))
			return -1;
		if ((bpf_ntohl(ip6.ver_tc_flow) >> 28) != 6)
			return -1;
		if (ip6.nexthdr != IPPROTO_UDP)
			return -1;
		l4 = l3 + IPV6_HLEN;
	} else {
		return -1;
	}

	if (load(skb, l4, &udp, sizeof(udp)))
		return -1;
	if (udp.dest != bpf_htons(ROCE_V2_PORT))
		return -1;
	/* BTH bytes 4..7: reserved byte, then the 24-bit destination QP. */
	if (load(skb, l4 + UDP_HLEN + 4, dqp, sizeof(dqp)))
		return -1;
	*qpn = ((__u32)dqp[1] << 16) | ((__u32)dqp[2] << 8) | dqp[3];
	return 0;
}

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&steer_stats, &idx);

	if (c)
		*c += 1; /* per-CPU slot: no atomic needed */
}

SEC("socket")
int vrnic_steer(struct __sk_buff *skb)
{
	struct steer_config *cfg;
	__u32 qpn, hash, q = 0, zero = 0;

	if (roce_dest_qpn(skb, &qpn)) {
		count(STEER_MAX_QUEUES);
		return 0;
	}
	hash = ((qpn & 0xffffff) * STEER_MUL) >> 16;

	cfg = bpf_map_lookup_elem(&steer_conf, &zero);
	if (cfg && cfg->queues)
		q = hash % cfg->queues;
	if (q < STEER_MAX_QUEUES)
		count(q);
	return hash;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
