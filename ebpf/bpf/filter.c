// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * vrnic TAP filter program (TUNSETFILTEREBPF).
 *
 * The tun driver (drivers/net/tun.c, tun_net_xmit -> run_ebpf_filter) runs
 * this program on every frame before queueing it to the reader: a return of
 * 0 drops the frame, any other value is the length to keep (the frame is
 * trimmed to it). The program keeps only what the emulated NIC needs:
 *
 *   - ARP requests and replies whose target IPv4 address is a device address;
 *   - IPv6 neighbour solicitations for a device address (sent to that
 *     address or to its solicited-node multicast group) and neighbour
 *     advertisements sent to a device address or to all-nodes (ff02::1);
 *   - RoCE v2 (UDP destination port 4791) to a device IPv4 or IPv6 address.
 *
 * Everything else returns 0 and is counted by reason in filter_stats. The
 * device addresses are in dev_addrs4/dev_addrs6, filled by the loader.
 */
#include "vrnic_bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __be32);
	__type(value, __u8);
} dev_addrs4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, struct ipv6_addr);
	__type(value, __u8);
} dev_addrs6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FILTER_REASON_MAX);
	__type(key, enum filter_reason);
	__type(value, __u64);
} filter_stats SEC(".maps");

static __always_inline __u32 verdict(struct __sk_buff *skb, __u32 reason)
{
	__u64 *c = bpf_map_lookup_elem(&filter_stats, &reason);

	if (c)
		*c += 1;
	if (reason <= FILTER_PASS_ROCE_V6)
		return skb->len; /* keep the whole frame */
	return 0;
}

static __always_inline int is_ours6(struct ipv6_addr *a)
{
	return bpf_map_lookup_elem(&dev_addrs6, a) != 0;
}

