package engine

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// QPConfig creates a QP on the engine (the RESET state). Everything but
// the QPN, the queues and the memory comes later with ModifyQP.
type QPConfig struct {
	QPN uint32
	// PD is the QP's protection domain handle: a UD WQE's address handle
	// must be of the same PD (UD only).
	PD uint32
	// SQ, RQ: where the engine takes send and receive WQEs. RQ may be an
	// SRQ source shared with other QPs (it must then be safe for
	// concurrent use by several workers).
	SQ SendSource
	RQ RecvSource
	// SendCQ, RecvCQ: where completions go.
	SendCQ, RecvCQ CompletionSink
	// Mem is the memory of the QP's protection domain.
	Mem Memory
	// SQDepth is the number of send WQEs the engine keeps (a power of
	// two, at most abi.MaxQPWR); MaxSendSGE, MaxRecvSGE and MaxInline
	// size the private copies.
	SQDepth    int32
	MaxSendSGE int32
	MaxRecvSGE int32
	MaxInline  int32
	// AHs resolves the address handles named by UD WQEs: the table of
	// the QP's context (UD only; nil: every UD WQE fails).
	AHs *AHTable
	// State, if set, is told when the engine moves the QP to ERR (or a
	// UD or UC QP to SQE) on its own (see StateObserver).
	State StateObserver
	// Type is the transport service: abi.QPTRC (also the zero value),
	// abi.QPTUC or abi.QPTUD.
	Type abi.QPType
	// SigAll: every send WR completes signaled (sq_sig_all).
	SigAll bool
	// PortMTU is the largest UD message (UD only; 0: 1024): a UD QP has
	// no path MTU attribute, its messages are limited by the port's MTU
	// (IBTA 9.8.1: a UD message is one packet; Linux rxe takes the
	// port's MTU too).
	PortMTU roce.MTU
	// GSI makes a UD QP numbered 1 the General Services Interface QP of
	// the port (IBTA 10.2.6, 13.5.1): QP1, owned by the daemon itself
	// for the management datagrams (package device/dataplane, qp1.go).
	// Without it QP numbers 0 and 1 are refused, so no client gets them.
	GSI bool
	// XRCD is the XRC domain of a target QP (abi.QPTXRCRecv): the XRC
	// SRQs its requests may name (Engine.AddXRCSRQ) are those of the
	// same domain.
	XRCD uint32
}

// QPAttr are the attributes ModifyQP may change (a subset of struct
// vrnic_qp_attr); Mask (abi.QPAttr* bits) says which are set.
type QPAttr struct {
	Mask            uint32
	State           abi.QPState
	PathMTU         roce.MTU
	DestQPN         uint32
	RQPSN           uint32
	SQPSN           uint32
	AccessFlags     uint32 // abi access bits (remote read/write/atomic)
	Timeout         uint8  // 5 bits: 4.096 us * 2^Timeout, 0 infinite
	RetryCnt        uint8  // 3 bits
	RNRRetry        uint8  // 3 bits, 7 = infinite
	MinRNRTimer     uint8  // 5-bit RNR timer code
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	// QKey is the Q_Key of a UD QP (abi.QPAttrQKey).
	QKey uint32
	// Path: the addresses of the QP (the AV); set with abi.QPAttrAV.
	LocalAddr, RemoteAddr netip.Addr
	// ECE: the ECE options in force (abi.QPAttrECE; abi.ECEOptions
	// bits), both ends' agreement: the control path sets them only
	// when the peer offered them too (CM REQ/REP, ibv_set_ece).
	ECE uint32
}

// QPCounters are per-QP data path counters (atomics: read from any
// goroutine while the owning worker updates them). The four that a QP in
// use counts all the time are here; the ten that count errors and
// recoveries are in a block the QP gets the first time one of them counts
// (Rare): a QP that never had one holds a pointer instead of 80 bytes
// (BENCHMARKS.md, "Idle QPs"). Load reads all of them, in the order of
// the operator's admin.QPCounters.
type QPCounters struct {
	PacketsSent     atomic.Uint64
	PacketsReceived atomic.Uint64
	SendCQEs        atomic.Uint64
	RecvCQEs        atomic.Uint64
	rare            atomic.Pointer[RareQPCounters]
}

