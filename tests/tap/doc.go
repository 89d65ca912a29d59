// Package tap holds vrnic's end-to-end tests over the TAP link: two real
// vrnicd daemons, each in its own network namespace, joined by a Linux
// bridge, with client processes moving data through them. They need root
// (network namespaces, TAP devices, eBPF) and skip with a message
// otherwise; CI runs them as root.
//
// # Topology
//
//	netns <p>a: vrnicd A ─┐                         ┌─ vrnicd B :netns <p>b
//	  (-tap-netns <p>br)  │     netns <p>br         │  (-tap-netns <p>br)
//	                      └─ vta ── br0 ── vtb ─────┘
//	                   (TAP, kernel side = bridge ports)
//
// Each daemon runs in its own namespace (ip netns exec) and creates its
// multi-queue TAP in a third namespace that holds the bridge (the
// -tap-netns flag: the device is created by a thread switched into that
// namespace, the queue fds stay with the daemon). The kernel side of
// each TAP is then a bridge port, so frames go daemon A → vta → br0 →
// vtb → daemon B without any IP configuration in the kernel: the daemons
// answer ARP/ND for their own addresses and resolve each other, as NICs
// on one Ethernet segment do. The daemons' own namespaces keep them
// apart from the host's network; the bridge namespace keeps the bridge,
// the TAPs and the capture point out of the host's. Deleting the three
// namespaces (t.Cleanup, pass or fail) removes the bridge; the TAPs go
// with the daemons.
package tap
