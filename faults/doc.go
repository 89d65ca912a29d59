// Package faults injects faults into a live daemon's traffic: rules that
// drop, duplicate, reorder, corrupt, delay, rate-limit, ECN-mark frames or
// take the link down for a while, and verb-level faults inside the
// transport (RNR NAKs, QP to ERR, CQ overflow, CQE delay, malformed WQE,
// port flap), added, listed, changed and removed at
// run time over the control socket (admin.FaultCmd, vrnicctl fault), or
// loaded at start from the config file (key "faults") or a scenario file
// (vrnicd -faults FILE).
//
// # Where it sits
//
// An Injector holds a device's rules; Wrap puts the fault layer on each
// of the engine's links (UDP, TAP, in-memory alike), between the engine's
// workers and the link:
//
//	engine worker ──SendBatch──► fault layer ──► link ──► wire
//	engine worker ◄─RecvBatch─── fault layer ◄── link ◄── wire
//	                                  │
//	                                  └─► Observer (the packet capture)
//
// The capture sees frames through the layer (Observer): a sent frame as
// the engine built it, before any rule, and a received frame as the link
// delivered it, before any rule; each with a comment naming what the
// rules did ("fault rule 3: drop"). So a dropped frame is in the capture
// with its comment, a corrupted one shows its original bytes, and a
// duplicated, delayed or reordered one appears once, where the engine
// sent it (or the link delivered it), with the action in the comment.
//
// With no rule enabled (and nothing held back) a link costs one atomic
// load of the rule set per call (BenchmarkNoRules: the ratio to the bare
// link is 1 within noise). With rules, each frame is parsed (offsets
// only; the ICRC is the receiver's business), its flow tracked and the
// rules matched in id order; nothing is allocated per frame unless a
// rule acts.
//
// # Rules
//
// A rule (admin.FaultRule, JSON or YAML with the same names) has filters,
// all of which must match, and one action. Frames that are not RoCE v2
// (ARP, ND on a TAP) pass untouched.
//
//	id          rule id (assigned from 1 when 0); rules run in id order
//	name        a label
//	disabled    kept, counted nowhere, not applied
//	dir         tx, rx or both (default)
//	peer        the remote end: IP, IP:port (the port is ignored) or prefix
//	qpn         BTH destination QP (on tx the peer's QP, on rx ours)
//	src_qpn     DETH source QP (UD frames; RC/UC frames carry none)
//	op          opcode names (RC_RDMA_WRITE_FIRST, UD_SEND_ONLY, 0x0a) or
//	            classes: request, response, ack, nak (NAK and RNR NAK),
//	            rnr_nak, read_response, atomic, atomic_ack, send, write,
//	            read (read requests), cnp
//	psn         "A" or "A-B", inclusive
//	message     {kind, index, packet}: the packet-th packet (from 1) of the
//	            index-th message (from 1) of kind (send, write, read,
//	            read_response, atomic, atomic_ack, ack) on the frame's flow;
//	            0 means any
//	round       first (the first transmission of the PSN), retransmit, or
//	            n: the n-th retransmission
//	probability of acting on a matching frame (default 1), drawn from the
//	            rule's seeded PRNG
//	count       act at most this many times (0: no bound)
//	after/until the rule's time window from its installation (durations)
//	action      {type, parameters}:
//	  drop
//	  duplicate  copies (default 1) sent right after the frame
//	  reorder    hold the frame until frames more frames (default 3) of its
//	             direction have passed, or for (default 1ms)
//	  corrupt    flip the bits of mask (default: drawn) at offset (default:
//	             drawn) of field payload (default), bth or icrc; fix_icrc
//	             recomputes the ICRC after, so that the receiver accepts the
//	             bad data
//	  delay      dist fixed (delay), uniform (min, max) or normal (delay as
//	             the mean, stddev)
//	  rate       bps or pps over the frames the rule matches, burst frames
//	             (default 1); a frame waits its turn, or is dropped if that is
//	             more than for (default 100ms) away; ce_above marks CE (as
//	             ecn does) on the frames that wait longer than it: a queue
//	             marking above a threshold
//	  ecn        mark CE: the ECN bits of the IP header (checksum fixed; the
//	             ICRC does not cover them); on the UDP link, whose IP header
//	             the kernel writes, the BTH FECN bit. A receiving daemon
//	             with -cc dcqcn answers a marked data packet with a CNP
//	             (kernel-notes/congestion.md); marks are counted and
//	             captured
//	  down       the link is down for for: this frame and every later one in
//	             the rule's direction(s) and peer are dropped until then
//	  verb       a verb-level fault (below), named by verb
//
// A frame goes through every rule that matches, in id order: a drop or a
// link-down ends the list; a frame is held back (delay, reorder, rate) by
// the first such rule only. "matched" counts the frames a rule's filters
// selected (before its time window, probability and count), "applied" the
// frames it acted on. Every action applied is logged (rule, action,
// direction, QPN, PSN, opcode, peer; at most 1000 lines a rule).
//
// # Verb-level faults
//
// A rule with action verb strikes inside the transport, not on a frame.
// Its filters are qpn (the local QP), cq (a CQ handle, for cq_overflow
// and cqe_delay), probability, count, after and until; the frame filters
// (dir, peer, src_qpn, op, psn, message, round) are refused. What each
// does, and what the IBTA has either side see:
//
//	rnr          the RC responder answers a request that needs a receive
//	             WQE with an RNR NAK although WQEs are posted (count: how
//	             many). The requester waits the RNR timer and retries, up
//	             to rnr_retry times (7: forever): it succeeds once the
//	             rule is spent, or completes the WR with
//	             RNR_RETRY_EXC_ERR (and its QP goes to ERR; no
//	             asynchronous event: the completion says why, as on Linux)
//	qp_err       the QP goes to ERR at its next send WQE fetch or request
//	             received, as on a catastrophic error: QP_FATAL on its
//	             context's event socket, every outstanding WR flushed
//	             (WR_FLUSH_ERR). A QP in ERR drops what it receives without
//	             an answer (IBTA 10.3.1), so the peer's requests time out:
//	             the peer sees RETRY_EXC_ERR after retry_cnt
//	             retransmissions, not REM_OP_ERR (which only a responder
//	             that answers sends)
//	cq_overflow  the next completion into the CQ overflows it, as a full
//	             CQ would: CQ_ERR (the CQ's handle), the QP of that
//	             completion to ERR (QP_FATAL); the CQ takes no completion
//	             any more, so every other QP on it goes to ERR at its next
//	             completion (IBTA 11.4.2.1)
//	cqe_delay    the next completion into the CQ appears only after delay,
//	             and every later completion of that CQ waits behind it, in
//	             order: the IBTA has a work queue's completions returned in
//	             the order its WRs were posted, and a CQ serves several
//	             queues, so holding the whole CQ keeps every queue's order
//	             (the CQ looks stalled for delay). At most a CQ's worth is
//	             held (one more overflows it); held completions of a CQ
//	             destroyed meanwhile are dropped
//	bad_wqe      the next send WQE fetched is treated as malformed:
//	             LOC_QP_OP_ERR, as for a WQE the ring's checks reject; the
//	             QP goes to ERR (no event: the completion says why), its
//	             later WRs are flushed, nothing of it reaches the wire
//	port_flap    the port goes down for for (after after): every context
//	             of the device gets PORT_ERR, QUERY_PORT says DOWN, every
//	             frame in either direction is dropped (captured with
//	             "port down"); then PORT_ACTIVE. It takes after and for
//	             only; deleting the rule brings the port up at once
//
// The engine asks the faults through one atomic pointer (engine
// VerbFaults, device/engine/verbfaults.go; the CQ points in
// device/dataplane/verbfaults.go), nil while no verb rule is enabled: a
// WQE fetch, a receive and a completion then cost one load of a nil
// pointer more (BenchmarkVerbHooks in device/engine measures the hooks
// even installed: a ratio of 1 within noise). "matched" counts the times
// a rule's qpn and cq filters matched at its point, "applied" the faults
// it injected (port_flap: its flaps).
//
// # Suites
//
// Package faults/suite starts daemons, installs rules over the control
// socket, runs a verbs workload and returns completions, counters and
// captures, with the checks a fault suite needs (each WR completed
// exactly once with the right status, no data changed without an ICRC
// error, go-back-N retransmissions). examples/faultmatrix is a suite to
// copy: a workload under a matrix of faults, PASS or FAIL per cell.
//
// # Flows, messages and rounds
//
// A flow is one PSN stream on one link: a direction, a destination QP and
// a peer, with requests and responses apart (a QP's requests run in its
// own PSN space, its ACKs and read responses in the peer's). A frame whose
// PSN is above the highest the flow has carried is a first transmission
// (round 0); any other is a retransmission, and its round is how many
// times that PSN went before (remembered for the last 4096 PSNs). A
// FIRST or ONLY packet on its first transmission starts a message; a
// rule counts the messages of its kind that started after it was
// installed, so "message 2" is the second one since the rule exists.
// ACKs count as messages of kind ack when their PSN advances.
//
// # Seeds
//
// Every random decision of a rule (probability, drawn offsets and masks,
// uniform and normal delays) comes from a PRNG of its own, seeded from
// the daemon's fault seed and the rule's id; the seed is logged and
// listed (vrnicctl fault list). The same seed and the same traffic give
// the same faults. Traffic of QPs on several workers interleaves its
// draws as the workers run; one QP's traffic, or one worker's, replays
// exactly.
//
// # Files
//
// A scenario file (vrnicd -faults FILE) and the config file's "faults"
// key hold admin.FaultScenario: {"seed": N, "rules": [rule...]}. YAML
// (a name ending in .yaml or .yml) is the same document:
//
//	seed: 1234
//	rules:
//	  - {id: 1, dir: tx, qpn: 0x1234, message: {kind: write, index: 2, packet: 3},
//	     round: first, action: {type: drop}}
//	  - {id: 2, dir: rx, op: [ack], probability: 0.1, action: {type: delay, dist: uniform, min: 10us, max: 2ms}}
//	  - {id: 3, dir: tx, op: [write], probability: 0.01, action: {type: corrupt, field: payload, fix_icrc: true}}
//
// Unknown fields, values out of range, impossible ranges (psn 9-5, until
// before after, uniform max below min), parameters the action does not
// take and unknown actions are errors that say what is wrong, in the
// daemon (which trusts no operator JSON) and in vrnicctl.
package faults