// RareQPCounters are a QP's counters of errors and recoveries.
type RareQPCounters struct {
	Retransmits     atomic.Uint64 // go-back-N restarts
	RNRNAKsReceived atomic.Uint64
	Timeouts        atomic.Uint64 // local ACK timeouts
	RNRNAKsSent     atomic.Uint64
	SeqNAKsReceived atomic.Uint64
	SeqNAKsSent     atomic.Uint64
	Duplicates      atomic.Uint64 // duplicate requests received
	Dropped         atomic.Uint64 // packets dropped by a check
	QKeyViolations  atomic.Uint64 // UD: dropped for a Q_Key other than the QP's (also in Dropped)
	NoRecvWQE       atomic.Uint64 // UD, UC: dropped without a receive WQE posted (also in Dropped)
	// The fatal NAKs (IBTA 9.7.5.2.3-9.7.5.2.5; the responder's class C
	// and D errors) sent and received, by code: the cause a Dropped or a
	// failed WQE alone does not tell.
	InvalidReqNAKsSent     atomic.Uint64
	RemAccessNAKsSent      atomic.Uint64
	RemOpNAKsSent          atomic.Uint64
	InvalidReqNAKsReceived atomic.Uint64
	RemAccessNAKsReceived  atomic.Uint64
	RemOpNAKsReceived      atomic.Uint64
	// Congestion control (cc.go): CE-marked packets received, CNPs sent
	// and received; ccRate is the QP's current rate in b/s while its
	// reaction point limits it, 0 while it is not limited (a gauge).
	CEReceived   atomic.Uint64
	CNPsSent     atomic.Uint64
	CNPsReceived atomic.Uint64
	ccRate       atomic.Uint64
}

// countErrNAK counts a fatal NAK of code c in sent or received; another
// code counts nowhere (INVALID_RD_REQUEST: no RD here).
func (r *RareQPCounters) countErrNAK(c roce.NAKCode, sent bool) {
	var n *atomic.Uint64
	switch c {
	case roce.NAKInvalidRequest:
		n = &r.InvalidReqNAKsReceived
		if sent {
			n = &r.InvalidReqNAKsSent
		}
	case roce.NAKRemoteAccessError:
		n = &r.RemAccessNAKsReceived
		if sent {
			n = &r.RemAccessNAKsSent
		}
	case roce.NAKRemoteOperationalErr:
		n = &r.RemOpNAKsReceived
		if sent {
			n = &r.RemOpNAKsSent
		}
	default:
		return
	}
	n.Add(1)
}

// noRare is what Load reads for a QP that never counted an error.
var noRare RareQPCounters

// Rare returns the QP's error and recovery counters, made the first time
// (one allocation in the QP's life; safe from any goroutine). Readers that
// only look use Load.
func (c *QPCounters) Rare() *RareQPCounters {
	if r := c.rare.Load(); r != nil {
		return r
	}
	r := new(RareQPCounters)
	if c.rare.CompareAndSwap(nil, r) {
		return r
	}
	return c.rare.Load()
}

// QPCounterValues are the values of a QP's counters at one moment, in the
// order of admin.QPCounters.
type QPCounterValues struct {
	PacketsSent     uint64
	PacketsReceived uint64
	Retransmits     uint64
	RNRNAKsReceived uint64
	Timeouts        uint64
	RNRNAKsSent     uint64
	SeqNAKsReceived uint64
	SeqNAKsSent     uint64
	Duplicates      uint64
	Dropped         uint64
	SendCQEs        uint64
	RecvCQEs        uint64
	QKeyViolations  uint64
	NoRecvWQE       uint64

	InvalidReqNAKsSent     uint64
	RemAccessNAKsSent      uint64
	RemOpNAKsSent          uint64
	InvalidReqNAKsReceived uint64
	RemAccessNAKsReceived  uint64
	RemOpNAKsReceived      uint64

	CEReceived   uint64
	CNPsSent     uint64
	CNPsReceived uint64
}

