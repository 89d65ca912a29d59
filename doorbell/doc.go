// Package doorbell implements the doorbell page, the eventfd kicks, CQ
// arming, completion events and the daemon's polling loop of vrnic. Of
// vrnic's packages it imports only abi (the record layout) and
// internal/fdwait (the poller's wait).
//
// The doorbell page (abi.DBPageSize bytes, a memfd the daemon creates per
// context and the client maps shared, read/write) is an array of 128-byte
// records. Record 0 is the page header (magic, ABI version, kick_needed);
// records 1.. are handed out to QPs, CQs and SRQs. In every record bytes
// 0..63 are written only by the client and bytes 64..127 only by the
// daemon, so the two sides never write the same cache line:
//
//	record 0  header  | magic abi_version kick_needed ... (daemon) | reserved (client) |
//	QP        client  | sq_pi rq_pi ...    | daemon | sq_ci rq_ci ...             |
//	CQ        client  | cq_ci arm ...      | daemon | cq_pi arm_sn_done overflow |
//	SRQ       client  | srq_pi ...         | daemon | srq_ci ...                |
//
// Every word is a free-running u32 accessed with 32-bit atomics (Go's
// sync/atomic operations are sequentially consistent; on amd64 a store is
// XCHG, matching __atomic_store_n(..., __ATOMIC_SEQ_CST) in C clients).
//
// Ringing a doorbell (client, Page.Ring): store the producer index, then
// load kick_needed; only if it is non-zero write the context's kick eventfd.
// While the daemon polls, kick_needed is 0 and posting costs no system
// call.
//
// Going to sleep (daemon, Poller): after SpinBudget empty passes the poller
// stores kick_needed = 1 in every page it serves, re-checks every record,
// and only if that finds nothing sleeps until a kick eventfd is readable.
// Because both sides store first and load second with sequentially
// consistent operations, at least one of them sees the other's store: the
// re-check sees the post, or the client sees kick_needed and kicks. No
// wake-up is lost. On waking the poller clears kick_needed and drains the
// eventfd.
//
// The kick eventfds are in an epoll set, and the poller sleeps on the Go
// poller, not in a blocking epoll_wait: it waits until the epoll fd itself
// is readable (package internal/fdwait: a poll(2) check with a zero
// timeout, then park), then collects the events with a zero-timeout
// epoll_wait. A thread blocked in a system call keeps its P until the
// runtime takes it back, which would stall a worker sharing the P.
//
// One page is served by one Poller (kick_needed is a single word).
//
// Completion events (CQNotifier, Signaller): after writing a CQE the
// engine worker decides, in memory, whether the CQ's arm is owed an event
// (CQNotifier.Completed: the arm word, the sequence, cq_ci). Raising the
// event must not block the worker, and a write(2) to the client's eventfd
// can: the daemon's descriptor shares its open file description, and so
// its O_NONBLOCK flag, with the client's, and a client that clears the
// flag and fills the counter to 2^64-2 makes the next write sleep until
// somebody reads the counter (kernel-notes/eventfd.md). So the worker
// never writes it:
//
//   - KernelSignaller (the default): the kernel signals the eventfd. One
//     io_submit(2) of an AIO poll request on a daemon-private, always
//     readable eventfd, with IOCB_FLAG_RESFD naming the client's eventfd:
//     the request completes inside the call and aio_complete signals the
//     eventfd with eventfd_signal, which never sleeps (a saturated counter
//     saturates further). One system call per event, as the write it
//     replaces, on the worker, with no hand-over and no allocation.
//   - EventWriter (where the kernel refuses that: no AIO, no poll
//     requests, io_setup denied): the worker hands the CQ to its client's
//     writer goroutine (one per context), which adds up the events owed
//     and writes them. A write the client made block stops only that
//     client's writer; closing the CQ drains the counter with a read that
//     cannot block (below), which lets the write finish.
//
// Reads never block either: EventFD.Drain reads with preadv2(RWF_NOWAIT),
// which an eventfd honours per call whatever its O_NONBLOCK flag, so a
// client that clears the flag on its kick eventfd and empties the counter
// between the poller's epoll_wait and its read cannot make the poller
// sleep in read(2).
//
// File descriptors: a Page owns its memfd and kick eventfd and closes them
// in Close; callers that send them to a client send them before Close (the
// client's copies are separate descriptors, on the same open file
// description). A CQ's completion eventfd is created by the client; the
// daemon's duplicate is owned by the CQNotifier it is given to.
package doorbell
