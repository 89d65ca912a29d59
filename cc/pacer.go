package cc

// Pacer is a token bucket in bytes: a sender may send while it holds
// tokens (Ready), and pays for what it sent afterwards (Spend), so one
// frame may take the bucket below zero; the next waits until the bucket
// is back at zero (ReadyAt). The long-run rate is the bucket's rate
// whatever the frame sizes; a burst of at most the bucket's depth plus
// one frame leaves at once.
//
// The zero Pacer is unlimited until SetRate. Times are the caller's
// monotonic nanoseconds.
type Pacer struct {
	rate   float64 // bytes per nanosecond; 0: unlimited
	depth  float64 // bytes
	tokens float64
	at     int64 // tokens are counted up to this instant
}

// SetRate sets the rate (b/s; 0: unlimited) and the bucket depth
// (bytes) from now on; the tokens held so far stay (up to the depth).
func (p *Pacer) SetRate(bps, depth uint64, now int64) {
	p.refill(now)
	p.rate = float64(bps) / 8e9
	p.depth = float64(depth)
	p.tokens = min(p.tokens, p.depth)
}

// Rate returns the rate in b/s (0: unlimited).
func (p *Pacer) Rate() uint64 { return uint64(p.rate * 8e9) }

func (p *Pacer) refill(now int64) {
	if now <= p.at {
		return
	}
	if p.rate > 0 {
		p.tokens = min(p.depth, p.tokens+float64(now-p.at)*p.rate)
	}
	p.at = now
}

// Ready reports whether a frame may be sent at now.
func (p *Pacer) Ready(now int64) bool {
	if p.rate == 0 {
		return true
	}
	p.refill(now)
	return p.tokens >= 0
}

// Spend takes n bytes sent from the bucket.
func (p *Pacer) Spend(n int) {
	if p.rate != 0 {
		p.tokens -= float64(n)
	}
}

// Holds reports whether, after n more bytes, the next frame will wait
// (as of the last Ready or ReadyAt).
func (p *Pacer) Holds(n int) bool { return p.rate != 0 && p.tokens < float64(n) }

// ReadyAt returns the instant the bucket is back at zero (now when it
// is, or when unlimited).
func (p *Pacer) ReadyAt(now int64) int64 {
	p.refill(now)
	if p.rate == 0 || p.tokens >= 0 {
		return now
	}
	return now + int64(-p.tokens/p.rate) + 1
}
