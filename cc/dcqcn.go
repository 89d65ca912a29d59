package cc

import "math"

// RP is the DCQCN reaction point of one QP (Zhu et al. 2015, section 3.1
// and Figure 4; the mlx5 parameters of Params).
//
// A QP is unlimited (it sends at its link's pace, no pacer) until its
// first CNP. Then:
//
//	CNP:       Rt = Rc; Rc = max(Rc - Rc·α·1024/2^gd, Rc·min_dec_fac/100, min_rate);
//	           α = α·g + (1 - g); the stage counters T and BC restart
//	timer:     every rpg_time_reset, T++ and increase
//	bytes:     every rpg_byte_reset bytes sent, BC++ and increase
//	increase:  max(T, BC) ≤ F: fast recovery  (Rt unchanged)
//	           min(T, BC) > F: hyper increase (Rt += hai_rate)
//	           else:           additive       (Rt += ai_rate)
//	           then Rc = (Rt + Rc) / 2
//	α period:  every dce_tcp_rtt without a CNP, α = α·g
//
// with g = dce_tcp_g/1024 and F = rpg_threshold. Once Rt is back at the
// line rate and Rc within a step of it, the QP is unlimited again (Active
// false), its timer stopped.
//
// The α decay of the periods between two events is applied at the next
// event in one step (α·g^k for k periods): the same values as a timer per
// period, without one (the mlx5 default period is 1 µs).
//
// Times are the caller's monotonic nanoseconds. The zero RP is unusable:
// Init it.
type RP struct {
	p       *Params
	rc, rt  float64 // current and target rate, b/s
	alpha   float64 // 0..1
	alphaAt int64   // α is decayed up to this instant (a period boundary)
	t, bc   uint32  // timer and byte stages since the last cut
	bytes   uint64  // bytes sent since the last byte-counter expiry
	active  bool
}

// Init resets r to unlimited under p (kept, not copied: p must not
// change while r is in use).
func (r *RP) Init(p *Params) { *r = RP{p: p} }

// Active reports whether the QP is rate limited.
func (r *RP) Active() bool { return r.active }

// Rate returns the current rate in b/s (the line rate when not limited).
func (r *RP) Rate() uint64 {
	if !r.active {
		return r.p.LineRate
	}
	return uint64(r.rc)
}

// Target returns the target rate in b/s.
func (r *RP) Target() uint64 {
	if !r.active {
		return r.p.LineRate
	}
	return uint64(r.rt)
}

// Alpha returns α in 1/1024 as of now.
func (r *RP) Alpha(now int64) uint32 {
	if !r.active {
		return 0
	}
	r.decay(now)
	return uint32(r.alpha*1024 + 0.5)
}

// decay applies the α decay of the whole periods up to now.
func (r *RP) decay(now int64) {
	per := int64(r.p.AlphaPeriod)
	k := (now - r.alphaAt) / per
	if k <= 0 {
		return
	}
	r.alpha *= math.Pow(float64(r.p.AlphaG)/1024, float64(k))
	r.alphaAt += k * per
}

// OnCNP applies a CNP received at now and returns the deadline of the
// rate-increase timer (now + rpg_time_reset), which restarts.
func (r *RP) OnCNP(now int64) (timer int64) {
	p := r.p
	line := float64(p.LineRate)
	if !r.active {
		r.active = true
		r.rc = line
		if p.RateOnFirstCNP != 0 {
			r.rc = float64(p.RateOnFirstCNP)
		}
		r.rt = r.rc
		r.alpha = float64(p.InitialAlpha) / 1024
		r.alphaAt = now
	} else {
		r.decay(now)
	}
	r.rt = r.rc
	cut := r.rc * r.alpha * 1024 / float64(uint64(1)<<p.GD)
	r.rc = max(r.rc-cut, r.rc*float64(p.MinDecFac)/100, float64(p.MinRate))
	g := float64(p.AlphaG) / 1024
	r.alpha = r.alpha*g + (1 - g)
	r.t, r.bc, r.bytes = 0, 0, 0
	return now + int64(p.TimeReset)
}

// OnTimer is the rate-increase timer's expiry at now: it returns the
// next deadline, or 0 when the QP is unlimited again (or was).
func (r *RP) OnTimer(now int64) (next int64) {
	if !r.active {
		return 0
	}
	r.t = min(r.t+1, 1<<30)
	if r.increase() {
		return 0
	}
	return now + int64(r.p.TimeReset)
}

// OnSent counts n bytes sent; every rpg_byte_reset of them is a
// byte-counter expiry and an increase. It reports whether the rate
// changed.
func (r *RP) OnSent(n uint64) (changed bool) {
	if !r.active {
		return false
	}
	r.bytes += n
	for r.active && r.bytes >= r.p.ByteReset {
		r.bytes -= r.p.ByteReset
		r.bc = min(r.bc+1, 1<<30)
		r.increase()
		changed = true
	}
	return changed
}

// increase is one rate-increase step; it reports whether the QP became
// unlimited.
func (r *RP) increase() (done bool) {
	p := r.p
	f := p.Threshold
	switch {
	case max(r.t, r.bc) <= f: // fast recovery
	case min(r.t, r.bc) > f:
		r.rt += float64(p.HAIRate)
	default:
		r.rt += float64(p.AIRate)
	}
	line := float64(p.LineRate)
	r.rt = min(r.rt, line)
	r.rc = (r.rt + r.rc) / 2
	if r.rt >= line && line-r.rc <= max(float64(p.AIRate), line/1024) {
		r.active = false
		r.rc, r.rt = line, line
		return true
	}
	return false
}

// NP is the notification point's CNP rate limit for one QP: at most one
// CNP per min_time_between_cnps (IBTA RoCE v2 annex A17.9.3 leaves the
// rate to the implementation; mlx5's default is 4 µs).
type NP struct {
	last int64
	sent bool
}

// Allow reports whether a CNP may be sent at now, and if so counts it.
func (n *NP) Allow(now int64, p *Params) bool {
	if n.sent && now-n.last < int64(p.MinTimeBetweenCNPs) {
		return false
	}
	n.last, n.sent = now, true
	return true
}
