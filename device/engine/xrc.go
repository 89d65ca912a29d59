package engine

import (
	"sync"
	"sync/atomic"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// XRC (IBTA vol. 1, XRC): an XRC initiator QP (abi.QPTXRCSend) is an RC
// requester whose requests name, in their XRCETH, an XRC SRQ at the
// responder (the WQE's RemoteQPN); an XRC target QP (abi.QPTXRCRecv) is an
// RC responder with no queues of its own: each request lands in the XRC
// SRQ its XRCETH names, which must belong to the target QP's XRC domain,
// completes in that SRQ's CQ, and is checked against that SRQ's PD
// (RDMA WRITE, READ and atomics too). The wire is RC's with the XRC
// opcodes (the RC opcode plus roce.XRCOpcodeOffset) and the XRCETH; the
// step machines see RC opcodes (worker.input, txBegin translate).

// XRCSRQ is an XRC SRQ as the engine sees it: where a request naming it
// takes its receive WQE, where the receive completes, and the memory of
// its PD, one accessor per worker (Mems[i] is used by worker i's QPs).
type XRCSRQ struct {
	XRCD uint32 // the domain: only target QPs of the same one use it
	RQ   RecvSource
	CQ   CompletionSink
	Mems []Memory
}

// XRCTable maps XRC SRQ numbers to their SRQs, for every target QP of
// the engine. Lookups (workers) take no lock: the map is replaced, never
// changed, under mu.
type XRCTable struct {
	mu sync.Mutex
	m  atomic.Pointer[map[uint32]*XRCSRQ]
}

func (t *XRCTable) lookup(srqn uint32) *XRCSRQ {
	if m := t.m.Load(); m != nil {
		return (*m)[srqn]
	}
	return nil
}

func (t *XRCTable) update(f func(m map[uint32]*XRCSRQ)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := map[uint32]*XRCSRQ{}
	if old := t.m.Load(); old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	f(m)
	t.m.Store(&m)
}

// AddXRCSRQ makes srqn resolvable by the engine's target QPs.
func (e *Engine) AddXRCSRQ(srqn uint32, s *XRCSRQ) {
	e.xrc.update(func(m map[uint32]*XRCSRQ) { m[srqn&roce.QPNMask] = s })
}

// RemoveXRCSRQ makes srqn unknown: a request naming it from now on is an
// invalid request. applied is closed once every worker has passed a
// control round after the removal (or the engine closed): from then on no
// worker touches the SRQ's source or sink, so keep them until then.
func (e *Engine) RemoveXRCSRQ(srqn uint32) (applied <-chan struct{}) {
	e.xrc.update(func(m map[uint32]*XRCSRQ) { delete(m, srqn&roce.QPNMask) })
	return e.Barrier()
}

// Barrier returns a channel closed once every worker has applied a
// control message posted now, that is, finished what it was doing when
// Barrier was called (or the engine exited).
func (e *Engine) Barrier() <-chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, w := range e.workers {
		ch := make(chan struct{})
		if !e.post(w, &ctlMsg{op: ctlBarrier, applied: ch}) {
			return e.exited
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-ch:
			case <-e.exited:
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// xrcRx prepares a packet for an XRC QP: the step machines see the RC
// opcode; the XRCETH's SRQ number goes beside it. An initiator answers
// no request and a target expects no response (false: drop it).
func (qp *QP) xrcRx(p *packet, pkt *roce.Packet) bool {
	p.opcode -= roce.XRCOpcodeOffset
	if pkt.XRCETH != nil {
		p.srqn = pkt.XRCETH.SRQN()
	}
	if qp.cfg.Type == abi.QPTXRCSend {
		return pkt.Info.Is(roce.OpResponse)
	}
	return pkt.Info.Is(roce.OpRequest)
}

// respCheckXRC: a target QP's request must name an XRC SRQ of the QP's
// domain; otherwise it is an invalid request (NAK, the QP to ERR; the
// requester's WR completes with REM_INV_REQ_ERR). The SRQ found serves
// the rest of the packet's steps.
func (qp *QP) respCheckXRC(p *packet) respState {
	if qp.cfg.Type != abi.QPTXRCRecv {
		return respCheckOpSeq
	}
	x := qp.w.e.xrc.lookup(p.srqn)
	if x == nil || x.XRCD != qp.cfg.XRCD {
		return qp.fatalNAK(roce.NAKInvalidRequest, p)
	}
	qp.resp.xsrq = x
	return respCheckOpSeq
}

// respMem is the memory the responder checks and places a request in: the
// QP's PD, or for a target QP the PD of the XRC SRQ of the request.
func (qp *QP) respMem() Memory {
	if x := qp.resp.xsrq; x != nil {
		return x.Mems[qp.w.id]
	}
	return qp.cfg.Mem
}

// recvSource and recvSink are where the responder takes receive WQEs and
// writes receive completions: the QP's, or the XRC SRQ's.
func (qp *QP) recvSource() RecvSource {
	if x := qp.resp.xsrq; x != nil {
		return x.RQ
	}
	return qp.cfg.RQ
}

func (qp *QP) recvSink() CompletionSink {
	if x := qp.resp.xsrq; x != nil {
		return x.CQ
	}
	return qp.cfg.RecvCQ
}

// noSend is the send queue of a target QP: nothing, whatever a client
// writes into the ring it named.
type noSend struct{}

func (noSend) PollSend(*SendWork) (bool, error) { return false, nil }

// noRecv is the receive queue of an XRC QP: its receives are the SRQs'.
type noRecv struct{}

func (noRecv) PollRecv(*RecvWork) (bool, error) { return false, nil }
