// Package device is the control plane of a vrnic device: the control
// server that clients reach over a SOCK_SEQPACKET socket (server.go,
// msgio.go, handlers*.go, errors.go), the resources they create and their
// lifecycles (device.go, resources.go, memory.go), the QP state machine
// (qpstate.go, qpattr.go) and the operator commands (operator.go).
//
// The data plane plugs in through the DataPlane interface (seam.go),
// declared here and implemented by package device/dataplane, which runs
// the transport engine (package device/engine) over the clients' rings,
// doorbell records, CQs and memory. This package imports neither: its
// imports are abi, admin (the operator's JSON types), dma (host memory
// and MRs), doorbell (the context's doorbell page) and roce (QPN rules).
// What the transport changes on its own, a QP entering ERR, reaches the
// control plane through the QP's StateWord, not through a call.
//
// # Control protocol
//
// One datagram is one command or one reply: struct vrnic_msg_hdr and the
// command's struct (abi/vrnic_abi.h); fds travel as SCM_RIGHTS. Every
// datagram is checked strictly before it reaches a handler: the header's
// length equals the datagram's, flags and status are 0, the payload has
// the exact size of the command's struct (REG_MR: the struct plus 8 bytes
// per inline page), the number of fds is what the command takes, and every
// control message is SCM_RIGHTS. MSG_TRUNC and MSG_CTRUNC are detected.
// A defect gets an error reply (errno in status, NUL-terminated message);
// fds not taken by a handler are closed; the connection continues.
// Operator commands (0x100..) carry JSON (operator.go; the types are
// package admin's) and are served to operators only: root, the daemon's
// effective uid, or a member of Config.OperatorGroup, by the peer's
// SO_PEERCRED credentials (and its supplementary groups from
// /proc/<pid>/status, read when the connection is accepted; accounts.go
// has the limits of that). Anyone else gets EPERM and the connection
// continues: a client sees only what it created.
//
// # Ownership
//
// A connection opens one context (OPEN_CONTEXT). The context owns host
// memory regions (in the dma.Space, under the context's owner id), PDs,
// MRs, CQs, QPs, SRQs and AHs, and its doorbell page. Objects refer to
// each other and the device counts the references: a PD with MRs, QPs,
// SRQs or AHs, a CQ used by a QP, an SRQ attached to a QP, and host memory
// under an MR or a ring cannot be destroyed (EBUSY). When the connection
// ends for any reason, the context and everything in it is destroyed in
// dependency order (QPs, AHs, SRQs, CQs, MRs, PDs, host memory, doorbell
// page), dma.ReleaseOwner catches the rest, and the client's fds held by
// the daemon (memfd duplicates, completion eventfds) are closed.
//
// Limits: per context (EAGAIN), per uid (EAGAIN) and per device (ENOMEM),
// see Limits; a REG_MR longer than Limits.MaxMRPages pages is refused with
// EINVAL. A client is its uid (accounts.go): the device counts the
// connections and contexts of each uid and bounds them
// (Limits.PerUID), so that one process or one user cannot take every
// context; a connection past the uid's limit has its first command
// answered with EAGAIN and is closed. The operator's account listing
// (admin.AccountsCmd) sums per uid what its contexts hold.
//
// Serve survives accept errors (EMFILE, ENFILE, ...): it pauses, 5 ms
// doubling up to 1 s, and retries, until Close or until its listener is
// closed by someone else.
//
// Memory is charged per uid (the peer credentials of the connection), so
// that a user gains nothing by opening more contexts: the host memory its
// MRs and rings pin (Limits.PinnedBytesPerUID, counted in the 2 MiB
// chunks the daemon locks) and the storage of its MR page tables
// (Limits.MRTableBytesPerUID); beyond either, REG_MR or the ring's
// creation fails with ENOMEM and a message naming the limit. ADD_HOST_MEM
// itself pins nothing, whatever the memfd's size (package dma, "Pinning").
//
// Counters: the control path's own (DeviceCounters) and, in admin.Info,
// the data-path totals: the per-QP counters summed over the live QPs when
// an operator asks, plus those of every QP destroyed so far (counters.go);
// nothing is added on the data path for them.
//
// # Trust boundaries
//
// What a client may affect (only its own resources), what an operator may
// see, what the wire can do, and how each rule is enforced:
// kernel-notes/security.md.
//
// # Locking
//
// One mutex (Device.mu) guards all resource tables; every command runs
// entirely under it. The control path is not hot; the data path never
// takes it (a QP's state is a StateWord, which the transport writes
// without the lock), and nothing holding it waits for an engine worker
// (DataPlane, seam.go).
//
// # QP state machine
//
// See qpstate.go: the states and the transition table of required and
// optional attributes per QP type (IBTA 10.3, the qp_state_table of
// libibverbs); StateWord (seam.go) says who writes the state.
package device
