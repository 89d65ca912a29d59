package suite

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/roce"
)

// ErrCheck wraps every check failure.
var ErrCheck = errors.New("suite: check failed")

// Want gives the status expected of a work request: side "a" (op index i)
// or "b" (the RECV of op i).
type Want func(side string, i int, o Op) abi.WCStatus

// AllSucceed expects every WR to complete with SUCCESS.
func AllSucceed(string, int, Op) abi.WCStatus { return abi.WCSuccess }

// CheckCompletions checks that every WR of the run (A's sends, B's
// RECVs) completed exactly once, with the status want gives, and that no
// completion names a WR that was not posted.
func (r *Result) CheckCompletions(want Want) error {
	type key struct {
		side string
		i    int
	}
	seen := map[key]abi.WCStatus{}
	var errs []string
	for _, c := range r.Completions {
		side, id := c.Side, c.WrID
		if id>>32 == 1 {
			id &= 1<<32 - 1
		}
		i := int(id) - 1
		if i < 0 || i >= len(r.Ops) || c.Side == "b" && r.Ops[i].Kind != Send {
			errs = append(errs, fmt.Sprintf("%s: completion of wr_id %#x that was not posted", side, c.WrID))
			continue
		}
		k := key{side, i}
		if _, dup := seen[k]; dup {
			errs = append(errs, fmt.Sprintf("%s: wr_id %#x completed twice", side, c.WrID))
		}
		seen[k] = c.Status
	}
	for i, o := range r.Ops {
		sides := []string{"a"}
		if o.Kind == Send {
			sides = append(sides, "b")
		}
		for _, s := range sides {
			st, ok := seen[key{s, i}]
			w := want(s, i, o)
			switch {
			case !ok:
				errs = append(errs, fmt.Sprintf("%s: %v %d (%d bytes) never completed (want %v)", s, o.Kind, i+1, o.Size, w))
			case st != w:
				errs = append(errs, fmt.Sprintf("%s: %v %d completed with %v, want %v", s, o.Kind, i+1, st, w))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrCheck, strings.Join(errs, "; "))
	}
	return nil
}

// CheckData checks that the data of every operation that completed
// successfully on A arrived intact, and that where data did not, the
// receiving daemon saw at least one frame with a bad ICRC: data changed
// with no ICRC error (a corruption the ICRC did not catch) fails.
// rxICRCErrors counts the frames with a bad ICRC the receiver of the
// data got (ICRCErrors of its capture: B for WRITE and SEND, A for READ).
func (r *Result) CheckData(rxICRCErrorsA, rxICRCErrorsB int) error {
	ok := map[int]bool{}
	for _, c := range r.Completions {
		if c.Side == "a" && c.Status == abi.WCSuccess {
			ok[int(c.WrID)-1] = true
		}
	}
	var errs []string
	for i, o := range r.Ops {
		if !ok[i] || r.DataOK[i] {
			continue
		}
		icrc := rxICRCErrorsB
		if o.Kind == Read {
			icrc = rxICRCErrorsA
		}
		if icrc == 0 {
			errs = append(errs, fmt.Sprintf("%v %d completed but its data differ, with no ICRC error at the receiver", o.Kind, i+1))
		} else {
			errs = append(errs, fmt.Sprintf("%v %d completed but its data differ", o.Kind, i+1))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrCheck, strings.Join(errs, "; "))
	}
	return nil
}

// ICRCErrors counts the frames of a capture received by local whose
// ICRC does not verify (the capture shows received frames as the link
// delivered them).
func ICRCErrors(frames []capture.Frame, local netip.Addr) int {
	n := 0
	for _, f := range frames {
		var p roce.Packet
		err := roce.Parse(f.Data, &p)
		if errors.Is(err, roce.ErrICRC) && p.Dst() == local {
			n++
		}
	}
	return n
}

// Retransmissions counts the request frames local sent whose PSN it had
// sent before (from its capture).
func Retransmissions(frames []capture.Frame, local netip.Addr) int {
	n := 0
	high := map[uint32]uint32{}
	seen := map[uint32]bool{}
	for _, f := range frames {
		var p roce.Packet
		if roce.Parse(f.Data, &p) != nil || p.Src() != local || p.Info.Flags&roce.OpRequest == 0 {
			continue
		}
		qp, psn := p.BTH.DestQP(), p.BTH.PSN()
		if seen[qp] && roce.PSNDiff(psn, high[qp]) <= 0 {
			n++
			continue
		}
		seen[qp], high[qp] = true, psn
	}
	return n
}

// CheckGoBackN checks the requests local sent (from its capture) per
// destination QP: each request's PSN is the next after the previous
// request's (a READ request takes one PSN per response packet: mtu is
// the path MTU), or a PSN already sent (a go-back-N restart: the
// requester resends from there, in order); never a PSN beyond the next
// (a PSN skipped, which go-back-N never does).
func CheckGoBackN(frames []capture.Frame, local netip.Addr, mtu int) error {
	next := map[uint32]uint32{}
	high := map[uint32]uint32{} // next PSN after the highest sent
	var errs []string
	for n, f := range frames {
		var p roce.Packet
		if roce.Parse(f.Data, &p) != nil || p.Src() != local || p.Info.Flags&roce.OpRequest == 0 {
			continue
		}
		qp, psn := p.BTH.DestQP(), p.BTH.PSN()
		width := uint32(1)
		if p.Info.Flags&roce.OpRead != 0 && p.RETH != nil {
			width = max(1, (p.RETH.DMALength()+uint32(mtu)-1)/uint32(mtu))
		}
		if nx, ok := next[qp]; ok && psn != nx {
			if roce.PSNDiff(psn, high[qp]) >= 0 {
				errs = append(errs, fmt.Sprintf("frame %d: QP %#x request PSN %d skips ahead of %d", n+1, qp, psn, nx))
			}
		}
		nx := (psn + width) & roce.PSNMask
		next[qp] = nx
		if h, ok := high[qp]; !ok || roce.PSNDiff(nx, h) > 0 {
			high[qp] = nx
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: not go-back-N: %s", ErrCheck, strings.Join(errs, "; "))
	}
	return nil
}
