// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
/*
 * vrnic kernel-side fault injector (tc/tcx, BPF_PROG_TYPE_SCHED_CLS).
 *
 * Attached to the ingress or egress hook of any interface (a TAP, a veth,
 * a bridge port, a physical NIC), it faults RoCE v2 frames that vrnic did
 * not build itself: Soft-RoCE's, a hardware RNIC's, another daemon's. The
 * rules fill tcfault_rules from slot 0 up (the first empty slot ends
 * them). Each frame that is RoCE v2 (Ethernet, optional 802.1Q tag, IPv4 without
 * fragments or IPv6 without extension headers, UDP to port 4791, a whole
 * BTH) is offered to the rules of tcfault_rules in index order:
 *
 *   match:  BTH destination QP, BTH opcode under a mask, a PSN range;
 *   then:   matched++ (the match index k is the value before);
 *           k < skip                       -> next rule;
 *           probability: draw(seed, k) >= prob -> next rule;
 *           taken++; taken >= limit (limit != 0) -> next rule;
 *           act: drop, corrupt one byte, duplicate, ECN CE mark;
 *           applied++ and stop (failed++ and next rule if the act failed).
 *
 * draw(seed, k) is splitmix64 of seed + (k + 1) * golden ratio, its high
 * 32 bits compared with prob (a fraction of 2^32): the same seed and the
 * same frames in the same order give the same faults, and user space can
 * compute them (ebpf.TCFaultDraw).
 *
 * A GSO packet (a run of frames the kernel has not cut yet) is one frame
 * here: its first frame's headers are matched and the action applies to
 * the whole packet.
 *
 * Frames that are not RoCE v2, and those no rule takes, go on (TC_ACT_UNSPEC:
 * the next tcx program or tc filter, else the kernel's default). A
 * duplicate is a clone redirected to the same hook of the same device
 * carrying mark TCFAULT_MARK; the program clears that mark and lets the
 * clone pass without offering it to the rules.
 */
#include "vrnic_bpf.h"

#define TCFAULT_MAX_RULES 16
#define TCFAULT_MAX_COPIES 8
#define TCFAULT_MARK 0x76726366 /* "vrcf" */

/* Actions (tcfault_rule.action). */
enum tcfault_action {
	TCFAULT_NONE = 0, /* an unused slot */
	TCFAULT_DROP,
	TCFAULT_CORRUPT,
	TCFAULT_DUPLICATE,
	TCFAULT_ECN,
};

/* Rule flags (tcfault_rule.flags). */
enum tcfault_flag {
	TCFAULT_F_QPN = 1 << 0,	 /* match the BTH destination QP */
	TCFAULT_F_PSN = 1 << 1,	 /* match psn_first <= PSN <= psn_last */
	TCFAULT_F_PROB = 1 << 2, /* apply with probability prob / 2^32 */
};

/* One rule. Written by user space (whole, while no frame may see a half
 * written one: a slot is cleared before it is rewritten). */
struct tcfault_rule {
	__u8 action;	  /* enum tcfault_action; 0: slot unused */
	__u8 opcode;	  /* BTH opcode, compared under opcode_mask */
	__u8 opcode_mask; /* 0 matches every opcode */
	__u8 corrupt_xor; /* TCFAULT_CORRUPT: the byte is XORed with it */
	__u32 flags;	  /* enum tcfault_flag */
	__u32 qpn;	  /* TCFAULT_F_QPN: BTH destination QP (24 bits) */
	__u32 psn_first;  /* TCFAULT_F_PSN: inclusive, first <= last */
	__u32 psn_last;
	__u32 prob;	   /* TCFAULT_F_PROB: apply when draw < prob */
	__u32 skip;	   /* let the first skip matches through */
	__u32 limit;	   /* apply at most limit times; 0: no limit */
	__s32 corrupt_off; /* >= 0: from the BTH; < 0: from the frame's end */
	__u32 copies;	   /* TCFAULT_DUPLICATE: extra copies, 1..8 */
	__u64 seed;
};

/* What a rule did; reset by user space when it writes the rule. */
struct tcfault_count {
	__u64 matched; /* frames that matched the rule's fields */
	__u64 taken;   /* of those, past skip and the draw */
	__u64 applied; /* frames the action was applied to */
	__u64 failed;  /* the action could not be applied (a helper failed) */
};

/* The program's attachment point, set by user space before it attaches.
 * Only ingress is read here; the rest lets user space find a pinned
 * attachment's filter again. */
