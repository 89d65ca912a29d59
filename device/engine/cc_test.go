package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/cc"
	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// ceLink marks Congestion Experienced on the RDMA WRITE packets it sends
// while mark is set, as a congested queue between the two nodes would: the
// IP ECN field on Ethernet frames (checksum updated), the BTH FECN bit on
// UDP payloads (what the UDP link makes of a CE datagram).
type ceLink struct {
	Link
	mode   roce.Mode
	ops    roce.OpFlags // the packets to mark: those with all of these (0: RDMA WRITE)
	mark   atomic.Bool
	marked atomic.Uint64
	// Ethernet frames sent: by their IP ECN field (before marking),
	// CNPs and others.
	ecn, cnpECN [4]atomic.Uint64
	pkt         roce.Packet // scratch (the link's one sender)
}

func (l *ceLink) SendBatch(frames [][]byte, peers []netip.AddrPort) (int, error) {
	pkt := &l.pkt
	if l.mode == roce.ModeEthernet {
		for _, f := range frames {
			if roce.Parse(f, pkt) == nil {
				if pkt.BTH.Opcode() == roce.OpCNP {
					l.cnpECN[pkt.IPv4.TOS()&3].Add(1)
				} else {
					l.ecn[pkt.IPv4.TOS()&3].Add(1)
				}
			}
		}
	}
	ops := l.ops
	if ops == 0 {
		ops = roce.OpWrite
	}
	if l.mark.Load() {
		for _, f := range frames {
			if l.mode == roce.ModeEthernet {
				if roce.Parse(f, pkt) != nil || pkt.Info.Flags&ops != ops {
					continue
				}
				pkt.IPv4.SetTOS(pkt.IPv4.TOS() | ecnCE)
				pkt.IPv4.SetChecksum(pkt.IPv4.CalculateChecksum())
			} else {
				if roce.BTH(f).Opcode().Info().Flags&ops != ops {
					continue
				}
				roce.BTH(f).SetFECN(true)
			}
			l.marked.Add(1)
		}
	}
	return l.Link.SendBatch(frames, peers)
}

// ccParams are DCQCN parameters for the engine tests: a line rate of
// 1 Gb/s and increases fast enough that a QP recovers within
// milliseconds once the marks stop.
func ccParams() *cc.Params {
	p := cc.DefaultParams()
	p.LineRate = cc.Mbps(1000)
	p.AIRate, p.HAIRate = cc.Mbps(100), cc.Mbps(400)
	p.TimeReset = 200 * time.Microsecond
	return &p
}

// newCCNode is newNodeWrap with congestion control p (nil: off).
func newCCNode(t testing.TB, nw *link.Network, addr string, p *cc.Params, wrap func(Link) Link) *node {
	a := netip.MustParseAddr(addr)
	ports, err := nw.Attach(a, 1, nil)
	require.NoError(t, err)
	links := make([]Link, len(ports))
	for i, pt := range ports {
		links[i] = pt
		if wrap != nil {
			links[i] = wrap(pt)
		}
	}
	cfg := Config{Links: links, Mode: nw.Mode(), CC: p}
	if nw.Mode() == roce.ModeUDP {
		cfg.Local = ports[0].LocalAddr()
		a = netip.AddrFrom16(a.As16())
	}
	eng, err := New(cfg)
	require.NoError(t, err)
	eng.Start()
	t.Cleanup(func() { _ = eng.Close() })
	return &node{eng: eng, mem: newFakeMem(), addr: a, ports: ports}
}

// writes posts n signaled RDMA WRITEs of size bytes from a to b and
// waits for their completions, which must all succeed; b's buffer then
// holds a's data.
func writes(t *testing.T, a, b *tqp, n, size int, seed uint64) {
	t.Helper()
	src := a.n.buffer(size, 0x1000_0000+seed<<32, abi.AccessAll, seed)
	dst := b.n.buffer(size, 0x2000_0000+seed<<32, abi.AccessAll, seed+1)
	start := a.scq.count.Load()
	for i := range n {
		a.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, size))
	}
	require.True(t, a.scq.wait(int(start)+n, waitFor), "WRITEs complete")
	for _, c := range a.scq.all()[start:] {
		require.Equal(t, abi.WCSuccess, c.Status)
	}
	assert.Equal(t, sum(src.b), sum(dst.b))
}

