// Package engine is the InfiniBand transport of vrnic (IBTA vol. 1
// chapter 9, reliability in 9.7): per QP a requester, a responder and a
// completer, run by N worker goroutines over links that carry RoCE v2
// frames. RC is the reliable service; UC and UD (unreliable.go) reuse the
// requester without acknowledgements, and have a responder of their own:
// UD QPs send through address handles (ah.go; their table, ahtable.go)
// and receive with the GRH.
//
// # Workers
//
// Worker i is a goroutine (deliberately not locked to an OS thread, see
// below); it owns the QPs that
// roce.SteerQueue(qpn, N) assigns to it and reads and writes Link i (TAP
// queue i, a UDP socket, an in-memory port), so the data path has no locks
// and per-QP ordering is free. Control operations (create, modify,
// destroy, query) travel to the owner through an unbounded queue; the
// control path posts them and never waits for a worker (a removal comes
// with a channel closed once it was applied, DestroyQP). A worker takes
// its queue at the top of every pass, again after each receive batch
// before handling its frames, and again before servicing its QPs: an
// operation posted before a frame was sent or a WQE was posted (the
// client learnt of the change from the command's reply) is in effect when
// the worker handles them. A worker loops: control messages, one receive
// batch
// (every frame parsed by roce, ICRC verified, dispatched to the QP's
// responder or completer), due timers, the output of every active QP
// (responses, then new requests: only QPs with recent work are serviced,
// active.go), one send batch. It polls while there is work and
// then sleeps until a kick (Engine.Kick, the doorbell), a frame
// (Link.Ready), a control message or its next timer. Timers are an
// indexed min-heap per worker with nanosecond deadlines (two per QP: ACK
// timeout and RNR back-off), not a goroutine or time.Timer per QP. A
// sleeping worker is woken shortly before its next deadline by a timerfd
// (the runtime alone wakes a goroutine no sooner than a millisecond) and
// polls through the last stretch, so timers fire within microseconds of
// their deadline (sleep.go).
//
// While it polls without work (up to 50 us before it sleeps) a worker
// yields (runtime.Gosched) between passes. A worker locked to its thread
// and spinning would keep its P: the goroutines that feed it (the doorbell
// poller, a link's waiter, a client in the same process) could run only
// when it slept or was preempted, and a yield on a locked thread costs a
// hand-off of the P to another thread and two futex calls. Unlocked, a
// yield with nothing else runnable returns at once (BENCHMARKS.md has
// what this changed).
//
// # Framing
//
// Config.Mode says what the links carry. In roce.ModeEthernet (the TAP
// link, the in-memory link) a frame is a whole Ethernet frame: the engine
// builds Ethernet, IP and UDP headers from the QP's path (PathFixup lets
// the TAP link fill in the MAC addresses) and roce.Parse reads the source
// and destination back from them. In roce.ModeUDP (the UDP link, the
// in-memory link in ModeUDP) a frame is the UDP payload only, BTH through
// ICRC, and its peer travels beside it in the Link calls: the engine
// sends to the QP's destination GID, port 4791, and takes the source of a
// received payload from the address beside it and the destination from
// Config.Local, the links' address. The ICRC covers the pseudo header of
// those two addresses and ports (roce.Pseudo): the kernel writes the real
// IP and UDP headers and nobody builds or parses them in user space.
// Either way an RC or UC packet reaches its QP only from the QP's peer: source
// = its destination GID, destination = its source GID (DESIGN 5);
// anything else is dropped and counted (WorkerCounters.BadPeer).
//
// # Memory layout and ownership
//
// Every frame buffer is a []byte of Config.FrameCap bytes; each worker
// owns Batch receive and Batch send buffers and exchanges them with its
// link (see Link). A frame is built in place: the payload is copied once
// from client memory (Memory.GatherTo or ReadRemoteTo) to
// buf[Path.Headroom(op):], roce.Path.Build writes the headers of the
// mode in front of it (so the frame starts at buf[0]) and the pad and
// ICRC behind it (an RC SEND or WRITE Only shorter than roce.FuseMin:
// roce.Path.BuildShort, the same bytes with less work, txShort, behind
// link headers encoded once per path in ModeEthernet); the peer beside
// a frame is a netip.AddrPort in an array
// of the worker's (txTo, rxFrom), never allocated per packet. On
// receive the payload is copied once from the frame to client memory
// (Scatter or WriteRemote). Per QP, send WQEs are copied once from the SQ
// (SendSource: package queues decodes each straight from the ring into
// the entry) into a private ring of SQDepth entries whose SGE lists and
// inline data live in slabs allocated with the ring, which the QP holds
// only while it is active (active.go):
//
//	head ──── completer: oldest WQE without a CQE
//	next ──── requester: the WQE it is sending
//	tail ──── WQEs fetched from the SQ
//
// The steady state allocates nothing per WQE, packet or CQE (tested with
// testing.AllocsPerRun). Counters are atomics, per QP and per worker; there
// is no logging on the data path.
//
// # State machines
//
// requester.go, responder.go and completer.go follow Linux rxe (rxe_req.c,
// rxe_resp.c, rxe_comp.c): an explicit state enum (its String generated by
// stringer from the names in the line comments: go generate) and small step
// functions, with the IBTA section quoted where the code is subtle.
// Where the IBTA and rxe differ the IBTA wins and a comment says so
// (retry_cnt 7 is a count of 7, not infinite). Which completion status
// (and which NAK code) each cause of failure means is decided in one table
// (status.go). A WQE's error status is set once on the WQE and turned into
// the CQE status in one place (completeSend). A QP in ERR completes every outstanding and later WR on
// both queues with WR_FLUSH_ERR.
//
// Loss is recovered as the IBTA says (go-back-N from a sequence NAK or an
// ACK timeout) unless both ends are vrnic and agreed otherwise (ECE,
// abi.ECEOptions): then sr.go's selective repeat and adaptive timer run,
// and nothing else on the wire changes (kernel-notes/loss.md).
//
// What the engine needs from other layers is declared here as interfaces:
// Memory (package dma), SendSource and RecvSource (package queues),
// CompletionSink (a CQ) and Link (package link: the TAP, UDP and
// in-memory links).
package engine
