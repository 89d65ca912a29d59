package link

import (
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/vrnic/vrnic/roce"
)

// Faults are the probabilistic faults a lossy port applies to each frame
// it sends. Probabilities are in [0, 1] and are tried in this order: drop,
// corrupt, duplicate, reorder, delay (a frame can be both corrupted and
// duplicated, say).
type Faults struct {
	// Seed seeds the port PRNGs (port i uses Seed+i). 0 picks one from the
	// clock; the seed in use is logged either way.
	Seed      uint64
	Drop      float64
	Duplicate float64
	Corrupt   float64 // flip one byte (after the Ethernet header, if any)
	// Reorder holds a frame back until ReorderDepth (default 3) later
	// frames of the port have been sent, or at most ReorderMaxAge
	// (default 1 ms) when the sender goes quiet.
	Reorder       float64
	ReorderDepth  int
	ReorderMaxAge time.Duration
	// Delay holds a frame back for DelayFor (default 100 us); it goes out
	// with the first send or receive on the port after that, and the port
	// signals its Ready channel when the time is up so that an idle owner
	// (a worker asleep until its next timer) calls it.
	Delay    float64
	DelayFor time.Duration
}

// maxHeld bounds the frames a port holds back; beyond it frames go out
// at once.
const maxHeld = 64

type heldFrame struct {
	frame []byte
	from  netip.AddrPort // the sender beside it (ModeUDP)
	dst   *Port
	after uint64 // release once sent >= after (reorder)
	until int64  // release once now >= until (delay)
}

type faultState struct {
	cfg   Faults
	seed  uint64
	rng   *rand.Rand
	held  []heldFrame
	sent  uint64
	start time.Time
	// wake signals the port's Ready channel when the earliest held frame
	// is due (wakeAt, on the start clock; 0 when not armed). Without it a
	// held frame would wait for the owner's next send or receive, which
	// for a worker that went to sleep is its next timer (an ACK timeout)
	// or, with no timer, the next frame it gets: the delay of a quiet
	// sender's last frames became a loss.
	wake   *time.Timer
	wakeAt int64 // deadline of the pending wake-up; in the past: none
	// now reads the start clock (ns since start); tests stop it to force
	// a frame to be held or due.
	now func() int64
}

func newFaultState(f Faults, index int, log *slog.Logger, addr netip.Addr) *faultState {
	seed := f.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	seed += uint64(index)
	if f.ReorderDepth <= 0 {
		f.ReorderDepth = 3
	}
	if f.DelayFor <= 0 {
		f.DelayFor = 100 * time.Microsecond
	}
	if f.ReorderMaxAge <= 0 {
		f.ReorderMaxAge = time.Millisecond
	}
	log.Info("lossy link port", "addr", addr, "port", index, "seed", seed,
		"drop", f.Drop, "duplicate", f.Duplicate, "corrupt", f.Corrupt, "reorder", f.Reorder, "delay", f.Delay)
	fs := &faultState{cfg: f, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		held: make([]heldFrame, 0, maxHeld), start: time.Now()}
	fs.now = func() int64 { return int64(time.Since(fs.start)) }
	return fs
}

// armWake arms the port's wake-up for the earliest held frame. Every held
// frame has a deadline (until): a delayed frame its delay, a reordered one
// its age limit. Called by the owner after held changed.
func (p *Port) armWake() {
	f := p.f
	if len(f.held) == 0 {
		return // a pending wake-up is harmless: Ready may be spurious
	}
	next := f.held[0].until
	for _, h := range f.held[1:] {
		next = min(next, h.until)
	}
	now := f.now()
	if f.wakeAt > now && f.wakeAt <= next {
		return // an earlier (or the same) wake-up is pending
	}
	f.wakeAt = next
	d := time.Duration(next - now)
	if f.wake == nil {
		f.wake = time.AfterFunc(d, p.wakeUp)
		return
	}
	f.wake.Reset(d)
}