// TestCNPOnCE: WRITEs marked CE on their way make the responder send CNPs
// (at most one per min_time_between_cnps), the requester's rate drop below
// the line rate, every WRITE still completes (a CNP is not an ACK), and
// once the marks stop the rate recovers through the worker's timers.
func TestCNPOnCE(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			nw := newNetworkMode(t, mode, 4096, 1024)
			p := ccParams()
			var mk, lb *ceLink
			na := newCCNode(t, nw, "10.0.0.1", p, func(l Link) Link { mk = &ceLink{Link: l, mode: mode}; return mk })
			nb := newCCNode(t, nw, "10.0.0.2", p, func(l Link) Link { lb = &ceLink{Link: l, mode: mode}; return lb })
			o := defaultOpts()
			a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
			connect(t, a, b, o)

			writes(t, a, b, 4, 8192, 1) // unmarked: nothing happens
			ca, cb := a.counters(t).Load(), b.counters(t).Load()
			assert.Zero(t, ca.CNPsReceived)
			assert.Zero(t, cb.CEReceived+cb.CNPsSent)

			mk.mark.Store(true)
			writes(t, a, b, 64, 16384, 2)
			require.NotZero(t, mk.marked.Load())
			ca, cb = a.counters(t).Load(), b.counters(t).Load()
			// The in-memory link drops what finds its queue full (a
			// loaded machine): marked packets and CNPs may be lost.
			assert.NotZero(t, cb.CEReceived)
			assert.LessOrEqual(t, cb.CEReceived, mk.marked.Load(), "CE only on what was marked")
			assert.NotZero(t, cb.CNPsSent)
			assert.LessOrEqual(t, cb.CNPsSent, cb.CEReceived)
			assert.NotZero(t, ca.CNPsReceived)
			assert.LessOrEqual(t, ca.CNPsReceived, cb.CNPsSent)
			assert.Equal(t, cb.CNPsSent, nb.eng.WorkerCounters(0).CNPsSent.Load())
			assert.Equal(t, ca.CNPsReceived, na.eng.WorkerCounters(0).CNPsReceived.Load())
			assert.Zero(t, na.eng.WorkerCounters(0).CNPsIgnored.Load())
			assert.Zero(t, ca.SeqNAKsReceived, "CNPs do not disturb the PSN sequence")
			if mode == roce.ModeEthernet {
				// Every packet ECN-capable (ECT(0)), but the CNPs (Not-ECT).
				for _, l := range []*ceLink{mk, lb} {
					assert.NotZero(t, l.ecn[ecnECT0].Load())
					assert.Zero(t, l.ecn[0].Load()+l.ecn[1].Load()+l.ecn[3].Load())
					assert.Zero(t, l.cnpECN[1].Load()+l.cnpECN[2].Load()+l.cnpECN[3].Load())
				}
				assert.Equal(t, cb.CNPsSent, lb.cnpECN[0].Load())
			}

			mk.mark.Store(false)
			// Recovery: the rate-increase timer brings the QP back to
			// the line rate and unlimited (CCRate 0). WRITEs keep the
			// byte counter going too.
			require.Eventually(t, func() bool {
				writes(t, a, b, 4, 16384, 3)
				return a.counters(t).CCRate() == 0
			}, waitFor, time.Millisecond, "rate recovers")
		})
	}
}

// TestCNPRateLimit: with min_time_between_cnps far beyond the test, the
// responder sends one CNP however many marked packets arrive, and the
// requester's rate is the first cut's (no increase: timer and byte
// counter set beyond the test).
func TestCNPRateLimit(t *testing.T) {
	nw := newNetworkMode(t, roce.ModeUDP, 4096, 1024)
	p := ccParams()
	p.MinTimeBetweenCNPs = time.Second
	p.TimeReset, p.ByteReset = time.Second, 1<<32
	var mk *ceLink
	na := newCCNode(t, nw, "10.0.0.1", p, func(l Link) Link { mk = &ceLink{Link: l, mode: roce.ModeUDP}; return mk })
	nb := newCCNode(t, nw, "10.0.0.2", p, nil)
	o := defaultOpts()
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	mk.mark.Store(true)
	start := time.Now()
	writes(t, a, b, 16, 8192, 1)
	cb := b.counters(t).Load()
	require.Greater(t, cb.CEReceived, uint64(1))
	if time.Since(start) < p.MinTimeBetweenCNPs {
		assert.Equal(t, uint64(1), cb.CNPsSent)
	} else { // a very slow machine: at most one per interval
		assert.LessOrEqual(t, cb.CNPsSent, uint64(time.Since(start)/p.MinTimeBetweenCNPs)+1)
	}
	if cb.CNPsSent == 1 {
		// α = 1023/1024 on the first CNP: Rc = L·(1 - α/2).
		assert.Equal(t, uint64(float64(p.LineRate)*(1-1023.0/2048)), a.counters(t).CCRate())
	}
}

