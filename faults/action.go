package faults

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vrnic/vrnic/roce"
)

// plan decides, rule by rule in id order, what happens to each frame of
// a batch in one direction, and writes the note of each frame (the
// capture's comment). Frames are not changed here: the observer sees
// them first.
func (l *Link) plan(rs *ruleSet, frames [][]byte, peers []netip.AddrPort, tx bool, now int64) {
	v, note := &l.v, &l.note
	for i, f := range frames {
		p := &l.plans[i]
		*p = plan{}
		l.notes[i] = ""
		parseView(f, l.inj.cfg.Mode, tx, peers[i], v)
		if !v.ok {
			continue
		}
		fl := l.flow(v, tx, rs)
		pos := fl.observe(v)
		note.Reset()
		for _, r := range rs.rules {
			if r.port {
				if r.portDown(now) {
					p.drop = true
					l.record(note, r, "port down", tx, v)
					break
				}
				continue
			}
			if r.act.typ == "down" && now < r.downUntil.Load() && r.dirPeer(v, tx) {
				r.applied.Add(1)
				p.drop = true
				l.record(note, r, "down", tx, v)
				break
			}
			if !r.filter(v, tx) || !r.position(fl, pos) {
				continue
			}
			r.matched.Add(1)
			if t := now - r.installed; t < r.after || r.until > 0 && t >= r.until {
				continue
			}
			if !r.draw() {
				continue
			}
			if what, ok := l.decide(r, p, v, len(f), now); ok {
				l.record(note, r, what, tx, v)
			}
			if p.drop {
				break
			}
		}
		if note.Len() > 0 {
			l.notes[i] = note.String()
		}
	}
}

// dirPeer reports whether a frame is in the rule's direction and from
// or to its peer: what a link-down period drops.
func (r *rule) dirPeer(v *view, tx bool) bool {
	return (tx && r.tx || !tx && r.rx) && (!r.peer.IsValid() || r.peer.Contains(v.peer))
}

// position applies the message and round filters to a frame's place in
// its flow.
func (r *rule) position(fl *flow, pos position) bool {
	if r.hasRnd && (pos.round < r.roundLo || pos.round > r.roundHi) {
		return false
	}
	if r.msgKind == kindNone {
		return true
	}
	base := fl.bases[r][r.msgKind]
	if pos.kind != r.msgKind || pos.index <= base {
		return false
	}
	return (r.msgIdx == 0 || pos.index-base == r.msgIdx) && (r.msgPkt == 0 || pos.pkt == r.msgPkt)
}

// flow returns the frame's flow, made on first sight, with a message
// base for every rule of rs taken before the frame counts.
func (l *Link) flow(v *view, tx bool, rs *ruleSet) *flow {
	k := flowKey{tx: tx, resp: v.info.Flags&roce.OpResponse != 0, qpn: v.qpn, peer: v.peer}
	f := l.flows[k]
	if f == nil {
		if l.flows == nil || len(l.flows) >= maxFlows {
			l.flows = map[flowKey]*flow{}
		}
		f = &flow{}
		l.flows[k] = f
	}
	if f.gen != rs.gen {
		for _, r := range rs.rules {
			f.base(r)
		}
		for r := range f.bases {
			if !containsRule(rs.rules, r) {
				delete(f.bases, r)
			}
		}
		f.gen = rs.gen
	}
	return f
}

func containsRule(rs []*rule, r *rule) bool {
	for _, x := range rs {
		if x == r {
			return true
		}
	}
	return false
}

// decide applies rule r's action to the plan of a frame of n bytes and
// describes it; false when the action does not apply (nothing to
// corrupt, the frame is held already, the count is spent, a rate the
// frame keeps to).
func (l *Link) decide(r *rule, p *plan, v *view, n int, now int64) (string, bool) {
	a := &r.act
	switch a.typ {
	case "drop":
		if !r.take() {
			return "", false
		}
		p.drop = true
		return "drop", true
	case "down":
		if !r.take() {
			return "", false
		}
		r.downUntil.Store(now + a.hold)
		p.drop = true
		return "link down for " + time.Duration(a.hold).String(), true
	case "duplicate":
		if !r.take() {
			return "", false
		}
		p.copies += a.copies
		return fmt.Sprintf("duplicate x%d", a.copies), true
	case "ecn":
		if !r.take() {
			return "", false
		}
		p.ecn = true
		return "ecn CE", true
	case "corrupt":
		lo, size := v.pay, v.pend-v.pay
		switch a.field {
		case "bth":
			lo, size = v.bth, roce.BTHLen
		case "icrc":
			lo, size = v.end, roce.ICRCLen
		}
		if size <= 0 || a.offset >= size || p.nmuts == len(p.muts) || !r.take() {
			return "", false
		}
		off := a.offset
		if off < 0 {
			off = int(r.intN(int64(size)))
		}
		mask := a.mask
		if mask == 0 {
			mask = byte(1 + r.intN(255))
		}
		p.muts[p.nmuts] = mutation{off: lo + off, mask: mask}
		p.nmuts++
		p.fix = p.fix || a.fixICRC
		fixed := ""
		if a.fixICRC {
			fixed = ", ICRC fixed"
		}
		return fmt.Sprintf("corrupt %s+%d ^%#02x%s", a.field, off, mask, fixed), true
	}
	// The holds: one per frame.
	if p.hold {
		return "", false
	}
	switch a.typ {
	case "delay":
		if !r.take() {
			return "", false
		}
		d := r.delayFor()
		p.hold, p.due = true, now+d
		return "delay " + time.Duration(d).String(), true
	case "reorder":
		if !r.take() {
			return "", false
		}
		p.hold, p.due, p.after = true, now+a.hold, uint64(a.frames)
		return fmt.Sprintf("reorder behind %d frames", a.frames), true
	case "rate":
		at := r.rateSlot(now, n)
		if at == now || !r.take() {
			return "", false
		}
		if at < 0 {
			r.rateDrops.Add(1)
			p.drop = true
			return "rate: drop", true
		}
		p.hold, p.due = true, at
		r.rateWait.Add(uint64(at - now))
		if a.ceAbove > 0 && at-now > a.ceAbove {
			r.ceMarked.Add(1)
			p.ecn = true
			return "rate: wait " + time.Duration(at-now).String() + ", ecn CE", true
		}
		return "rate: wait " + time.Duration(at-now).String(), true
	}
	return "", false
}

// record adds what rule r did to a frame's note and logs it (at most
// LogLimit lines per rule).
func (l *Link) record(note *strings.Builder, r *rule, what string, tx bool, v *view) {
	if note.Len() > 0 {
		note.WriteString("; ")
	}
	fmt.Fprintf(note, "fault rule %d: %s", r.id, what)
	n := r.logged.Add(1)
	lim := l.inj.cfg.LogLimit
	if n > lim {
		return
	}
	dir := "rx"
	if tx {
		dir = "tx"
	}
	if n == lim {
		l.inj.cfg.Logger.Info("fault injected; further faults of this rule are not logged", "rule", r.id, "action", what,
			"dir", dir, "qpn", v.qpn, "psn", v.psn, "opcode", v.op.String(), "peer", v.peer)
		return
	}
	l.inj.cfg.Logger.Info("fault injected", "rule", r.id, "action", what, "dir", dir, "qpn", v.qpn, "psn", v.psn,
		"opcode", v.op.String(), "peer", v.peer)
}
