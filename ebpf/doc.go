// Package ebpf holds the BPF programs vrnic attaches to its multi-queue TAP
// devices, its kernel-side fault injector, and their Go loaders. Of vrnic's
// packages it imports only roce (SteerQueue, which the steering program
// must agree with) and internal/nsrun; the loaders are built on
// github.com/cilium/ebpf and github.com/vishvananda/netlink.
//
// Two BPF_PROG_TYPE_SOCKET_FILTER programs run in the tun driver on every
// frame the kernel sends to the device (frames the emulated NIC receives):
//
//   - the steering program (steer.c, attached with TUNSETSTEERINGEBPF)
//     returns roce.SteerHash of the BTH destination QP of a RoCE v2 frame,
//     and 0 for anything else; the kernel puts the frame on TAP queue
//     (u16)ret % queues, so RoCE frames land on the queue of the worker that
//     owns the QP (roce.SteerQueue) and ARP/ND land on queue 0;
//   - the filter program (filter.c, attached with TUNSETFILTEREBPF) keeps
//     ARP and neighbour discovery for the device's addresses and RoCE v2 to
//     them, and drops everything else, counting each verdict by reason.
//
// A third program, the kernel-side fault injector (tcfault.c, a
// BPF_PROG_TYPE_SCHED_CLS program attached with tcx, or as a cls_bpf
// filter on a clsact qdisc where tcx is missing), runs on the ingress or
// egress hook of any interface and drops, corrupts, duplicates or
// ECN-marks RoCE v2 frames by BTH destination QP, opcode and PSN, with
// seeded probabilities user space can predict (TCFaultTakes): it faults
// traffic vrnic does not build itself (AttachTCFaults, TCFaults). Its
// maps, per attachment:
//
//	tcfault_rules   array[16]  struct tcfault_rule, written by SetRules
//	tcfault_counts  array[16]  {matched, taken, applied, failed} u64,
//	                           atomic adds (the match index must be global
//	                           for the draws to be reproducible)
//	tcfault_conf    array[1]   {ingress u32}
//
// Maps of the TAP programs (all created by Load, owned by Programs, freed
// by Close):
//
//	steer_conf    array[1]            {queues u32}, written by Load
//	steer_stats   percpu array[257]   u64: [q] RoCE frames steered to q,
//	                                  [256] non-RoCE frames (queue 0)
//	dev_addrs4    hash be32 -> u8     device IPv4 addresses (SetAddrs)
//	dev_addrs6    hash [16]u8 -> u8   device IPv6 addresses (SetAddrs)
//	filter_stats  percpu array[reason] u64 verdict counters
//
// Once attached, the kernel holds its own reference to each program: the
// programs stay attached until the TAP device is destroyed or Detach is
// called, even after Close (the counters are then no longer readable).
//
// The objects are built by bpf2go from the C sources and committed
// (steer_bpfel.o, filter_bpfel.o, tcfault_bpfel.o and their Go wrappers);
// regenerate with
// `go generate ./ebpf` (which also regenerates FilterReason's String,
// stats_string.go) and check with scripts/check-bpf.sh.
package ebpf
