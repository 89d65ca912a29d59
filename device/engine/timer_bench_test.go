package engine

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/roce"
)

// Timer accuracy: how late the ACK timeout and the RNR timer fire, seen
// on the wire. Two engines over the in-memory link, one RC QP pair; a
// probe wraps the requester's link and time-stamps the frames it passes
// (the engine's clock is the runtime's monotonic clock, like time.Now):
//
//   - ACK timeout: the probe drops the first transmission of every
//     request and lets the retransmission through; firing delay =
//     (retransmission sent) - (first transmission sent) - the timeout.
//   - RNR timer: the responder has no receive posted, so every SEND is
//     answered with an RNR NAK carrying the code (rnr_retry 7: retried
//     for ever); firing delay = (retried SEND sent) - (RNR NAK received)
//   - the code's time.
//
// Both intervals start and end at the link, so the pass that arms the
// timer and the pass that sends the retry are in the delay (a few µs).
// Reported: p50 and p99 of the delay in µs, and the delay over the
// timeout at p50.
//
//	go test -run '^$' -bench TimerAccuracy -benchtime 200x ./device/engine/
//
// b.N is the number of samples per code (at least 20; code 14 is 67 ms a
// sample). ACK timeout code 0 means no timer (IBTA: infinite); its
// sub-benchmark checks that nothing is retransmitted within 100 ms.
func BenchmarkTimerAccuracy(b *testing.B) {
	for _, code := range []uint8{0, 4, 8, 12, 14} {
		b.Run(fmt.Sprintf("ack/code=%d", code), func(b *testing.B) { benchAckTimer(b, code) })
	}
	for _, code := range []uint8{0, 4, 8, 12, 14} {
		b.Run(fmt.Sprintf("rnr/code=%d", code), func(b *testing.B) { benchRNRTimer(b, code) })
	}
}

// timeProbe wraps a link: it drops the first transmission of each request
// PSN (dropFirst) and records the delays of retransmissions, or records
// RNR NAKs received and the delay of the next request sent.
type timeProbe struct {
	Link
	dropFirst bool
	wait      time.Duration // the timeout or RNR time
	mu        sync.Mutex
	first     map[uint32]time.Time // PSN -> first transmission
	timed     map[uint32]bool      // PSNs whose retransmission was timed
	nakAt     time.Time            // last RNR NAK received, zero when consumed
	delays    []time.Duration
	pkt       roce.Packet
}

func (p *timeProbe) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	now := time.Now()
	for i := range frames {
		drop := false
		if roce.Parse(frames[i], &p.pkt) == nil && p.pkt.Info.Is(roce.OpRequest) {
			psn := p.pkt.BTH.PSN()
			p.mu.Lock()
			switch {
			case p.dropFirst:
				if p.timed[psn] {
					// Retransmitted again (the ACK of the timed
					// retransmission was slower than a short
					// timeout): passed on, not dropped as a new
					// first transmission, which would only make
					// the QP run out of retries.
					break
				}
				if t0, ok := p.first[psn]; ok {
					p.delays = append(p.delays, now.Sub(t0)-p.wait)
					delete(p.first, psn)
					p.timed[psn] = true
				} else {
					p.first[psn] = now
					drop = true
				}
			case !p.nakAt.IsZero():
				p.delays = append(p.delays, now.Sub(p.nakAt)-p.wait)
				p.nakAt = time.Time{}
			}
			p.mu.Unlock()
		}
		if drop {
			continue
		}
		if n, err := p.Link.SendBatch(frames[i:i+1], peers[i:i+1]); n == 0 {
			return i, err
		}
	}
	return len(frames), nil
}

func (p *timeProbe) RecvBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	n, err := p.Link.RecvBatch(frames, peers)
	if p.dropFirst || n <= 0 {
		return n, err
	}
	now := time.Now()
	for i := range n {
		if roce.Parse(frames[i], &p.pkt) == nil && p.pkt.AETH != nil &&
			p.pkt.AETH.Syndrome().Kind() == roce.SyndromeRNRNAK {
			p.mu.Lock()
			p.nakAt = now
			p.mu.Unlock()
		}
	}
	return n, err
}

func (p *timeProbe) samples() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.delays)
}

