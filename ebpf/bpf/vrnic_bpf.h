/* SPDX-License-Identifier: (GPL-2.0-only OR MIT) */
/*
 * Shared definitions of the vrnic eBPF programs: steer.c and filter.c are
 * BPF_PROG_TYPE_SOCKET_FILTER programs run by the tun driver on every frame
 * the kernel transmits to the TAP device (that is, on every frame the
 * emulated NIC receives); tcfault.c is a BPF_PROG_TYPE_SCHED_CLS program
 * on the tc ingress or egress hook of any interface. The frame starts at
 * the Ethernet header in both.
 *
 * This header carries its own copy of the few kernel ABI definitions the
 * programs use instead of including <linux/bpf.h>: the uapi headers pull in
 * <asm/types.h>, whose location depends on the build host's architecture,
 * and the objects must build the same everywhere (scripts/check-bpf.sh).
 */
#ifndef VRNIC_BPF_H
#define VRNIC_BPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;

/* include/uapi/linux/bpf.h: only the leading fields are used. */
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
};

enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
};

enum {
	BPF_ANY = 0,
};

/* Helper flags (include/uapi/linux/bpf.h). */
#define BPF_F_RECOMPUTE_CSUM (1ULL << 0)
#define BPF_F_INGRESS (1ULL << 0)
#define BPF_F_MARK_MANGLED_0 (1ULL << 5)

/* tc verdicts (include/uapi/linux/pkt_cls.h; tcx's TCX_NEXT, TCX_DROP). */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_SHOT 2

/* bpf_skb_load_bytes_relative() start_header values. */
enum {
	BPF_HDR_START_MAC = 0,
	BPF_HDR_START_NET = 1,
};

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_HLEN 14
#define VLAN_HLEN 4
#define ETH_P_IP 0x0800
#define ETH_P_ARP 0x0806
#define ETH_P_8021Q 0x8100
#define ETH_P_IPV6 0x86DD

#define IPPROTO_UDP 17
#define IPPROTO_ICMPV6 58

#define IPV4_MIN_HLEN 20
#define IPV6_HLEN 40
#define UDP_HLEN 8
#define BTH_LEN 12
#define ARP_LEN 28 /* Ethernet/IPv4 ARP */

#define ROCE_V2_PORT 4791

#define ICMPV6_ND_NS 135
#define ICMPV6_ND_NA 136
#define ND_HOP_LIMIT 255

/* The steering hash: must equal roce.SteerHash (roce/steer.go). */
#define STEER_MUL 0x9E3779B1u

/* Steering counters: index q < STEER_MAX_QUEUES counts RoCE frames steered
 * to queue q, index STEER_MAX_QUEUES counts frames that are not RoCE v2
 * (sent to queue 0). */
#define STEER_MAX_QUEUES 256

struct steer_config {
	/* Number of TAP queues; the kernel takes the program's return value
	 * modulo its own queue count, this copy only feeds the counters. */
	__u32 queues;
};

/* Verdict reasons of the filter program: index of its counter array.
 * The Go constants are generated from this enum (bpf2go -type). */
enum filter_reason {
	FILTER_PASS_ARP = 0,
	FILTER_PASS_ND,
	FILTER_PASS_ROCE_V4,
	FILTER_PASS_ROCE_V6,
	FILTER_DROP_TRUNCATED,	   /* headers cut short */
	FILTER_DROP_ETHERTYPE,	   /* not ARP, IPv4 or IPv6 (also QinQ) */
	FILTER_DROP_ARP_MALFORMED, /* not Ethernet/IPv4 request or reply */
	FILTER_DROP_ARP_NOT_OURS,  /* target IPv4 not a device address */
	FILTER_DROP_IP_MALFORMED,  /* bad version or header length */
	FILTER_DROP_IP_FRAGMENT,   /* IPv4 fragment */
	FILTER_DROP_L4_PROTO,	   /* not UDP/ICMPv6 (incl. IPv6 ext headers) */
	FILTER_DROP_UDP_PORT,	   /* UDP, not to port 4791 */
	FILTER_DROP_ADDR_NOT_OURS, /* RoCE v2 to another address */
	FILTER_DROP_ND_NOT_OURS,   /* NS/NA not for a device address */
	FILTER_DROP_ND_MALFORMED,  /* hop limit not 255, short message */
	FILTER_DROP_ICMPV6_OTHER,  /* ICMPv6 other than NS/NA */
	FILTER_REASON_MAX,
};

struct ipv6_addr {
	__u8 b[16];
};

/*
 * load copies len bytes at offset off from the start of the Ethernet
 * header. bpf_skb_load_bytes_relative(BPF_HDR_START_MAC) is right both
 * on the tun transmit path (skb->data is the MAC header) and under
 * BPF_PROG_TEST_RUN (which pulls the Ethernet header, so skb->data is
 * the network header) but it reads the linear part only; when it fails
 * the frame is either too short or its headers are paged, and
 * bpf_skb_load_bytes from skb->data (the MAC header on the tun path) reads
 * paged data too. On a linear skb the fallback cannot succeed where the
 * first call failed, so it never reads from a wrong base.
 */
static __always_inline int load(struct __sk_buff *skb, __u32 off, void *to,
				__u32 len)
{
	if (bpf_skb_load_bytes_relative(skb, off, to, len, BPF_HDR_START_MAC) == 0)
		return 0;
	return bpf_skb_load_bytes(skb, off, to, len);
}

/*
 * parse_l2 finds the EtherType and the offset of the L3 header, skipping
 * one 802.1Q tag. Returns 0, or -1 when the frame is too short.
 */
static __always_inline int parse_l2(struct __sk_buff *skb, __u32 *l3_off,
				    __u16 *proto)
{
	__be16 type;

	if (load(skb, 12, &type, sizeof(type)))
		return -1;
	*l3_off = ETH_HLEN;
	if (type == bpf_htons(ETH_P_8021Q)) {
		if (load(skb, 16, &type, sizeof(type)))
			return -1;
		*l3_off = ETH_HLEN + VLAN_HLEN;
	}
	*proto = bpf_ntohs(type);
	return 0;
}

/* Fixed part of the IPv4 header (RFC 791). */
struct ipv4_hdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
};

/* IPv6 header (RFC 8200). */
struct ipv6_hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	struct ipv6_addr saddr;
	struct ipv6_addr daddr;
};

struct udp_hdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
};

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#endif /* VRNIC_BPF_H */
