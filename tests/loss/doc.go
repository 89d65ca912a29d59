// Package loss measures RC over a lossy link: two vrnicd daemons, a
// vrnic-perf server on one and a client on the other, once on a clean
// link and once per loss condition, with the loss put in by live fault
// rules (vrnicctl fault) or by the kernel-side injector (vrnicctl
// tcfault). It reports what the perf tool measured (goodput, latency
// percentiles, data verified) beside the daemons' counters that explain
// it (packets sent against the data packets the work needed, restarts,
// ACK timeouts, sequence NAKs, duplicates, ICRC errors, the injectors'
// own counts and the kernel's socket drops), and prints the comparison
// as Markdown.
//
// The package is the harness; its tests are the assertions (quick,
// bounded work, no rate or time asserted) and, on demand, the table
// (VRNIC_LOSS_TABLE=1; scripts/loss-table.sh).
//
// # Topology
//
// Daemon rules (Injector Rules; no privileges):
//
//	vrnicd A 127.0.48.1:4791 ──UDP link on lo── vrnicd B 127.0.48.2:4791
//	   │ fault rules (tx)                           │ fault rules (tx)
//	vrnic-perf client ────── control: unix socket ── vrnic-perf server
//
// Kernel injector (Injector Kernel; root): the same two daemons in a
// network namespace of their own (vl<pid>), whose lo carries their
// frames; the tc program (vrnicctl tcfault, tcx or cls_bpf) sits on that
// lo's egress hook, which every frame crosses exactly once. The daemons
// run with -udp-segment-ipv4=false there, so that each frame is a
// datagram of its own at the hook (a UDP_SEGMENT datagram would be one
// "frame" to the rules, and a drop would lose all of it); the clean run
// of that variant uses the same flag, so its ratios compare like with
// like. The perf processes stay outside the namespace: they reach the
// daemons through their unix sockets.
//
// One worker per daemon, the path MTU 4096 (vrnic-perf's default), the
// ACK timeout code 14 (about 67 ms) and retry count 7 that vrnic-perf's
// connections use.
//
// # Conditions
//
//	none       no rule (the baseline of the ratios, measured in the same run)
//	drop 0.1%  each daemon drops 0.1% of the requests it sends (RC SEND,
//	           RDMA WRITE, RDMA READ and atomic requests; ACKs and READ
//	           responses pass)
//	drop 1%    the same at 1%
//	mix        each daemon, on everything it sends: 5% dropped, 1% of the
//	           frames that carry a payload corrupted (the receiver's ICRC
//	           check drops them), 1% duplicated, 1% held back behind 3
//	           later frames (reordered); the kernel variant has no reorder
//	           action and corrupts 1% of all RC frames (the byte before
//	           the ICRC)
//
// Every probability is drawn from a seed: the daemons get -fault-seed
// (Config.Seed+1 and +2) and each rule a fixed id, reinstalled before
// each test, so each test of a condition meets the same sequence of
// decisions; tc rule i gets seed=Config.Seed+100+i. With one worker per
// daemon, the same traffic gives the same faults.
//
// # Tests
//
// write_bw (64 KiB RDMA WRITEs, -depth outstanding, the client waiting
// for completion events rather than polling, the server's memory
// checksummed after the run), send_lat and read_lat (8 bytes, one at a
// time). vrnic-perf verifies the data and fails on any completion in
// error.
//
// # Counters
//
// The daemons' data-path counters (vrnicctl -json info, data_path and
// wire) and the rules' matched/applied counts are read before and after
// each test. In write_bw the client's QP sends nothing but requests, so
// its packets sent less the packets the completed WRITEs needed (each
// ceil(size/MTU)) are the requests it sent again; every request the
// injector dropped or corrupted must have been sent again at least once
// for its data to arrive, which is what the tests assert. Go-back-N sends
// again everything after a hole; selective repeat only the holes.
//
// # Selective repeat
//
// Config.SR passes -selective-repeat -ece rto (selective repeat and the
// adaptive retransmission timer) to the vrnic-perf server and client;
// SRSupported asks the vrnic-perf binary (client -h and server -h)
// whether it has the flag. Without it the SR runs are skipped, saying
// so.
package loss