// Load reads every counter (each atomically; not one snapshot of all).
func (c *QPCounters) Load() QPCounterValues {
	r := c.rare.Load()
	if r == nil {
		r = &noRare
	}
	return QPCounterValues{
		PacketsSent:     c.PacketsSent.Load(),
		PacketsReceived: c.PacketsReceived.Load(),
		Retransmits:     r.Retransmits.Load(),
		RNRNAKsReceived: r.RNRNAKsReceived.Load(),
		Timeouts:        r.Timeouts.Load(),
		RNRNAKsSent:     r.RNRNAKsSent.Load(),
		SeqNAKsReceived: r.SeqNAKsReceived.Load(),
		SeqNAKsSent:     r.SeqNAKsSent.Load(),
		Duplicates:      r.Duplicates.Load(),
		Dropped:         r.Dropped.Load(),
		SendCQEs:        c.SendCQEs.Load(),
		RecvCQEs:        c.RecvCQEs.Load(),
		QKeyViolations:  r.QKeyViolations.Load(),
		NoRecvWQE:       r.NoRecvWQE.Load(),

		InvalidReqNAKsSent:     r.InvalidReqNAKsSent.Load(),
		RemAccessNAKsSent:      r.RemAccessNAKsSent.Load(),
		RemOpNAKsSent:          r.RemOpNAKsSent.Load(),
		InvalidReqNAKsReceived: r.InvalidReqNAKsReceived.Load(),
		RemAccessNAKsReceived:  r.RemAccessNAKsReceived.Load(),
		RemOpNAKsReceived:      r.RemOpNAKsReceived.Load(),

		CEReceived:   r.CEReceived.Load(),
		CNPsSent:     r.CNPsSent.Load(),
		CNPsReceived: r.CNPsReceived.Load(),
	}
}

// CCRate returns the QP's current rate in b/s while congestion control
// limits it, 0 while it does not (never did, or recovered).
func (c *QPCounters) CCRate() uint64 {
	if r := c.rare.Load(); r != nil {
		return r.ccRate.Load()
	}
	return 0
}

//go:generate go tool stringer -type=wqeState -linecomment

// wqeState is the life of a send WQE in the engine's private ring; the
// line comment is the name String prints.
type wqeState uint8

const (
	// wqePosted: fetched, no packet sent.
	wqePosted wqeState = iota // posted
	// wqeSending: PSNs assigned, packets being sent.
	wqeSending // sending
	// wqePending: every packet sent, waiting for responses.
	wqePending // pending
	// wqeDone: finished (status says how).
	wqeDone // done
)

// swqe is a send WQE in the private ring with its transport state.
type swqe struct {
	SendWork
	state  wqeState
	status abi.WCStatus // set once, turned into the CQE status in completeSend
	// used: the slot has held a WQE since the ring was last cleared
	// (releaseSQ clears only those).
	used    bool
	length  uint64       // message length
	info    *roce.OpInfo // of the first packet's opcode family (nil: local op)
	npkts   uint32       // PSNs the message uses
	first   uint32       // first PSN
	last    uint32       // last PSN
	sendPSN uint32       // requester: next PSN to send
	rcvd    uint32       // completer: READ response packets placed
	rdAtom  bool         // holds a max_rd_atomic credit
	ah      *AH          // UD: the address handle the WQE named
	result  uint64       // atomic original value
	taken   int64        // when the requester fetched it (worker.now; latency.go)
}

// qpAttrs are the attributes a QP keeps of what ModifyQP set (QPAttr
// without its mask, the state, which is QP.state, and the destination
// address, which is the path's Dst).
type qpAttrs struct {
	PathMTU         roce.MTU
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	MinRNRTimer     uint8
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	DestQPN         uint32
	RQPSN           uint32
	SQPSN           uint32
	AccessFlags     uint32
	QKey            uint32
	// LocalAddr is the source address of the address vector: in ModeUDP
	// the path's source is the link's, and a QP whose source GID is not
	// the link's address receives nothing (worker.input).
	LocalAddr netip.Addr
}

func (e *swqe) isReadAtomic() bool {
	op := e.Opcode
	return op == abi.WRRDMARead || op == abi.WRAtomicCmpAndSwp || op == abi.WRAtomicFetchAdd || e.isPlacement()
}

