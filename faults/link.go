package faults

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/roce"
)

// Observer sees the frames at the fault layer with what the rules did
// to each (a packet capture implements it). Sent frames are observed as
// the engine sent them, before any fault; received frames as they
// arrived from the link, before any fault; notes[i] ("" for none) says
// which rules did what to frames[i]. A dropped frame is observed too.
type Observer interface {
	// Capturing reports whether frames are wanted now (cheap: it is
	// asked per batch).
	Capturing() bool
	// Observe records frames; it copies what it keeps and never blocks.
	Observe(frames [][]byte, peers []netip.AddrPort, notes []string, sent bool)
}

// Link is the fault layer on one engine link (one worker's). It is used
// by one goroutine (the worker): the frames it holds back, its flow
// table and its buffers need no lock.
//
// With no rule enabled and nothing held it calls the link below
// directly, after one atomic load (and, while a capture runs, a copy of
// the sent frames for it). Otherwise each batch is parsed, matched
// against the rules and changed, dropped, duplicated or held back;
// frames it holds (delay, reorder, rate, frames the link below did not
// take) live in buffers of its own, at most maxOwned of them.
type Link struct {
	inner engine.Link
	arm   engine.ReadyArmer
	inj   *Injector
	obs   Observer
	udp   bool

	flows   map[flowKey]*flow
	plans   []plan
	notes   []string
	out     [][]byte
	outTo   []netip.AddrPort
	outSrc  []int // engine slot of out[j], -1 for the layer's own buffers
	held    []heldFrame
	free    [][]byte // the layer's empty buffers
	owned   int
	passed  [2]uint64       // frames passed on, per direction (0 rx, 1 tx): reorder counts them
	scratch [][]byte        // copies of sent frames for the observer
	v       view            // plan's parse of the frame at hand
	note    strings.Builder // plan's note of the frame at hand

	// Wake-ups for held frames: while it holds frames the layer's Ready
	// is its own channel, fed by a forwarder of the link's Ready and by
	// a timer at the next release.
	ready   chan struct{}
	fwdStop chan struct{}
	fwdDone chan struct{}
	wake    *time.Timer
	wakeAt  int64
}

var (
	_ engine.Link       = (*Link)(nil)
	_ engine.ReadyArmer = (*Link)(nil)
)

// maxOwned bounds the buffers one link layer allocates for frames it
// holds; beyond it a frame that would be held goes on at once and a
// duplicate is not made.
const maxOwned = 512

type heldFrame struct {
	frame []byte
	peer  netip.AddrPort
	tx    bool
	after uint64 // release once passed[dir] reaches it (0: no such bound)
	due   int64  // release at this time of the injector's clock (0: now)
}

// plan is what the rules decided for one frame.
type plan struct {
	drop   bool
	hold   bool
	due    int64
	after  uint64 // reorder: frames that must pass first
	copies int
	ecn    bool
	fix    bool
	muts   [4]mutation
	nmuts  int
}

type mutation struct {
	off  int
	mask byte
}

func dirIndex(tx bool) int {
	if tx {
		return 1
	}
	return 0
}

// SendBatch implements engine.Link.
func (l *Link) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	rs := l.inj.set.Load()
	if rs == nil && len(l.held) == 0 {
		if l.obs == nil || !l.obs.Capturing() {
			return l.inner.SendBatch(frames, peers)
		}
		return l.sendObserved(frames, peers)
	}
	now := l.inj.now()
	if blocked, err := l.flushTx(now); blocked || err != nil {
		return 0, err
	}
	if len(frames) == 0 {
		return 0, nil
	}
	l.grow(len(frames))
	if rs != nil {
		l.plan(rs, frames, peers, true, now)
	} else {
		clear(l.plans[:len(frames)])
		clear(l.notes[:len(frames)])
	}
	if l.obs != nil && l.obs.Capturing() {
		l.obs.Observe(frames, peers, l.notes[:len(frames)], true)
	}
	l.out, l.outTo, l.outSrc = l.out[:0], l.outTo[:0], l.outSrc[:0]
	for i := range frames {
		p := &l.plans[i]
		if p.drop {
			continue
		}
		l.mutate(frames[i], peers[i], true, p)
		if p.hold && l.holdCopy(frames[i], peers[i], true, p) {
			continue
		}
		l.out, l.outTo, l.outSrc = append(l.out, frames[i]), append(l.outTo, peers[i]), append(l.outSrc, i)
		for range p.copies {
			if b := l.buf(cap(frames[i])); b != nil {
				l.out = append(l.out, append(b[:0], frames[i]...))
				l.outTo, l.outSrc = append(l.outTo, peers[i]), append(l.outSrc, -1)
			}
		}
	}
	err := l.sendOut(frames, now)
	return len(frames), err
}

