package engine

import (
	"errors"
	"net/netip"

	"github.com/vrnic/vrnic/abi"
)

// Memory is what the engine needs from the memory layer (package dma) for
// one QP: every method is scoped to the QP's protection domain. Offsets
// are message offsets; a method fills or drains exactly len(buf) bytes or
// fails. Errors must wrap one of ErrMemProtection, ErrMemLength or
// ErrMemBounds so the engine can pick the completion status or NAK code.
type Memory interface {
	// GatherTo hands n bytes of the message described by sges,
	// starting at message offset off, to s in order, one Put per piece
	// contiguous in memory (views of client memory, valid during the
	// call only), instead of copying them: the requester's sink copies
	// each piece into the frame and computes the ICRC in the same pass.
	// The SGEs are checked against their lkeys (local read needs no
	// access flag); on an error, the pieces before it have been put.
	GatherTo(sges []abi.SGE, off uint64, n int, s Sink) error
	// Scatter copies src to the message described by sges starting at
	// message offset off; the MRs need local write access.
	Scatter(sges []abi.SGE, off uint64, src []byte) error
	// WriteRemote copies src to [va, va+len(src)) of the MR of rkey,
	// which needs remote write access.
	WriteRemote(rkey uint32, va uint64, src []byte) error
	// ReadRemoteTo hands [va, va+n) of the MR of rkey, which needs
	// remote read access, to s in order, as GatherTo does (the READ
	// responder puts it into the response frame with its ICRC); nothing
	// is put unless the whole range passes the checks.
	ReadRemoteTo(rkey uint32, va uint64, n int, s Sink) error
	// CheckRemote validates a whole remote range [va, va+length) of rkey
	// for the access flags in access (abi access bits) without copying.
	CheckRemote(rkey uint32, va uint64, length uint64, access uint32) error
	// Atomic executes an 8-byte atomic on the aligned word at va of the
	// MR of rkey (remote atomic access): compare-and-swap when cas is true
	// (compare, swap), else fetch-and-add (add in compare). It returns the
	// original value.
	Atomic(rkey uint32, va uint64, cas bool, compare, swap uint64) (uint64, error)
	// AtomicWrite stores v (its 8 bytes in host memory order) into the
	// aligned word at va of the MR of rkey (remote write access) with one
	// atomic store: ATOMIC WRITE (IBTA 1.5 Memory Placement Extensions).
	AtomicWrite(rkey uint32, va uint64, v uint64) error
	// Flush checks the MR of rkey for access (the FLUSH rights its
	// placement type needs) over [va, va+length), or over the whole MR when
	// whole is set, and returns once what was placed before is visible:
	// FLUSH (IBTA 1.5 Memory Placement Extensions).
	Flush(rkey uint32, va, length uint64, whole bool, access uint32) error
	// Invalidate invalidates the MR (or memory window) of key.
	Invalidate(key uint32) error
	// BindMW executes a BIND_MW work request of this QP (binds, rebinds
	// or unbinds a memory window). Any error completes the WR with
	// MW_BIND_ERR.
	BindMW(b abi.BindMW) error
}

// Sink takes the pieces of a gather (Memory.GatherTo) in order: it only
// reads each (client memory: the client may write it meanwhile) and
// keeps none. *roce.Framer is one.
type Sink interface {
	Put(b []byte)
}

// Sentinel errors a Memory implementation wraps.
var (
	// ErrMemProtection: unknown or invalidated key, key of another PD, or
	// missing access right.
	ErrMemProtection = errors.New("engine: memory protection error")
	// ErrMemLength: the SGE list is shorter than the message.
	ErrMemLength = errors.New("engine: message longer than the buffers")
	// ErrMemBounds: the range leaves the MR, or a misaligned atomic.
	ErrMemBounds = errors.New("engine: access outside the memory region")
)

// SendWork is a send WQE as the engine keeps it: a private copy, read once
// from shared memory and validated by the source. SGEs and Inline are
// backed by storage the engine owns (capacity set by the engine); the source
// fills them (reslicing within their capacity).
type SendWork struct {
	abi.SendWQE
	SGEs   []abi.SGE
	Inline []byte
}

// RecvWork is a receive WQE (RQ or SRQ) as the engine keeps it.
type RecvWork struct {
	WrID uint64
	SGEs []abi.SGE
}

// SendSource hands the engine the next posted send WQE of a QP.
type SendSource interface {
	// PollSend copies the next posted WQE into w and consumes it. It
	// returns false when nothing is posted. An error means the WQE was bad
	// (the QP goes to ERROR; the WQE completes with the status the
	// engine's status table gives the error, e.g. LOC_LEN_ERR for a
	// *queues.WQEError with too many SGEs: status.go).
	PollSend(w *SendWork) (bool, error)
}