// isPlacement reports whether e is an ATOMIC WRITE or a FLUSH (IBTA 1.5
// Memory Placement Extensions). Both are answered like a READ, with a
// zero-length RDMA READ RESPONSE Only, so the requester treats them as
// READ/atomic WQEs: they hold a max_rd_atomic credit (the responder keeps a
// responder resource for each, to answer a duplicate without executing it
// again), a fenced WR waits for them, and a later ACK without their
// response is an implied NAK.
func (e *swqe) isPlacement() bool { return e.Opcode == abi.WRAtomicWrite || e.Opcode == abi.WRFlush }

// QP is the transport state of one queue pair (RC, UC or UD). It is
// owned by one worker; only that worker touches it after creation.
//
// The fields are ordered so that the struct has no padding (an idle QP
// holds it: BENCHMARKS.md, "Idle QPs").
type QP struct {
	qpn   uint32
	state abi.QPState
	mtu   uint32
	// lastCompPSN is comp.psn when the retry timer was last updated.
	lastCompPSN uint32
	cfg         QPConfig
	attr        qpAttrs
	w           *worker
	// path builds its frames; its Dst is the destination address of the
	// address vector (RC, UC) or of the AH last used (UD), and the
	// destination beside the frames (ModeUDP) is peerOf(&path).
	path roce.Path
	// ah is the address handle path was last set from (UD).
	ah *AH
	// rxPeer is where the last frame for the QP that passed the peer
	// check came from (0: none; worker.fromPeer says how it is kept): a
	// frame from there again passes it without the address comparisons.
	// Cleared with the path.
	rxPeer uint64
	// sr is the state of the ECE options in force (selective repeat,
	// the adaptive retransmission timer; sr.go), nil without any.
	sr *srState

	// Send queue: a private ring of copies. head: oldest WQE not yet
	// completed (completer); next: the WQE the requester works on; tail:
	// WQEs fetched. head <= next <= tail, free-running. sq is nil while
	// the QP is idle (active.go): ensureSQ before fetching.
	sq               []swqe
	sqMask           uint32
	head, next, tail uint32

	req  requester
	resp responder
	comp completer

	// activeIdx is the QP's position on its worker's active list, -1
	// when it is not there; parkedIdx on its parked list (off the
	// active list, still holding its send ring), -1 when not there;
	// lastActive the worker's time of its last activity (active.go).
	activeIdx int32
	parkedIdx int32

	svc roce.Service // the opcodes' service: RC, UC or UD
	// unrel: UC or UD, no acknowledgements: a send WQE is done once its
	// last packet was handed to the link (worker.flush, sentThrough).
	unrel bool
	// Congestion control (cc.go): ccHas, the QP has CC state (in its
	// worker's ccs, made when it first saw CE or a CNP); ccPaced, its
	// reaction point limits it. Two bytes where the struct had padding:
	// an idle QP holds no more than before.
	ccHas, ccPaced bool

	retryTimer timer
	rnrTimer   timer
	lastActive int64

	Counters QPCounters
}