static __always_inline __u32 filter_arp(struct __sk_buff *skb, __u32 l3)
{
	struct {
		__be16 htype, ptype;
		__u8 hlen, plen;
		__be16 op;
		__u8 sha[6];
		__u8 spa[4];
		__u8 tha[6];
		__u8 tpa[4];
	} __attribute__((packed)) arp;
	__be32 tpa;

	if (load(skb, l3, &arp, sizeof(arp)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	if (arp.htype != bpf_htons(1) || arp.ptype != bpf_htons(ETH_P_IP) ||
	    arp.hlen != 6 || arp.plen != 4 ||
	    (arp.op != bpf_htons(1) && arp.op != bpf_htons(2)))
		return verdict(skb, FILTER_DROP_ARP_MALFORMED);
	__builtin_memcpy(&tpa, arp.tpa, 4);
	if (!bpf_map_lookup_elem(&dev_addrs4, &tpa))
		return verdict(skb, FILTER_DROP_ARP_NOT_OURS);
	return verdict(skb, FILTER_PASS_ARP);
}

static __always_inline __u32 filter_roce(struct __sk_buff *skb, __u32 l4,
					 __u32 pass)
{
	struct udp_hdr udp;
	__u8 bth[BTH_LEN];

	if (load(skb, l4, &udp, sizeof(udp)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	if (udp.dest != bpf_htons(ROCE_V2_PORT))
		return verdict(skb, FILTER_DROP_UDP_PORT);
	if (load(skb, l4 + UDP_HLEN, bth, sizeof(bth)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	return verdict(skb, pass);
}

static __always_inline __u32 filter_ipv4(struct __sk_buff *skb, __u32 l3)
{
	struct ipv4_hdr ip;
	__u32 ihl;

	if (load(skb, l3, &ip, sizeof(ip)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	ihl = (ip.ver_ihl & 0xf) * 4;
	if ((ip.ver_ihl >> 4) != 4 || ihl < IPV4_MIN_HLEN)
		return verdict(skb, FILTER_DROP_IP_MALFORMED);
	if (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return verdict(skb, FILTER_DROP_IP_FRAGMENT);
	if (ip.protocol != IPPROTO_UDP)
		return verdict(skb, FILTER_DROP_L4_PROTO);
	/* Check the port before the address: a datagram to another port is
	 * counted as such whatever its destination. */
	{
		struct udp_hdr udp;

		if (load(skb, l3 + ihl, &udp, sizeof(udp)))
			return verdict(skb, FILTER_DROP_TRUNCATED);
		if (udp.dest != bpf_htons(ROCE_V2_PORT))
			return verdict(skb, FILTER_DROP_UDP_PORT);
	}
	if (!bpf_map_lookup_elem(&dev_addrs4, &ip.daddr))
		return verdict(skb, FILTER_DROP_ADDR_NOT_OURS);
	return filter_roce(skb, l3 + ihl, FILTER_PASS_ROCE_V4);
}

/* is_solicited_node tells whether dst is ff02::1:ffXX:XXXX for target. */
static __always_inline int is_solicited_node(struct ipv6_addr *dst,
					     struct ipv6_addr *target)
{
	int i;

	if (dst->b[0] != 0xff || dst->b[1] != 0x02 || dst->b[11] != 0x01 ||
	    dst->b[12] != 0xff)
		return 0;
#pragma unroll
	for (i = 2; i < 11; i++)
		if (dst->b[i])
			return 0;
	return dst->b[13] == target->b[13] && dst->b[14] == target->b[14] &&
	       dst->b[15] == target->b[15];
}

static __always_inline int is_all_nodes(struct ipv6_addr *dst)
{
	int i;

	if (dst->b[0] != 0xff || dst->b[1] != 0x02 || dst->b[15] != 0x01)
		return 0;
#pragma unroll
	for (i = 2; i < 15; i++)
		if (dst->b[i])
			return 0;
	return 1;
}

static __always_inline __u32 filter_nd(struct __sk_buff *skb, __u32 l4,
				       struct ipv6_hdr *ip6)
{
	struct {
		__u8 type, code;
		__be16 check;
		__be32 flags;
		struct ipv6_addr target;
	} nd;
	__u8 type;

	if (load(skb, l4, &type, sizeof(type)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	if (type != ICMPV6_ND_NS && type != ICMPV6_ND_NA)
		return verdict(skb, FILTER_DROP_ICMPV6_OTHER);
	if (load(skb, l4, &nd, sizeof(nd)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	if (ip6->hop_limit != ND_HOP_LIMIT || nd.code != 0)
		return verdict(skb, FILTER_DROP_ND_MALFORMED);
	if (type == ICMPV6_ND_NS) {
		if (!is_ours6(&nd.target))
			return verdict(skb, FILTER_DROP_ND_NOT_OURS);
		if (!is_ours6(&ip6->daddr) &&
		    !is_solicited_node(&ip6->daddr, &nd.target))
			return verdict(skb, FILTER_DROP_ND_NOT_OURS);
		return verdict(skb, FILTER_PASS_ND);
	}
	if (!is_ours6(&ip6->daddr) && !is_all_nodes(&ip6->daddr))
		return verdict(skb, FILTER_DROP_ND_NOT_OURS);
	return verdict(skb, FILTER_PASS_ND);
}

static __always_inline __u32 filter_ipv6(struct __sk_buff *skb, __u32 l3)
{
	struct ipv6_hdr ip6;

	if (load(skb, l3, &ip6, sizeof(ip6)))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	if ((bpf_ntohl(ip6.ver_tc_flow) >> 28) != 6)
		return verdict(skb, FILTER_DROP_IP_MALFORMED);
	if (ip6.nexthdr == IPPROTO_ICMPV6)
		return filter_nd(skb, l3 + IPV6_HLEN, &ip6);
	if (ip6.nexthdr != IPPROTO_UDP)
		return verdict(skb, FILTER_DROP_L4_PROTO);
	{
		struct udp_hdr udp;

		if (load(skb, l3 + IPV6_HLEN, &udp, sizeof(udp)))
			return verdict(skb, FILTER_DROP_TRUNCATED);
		if (udp.dest != bpf_htons(ROCE_V2_PORT))
			return verdict(skb, FILTER_DROP_UDP_PORT);
	}
	if (!is_ours6(&ip6.daddr))
		return verdict(skb, FILTER_DROP_ADDR_NOT_OURS);
	return filter_roce(skb, l3 + IPV6_HLEN, FILTER_PASS_ROCE_V6);
}

SEC("socket")
int vrnic_filter(struct __sk_buff *skb)
{
	__u32 l3;
	__u16 proto;

	if (parse_l2(skb, &l3, &proto))
		return verdict(skb, FILTER_DROP_TRUNCATED);
	switch (proto) {
	case ETH_P_ARP:
		return filter_arp(skb, l3);
	case ETH_P_IP:
		return filter_ipv4(skb, l3);
	case ETH_P_IPV6:
		return filter_ipv6(skb, l3);
	default:
		return verdict(skb, FILTER_DROP_ETHERTYPE);
	}
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