struct tcfault_config {
	__u32 ingress;	  /* 1: ingress hook (duplicates go to BPF_F_INGRESS) */
	__u32 ifindex;	  /* the interface, in its namespace */
	__u32 owns_qdisc; /* cls_bpf: the loader added the clsact qdisc */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TCFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, struct tcfault_rule);
} tcfault_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TCFAULT_MAX_RULES);
	__type(key, __u32);
	__type(value, struct tcfault_count);
} tcfault_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tcfault_config);
} tcfault_conf SEC(".maps");

/* The RoCE v2 headers of a frame. */
struct roce_frame {
	__u32 len;	   /* the frame's length (skb->len) */
	__u32 l3, l4, bth; /* offsets from the Ethernet header */
	__u32 qpn, psn;
	__u8 opcode;
	__u8 v6;
};

static __always_inline __u64 splitmix64(__u64 z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

/* draw is the k-th decision of a rule with seed: must equal
 * ebpf.TCFaultDraw (ebpf/tcfault.go). */
static __always_inline __u32 draw(__u64 seed, __u64 k)
{
	return splitmix64(seed + (k + 1) * 0x9E3779B97F4A7C15ULL) >> 32;
}

/* parse_roce fills f for a RoCE v2 frame; -1 for anything else. */
static __always_inline int parse_roce(struct __sk_buff *skb,
				      struct roce_frame *f)
{
	struct udp_hdr udp;
	__u8 bth[BTH_LEN];
	__u16 proto;

	f->len = skb->len;
	if (parse_l2(skb, &f->l3, &proto))
		return -1;
	if (proto == ETH_P_IP) {
		struct ipv4_hdr ip;
		__u32 ihl;

		if (load(skb, f->l3, &ip, sizeof(ip)))
			return -1;
		ihl = (ip.ver_ihl & 0xf) * 4;
		if ((ip.ver_ihl >> 4) != 4 || ihl < IPV4_MIN_HLEN ||
		    (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
		    ip.protocol != IPPROTO_UDP)
			return -1;
		f->l4 = f->l3 + ihl;
		f->v6 = 0;
	} else if (proto == ETH_P_IPV6) {
		struct ipv6_hdr ip6;

		if (load(skb, f->l3, &ip6, sizeof(ip6)))
			return -1;
		if ((bpf_ntohl(ip6.ver_tc_flow) >> 28) != 6 ||
		    ip6.nexthdr != IPPROTO_UDP)
			return -1;
		f->l4 = f->l3 + IPV6_HLEN;
		f->v6 = 1;
	} else {
		return -1;
	}
	if (load(skb, f->l4, &udp, sizeof(udp)) ||
	    udp.dest != bpf_htons(ROCE_V2_PORT))
		return -1;
	f->bth = f->l4 + UDP_HLEN;
	if (load(skb, f->bth, bth, sizeof(bth)))
		return -1;
	f->opcode = bth[0];
	f->qpn = (__u32)bth[5] << 16 | (__u32)bth[6] << 8 | bth[7];
	f->psn = (__u32)bth[9] << 16 | (__u32)bth[10] << 8 | bth[11];
	return 0;
}

/* corrupt XORs one byte of the frame with r->corrupt_xor and updates the
 * UDP checksum (if the frame has one) so that the frame still reaches the
 * RoCE layer, where its ICRC fails. 0 on success. */
static __always_inline int corrupt(struct __sk_buff *skb, struct roce_frame *f,
				   struct tcfault_rule *r)
{
	__s64 off = r->corrupt_off;
	__u8 old, new;
	__u16 from, to;

	/* Both bases come from f (the stack): a load that may read either
	 * the context or the stack is refused by the verifier. */
	if (off >= 0)
		off += f->bth;
	else
		off += f->len;
	if (off < f->bth || off >= f->len || off > 0xffff)
		return -1;
	if (load(skb, off, &old, 1))
		return -1;
	new = old ^ r->corrupt_xor;
	/* The byte's place in its 16-bit word of the UDP checksum. */
	if ((off - f->l4) & 1) {
		from = bpf_htons(old);
		to = bpf_htons(new);
	} else {
		from = bpf_htons((__u16)old << 8);
		to = bpf_htons((__u16)new << 8);
	}
	if (bpf_skb_store_bytes(skb, off, &new, 1, BPF_F_RECOMPUTE_CSUM))
		return -1;
	return bpf_l4_csum_replace(skb, f->l4 + 6, from, to,
				   BPF_F_MARK_MANGLED_0 | sizeof(__u16));
}

/* ecn sets the ECN field of the IP header to CE (0b11), fixing the IPv4
 * header checksum. The ICRC masks the field, so the frame stays valid. */
static __always_inline int ecn(struct __sk_buff *skb, struct roce_frame *f)
{
	__u8 b[2], nb[2];

	if (load(skb, f->l3, b, 2))
		return -1;
	nb[0] = b[0];
	nb[1] = b[1];
	if (f->v6) {
		/* version(4) traffic class(8) flow label(20): ECN is the
		 * class's low two bits, bits 5..4 of the second byte. */
		nb[1] |= 0x30;
		return bpf_skb_store_bytes(skb, f->l3 + 1, &nb[1], 1,
					   BPF_F_RECOMPUTE_CSUM);
	}
	nb[1] |= 0x03;
	if (bpf_skb_store_bytes(skb, f->l3 + 1, &nb[1], 1,
				BPF_F_RECOMPUTE_CSUM))
		return -1;
	return bpf_l3_csum_replace(skb, f->l3 + 10, *(__u16 *)b, *(__u16 *)nb,
				   sizeof(__u16));
}

/* duplicate sends copies clones of the frame to the same hook. */
static __always_inline int duplicate(struct __sk_buff *skb,
				     struct tcfault_rule *r)
{
	struct tcfault_config *c;
	__u32 zero = 0, mark = skb->mark, n = r->copies, i;
	__u64 flags = 0;
	int err = 0;

	c = bpf_map_lookup_elem(&tcfault_conf, &zero);
	if (c && c->ingress)
		flags = BPF_F_INGRESS;
	if (n < 1 || n > TCFAULT_MAX_COPIES)
		return -1;
	skb->mark = TCFAULT_MARK;
	for (i = 0; i < TCFAULT_MAX_COPIES; i++) {
		if (i >= n)
			break;
		if (bpf_clone_redirect(skb, skb->ifindex, flags))
			err = -1;
	}
	skb->mark = mark;
	return err;
}

static __always_inline int matches(struct tcfault_rule *r, struct roce_frame *f)
{
	if ((f->opcode & r->opcode_mask) != (r->opcode & r->opcode_mask))
		return 0;
	if ((r->flags & TCFAULT_F_QPN) && f->qpn != r->qpn)
		return 0;
	if ((r->flags & TCFAULT_F_PSN) &&
	    (f->psn < r->psn_first || f->psn > r->psn_last))
		return 0;
	return 1;
}

SEC("tc")
int vrnic_tcfault(struct __sk_buff *skb)
{
	struct roce_frame f = {};
	struct tcfault_rule *first;
	__u32 i, zero = 0;

	if (skb->mark == TCFAULT_MARK) {
		skb->mark = 0; /* a duplicate this program made */
		return TC_ACT_UNSPEC;
	}
	/* Rules fill the slots from 0 up: no rule, no parsing. */
	first = bpf_map_lookup_elem(&tcfault_rules, &zero);
	if (!first || first->action == TCFAULT_NONE)
		return TC_ACT_UNSPEC;
	if (parse_roce(skb, &f))
		return TC_ACT_UNSPEC;
	for (i = 0; i < TCFAULT_MAX_RULES; i++) {
		/* The key is a copy: the counter stays in a register the
		 * verifier tracks, so it sees the loop end. */
		__u32 key = i;
		struct tcfault_rule *r = bpf_map_lookup_elem(&tcfault_rules, &key);
		struct tcfault_count *c;
		__u64 k;
		int err;

		if (!r || r->action == TCFAULT_NONE)
			break; /* the first empty slot ends the rules */
		if (!matches(r, &f))
			continue;
		c = bpf_map_lookup_elem(&tcfault_counts, &key);
		if (!c)
			continue;
		k = __sync_fetch_and_add(&c->matched, 1);
		if (k < r->skip)
			continue;
		if ((r->flags & TCFAULT_F_PROB) && draw(r->seed, k) >= r->prob)
			continue;
		if (__sync_fetch_and_add(&c->taken, 1) >= r->limit && r->limit)
			continue;
		switch (r->action) {
		case TCFAULT_DROP:
			__sync_fetch_and_add(&c->applied, 1);
			return TC_ACT_SHOT;
		case TCFAULT_CORRUPT:
			err = corrupt(skb, &f, r);
			break;
		case TCFAULT_DUPLICATE:
			err = duplicate(skb, r);
			break;
		case TCFAULT_ECN:
			err = ecn(skb, &f);
			break;
		default:
			err = -1;
		}
		if (err) {
			__sync_fetch_and_add(&c->failed, 1);
			continue;
		}
		__sync_fetch_and_add(&c->applied, 1);
		return TC_ACT_UNSPEC;
	}
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