func newQP(cfg QPConfig, w *worker) (*QP, error) {
	switch cfg.Type {
	case abi.QPTXRCSend: // sends only
		cfg.RQ = noRecv{}
	case abi.QPTXRCRecv: // no queues: its receives are its domain's SRQs' (xrc.go)
		cfg.SQ, cfg.RQ = noSend{}, noRecv{}
		cfg.MaxRecvSGE = abi.MaxSGE // any SRQ's receive WQE fits
	}
	if cfg.SQ == nil || cfg.RQ == nil || cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.Mem == nil {
		return nil, fmt.Errorf("%w: QP %#x: queues, CQs and memory are required", ErrInvalid, cfg.QPN)
	}
	if cfg.SQDepth <= 0 || cfg.SQDepth&(cfg.SQDepth-1) != 0 || cfg.SQDepth > abi.MaxQPWR {
		return nil, fmt.Errorf("%w: QP %#x: SQ depth %d is not a power of two in 1..%d", ErrInvalid, cfg.QPN, cfg.SQDepth, abi.MaxQPWR)
	}
	if cfg.MaxSendSGE < 0 || cfg.MaxSendSGE > abi.MaxSGE || cfg.MaxRecvSGE < 0 || cfg.MaxRecvSGE > abi.MaxSGE ||
		cfg.MaxInline < 0 || cfg.MaxInline > abi.MaxInline {
		return nil, fmt.Errorf("%w: QP %#x: SGE or inline limits out of range", ErrInvalid, cfg.QPN)
	}
	qp := &QP{qpn: cfg.QPN & roce.QPNMask, cfg: cfg, w: w, state: abi.QPSReset}
	switch cfg.Type {
	case 0, abi.QPTRC:
		qp.cfg.Type, qp.svc = abi.QPTRC, roce.ServiceRC
	case abi.QPTUC:
		qp.svc, qp.unrel = roce.ServiceUC, true
	case abi.QPTXRCSend, abi.QPTXRCRecv:
		qp.svc = roce.ServiceXRC
	case abi.QPTUD:
		qp.svc, qp.unrel = roce.ServiceUD, true
		if qp.qpn < 2 && !(cfg.GSI && qp.qpn == 1) {
			// QP0 and QP1 are the special QPs (IBTA 10.2.6), not
			// plain UD QPs.
			return nil, fmt.Errorf("%w: QP %#x: QP numbers 0 and 1 are reserved", ErrInvalid, cfg.QPN)
		}
	default:
		return nil, fmt.Errorf("%w: QP %#x: type %d", ErrInvalid, cfg.QPN, cfg.Type)
	}
	qp.sqMask = uint32(cfg.SQDepth - 1)
	qp.activeIdx, qp.parkedIdx = -1, -1
	qp.resp.rqe.SGEs = make([]abi.SGE, 0, cfg.MaxRecvSGE)
	qp.retryTimer = timer{idx: -1, kind: timerRetry, qp: qp}
	qp.rnrTimer = timer{idx: -1, kind: timerRNR, qp: qp}
	qp.attr.PathMTU = roce.MTU1024
	if qp.svc == roce.ServiceUD && cfg.PortMTU.Valid() {
		qp.attr.PathMTU = cfg.PortMTU
	}
	qp.mtu = uint32(qp.attr.PathMTU.Bytes())
	qp.attr.MaxRdAtomic = 1
	qp.attr.MaxDestRdAtomic = 1
	qp.resp.setResources(1)
	return qp, nil
}