// TestCNPWithCCOff: a requester without congestion control counts the
// CNPs it gets and ignores them; a responder without it sends none.
func TestCNPWithCCOff(t *testing.T) {
	nw := newNetworkMode(t, roce.ModeEthernet, 4096, 1024)
	var mk *ceLink
	na := newCCNode(t, nw, "10.0.0.1", nil, func(l Link) Link { mk = &ceLink{Link: l, mode: roce.ModeEthernet}; return mk })
	nb := newCCNode(t, nw, "10.0.0.2", ccParams(), nil)
	o := defaultOpts()
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	mk.mark.Store(true)
	writes(t, a, b, 16, 8192, 1)
	ca := a.counters(t).Load()
	require.NotZero(t, ca.CNPsReceived)
	assert.Equal(t, ca.CNPsReceived, na.eng.WorkerCounters(0).CNPsIgnored.Load())
	assert.Zero(t, a.counters(t).CCRate())
	// Off, the packets are as without congestion control: ECN field 0.
	assert.NotZero(t, mk.ecn[0].Load())
	assert.Zero(t, mk.ecn[1].Load()+mk.ecn[2].Load()+mk.ecn[3].Load())

	// The other way: b's WRITEs reach a, which has CC off, unmarked, so
	// nothing; a never sends a CNP.
	writes(t, b, a, 4, 8192, 2)
	assert.Zero(t, a.counters(t).Load().CNPsSent)
}

// TestForgedCNP: CNPs that do not come from the QP's peer, name no QP or
// fail the ICRC are dropped and counted as such; none reaches the
// reaction point.
func TestForgedCNP(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			nw := newNetworkMode(t, mode, 4096, 1024)
			na := newCCNode(t, nw, "10.0.0.1", ccParams(), nil)
			nb := newCCNode(t, nw, "10.0.0.2", ccParams(), nil)
			o := defaultOpts()
			a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
			connect(t, a, b, o)
			rogue, err := nw.Attach(netip.MustParseAddr("10.0.0.3"), 1, nil)
			require.NoError(t, err)
			w := na.eng.WorkerCounters(0)
			send := func(src string, qpn uint32, corrupt bool) {
				path := roce.Path{Mode: mode, Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.0.0.1"), SrcPort: 49152}
				if mode == roce.ModeUDP {
					path.Src, path.DstPort = rogue[0].LocalAddr().Addr(), roce.UDPPort
					path.SrcPort = rogue[0].LocalAddr().Port()
				}
				buf := make([]byte, 256)
				h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpCNP, PKey: 0xffff, DestQP: qpn, BECN: true}}
				f, err := path.Build(buf, path.Headroom(roce.OpCNP), 0, &h)
				require.NoError(t, err)
				if corrupt {
					f[len(f)-1] ^= 1
				}
				n, err := rogue[0].SendBatch([][]byte{f}, []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), roce.UDPPort)})
				require.NoError(t, err)
				require.Equal(t, 1, n)
			}
			bad0, unk0, icrc0 := w.BadPeer.Load(), w.UnknownQP.Load(), w.ICRCErrors.Load()
			send("10.0.0.3", 0x11, false) // not the QP's peer
			send("10.0.0.3", 0x99, false) // no such QP
			send("10.0.0.3", 0x11, true)  // bad ICRC
			require.Eventually(t, func() bool {
				return w.BadPeer.Load() == bad0+1 && w.UnknownQP.Load() == unk0+1 && w.ICRCErrors.Load() == icrc0+1
			}, waitFor, time.Millisecond, "bad %d unknown %d icrc %d", w.BadPeer.Load()-bad0, w.UnknownQP.Load()-unk0, w.ICRCErrors.Load()-icrc0)
			assert.Zero(t, w.CNPsReceived.Load())
			assert.Zero(t, a.counters(t).CCRate())
			writes(t, a, b, 4, 4096, 1) // the QP is unharmed
		})
	}
}