// probePair is a connected pair whose requester side a sends through
// probe.
func probePair(b testing.TB, probe *timeProbe, o qpOpts) (*tqp, *tqp) {
	nw := newNetwork(b)
	na := newNodeWrap(b, nw, "10.0.0.1", 1, nil, func(l Link) Link { probe.Link = l; return probe })
	nb := newNode(b, nw, "10.0.0.2", 1, nil)
	a, c := na.newQP(b, 0x11, o), nb.newQP(b, 0x22, o)
	connect(b, a, c, o)
	return a, c
}

func benchAckTimer(b *testing.B, code uint8) {
	n := max(b.N, 20)
	if code == 0 {
		ackTimerRun(b, code, n)
		b.ReportMetric(0, "retransmissions")
		return
	}
	probe := ackTimerRun(b, code, n)
	b.StopTimer()
	reportDelays(b, probe, n)
}

// ackTimerRun runs n 8-byte WRITEs on a pair whose requester has ACK
// timeout code, the first transmission of each dropped: each must
// complete successfully after its retransmission. Code 0 (no timer): one
// WRITE, which must not complete within 100 ms. It returns the probe
// with the delays.
func ackTimerRun(tb testing.TB, code uint8, n int) *timeProbe {
	o := defaultOpts()
	o.timeout = code
	probe := &timeProbe{dropFirst: true, wait: time.Duration(ackTimeout(code)), first: map[uint32]time.Time{}, timed: map[uint32]bool{}}
	a, c := probePair(tb, probe, o)
	src := a.n.buffer(64, 0x1000, abi.AccessAll, 1)
	dst := c.n.buffer(64, 0x1000, abi.AccessAll, 2)
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
	if code == 0 {
		a.send(tb, abi.SendWQE{WrID: 1, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 8))
		require.False(tb, a.scq.wait(1, 100*time.Millisecond), "code 0: no timer, the dropped WRITE is never retransmitted")
		return probe
	}
	for i := range n {
		a.send(tb, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, 8))
		require.True(tb, a.scq.wait(i+1, waitFor), "WRITE %d completes after its retransmission", i)
		require.Equal(tb, abi.WCSuccess, a.scq.all()[i].Status, "WRITE %d", i)
	}
	return probe
}

func benchRNRTimer(b *testing.B, code uint8) {
	o := defaultOpts()
	o.minRNR, o.rnrRetry = code, 7
	probe := &timeProbe{wait: roce.RNRTimer(code).Duration(), first: map[uint32]time.Time{}}
	a, c := probePair(b, probe, o)
	src := a.n.buffer(64, 0x1000, abi.AccessAll, 1)
	dst := c.n.buffer(64, 0x1000, abi.AccessAll, 2)
	n := max(b.N, 20)
	if code == 0 {
		n = min(n, 8) // 655 ms a sample
	}
	b.ResetTimer()
	a.send(b, abi.SendWQE{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled}, src.sge(0, 8))
	deadline := time.Now().Add(waitFor + time.Duration(n)*probe.wait)
	for probe.samples() < n && time.Now().Before(deadline) {
		time.Sleep(probe.wait)
	}
	c.recv(b, 1, dst.sge(0, 64))
	require.True(b, a.scq.wait(1, waitFor), "the SEND completes once a receive is posted")
	b.StopTimer()
	reportDelays(b, probe, n)
}

// reportDelays reports the p50 and p99 of the first n delays in µs and the
// p50 over the timeout.
func reportDelays(b *testing.B, p *timeProbe, n int) {
	p.mu.Lock()
	d := slices.Clone(p.delays)
	p.mu.Unlock()
	require.GreaterOrEqual(b, len(d), n)
	d = d[:n]
	slices.Sort(d)
	us := func(x time.Duration) float64 { return float64(x) / 1e3 }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(us(d[len(d)/2]), "p50-µs")
	b.ReportMetric(us(d[min(len(d)-1, len(d)*99/100)]), "p99-µs")
	b.ReportMetric(us(d[len(d)-1]), "max-µs")
	b.ReportMetric(float64(p.wait+d[len(d)/2])/float64(p.wait), "p50-fired/timeout")
}