// modify applies attributes. The control path (package device) validates
// transitions against the IBTA state table; the engine checks only what it
// needs to run safely.
func (qp *QP) modify(a *QPAttr) error {
	if err := a.check(); err != nil {
		return err
	}
	m := a.Mask
	if m&abi.QPAttrPathMTU != 0 {
		qp.attr.PathMTU = a.PathMTU
		qp.mtu = uint32(a.PathMTU.Bytes())
	}
	if m&abi.QPAttrDestQPN != 0 {
		qp.attr.DestQPN = a.DestQPN & roce.QPNMask
	}
	if m&abi.QPAttrRQPSN != 0 {
		qp.attr.RQPSN = a.RQPSN & roce.PSNMask
		qp.resp.epsn = qp.attr.RQPSN
	}
	if m&abi.QPAttrSQPSN != 0 {
		qp.attr.SQPSN = a.SQPSN & roce.PSNMask
		qp.req.psn = qp.attr.SQPSN
		qp.req.ackAllUntil = qp.attr.SQPSN
		qp.comp.psn = qp.attr.SQPSN
	}
	if m&abi.QPAttrAccessFlags != 0 {
		qp.attr.AccessFlags = a.AccessFlags
	}
	if m&abi.QPAttrECE != 0 {
		qp.setECE(a.ECE)
	}
	if m&abi.QPAttrQKey != 0 {
		qp.attr.QKey = a.QKey
	}
	if m&abi.QPAttrTimeout != 0 {
		qp.attr.Timeout = a.Timeout & 0x1f
	}
	if m&abi.QPAttrRetryCnt != 0 {
		qp.attr.RetryCnt = a.RetryCnt & 7
		qp.comp.retryLeft = qp.attr.RetryCnt
	}
	if m&abi.QPAttrRNRRetry != 0 {
		qp.attr.RNRRetry = a.RNRRetry & 7
		qp.comp.rnrLeft = qp.attr.RNRRetry
	}
	if m&abi.QPAttrMinRNRTimer != 0 {
		qp.attr.MinRNRTimer = a.MinRNRTimer & 0x1f
	}
	if m&abi.QPAttrMaxQPRdAtomic != 0 {
		qp.attr.MaxRdAtomic = max(1, a.MaxRdAtomic)
	}
	if m&abi.QPAttrMaxDestRdAtomic != 0 {
		qp.attr.MaxDestRdAtomic = max(1, a.MaxDestRdAtomic)
		qp.resp.setResources(int(qp.attr.MaxDestRdAtomic))
	}
	if m&abi.QPAttrAV != 0 && qp.svc != roce.ServiceUD {
		qp.attr.LocalAddr = a.LocalAddr
		qp.setPath(a.RemoteAddr)
		qp.rxPeer = 0
	}
	if m&abi.QPAttrState != 0 {
		switch a.State {
		case abi.QPSErr:
			// QP_FATAL for the data plane's own moves (a change it could
			// not apply); the control plane stored a client's MODIFY_QP
			// to ERR before queuing it and raises nothing for that one
			// (StateObserver).
			qp.enterError(evFatal)
		case abi.QPSReset:
			qp.reset()
		case abi.QPSInit, abi.QPSRTR, abi.QPSRTS, abi.QPSSQD:
			if qp.state == abi.QPSErr {
				return fmt.Errorf("%w: QP %#x is in ERR; only RESET leaves it", ErrInvalid, qp.qpn)
			}
			// A UD QP has no path of its own: every WQE names an
			// address handle.
			if (a.State == abi.QPSRTS || a.State == abi.QPSRTR) && qp.svc != roce.ServiceUD && !qp.path.Dst.IsValid() {
				return fmt.Errorf("%w: QP %#x: %v needs an address vector", ErrInvalid, qp.qpn, a.State)
			}
			qp.state = a.State
		}
	}
	return nil
}

// check is what modify checks of a without the QP: the values themselves.
func (a *QPAttr) check() error {
	if a.Mask&abi.QPAttrPathMTU != 0 && !a.PathMTU.Valid() {
		return fmt.Errorf("%w: path MTU %d", ErrInvalid, a.PathMTU)
	}
	if a.Mask&abi.QPAttrAV != 0 &&
		(!a.LocalAddr.IsValid() || !a.RemoteAddr.IsValid() || a.LocalAddr.Is4() != a.RemoteAddr.Is4()) {
		return fmt.Errorf("%w: address vector %v -> %v", ErrInvalid, a.LocalAddr, a.RemoteAddr)
	}
	if a.Mask&abi.QPAttrECE != 0 && a.ECE&^abi.ECEOptions != 0 {
		return fmt.Errorf("%w: ECE options %#x (known: %#x)", ErrInvalid, a.ECE, abi.ECEOptions)
	}
	if a.Mask&abi.QPAttrState != 0 {
		switch a.State {
		case abi.QPSErr, abi.QPSReset, abi.QPSInit, abi.QPSRTR, abi.QPSRTS, abi.QPSSQD:
		default: // SQE is entered by the transport only
			return fmt.Errorf("%w: QP state %d", ErrInvalid, a.State)
		}
	}
	return nil
}

// reset returns the QP to RESET: everything outstanding is forgotten
// (IBTA 10.3.1: RESET discards all work requests without completions).
func (qp *QP) reset() {
	qp.w.timers.stop(&qp.retryTimer)
	qp.w.timers.stop(&qp.rnrTimer)
	qp.ccStop()
	qp.state = abi.QPSReset
	qp.w.forgetTx(qp)
	qp.ah = nil
	qp.head, qp.next, qp.tail = 0, 0, 0
	// WQEs taken before the reset are still to be published.
	qp.req = requester{psn: qp.attr.SQPSN, ackAllUntil: qp.attr.SQPSN, sqTaken: qp.req.sqTaken}
	qp.comp = completer{psn: qp.attr.SQPSN, retryLeft: qp.attr.RetryCnt, rnrLeft: qp.attr.RNRRetry}
	qp.resp.clear(qp.attr.RQPSN)
	qp.srRelease()
}

