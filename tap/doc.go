// Package tap is vrnic's TAP link: a multi-queue TAP device per emulated
// NIC, its netlink set-up, the NIC's own ARP and IPv6 neighbour discovery,
// its GID table, and batched frame I/O per queue.
//
// # Picture
//
//	kernel (bridge port / host interface)         vrnicd
//	   tapN  ── queue 0 fd ──────────────► worker 0 (also ARP/ND)
//	         ── queue 1 fd ──────────────► worker 1
//	         ── ...                        ...
//
// The interface tapN is the kernel's end of a virtual cable; the emulated
// NIC is at the other end. The NIC's IP addresses (Config.Addrs) are not
// configured on tapN: the kernel reaches them through tapN like any host
// on the link, and the NIC answers ARP and neighbour solicitations for
// them itself (Neighbors), as NIC firmware does. The kernel side is a
// bridge port or an interface with its own address, e.g. in a network
// namespace.
//
// The device is created non-persistent with IFF_TAP|IFF_MULTI_QUEUE|
// IFF_NO_PI (no IFF_VNET_HDR: frames are plain Ethernet, no offloads), one
// fd per queue; it disappears when Close closes the last fd. Worker i
// reads and writes queue i only; the eBPF steering program (package ebpf,
// attached through Device.Control) puts each received RoCE v2 frame on the
// queue of the worker owning its destination QP and everything else
// (ARP, ND) on queue 0, whose worker passes those frames to
// Neighbors.HandleFrame.
//
// # Buffers
//
// Queue.ReadBatch and Queue.WriteBatch move several frames per wakeup
// between the queue fd and caller-owned buffers: frame i is at
// bufs[i][offset:offset+sizes[i]]; the offset bytes in front are headroom
// where a sender builds headers in place. Neither allocates.
//
// # fd ownership
//
// The Device owns its queue fds; Close closes them. Control lends queue
// 0's fd to a callback (for the TUNSETSTEERINGEBPF/TUNSETFILTEREBPF
// ioctls) for the duration of the call.
package tap