// SendPublisher is a SendSource whose consumer index the client reads
// (an SQ in shared memory): PollSend does not publish it, the engine
// does, once per service of the QP and always before it writes a send
// completion (so a client that polled a CQE never finds the slots of the
// WQEs before it still taken). One store per batch instead of one per
// WQE: the index shares a cache line with the producer index the client
// writes.
type SendPublisher interface {
	PublishSend()
}

// RecvSource hands the engine the next posted receive WQE (RQ or SRQ).
type RecvSource interface {
	// PollRecv copies the next posted RQE into r and consumes it; false
	// when none is posted.
	PollRecv(r *RecvWork) (bool, error)
}

// CompletionSink receives completions (a CQ).
type CompletionSink interface {
	// PushCQE writes one completion. se is set on the successful receive
	// completion of a message whose last packet carried the Solicited
	// Event bit (a SEND or RDMA WRITE with immediate posted with
	// VRNIC_SEND_SOLICITED; IBTA 9.2.3, 10.8.6 / 11.4.2.2), for a CQ armed
	// for solicited completions only; whether an error completion
	// satisfies such an arm is the sink's decision (it does). An error
	// means the CQ overflowed.
	PushCQE(c *abi.CQE, se bool) error
}

// StateObserver is told the state the engine moved a QP to on its own
// (IBTA 10.3.1: the transport places the QP in the Error state), and
// whether the move is one the client hears of only through an affiliated
// asynchronous error (IBTA 11.6.3.1). The control plane keeps its copy of
// the state there (QUERY_QP, the transition rules) and raises the events:
// one call, on the QP's owning worker, at the moment the engine changes
// state. Neither method may block or allocate.
//
//   - TransportState(ERR): an error a completion reports (the error
//     completion of the WR that failed: IBTA C9-222.1.1, as Linux rxe and
//     mlx5 report it, with no event); TransportState(SQE): a UD or UC
//     send WR failed.
//   - TransportError(ev): ERR through an error no completion reports; ev
//     is the affiliated asynchronous error that tells the client (status.go,
//     errEvent): abi.EventQPFatal (a local work queue catastrophic error:
//     a completion its CQ refused, a broken ring, a change the engine
//     could not apply, ModifyQP to ERR), abi.EventQPReqErr or
//     abi.EventQPAccessErr (an RC responder's class C error on a request
//     that consumed no receive WQE). A ModifyQP to ERR is reported so
//     because the data plane uses it for changes it could not apply; the
//     control plane, which stores a client's own MODIFY_QP to ERR before
//     queuing it, sees the QP in ERR already and raises nothing for it.
type StateObserver interface {
	TransportState(abi.QPState)
	TransportError(ev abi.EventType)
}

// Link is the engine's network attachment for one worker (a TAP queue, a
// UDP socket, an in-memory port). What a frame is depends on the engine's
// Mode: a whole Ethernet frame (roce.ModeEthernet), which names its own
// source and destination, or a UDP payload, BTH through ICRC
// (roce.ModeUDP), whose peer travels beside it: peers[i] is the
// destination of frames[i] on send and its source on receive, as
// wireguard-go's bind returns each packet's endpoint beside it. The
// engine always passes len(peers) == len(frames); a link of Ethernet
// frames neither reads nor writes peers. Buffers move by exchange so a
// link may pass them without copying:
//
//   - SendBatch transmits frames[:n] (to peers[:n]) and returns n, the
//     number accepted (fewer than len(frames) when the link is
//     momentarily full; the caller keeps and retries the rest, in order).
//     Slots of accepted frames may be replaced by other empty buffers of
//     the same capacity.
//   - RecvBatch fills up to len(frames) slots with received frames (and
//     the same slots of peers with their sources) and returns how many;
//     the caller passes empty buffers (len == cap == the frame capacity)
//     and gets back frames that may live in other buffers of the same
//     capacity. It never blocks.
//   - Ready is signalled (capacity 1, never closed) when frames may be
//     waiting, so an idle worker can sleep.
//
// Neither call allocates: the addresses are netip.AddrPort values in
// slices the worker owns.
type Link interface {
	SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
	RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error)
	Ready() <-chan struct{}
}

// ReadyArmer is implemented by a link whose Ready must be armed: the
// worker calls ArmReady right before it sleeps on Ready (after a round in
// which RecvBatch found nothing), and the link then signals Ready when a
// frame arrives after its last RecvBatch. A link that reads in the
// worker's own RecvBatch (the TAP link) uses it to watch the kernel only
// while the worker sleeps.
type ReadyArmer interface {
	ArmReady()
}