// enterError moves the QP to ERR. Outstanding and later WRs complete with
// WR_FLUSH_ERR (the WQE that caused the error carries its own status) on
// both queues; nothing is dropped silently (IBTA 10.3.1 "Error state").
// ev is the asynchronous event that tells the client why, evNone when a
// completion does (status.go, errEvent).
func (qp *QP) enterError(ev errEvent) {
	if qp.state == abi.QPSErr {
		return
	}
	qp.state = abi.QPSErr
	if qp.cfg.State != nil {
		if ev == evNone {
			qp.cfg.State.TransportState(abi.QPSErr)
		} else {
			qp.cfg.State.TransportError(errEventTypes[ev])
		}
	}
	qp.w.timers.stop(&qp.retryTimer)
	qp.w.timers.stop(&qp.rnrTimer)
	qp.ccStop()
	qp.srRelease()
	// Serviced, so that its WQEs are flushed now: a UD QP that failed on
	// a datagram (inputUD) is not on the active list otherwise, and its
	// posted receives would wait for the client's next doorbell.
	qp.w.activate(qp)
	qp.w.busy = true
}

// enterSQE moves a UD or UC QP to SQE after a send WR completed in error
// (IBTA 10.3.1 "Send Queue Error state"): the SQ stops, its
// outstanding and later WRs are flushed, the receive side goes on, and
// MODIFY_QP SQE → RTS resumes sending. An RC QP goes to ERR instead.
func (qp *QP) enterSQE() {
	if qp.state != abi.QPSRTS && qp.state != abi.QPSSQD {
		qp.enterError(evNone) // the failed WR's completion says why
		return
	}
	qp.state = abi.QPSSQE
	if qp.cfg.State != nil {
		qp.cfg.State.TransportState(abi.QPSSQE)
	}
	qp.w.busy = true
}

// flush completes every WQE the QP still holds or is posted, in ERR. At
// most one SQ ring's worth of later posts is flushed per call so a client
// posting without pause cannot starve the worker.
func (qp *QP) flush() {
	qp.flushSend()
	qp.flushRecv()
}

// flushSend completes the send side's WQEs (ERR and SQE).
func (qp *QP) flushSend() {
	qp.ensureSQ()
	for qp.head != qp.tail {
		e := &qp.sq[qp.head&qp.sqMask]
		switch {
		case e.state == wqeDone && e.status != abi.WCSuccess:
			// The WQE whose error moved the QP to ERR (or SQE) keeps
			// its status.
		case qp.unrel && (e.state == wqePending || e.state == wqeDone):
			// UD, UC: every packet is built and queued for the link,
			// which sends it; nothing more is waited for.
			e.status = abi.WCSuccess
		default:
			e.status = abi.WCWRFlushErr
		}
		e.state = wqeDone
		qp.completeSend(e)
		qp.head++
	}
	qp.next = qp.head
	qp.req.rdAtomic = 0
	for range qp.cfg.SQDepth {
		e := &qp.sq[qp.tail&qp.sqMask]
		e.SGEs, e.Inline = e.SGEs[:0], e.Inline[:0]
		ok, err := qp.cfg.SQ.PollSend(&e.SendWork)
		if !ok && err == nil {
			break
		}
		qp.req.sqTaken = true
		e.state, e.status = wqeDone, abi.WCWRFlushErr
		qp.completeSend(e)
	}
}

// flushRecv completes the receive side's WQEs (ERR): the RQE in progress,
// then every posted RQE.
func (qp *QP) flushRecv() {
	if qp.resp.rqeValid {
		qp.resp.rqeValid = false
		qp.completeRecv(&qp.resp.rqe, abi.WCWRFlushErr, abi.WCRecv, 0, 0, 0, false)
	}
	qp.resp.xsrq = nil
	for range qp.cfg.SQDepth + 1024 {
		r := &qp.w.flushRQE
		r.SGEs = r.SGEs[:0]
		ok, err := qp.cfg.RQ.PollRecv(r)
		if !ok && err == nil {
			break
		}
		qp.completeRecv(r, abi.WCWRFlushErr, abi.WCRecv, 0, 0, 0, false)
	}
}