func (q *tqp) counters(t testing.TB) *QPCounters {
	t.Helper()
	c, err := q.n.eng.Counters(q.qpn)
	require.NoError(t, err)
	return c
}

// TestPacingHoldsTheRate: after one CNP (and no increase: the timer and
// the byte counter are set beyond the test) a QP sends at most at its cut
// rate, about 1 Mb/s here: B bytes take at least (B - burst) / rate. And
// with link_rate the worker's QPs together send at most at that rate
// without any CNP. Lower bounds only: a slow machine only takes longer.
func TestPacingHoldsTheRate(t *testing.T) {
	const size, n = 4096, 16 // 64 KiB
	t.Run("qp", func(t *testing.T) {
		nw := newNetworkMode(t, roce.ModeUDP, 4096, 1024)
		p := ccParams()
		p.LineRate = cc.Mbps(2) // the first cut: 2 · (1 - 1023/2048) ≈ 1 Mb/s
		p.MinRate = cc.Mbps(1)
		p.AIRate, p.HAIRate = cc.Mbps(1), cc.Mbps(1)
		p.TimeReset, p.ByteReset, p.MinTimeBetweenCNPs = time.Second, 1<<32, time.Second
		p.PaceBurst = 4096
		var mk *ceLink
		na := newCCNode(t, nw, "10.0.0.1", p, func(l Link) Link { mk = &ceLink{Link: l, mode: roce.ModeUDP}; return mk })
		nb := newCCNode(t, nw, "10.0.0.2", p, nil)
		o := defaultOpts()
		a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
		connect(t, a, b, o)
		mk.mark.Store(true)
		writes(t, a, b, 1, 64, 1)
		mk.mark.Store(false)
		require.Eventually(t, func() bool { return a.counters(t).CCRate() != 0 }, waitFor, time.Millisecond, "the CNP arrives")
		rate := a.counters(t).CCRate()
		require.InDelta(t, float64(cc.Mbps(1)), float64(rate), float64(cc.Mbps(1))/100)
		start := time.Now()
		writes(t, a, b, n, size, 2)
		took := time.Since(start)
		least := time.Duration(float64((n*size-2*int(p.PaceBurst))*8) / float64(rate) * float64(time.Second))
		assert.GreaterOrEqual(t, took, least, "%d bytes at %d b/s", n*size, rate)
		assert.Equal(t, rate, a.counters(t).CCRate(), "no increase meanwhile")
	})
	t.Run("read", func(t *testing.T) {
		// The responder is paced too: READ responses marked CE on their
		// way make the requester send CNPs to the responder's QP.
		nw := newNetworkMode(t, roce.ModeUDP, 4096, 1024)
		p := ccParams()
		p.LineRate, p.MinRate = cc.Mbps(2), cc.Mbps(1)
		p.AIRate, p.HAIRate = cc.Mbps(1), cc.Mbps(1)
		p.TimeReset, p.ByteReset, p.MinTimeBetweenCNPs = time.Second, 1<<32, time.Second
		p.PaceBurst = 4096
		na := newCCNode(t, nw, "10.0.0.1", p, nil)
		var mk *ceLink
		nb := newCCNode(t, nw, "10.0.0.2", p, func(l Link) Link {
			mk = &ceLink{Link: l, mode: roce.ModeUDP, ops: roce.OpRead | roce.OpResponse}
			return mk
		})
		o := defaultOpts()
		a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
		connect(t, a, b, o)
		local := a.n.buffer(n*size, 0x7000_0000, abi.AccessAll, 7)
		remote := b.n.buffer(n*size, 0x8000_0000, abi.AccessAll, 8)
		read := func(size int, wrid uint64) {
			start := a.scq.count.Load()
			a.send(t, abi.SendWQE{WrID: wrid, Opcode: abi.WRRDMARead, Flags: abi.SendSignaled, RemoteAddr: remote.va, RKey: remote.key}, local.sge(0, size))
			require.True(t, a.scq.wait(int(start)+1, waitFor))
			require.Equal(t, abi.WCSuccess, a.scq.all()[start].Status)
		}
		mk.mark.Store(true)
		read(64, 1)
		mk.mark.Store(false)
		require.Eventually(t, func() bool { return b.counters(t).CCRate() != 0 }, waitFor, time.Millisecond, "the CNP reaches the responder")
		assert.NotZero(t, a.counters(t).Load().CNPsSent)
		rate := b.counters(t).CCRate()
		start := time.Now()
		read(n*size, 2)
		took := time.Since(start)
		least := time.Duration(float64((n*size-2*int(p.PaceBurst))*8) / float64(rate) * float64(time.Second))
		assert.GreaterOrEqual(t, took, least, "a %d-byte READ answered at %d b/s", n*size, rate)
		assert.Equal(t, sum(remote.b), sum(local.b))
	})
	t.Run("link", func(t *testing.T) {
		nw := newNetworkMode(t, roce.ModeUDP, 4096, 1024)
		p := ccParams()
		p.LinkRate, p.PaceBurst = cc.Mbps(2), 4096
		na := newCCNode(t, nw, "10.0.0.1", p, nil)
		nb := newCCNode(t, nw, "10.0.0.2", ccParams(), nil)
		o := defaultOpts()
		a1, b1 := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
		a2, b2 := na.newQP(t, 0x13, o), nb.newQP(t, 0x24, o)
		connect(t, a1, b1, o)
		connect(t, a2, b2, o)
		start := time.Now()
		src := a2.n.buffer(size, 0x5000_0000, abi.AccessAll, 5)
		dst := b2.n.buffer(size, 0x6000_0000, abi.AccessAll, 6)
		for i := range n / 2 { // a2's WRITEs go out beside a1's
			a2.send(t, abi.SendWQE{WrID: uint64(i), Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled, RemoteAddr: dst.va, RKey: dst.key}, src.sge(0, size))
		}
		writes(t, a1, b1, n/2, size, 4)
		require.True(t, a2.scq.wait(n/2, waitFor))
		took := time.Since(start)
		for _, c := range a2.scq.all() {
			require.Equal(t, abi.WCSuccess, c.Status)
		}
		assert.Equal(t, sum(src.b), sum(dst.b))
		least := time.Duration(float64((n*size-2*int(p.PaceBurst))*8) / float64(p.LinkRate) * float64(time.Second))
		assert.GreaterOrEqual(t, took, least, "two QPs, %d bytes together at %d b/s", n*size, p.LinkRate)
		assert.Zero(t, a1.counters(t).CCRate(), "no CNP: the QPs themselves are not limited")
	})
}

