// Package ebpf holds the BPF programs vrnic attaches to its multi-queue TAP
// devices and their Go loader. Of vrnic's packages it imports only roce
// (SteerQueue, which the steering program must agree with); the loader is
// built on github.com/cilium/ebpf.
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
// Maps (all created by Load, owned by Programs, freed by Close):
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
// (steer_bpfel.o, filter_bpfel.o and their Go wrappers); regenerate with
// `go generate ./ebpf` (which also regenerates FilterReason's String,
// stats_string.go) and check with scripts/check-bpf.sh.
package ebpf