// wcOpcode maps a send opcode to its completion opcode.
func wcOpcode(op abi.WROpcode) abi.WCOpcode {
	switch op {
	case abi.WRRDMAWrite, abi.WRRDMAWriteWithImm:
		return abi.WCRDMAWrite
	case abi.WRRDMARead:
		return abi.WCRDMARead
	case abi.WRAtomicCmpAndSwp:
		return abi.WCCompSwap
	case abi.WRAtomicFetchAdd:
		return abi.WCFetchAdd
	case abi.WRLocalInv:
		return abi.WCLocalInv
	case abi.WRFlush:
		return abi.WCFlush
	case abi.WRAtomicWrite:
		return abi.WCAtomicWrite
	case abi.WRBindMW:
		return abi.WCBindMW
	}
	return abi.WCSend
}

// completeSend is the one place a send WQE's status becomes a CQE.
// Successful unsignaled WRs produce none (IBTA 10.8.3.1); errors always
// complete.
func (qp *QP) completeSend(e *swqe) {
	if e.status == abi.WCSuccess && !qp.cfg.SigAll && e.Flags&abi.SendSignaled == 0 {
		return
	}
	if qp.req.sqTaken {
		qp.publishSQ() // the client sees the slots free before the CQE
	}
	c := &qp.w.cqe
	*c = abi.CQE{
		WrID:   e.WrID,
		Status: e.status,
		Opcode: wcOpcode(e.Opcode),
		QPNum:  qp.qpn,
	}
	if e.status == abi.WCSuccess && (e.Opcode == abi.WRRDMARead) {
		c.ByteLen = uint32(e.length)
	}
	if e.status != abi.WCSuccess && e.status != abi.WCWRFlushErr {
		c.VendorErr = 1
	}
	qp.Counters.SendCQEs.Add(1)
	qp.w.Counters.CQEs.Add(1)
	if e.status == abi.WCSuccess {
		qp.w.recordLatency(c.Opcode, e.taken)
	}
	if err := qp.cfg.SendCQ.PushCQE(c, false); err != nil {
		qp.cqOverflow()
	}
}

// completeRecv writes a receive completion; se: the message's last
// packet carried the Solicited Event bit.
func (qp *QP) completeRecv(r *RecvWork, st abi.WCStatus, op abi.WCOpcode, n uint32, flags abi.WCFlags, immInv uint32, se bool) {
	c := &qp.w.cqe
	*c = abi.CQE{WrID: r.WrID, Status: st, Opcode: op, QPNum: qp.qpn, ByteLen: n, WCFlags: flags, ImmOrInv: immInv}
	qp.pushRecv(c, se)
}

// pushRecv writes the receive completion c.
func (qp *QP) pushRecv(c *abi.CQE, se bool) {
	qp.Counters.RecvCQEs.Add(1)
	qp.w.Counters.CQEs.Add(1)
	if c.Status == abi.WCSuccess {
		qp.w.recordLatency(c.Opcode, qp.resp.rqeTaken)
	}
	if err := qp.recvSink().PushCQE(c, se); err != nil {
		qp.cqOverflow()
	}
}

// cqOverflow handles a completion the CQ refused: an overrun CQ is in
// error and the QPs that complete into it go to ERR with QP_FATAL, the
// one way left to tell their clients (IBTA 11.4.2.1, C9-218; the CQ's
// sink keeps refusing, so every later completion is lost and counted).
func (qp *QP) cqOverflow() {
	qp.w.Counters.CQOverflows.Add(1)
	qp.enterError(evFatal)
}

// publishSQ publishes the send queue's consumer index (SendPublisher).
func (qp *QP) publishSQ() {
	qp.req.sqTaken = false
	if p, ok := qp.cfg.SQ.(SendPublisher); ok {
		p.PublishSend()
	}
}