// TestZeroAllocWriteCC: the RDMA WRITE path allocates nothing with
// congestion control working: every WRITE packet marked CE, CNPs back,
// the rate cut and recovering on the timers and byte counter, the QP
// paced, the link limiter on.
func TestZeroAllocWriteCC(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	nw := newNetworkMode(t, roce.ModeUDP, 128, 64)
	p := ccParams()
	p.MinRate = cc.Mbps(500) // between 500 Mb/s and the line rate: fast enough for the test
	p.LinkRate = cc.Mbps(4000)
	var mk *ceLink
	na := newCCNode(t, nw, "10.0.0.1", p, func(l Link) Link { mk = &ceLink{Link: l, mode: roce.ModeUDP}; return mk })
	nb := newCCNode(t, nw, "10.0.0.2", p, nil)
	o := defaultOpts()
	o.mtu, o.timeout = roce.MTU4096, 20
	a, b := na.newQP(t, 0x11, o), nb.newQP(t, 0x22, o)
	connect(t, a, b, o)
	mk.mark.Store(true)
	allocs, src, dst := writeAllocs(a, b)
	assert.Zero(t, allocs, "allocations per 64 KiB WRITE with congestion control")
	ca, cb := a.counters(t).Load(), b.counters(t).Load()
	require.NotZero(t, ca.CNPsReceived)
	require.NotZero(t, cb.CNPsSent)
	t.Logf("CNPs %d, rate now %d b/s", ca.CNPsReceived, a.counters(t).CCRate())
	assert.Equal(t, sum(src.b), sum(dst.b))
}
