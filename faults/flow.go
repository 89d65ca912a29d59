package faults

import (
	"net/netip"

	"github.com/vrnic/vrnic/roce"
)

// A flow is one PSN stream as a link sees it: the frames of one
// direction to one destination QP of one peer, requests and responses
// apart (a QP's requests use its own PSN space, its ACKs and read
// responses the peer's). The link that carries a QP's frames is always
// the same worker's, so a flow belongs to one link and needs no lock.
type flowKey struct {
	tx   bool
	resp bool
	qpn  uint32
	peer netip.Addr
}

// Flow tracking windows: rounds are remembered for the last psnWindow
// PSNs of a flow, message starts for the last msgWindow messages.
const (
	psnWindow = 4096
	msgWindow = 64
	maxFlows  = 4096 // per link; beyond it the table starts afresh
)

type msgStart struct {
	psn   uint32
	kind  kind
	index uint64 // the message's number among its kind on the flow, from 1
}

type flow struct {
	gen     uint64 // the rule set the bases were synced with
	seen    bool
	highest uint32
	// sends[psn % psnWindow] is psn<<8 | transmissions so far (0: none).
	sends [psnWindow]uint32
	msgs  [msgWindow]msgStart
	nmsgs int
	// counts are the messages of each kind started on the flow.
	counts [numKinds]uint64
	// bases[rule] are the counts when the rule first saw the flow: a
	// rule counts messages from its own start.
	bases map[*rule]*[numKinds]uint64
}

// position is where a frame sits in its flow.
type position struct {
	round uint32 // 0: first transmission; n: the n-th retransmission
	kind  kind   // kind of its message (kindNone: unknown)
	index uint64 // the message's number among its kind (0: unknown)
	pkt   uint64 // the frame's number in its message, from 1
}

// observe updates the flow with the frame of v and returns its position.
func (f *flow) observe(v *view) position {
	psn := v.psn
	slot := &f.sends[psn%psnWindow]
	var p position
	if !f.seen || roce.PSNAfter(psn, f.highest) {
		f.seen, f.highest = true, psn
		*slot = psn<<8 | 1
		if k := kindOf(v.op, v.info); k != kindNone && v.info.Flags&(roce.OpFirst|roce.OpOnly) != 0 {
			f.counts[k]++
			f.msgs[f.nmsgs%msgWindow] = msgStart{psn: psn, kind: k, index: f.counts[k]}
			f.nmsgs++
		}
	} else if *slot>>8 == psn && *slot&0xff != 0 {
		p.round = *slot & 0xff
		if p.round < 0xff {
			*slot++
		}
	} else {
		p.round = 1 // a retransmission older than the window
	}
	// The message holding psn: the latest start at or before it.
	k := kindOf(v.op, v.info)
	for i := 1; i <= min(f.nmsgs, msgWindow); i++ {
		m := f.msgs[(f.nmsgs-i)%msgWindow]
		if d := roce.PSNDiff(psn, m.psn); d >= 0 {
			if m.kind == k {
				p.kind, p.index, p.pkt = k, m.index, uint64(d)+1
			}
			break
		}
	}
	return p
}

// base returns the message counts of the flow when r first saw it,
// taking them now if this is the first time.
func (f *flow) base(r *rule) *[numKinds]uint64 {
	b, ok := f.bases[r]
	if !ok {
		if f.bases == nil {
			f.bases = map[*rule]*[numKinds]uint64{}
		}
		c := f.counts
		b = &c
		f.bases[r] = b
	}
	return b
}
