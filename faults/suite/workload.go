package suite

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/verbs"
)

// OpKind is a workload operation.
type OpKind uint8

const (
	Write OpKind = iota // RDMA WRITE from A's buffer to B's
	Send                // SEND from A into a RECV posted on B
	Read                // RDMA READ of B's buffer into A's
)

func (k OpKind) String() string { return [...]string{"WRITE", "SEND", "READ"}[k] }

// Op is one work request of a workload: Size bytes.
type Op struct {
	Kind OpKind
	Size int
}

// Workload is a list of work requests A posts towards B (each signaled,
// wr_id i+1 for Ops[i]; B's RECVs have wr_id 1<<32 | i+1). Every
// operation has a region of its own in both buffers, filled with bytes
// drawn from Seed, so CheckData can tell what arrived where.
type Workload struct {
	Ops  []Op
	Seed uint64
	// Window: WRs outstanding at most (default: all posted at once, up
	// to the QP's depth).
	Window int
}

// Completion is one CQE of a run, with which side polled it.
type Completion struct {
	Side string // "a" or "b"
	abi.CQE
}

// Result is what a run produced.
type Result struct {
	Ops         []Op
	Completions []Completion // in the order polled
	// Data: per op, whether the destination region equals the source
	// region after the run (only meaningful for successful ops).
	DataOK []bool
	// Counters of the two QPs after the run (QUERY_QP).
	A, B abi.RespQueryQP
	// Err: the run stopped early (timeout); the completions so far are
	// kept.
	Err error
}

// region returns op i's offset in both buffers.
func regions(ops []Op) []int {
	off := make([]int, len(ops))
	n := 0
	for i, o := range ops {
		off[i] = n
		n += (o.Size + 63) &^ 63
	}
	return off
}

// Run posts the workload on a (towards b), waits until every WR of both
// sides completed (or timeout), and checks the data.
func (w Workload) Run(a, b *Endpoint, timeout time.Duration) (*Result, error) {
	off := regions(w.Ops)
	need := 0
	if len(w.Ops) > 0 {
		need = off[len(off)-1] + w.Ops[len(w.Ops)-1].Size
	}
	if need > len(a.Buf.Bytes) || need > len(b.Buf.Bytes) {
		return nil, fmt.Errorf("suite: workload needs %d bytes, buffers have %d", need, min(len(a.Buf.Bytes), len(b.Buf.Bytes)))
	}
	rng := rand.New(rand.NewPCG(w.Seed, w.Seed^0x5eed))
	for i, o := range w.Ops {
		src, dst := a.Buf.Bytes, b.Buf.Bytes
		if o.Kind == Read {
			src, dst = dst, src
		}
		for j := range o.Size {
			src[off[i]+j] = byte(rng.Uint32())
			dst[off[i]+j] = ^src[off[i]+j] // differs from the source everywhere
		}
	}
	res := &Result{Ops: w.Ops, DataOK: make([]bool, len(w.Ops))}
	recvs := 0
	for i, o := range w.Ops {
		if o.Kind != Send {
			continue
		}
		recvs++
		if err := b.QP.PostRecv(&verbs.RecvWR{WrID: 1<<32 | uint64(i+1),
			SGL: []abi.SGE{{Addr: b.MR.Addr + uint64(off[i]), Length: uint32(o.Size), LKey: b.MR.LKey}}}); err != nil {
			return nil, fmt.Errorf("suite: post recv %d: %w", i, err)
		}
	}
	window := w.Window
	if window <= 0 {
		window = len(w.Ops)
	}
	deadline := time.Now().Add(timeout)
	posted, doneA := 0, 0
	wc := make([]abi.CQE, 32)
	poll := func(e *Endpoint, side string) int {
		k := e.CQ.Poll(wc)
		for _, c := range wc[:k] {
			res.Completions = append(res.Completions, Completion{Side: side, CQE: c})
		}
		return k
	}
	doneB := 0
	for doneA < len(w.Ops) || doneB < recvs {
		for posted < len(w.Ops) && posted-doneA < window {
			if err := a.post(w.Ops[posted], posted, off[posted], b); err != nil {
				// A full SQ: poll first.
				if !errors.Is(err, verbs.ErrQueueFull) {
					return res, fmt.Errorf("suite: post %d: %w", posted, err)
				}
				break
			}
			posted++
		}
		ka, kb := poll(a, "a"), poll(b, "b")
		doneA, doneB = doneA+ka, doneB+kb
		if ka+kb > 0 {
			continue
		}
		if time.Now().After(deadline) {
			res.Err = fmt.Errorf("%w: %d of %d send and %d of %d receive completions", ErrTimeout, doneA, len(w.Ops), doneB, recvs)
			break
		}
		time.Sleep(20 * time.Microsecond)
	}
	for i, o := range w.Ops {
		src, dst := a.Buf.Bytes, b.Buf.Bytes
		if o.Kind == Read {
			src, dst = dst, src
		}
		res.DataOK[i] = bytes.Equal(src[off[i]:off[i]+o.Size], dst[off[i]:off[i]+o.Size])
	}
	res.A, _ = a.Counters()
	res.B, _ = b.Counters()
	return res, nil
}

// post posts op i (at offset off of both buffers) on e towards peer.
func (e *Endpoint) post(o Op, i, off int, peer *Endpoint) error {
	wr := &verbs.SendWR{WrID: uint64(i + 1), Flags: abi.SendSignaled,
		SGL: []abi.SGE{{Addr: e.MR.Addr + uint64(off), Length: uint32(o.Size), LKey: e.MR.LKey}}}
	switch o.Kind {
	case Write:
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WRRDMAWrite, peer.MR.Addr+uint64(off), peer.MR.RKey
	case Read:
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WRRDMARead, peer.MR.Addr+uint64(off), peer.MR.RKey
	case Send:
		wr.Opcode = abi.WRSend
	}
	return e.QP.PostSend(wr)
}