// sendObserved sends with a capture running and no rule: the observer
// gets copies taken before the send, since a link may hand accepted
// buffers on (the in-memory link does).
func (l *Link) sendObserved(frames [][]byte, peers []netip.AddrPort) (int, error) {
	for len(l.scratch) < len(frames) {
		l.scratch = append(l.scratch, nil)
	}
	for i, f := range frames {
		l.scratch[i] = append(l.scratch[i][:0], f...)
	}
	n, err := l.inner.SendBatch(frames, peers)
	if n > 0 {
		l.obs.Observe(l.scratch[:n], peers[:n], nil, true)
	}
	return n, err
}

// sendOut sends l.out; frames of engine slots get back the buffers the
// link left in their place, the layer's own buffers return to its pool,
// and what the link did not take waits in held, first in line.
func (l *Link) sendOut(frames [][]byte, now int64) error {
	if len(l.out) == 0 {
		return nil
	}
	n, err := l.inner.SendBatch(l.out, l.outTo)
	n = max(n, 0)
	var left []heldFrame
	for j := range l.out {
		src := l.outSrc[j]
		switch {
		case j < n && src >= 0:
			frames[src] = l.out[j]
		case j < n:
			l.put(l.out[j])
		case src >= 0:
			b := l.buf(cap(l.out[j]))
			if b == nil {
				continue // no room: a lossy link loses the frame
			}
			left = append(left, heldFrame{frame: append(b[:0], l.out[j]...), peer: l.outTo[j], tx: true})
		default:
			left = append(left, heldFrame{frame: l.out[j], peer: l.outTo[j], tx: true})
		}
	}
	l.passed[1] += uint64(n)
	clear(l.out)
	if len(left) > 0 {
		l.held = slices.Insert(l.held, 0, left...)
	}
	return err
}

// flushTx sends the held sent frames that are due; blocked when the link
// below did not take them all.
func (l *Link) flushTx(now int64) (blocked bool, err error) {
	if len(l.held) == 0 {
		return false, nil
	}
	l.out, l.outTo, l.outSrc = l.out[:0], l.outTo[:0], l.outSrc[:0]
	j := 0
	for _, h := range l.held {
		if h.tx && l.isDue(&h, now) {
			l.out, l.outTo, l.outSrc = append(l.out, h.frame), append(l.outTo, h.peer), append(l.outSrc, -1)
			continue
		}
		l.held[j] = h
		j++
	}
	clear(l.held[j:])
	l.held = l.held[:j]
	if len(l.out) == 0 {
		return false, nil
	}
	before := len(l.held)
	err = l.sendOut(nil, now)
	return len(l.held) > before, err
}

func (l *Link) isDue(h *heldFrame, now int64) bool {
	return h.due <= now || h.after != 0 && l.passed[dirIndex(h.tx)] >= h.after
}