// wakeUp runs on the timer's goroutine: it only signals Ready; the owner
// releases the due frames in its next SendBatch or RecvBatch.
func (p *Port) wakeUp() {
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// Seed returns the seed of a lossy port (0 for a perfect one).
func (p *Port) Seed() uint64 {
	if p.f == nil {
		return 0
	}
	return p.f.seed
}

func (f *faultState) hit(prob float64) bool { return prob > 0 && f.rng.Float64() < prob }

// take gets an empty buffer from the pool (after the ports' parked ones
// went back to it, if need be), or nil.
func (p *Port) take() []byte {
	b := p.net.pool.pop()
	if b == nil {
		p.net.reclaim()
		b = p.net.pool.pop()
	}
	if b == nil {
		return nil
	}
	return b[:cap(b)]
}

// sendFaulty sends fr, from from, through the faults: a copy of it (in a
// buffer of the pool) reaches dst's queue, now or (held back) later, once,
// twice or not at all. The sender's buffer is left to it (corrupted, for
// a corrupted frame: it is the sender's to reuse once taken). false:
// backpressure, no empty buffer to be had (the frame was not taken and no
// decision was consumed... except the PRNG draws, which is fine for
// replay as the same retry happens next time).
func (p *Port) sendFaulty(dst *Port, fr []byte, from netip.AddrPort) bool {
	f := p.f
	if f.hit(f.cfg.Drop) {
		p.Counters.Dropped.Add(1)
		f.sent++
		return true
	}
	// Reserve the buffer the frame needs (the one it is held in, or the
	// one its copy is queued in) before any other decision.
	held := p.take()
	if held == nil {
		return false
	}
	if f.hit(f.cfg.Corrupt) {
		lo := roce.EthernetHeaderLen
		if p.udp {
			lo = 0
		}
		i := lo + f.rng.IntN(max(1, len(fr)-lo))
		if i < len(fr) {
			fr[i] ^= byte(1 + f.rng.IntN(255))
			p.Counters.Corrupted.Add(1)
		}
	}
	if f.hit(f.cfg.Duplicate) && dst.deliver(fr, from) {
		p.Counters.Duplicated.Add(1)
	}
	f.sent++
	held = held[:copy(held, fr)]
	switch {
	case len(f.held) < maxHeld && f.hit(f.cfg.Reorder):
		// The age limit keeps a frame from waiting forever behind a
		// sender that went quiet.
		f.held = append(f.held, heldFrame{frame: held, from: from, dst: dst, after: f.sent + uint64(f.cfg.ReorderDepth),
			until: f.now() + int64(f.cfg.ReorderMaxAge)})
		p.Counters.Reordered.Add(1)
		p.armWake()
	case len(f.held) < maxHeld && f.hit(f.cfg.Delay):
		f.held = append(f.held, heldFrame{frame: held, from: from, dst: dst, until: f.now() + int64(f.cfg.DelayFor)})
		p.Counters.Delayed.Add(1)
		p.armWake()
	default:
		if !dst.deliverOwned(held, from) {
			// Receiver full: a lossy link loses the frame.
			p.net.pool.push(held[:cap(held)], netip.AddrPort{})
			p.Counters.Dropped.Add(1)
		}
	}
	p.releaseHeld(false)
	return true
}

// releaseHeld delivers held frames that are due (all of them with force).
func (p *Port) releaseHeld(force bool) {
	f := p.f
	if len(f.held) == 0 {
		return
	}
	now := f.now()
	j := 0
	for _, h := range f.held {
		due := force || (h.after != 0 && f.sent >= h.after) || (h.until != 0 && now >= h.until)
		if !due {
			f.held[j] = h
			j++
			continue
		}
		if !h.dst.deliverOwned(h.frame, h.from) {
			p.net.pool.push(h.frame[:cap(h.frame)], netip.AddrPort{})
			p.Counters.Dropped.Add(1)
		}
	}
	clear(f.held[j:])
	f.held = f.held[:j]
	p.armWake()
}
