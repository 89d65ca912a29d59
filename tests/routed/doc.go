// Package routed holds vrnic's many-hosts tests: four "hosts" (network
// namespaces), each on its own subnet, joined by two routers (namespaces
// that forward IPv4 and IPv6), a vrnicd in each host. They need root
// (network namespaces, veth, bridges, TAP devices, eBPF), ip(8), ping and
// sysctl, and skip with a message otherwise; CI runs them as root.
//
// # Topology
//
//	h0: 10.142.1.0/24                              h2: 10.142.3.0/24
//	br0 ── up0 ══ d0 ┐                          ┌ d2 ══ up0 ── br0
//	                 r1 t1 ════════════════ t2 r2
//	br0 ── up0 ══ d1 ┘    10.142.100.0/30       └ d3 ══ up0 ── br0
//	h1: 10.142.2.0/24                              h3: 10.142.4.0/24
//
// Host hI (namespace <p>hI) has a bridge br0, its Ethernet segment, with
// the host kernel's addresses 10.142.(I+1).2/24 and fd42:142:(I+1)::2/64
// and default routes via the router port .1 / ::1. The bridge's port up0
// is a veth whose other end dI is that router port, in r1 (hosts 0, 1) or
// r2 (hosts 2, 3). The routers are joined by the veth pair t1 ═ t2
// (10.142.100.0/30, fd42:142:100::/64) and route the other router's
// subnets through it. So h0 ↔ h1 crosses r1, and h0 ↔ h3 crosses r1 and
// r2 (TestTopology checks the paths with ping and growing TTLs). There is
// no bridge between hosts: the only way from one to another is IP
// forwarding.
//
// The daemons run inside the host namespaces (ip netns exec), one worker
// each, on either link:
//
//   - UDP: -link udp -local 10.142.(I+1).2:4791, the host kernel's
//     address; the kernels route the datagrams.
//   - TAP: -link tap -tap-name vnic0 -tap-mtu 1500 -tap-addr
//     10.142.(I+1).3/24 -tap-addr fd42:142:(I+1)::3/64 -tap-gateway
//     10.142.(I+1).1 -tap-gateway fd42:142:(I+1)::1; the TAP is made a
//     port of br0, so the NIC is a second station on the host's segment
//     with addresses of its own. Every peer is off its prefixes: it
//     resolves its gateway's MAC by ARP or neighbour discovery when a QP
//     goes to RTR and sends there, with the peer's IP addresses.
//
// Clients connect to a daemon through its control socket (a path), so
// they run anywhere; the tests run them in the host's namespace anyway.
// All links have MTU 1500 and the QPs path MTU 1024.
//
// # Tests
//
// TestAllToAllUDP and TestAllToAllTAP (allToAll): a helper process per
// host (this test binary in its helper role, in the host's namespace)
// opens the host's daemon; every two hosts get an RC QP pair, and every
// ordered pair runs rounds of WRITE, SEND and READ of 1 B to 64 KiB,
// each checked where the data lands. h3's daemon is SIGKILLed while the
// other pairs' rounds run: the QPs of h0, h1 and h2 to h3 fail with
// RETRY_EXC_ERR (ACK timeout code 16, retry count 3: about a second),
// the other pairs go on, checked; the daemon is restarted at the same
// address, new QPs to it connect, and all pairs run again.
//
// TestMPIUDP and TestMPITAP (mpiJob): an Open MPI job of four ranks,
// rank I in host I's namespace on host I's daemon through vrnic-run, over
// pml ucx with UCX on rc_verbs and ud_verbs; mpirun runs in h0 and starts
// the other hosts' ORTE daemons through an rsh agent that runs them with
// ip netns exec.
//
// # By hand
//
// The UDP variant with two hosts and one router (the tests add a second
// router; TAP daemons take the flags above instead of -local):
//
//	go build -o /tmp/routed-bin/ ./cmd/vrnicd ./cmd/vrnic-perf
//	for n in vrtrh0 vrtrh1 vrtrr1; do ip netns add $n; ip -n $n link set lo up; done
//	ip netns exec vrtrr1 sysctl -w net.ipv4.ip_forward=1
//	for i in 0 1; do
//	  s=$((i+1))
//	  ip -n vrtrh$i link add br0 type bridge
//	  ip -n vrtrh$i link add up0 type veth peer name d$i netns vrtrr1
//	  ip -n vrtrh$i link set up0 master br0
//	  for l in up0 br0; do ip -n vrtrh$i link set $l up; done
//	  ip -n vrtrr1 link set d$i up
//	  ip -n vrtrh$i addr add 10.142.$s.2/24 dev br0
//	  ip -n vrtrr1 addr add 10.142.$s.1/24 dev d$i
//	  ip -n vrtrh$i route add default via 10.142.$s.1
//	  ip netns exec vrtrh$i /tmp/routed-bin/vrnicd -name h$i -runtime-dir /tmp/routed-run \
//	      -link udp -local 10.142.$s.2:4791 &
//	done
//	# once both sockets are up (1500-byte links: path MTU 1024)
//	/tmp/routed-bin/vrnic-perf run -dev-a /tmp/routed-run/h0.sock -dev-b /tmp/routed-run/h1.sock \
//	    -test write_bw -mtu 1024
//
// Stop the daemons by their PIDs, then ip netns del each namespace.
package routed