// RecvBatch implements engine.Link.
func (l *Link) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	rs := l.inj.set.Load()
	if rs == nil && len(l.held) == 0 {
		if l.obs == nil || !l.obs.Capturing() {
			return l.inner.RecvBatch(frames, peers)
		}
		n, err := l.inner.RecvBatch(frames, peers)
		if n > 0 {
			l.obs.Observe(frames[:n], peers[:n], nil, false)
		}
		return n, err
	}
	now := l.inj.now()
	if _, err := l.flushTx(now); err != nil {
		return 0, err
	}
	k := l.releaseRx(frames, peers, now)
	n, err := l.inner.RecvBatch(frames[k:], peers[k:])
	if n <= 0 {
		return k, err
	}
	got, gotPeers := frames[k:k+n], peers[k:k+n]
	l.grow(n)
	if rs != nil {
		l.plan(rs, got, gotPeers, false, now)
	} else {
		clear(l.plans[:n])
		clear(l.notes[:n])
	}
	if l.obs != nil && l.obs.Capturing() {
		l.obs.Observe(got, gotPeers, l.notes[:n], false)
	}
	w := 0
	for i := range got {
		p := &l.plans[i]
		if p.drop {
			continue
		}
		l.mutate(got[i], gotPeers[i], false, p)
		for range p.copies {
			if b := l.buf(cap(got[i])); b != nil {
				l.held = append(l.held, heldFrame{frame: append(b[:0], got[i]...), peer: gotPeers[i]})
			}
		}
		if p.hold {
			if b := l.buf(cap(got[i])); b != nil {
				l.held = append(l.held, heldFrame{frame: got[i], peer: gotPeers[i], due: p.due, after: l.after(p, false)})
				got[i] = b[:cap(b)]
				continue
			}
		}
		got[i], got[w] = got[w], got[i]
		gotPeers[w] = gotPeers[i]
		w++
	}
	for i := w; i < n; i++ {
		got[i] = got[i][:cap(got[i])]
	}
	l.passed[0] += uint64(w)
	if len(l.held) > 0 && l.ready != nil {
		l.signal() // duplicates wait for the next call
	}
	return k + w, err
}

// releaseRx moves the held received frames that are due into the first
// slots of frames (their empty buffers join the pool) and returns how
// many.
func (l *Link) releaseRx(frames [][]byte, peers []netip.AddrPort, now int64) int {
	k, j := 0, 0
	for _, h := range l.held {
		if !h.tx && k < len(frames) && l.isDue(&h, now) {
			l.put(frames[k])
			frames[k], peers[k] = h.frame, h.peer
			k++
			continue
		}
		l.held[j] = h
		j++
	}
	clear(l.held[j:])
	l.held = l.held[:j]
	l.passed[0] += uint64(k)
	return k
}

// holdCopy holds a copy of a sent frame (and of its duplicates); false
// when there is no free buffer for it: the frame goes out at once.
func (l *Link) holdCopy(f []byte, peer netip.AddrPort, tx bool, p *plan) bool {
	for c := 0; c <= p.copies; c++ {
		b := l.buf(cap(f))
		if b == nil {
			return c > 0
		}
		l.held = append(l.held, heldFrame{frame: append(b[:0], f...), peer: peer, tx: tx, due: p.due, after: l.after(p, tx)})
	}
	return true
}

func (l *Link) after(p *plan, tx bool) uint64 {
	if p.after == 0 {
		return 0
	}
	return l.passed[dirIndex(tx)] + p.after
}

// buf returns an empty buffer of the layer of capacity c, or nil when it
// has maxOwned already.
func (l *Link) buf(c int) []byte {
	for n := len(l.free); n > 0; n = len(l.free) {
		b := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		if cap(b) == c {
			return b[:cap(b)]
		}
		l.owned-- // another size: let it go
	}
	if l.owned >= maxOwned {
		return nil
	}
	l.owned++
	return make([]byte, c)
}

func (l *Link) put(b []byte) { l.free = append(l.free, b[:cap(b)]) }

// grow sizes the per-batch slices for n frames.
func (l *Link) grow(n int) {
	if len(l.plans) < n {
		l.plans = make([]plan, n)
		l.notes = make([]string, n)
	}
}

