// Package verbs is the Go client library of vrnic: what libibverbs is to a
// hardware RNIC. It imports only the ABI (package abi) and
// golang.org/x/sys; it never links daemon code, and a C client written
// from abi/vrnic_abi.h alone can do everything it does.
//
// # Two paths
//
// The control path is a SOCK_SEQPACKET connection to vrnicd: Open sends
// OPEN_CONTEXT and receives the doorbell page memfd and the kick eventfd;
// AddHostMem, AllocPD, RegMR, CreateCQ, CreateQP, Modify, Query, CreateSRQ,
// CreateAH and the Destroy methods are one command and one reply each.
// Closing the Context (or the process dying) makes the daemon destroy
// everything the context created.
//
// The data path never talks to the daemon: PostSend, PostRecv and
// SRQ.PostRecv write WQEs into rings in host memory and store the new
// producer index in the object's doorbell record; CQ.Poll reads CQEs from
// the CQ ring by their owner bit and stores the consumer index. None of
// them allocates or makes a system call, except the kick: after storing a
// producer index, the poster reads the page's kick_needed word and writes
// the kick eventfd only if the daemon said it is going to sleep.
//
// # Memory layout
//
//	host memory (memfd, mapped here and in the daemon; PA = base + offset)
//	  ├─ SQ ring:  max_send_wr slots × sq_wqe_blocks × 64 B
//	  │            block 0 struct vrnic_send_wqe, then SGEs (4 per block) or inline data
//	  ├─ RQ ring:  max_recv_wr slots × rq_wqe_size B: struct vrnic_recv_wqe + SGEs
//	  ├─ CQ ring:  cqe_count × 32 B struct vrnic_cqe, owner byte last
//	  │            (a timestamped CQ: then cqe_count × u64 completion times)
//	  └─ buffers and REG_MR page lists
//	doorbell page (daemon's memfd, mapped here): 128-byte records
//	  record 0   header: magic, ABI version, kick_needed (daemon-written)
//	  QP record  bytes 0..63 client: sq_pi, rq_pi | bytes 64..127 daemon: sq_ci, rq_ci
//	  CQ record  client: cq_ci, arm word          | daemon: cq_pi, arm_sn_done, overflow
//	  SRQ record client: srq_pi                   | daemon: srq_ci
//
// Every index is a free-running u32; a slot is index & (slots-1). A poster
// never reuses a slot before the daemon's consumer index says it was
// consumed (ErrQueueFull).
//
// # Memory registration
//
// Host memory is allocated by Context.Alloc (regions of at least 4 MiB
// added on demand) or HostMem.Alloc. RegMR registers a Buffer with its
// process virtual address as IOVA (like ibv_reg_mr) and builds the page
// list from the buffer's PA: inline in the command up to 64 pages,
// otherwise in a temporary buffer in host memory named by pbl_pa.
//
// # ABI 1.4 memory and CQ features
//
// With the semantics the project's C library gives libibverbs programs
// (ibverbs/src/mrdm.c): MR.Rereg and MR.ReregAt (REREG_MR) change an MR's
// translation, PD or access and keep its keys, sending the new page list
// as RegMR does; CQ.Resize (RESIZE_CQ) moves a CQ to a new ring, the
// daemon carrying the completions not yet polled over at the same
// free-running indices, so polling goes on from the same consumer index;
// Context.AllocDM (ALLOC_DM) maps a memfd of device memory the daemon
// made, reached by DM.CopyTo and DM.CopyFrom here and by the device
// through PD.RegDMMR's zero-based MRs (REG_DM_MR); QueryDeviceEx adds
// QUERY_DEVICE_EX's device memory size and the device clock to
// QueryDevice. CreateCQWithTimestamps makes a CQ whose ring carries, after
// its CQEs, one u64 per CQE: the CLOCK_REALTIME nanoseconds at which the
// daemon wrote it, read with PollTS and comparable with QueryRTValues.
// Memory windows (AllocMW, BindWR) are in mw.go; ATOMIC WRITE and FLUSH
// work requests (AtomicWriteWR, FlushWR) in placement.go; XRC domains,
// XRC SRQs and target QPs (OpenXRCD, PD.CreateXRCSRQ, CreateTargetQP;
// initiators are CreateQP's abi.QPTXRCSend) in xrc.go; on-demand paging
// (ODPCaps, PD.RegMRODP, PD.RegMRImplicitODP, PD.AdviseMR) in odp.go.
//
// # Who consumes the work
//
// vrnicd runs the RC transport (package device/engine) over its link:
// work posted to an RC QP is read from the ring by the daemon, validated
// (a malformed WQE completes with an error status and moves the QP to
// ERROR), carried to the peer, and completed in the QP's CQs. UD QPs can
// be created and moved through their states, but the daemon carries no UD
// traffic yet: work posted to a UD QP stays in its ring. A device served
// without a data path (device/devicetest by default) consumes nothing, and
// nothing in this package fakes completions.
//
// # Concurrency
//
// Control calls may be made from several goroutines. Posting to one QP or
// SRQ, and polling or arming one CQ, must be done by one goroutine at a
// time.
package verbs