// mutate applies the plan's changes to the bytes of f: corruptions,
// ECN, the ICRC.
func (l *Link) mutate(f []byte, peer netip.AddrPort, tx bool, p *plan) {
	if p.nmuts == 0 && !p.ecn {
		return
	}
	for _, m := range p.muts[:p.nmuts] {
		f[m.off] ^= m.mask
	}
	var v view
	parseView(f, l.inj.cfg.Mode, tx, peer, &v)
	if !v.ok {
		return
	}
	if p.ecn {
		markCE(f, &v)
	}
	if p.fix {
		if l.udp {
			ps := roce.Pseudo{Src: l.inj.cfg.Local.Addr(), SrcPort: l.inj.cfg.Local.Port(), Dst: peer.Addr(), DstPort: peer.Port()}
			if !tx {
				ps = roce.Pseudo{Src: peer.Addr(), SrcPort: peer.Port(), Dst: l.inj.cfg.Local.Addr(), DstPort: l.inj.cfg.Local.Port()}
			}
			roce.StoreICRCUDP(f[:v.end+roce.ICRCLen], &ps)
		} else {
			roce.StoreICRC(f[v.ip : v.end+roce.ICRCLen])
		}
	}
}

// markCE marks congestion experienced: the IP header's ECN field (its
// checksum updated; the ICRC does not cover it), or, on the UDP link,
// whose IP header the kernel writes, the BTH FECN bit (not covered by
// the ICRC either).
func markCE(f []byte, v *view) {
	switch {
	case v.ip < 0:
		roce.BTH(f[v.bth:]).SetFECN(true)
	case v.v6:
		h := roce.IPv6(f[v.ip:])
		h.SetTrafficClass(h.TrafficClass() | 3)
	default:
		h := roce.IPv4(f[v.ip:])
		h.SetTOS(h.TOS() | 3)
		h.SetChecksum(h.CalculateChecksum())
	}
}

// Ready implements engine.Link. While frames are held it is the layer's
// own channel (see Link); switching back to the link's own waits for
// the forwarder to stop, and returns the layer's channel once more if it
// got a signal meanwhile, so that no wake-up is lost.
func (l *Link) Ready() <-chan struct{} {
	if l.fwdStop == nil {
		if len(l.held) == 0 {
			return l.inner.Ready()
		}
		l.startForwarder()
	} else if len(l.held) == 0 {
		close(l.fwdStop)
		<-l.fwdDone
		l.fwdStop, l.fwdDone = nil, nil
		if len(l.ready) > 0 {
			return l.ready
		}
		return l.inner.Ready()
	}
	l.armWake()
	return l.ready
}

// ArmReady implements engine.ReadyArmer: the link below is armed when it
// needs it.
func (l *Link) ArmReady() {
	if l.arm != nil {
		l.arm.ArmReady()
	}
}

func (l *Link) startForwarder() {
	if l.ready == nil {
		l.ready = make(chan struct{}, 1)
	}
	stop, done, in := make(chan struct{}), make(chan struct{}), l.inner.Ready()
	l.fwdStop, l.fwdDone = stop, done
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-in:
				l.signal()
			}
		}
	}()
}

func (l *Link) signal() {
	select {
	case l.ready <- struct{}{}:
	default:
	}
}

// armWake arms the timer for the earliest held frame.
func (l *Link) armWake() {
	next := int64(-1)
	for _, h := range l.held {
		if next < 0 || h.due < next {
			next = h.due
		}
	}
	if next < 0 {
		return
	}
	now := l.inj.now()
	if next <= now {
		l.signal()
		return
	}
	if l.wakeAt > now && l.wakeAt <= next {
		return // an earlier or equal wake-up is armed
	}
	l.wakeAt = next
	if l.wake == nil {
		l.wake = time.AfterFunc(time.Duration(next-now), l.signal)
		return
	}
	l.wake.Reset(time.Duration(next - now))
}
