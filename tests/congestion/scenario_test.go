package congestion

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/rcpair"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/verbs"
)

// The scenario's parameters.
const (
	// bottleneck is the receiver's queue: served at 100 Mb/s, at most
	// 40 ms deep, marking CE above 2 ms of wait.
	bottleneckBPS = 100_000_000
	queueLimit    = "40ms"
	markAbove     = "2ms"
	// qpsPerSender WRITE streams (vrnic-perf write_bw, one QP each) run
	// from each of the three senders to the receiver for runFor.
	qpsPerSender = 2
	runFor       = 6 * time.Second
	// probeEvery: the latency probe's period (one 64-byte WRITE from
	// sender 1 to the receiver, timed to its completion).
	probeEvery = 5 * time.Millisecond
	// The path MTU of the streams (the veths' 1500 bytes carry 1024).
	mtu = 1024
)

// ccParams are the DCQCN parameters of the "dcqcn" run: the mlx5
// defaults (package cc) are for 40 to 100 Gb/s ports, where a QP sends a
// packet every few hundred nanoseconds; here a QP's share is about
// 17 Mb/s, a packet every half millisecond. The time constants are
// stretched and the rate steps shrunk accordingly (BENCHMARKS.md,
// kernel-notes/congestion.md): the line rate is about what one QP of
// this machine can send.
var ccParams = []string{
	"line_rate=1000",
	"rpg_ai_rate=1", "rpg_hai_rate=10",
	"rpg_time_reset=2000",
	"dce_tcp_rtt=500",
	"min_time_between_cnps=500",
	"pace_burst=4096",
}

// topo is the scenario's network: the receiver's namespace, the
// senders', the bridge's.
type topo struct {
	pfx     string
	ns      map[string]string // role (r, s1, s2, s3) -> namespace
	addr    map[string]netip.Addr
	senders []string
	all     []string
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// newTopo creates the namespaces, the bridge and a veth from each
// daemon's namespace into it; t.Cleanup deletes the namespaces (the
// veths and the bridge go with them) and checks nothing is left.
func newTopo(t *testing.T) *topo {
	testenv.Need(t, skipReason == "", skipReason)
	testenv.NeedTool(t, "ss") // dialable: a server listens (a test connection would be its client)
	tp := &topo{pfx: fmt.Sprintf("vcc%d", os.Getpid()%100000), ns: map[string]string{}, addr: map[string]netip.Addr{},
		senders: []string{"s1", "s2", "s3"}, all: []string{"r", "s1", "s2", "s3"}}
	t.Cleanup(func() { // registered first: runs last
		out, _ := exec.Command("ip", "netns", "list").CombinedOutput()
		if strings.Contains(string(out), tp.pfx) {
			t.Errorf("namespaces left behind: %s", out)
		}
	})
	for _, role := range append([]string{"br"}, tp.all...) {
		ns := tp.pfx + role
		tp.ns[role] = ns
		ipCmd(t, "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		ipCmd(t, "-n", ns, "link", "set", "lo", "up")
	}
	br := tp.ns["br"]
	ipCmd(t, "-n", br, "link", "add", "br0", "type", "bridge")
	ipCmd(t, "-n", br, "link", "set", "br0", "up")
	host := map[string]byte{"r": 1, "s1": 11, "s2": 12, "s3": 13}
	for _, role := range tp.all {
		port := "p" + role
		tp.addr[role] = netip.AddrFrom4([4]byte{10, 144, 0, host[role]})
		ipCmd(t, "-n", br, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", tp.ns[role])
		ipCmd(t, "-n", br, "link", "set", port, "master", "br0")
		ipCmd(t, "-n", br, "link", "set", port, "up")
		ipCmd(t, "-n", tp.ns[role], "addr", "add", tp.addr[role].String()+"/24", "dev", "eth0")
		ipCmd(t, "-n", tp.ns[role], "link", "set", "eth0", "up")
	}
	return tp
}

// daemons runs one vrnicd per role, each in its namespace, with extra
// flags; stop (also the test's cleanup) stops them by PID.
func (tp *topo) daemons(t *testing.T, dir string, extra []string) (socks map[string]string, stop func()) {
	t.Helper()
	socks = map[string]string{}
	var procs []func()
	stop = func() {
		for _, s := range procs {
			s()
		}
		procs = nil
	}
	t.Cleanup(stop)
	for _, role := range tp.all {
		name := "vcc" + role
		logf := filepath.Join(dir, name+".log")
		lf, err := os.Create(logf)
		require.NoError(t, err)
		t.Cleanup(func() { lf.Close() })
		args := append([]string{"netns", "exec", tp.ns[role], filepath.Join(bin, "vrnicd"), "-name", name, "-runtime-dir", dir,
			"-link", "udp", "-local", tp.addr[role].String() + ":4791", "-workers", "1"}, extra...)
		p, err := launch.Start(launch.Spec{Name: "vrnicd " + role, Bin: "ip", Args: args, Stdout: lf, Stderr: lf})
		require.NoError(t, err)
		p.Log = logf
		procs = append(procs, func() {
			if err := p.Stop(0, 10*time.Second); err != nil || p.Killed() {
				t.Errorf("vrnicd %s: %v (killed %v)\n%s", role, err, p.Killed(), launch.Tail(logf, 20))
			}
		})
		socks[role] = admin.SocketPath(dir, name)
		require.NoError(t, launch.WaitReady(t.Context(), p, socks[role], 20*time.Second))
	}
	return socks, stop
}

func ctl(t *testing.T, sock string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(filepath.Join(bin, "vrnicctl"), append([]string{"-s", sock}, args...)...).CombinedOutput()
	require.NoError(t, err, "vrnicctl %v: %s", args, out)
	return out
}

// stream is one WRITE stream's result (vrnic-perf's JSON).
type stream struct {
	Gbps        float64 `json:"gbps"`
	Retransmits uint64  `json:"retransmits"`
}

// phase is what one run measured.
type phase struct {
	name        string
	mbps        []float64 // per QP that completed
	failed      int       // QPs that failed (RETRY_EXC_ERR)
	jain        float64
	retransmits uint64        // go-back-N restarts on the senders
	timeouts    uint64        // ACK timeouts of the senders
	drops       uint64        // frames the bottleneck dropped
	marks       uint64        // frames it marked CE
	passed      uint64        // frames it passed
	meanWait    time.Duration // mean queueing delay of what it passed
	probe       []time.Duration
	probeLost   int
	cnpsSent    uint64   // by the receiver
	cnpsRecv    uint64   // by the senders
	rates       []uint64 // sender 1's QPs' cc_rate_bps half-way (vrnicctl qps)
}

// jain is Jain's fairness index of xs: (Σx)² / (n Σx²), 1 when all are
// equal, 1/n when one has everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

// quantile of sorted ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// run is one phase: fresh daemons (congestion control per extra), the
// bottleneck rule on the receiver, the streams and the probe.
func (tp *topo) run(t *testing.T, name string, extra []string, tolerateFailures bool) *phase {
	dir, err := os.MkdirTemp("", "cc-"+name+"-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	socks, stopDaemons := tp.daemons(t, dir, extra)
	defer stopDaemons()
	ctl(t, socks["r"], "fault", "add", "dir=rx", "action=rate", fmt.Sprintf("bps=%d", bottleneckBPS), "for="+queueLimit, "ce_above="+markAbove)

	// One vrnic-perf server per stream on the receiver (their control
	// connections on this test's loopback addresses), one client on a
	// sender each.
	perf := filepath.Join(bin, "vrnic-perf")
	type cli struct {
		p   *launch.Proc
		out *launch.Buffer
	}
	var clis []cli
	port := 47000 + os.Getpid()%1000*10
	for _, s := range tp.senders {
		for range qpsPerSender {
			port++
			addr := fmt.Sprintf("127.0.44.%d:%d", 60, port)
			srvOut := &launch.Buffer{}
			srv, err := launch.Start(launch.Spec{Name: "vrnic-perf server", Bin: perf, Args: []string{"server", "-dev", socks["r"], "-listen", addr},
				Stdout: srvOut, Stderr: srvOut})
			require.NoError(t, err)
			t.Cleanup(func() { srv.Stop(0, 5*time.Second) })
			require.Eventually(t, func() bool { return strings.Contains(srvOut.String(), "listening") || dialable(addr) },
				10*time.Second, 10*time.Millisecond, "vrnic-perf server: %s", srvOut.String())
			out := &launch.Buffer{}
			c, err := launch.Start(launch.Spec{Name: "vrnic-perf client " + s, Bin: perf, Args: []string{"client", "-dev", socks[s], "-server", addr,
				"-test", "write_bw", "-size", "65536", "-depth", "16", "-mtu", fmt.Sprint(mtu), "-duration", runFor.String(), "-events", "-json"},
				Stdout: out, Stderr: out})
			require.NoError(t, err)
			t.Cleanup(func() { c.Stop(0, 5*time.Second) })
			clis = append(clis, cli{c, out})
		}
	}
	ph := &phase{name: name}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		ph.probe, ph.probeLost = probe(t, socks["s1"], socks["r"], stop)
	}()
	// Half-way, what vrnicctl qps says of sender 1's QPs: their rates.
	time.Sleep(runFor / 2)
	var qps []admin.QPInfo
	require.NoError(t, json.Unmarshal(ctl(t, socks["s1"], "-json", "qps"), &qps))
	for _, q := range qps {
		ph.rates = append(ph.rates, q.CCRate)
	}
	for _, c := range clis {
		require.True(t, c.p.Wait(runFor+60*time.Second), "vrnic-perf client hangs: %s", c.out.String())
	}
	close(stop)
	wg.Wait()
	for _, c := range clis {
		if err := c.p.Err(); err != nil && tolerateFailures && strings.Contains(c.out.String(), "RETRY_EXC_ERR") {
			// Seven ACK timeouts in a row: the QP gave up (and went to
			// ERR), as RC does in a collapse without congestion control.
			ph.failed++
			continue
		}
		require.NoError(t, c.p.Err(), "%s", c.out.String())
		var res struct{ Results []stream }
		require.NoError(t, json.Unmarshal([]byte(c.out.String()), &res), "%s", c.out.String())
		require.Len(t, res.Results, 1)
		ph.mbps = append(ph.mbps, res.Results[0].Gbps*1000)
	}
	ph.jain = jain(ph.mbps)

	var rules admin.FaultReply
	require.NoError(t, json.Unmarshal(ctl(t, socks["r"], "-json", "fault", "list"), &rules))
	require.Len(t, rules.Rules, 1)
	rl := rules.Rules[0]
	ph.drops, ph.marks, ph.passed = rl.RateDrops, rl.CEMarked, rl.Matched-rl.RateDrops
	if ph.passed > 0 {
		ph.meanWait = time.Duration(rl.RateWaitNs / ph.passed)
	}
	for _, role := range tp.all {
		var info admin.Info
		require.NoError(t, json.Unmarshal(ctl(t, socks[role], "-json", "info"), &info))
		if role == "r" {
			ph.cnpsSent = info.Wire.CNPsSent
		} else {
			ph.cnpsRecv += info.Wire.CNPsReceived
			ph.timeouts += info.DataPath.Timeouts
			ph.retransmits += info.DataPath.Retransmits
		}
	}
	return ph
}

func dialable(addr string) bool {
	out, err := exec.Command("ss", "-Htln", "src", addr).Output()
	return err == nil && len(strings.TrimSpace(string(out))) > 0
}

// probe connects an RC QP of sender socket s to one of receiver socket r
// and, every probeEvery until stop, writes 64 bytes and times the WRITE
// to its completion: the queueing delay the bottleneck adds, sampled
// evenly in time (a WRITE that takes longer delays the next sample).
// lost counts WRITEs that completed in error (the probe then stops).
func probe(t *testing.T, s, r string, stop <-chan struct{}) (lat []time.Duration, lost int) {
	type end struct {
		ctx *verbs.Context
		qp  *verbs.QP
		cq  *verbs.CQ
		mr  *verbs.MR
		me  rcpair.Info
	}
	open := func(sock string) *end {
		e := &end{}
		var err error
		e.ctx, err = verbs.Open(sock, verbs.WithClientName("cc-probe"))
		require.NoError(t, err)
		t.Cleanup(func() { e.ctx.Close() })
		pd, err := e.ctx.AllocPD()
		require.NoError(t, err)
		e.cq, err = e.ctx.CreateCQ(16, nil)
		require.NoError(t, err)
		e.qp, err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: e.cq, RecvCQ: e.cq,
			Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		require.NoError(t, err)
		buf, err := e.ctx.Alloc(4096, 4096)
		require.NoError(t, err)
		e.mr, err = pd.RegMR(buf, abi.AccessAll)
		require.NoError(t, err)
		gid, err := e.ctx.QueryGID(1, 0)
		require.NoError(t, err)
		e.me = rcpair.Local(e.qp, 0x100, gid.GID, e.mr)
		return e
	}
	a, b := open(s), open(r)
	require.NoError(t, rcpair.Connect(a.qp, 0x100, b.me, rcpair.Attr{MTU: rcpair.MTU(mtu), MaxRdAtomic: 1}))
	require.NoError(t, rcpair.Connect(b.qp, 0x100, a.me, rcpair.Attr{MTU: rcpair.MTU(mtu), MaxRdAtomic: 1}))
	wc := make([]abi.CQE, 1)
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for seq := uint64(0); ; seq++ {
		select {
		case <-stop:
			return lat, lost
		case <-tick.C:
		}
		start := time.Now()
		wr := verbs.SendWR{WrID: seq, Opcode: abi.WRRDMAWrite, Flags: abi.SendSignaled,
			SGL: []abi.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.me.Addr, RKey: b.me.RKey}
		require.NoError(t, a.qp.PostSend(&wr))
		for a.cq.Poll(wc) == 0 {
			time.Sleep(20 * time.Microsecond)
		}
		if wc[0].Status != abi.WCSuccess {
			return lat, lost + 1
		}
		lat = append(lat, time.Since(start))
	}
}

// TestCongestionDCQCN: three senders, two WRITE QPs each, into one
// receiver through a 100 Mb/s queue that marks CE above 2 ms and drops
// beyond 40 ms; once without congestion control (the daemons' default)
// and once with DCQCN. With DCQCN the QPs share the bottleneck fairly
// (Jain's index ≥ 0.9) and the queue drops less and holds the packets
// less long than without. Ratios only: no absolute time or rate is
// asserted. Without congestion control a QP may give up (seven ACK
// timeouts in a row: RETRY_EXC_ERR); that run counts it and goes on. With
// DCQCN none may. BENCHMARKS.md has the figures.
func TestCongestionDCQCN(t *testing.T) {
	tp := newTopo(t)
	var dcqcnArgs []string
	dcqcnArgs = append(dcqcnArgs, "-cc", "dcqcn")
	for _, kv := range ccParams {
		dcqcnArgs = append(dcqcnArgs, "-cc-param", kv)
	}
	off := tp.run(t, "off", nil, true)
	on := tp.run(t, "dcqcn", dcqcnArgs, false)

	var b strings.Builder
	fmt.Fprintf(&b, "| | CC off | DCQCN |\n|---|---|---|\n")
	row := func(name string, f func(*phase) string) { fmt.Fprintf(&b, "| %s | %s | %s |\n", name, f(off), f(on)) }
	row("goodput per QP, Mb/s", func(p *phase) string {
		if p.failed > 0 {
			return fmt.Sprintf("%s (%d more failed: RETRY_EXC_ERR)", fmtFloats(p.mbps), p.failed)
		}
		return fmtFloats(p.mbps)
	})
	row("goodput total, Mb/s", func(p *phase) string { return fmt.Sprintf("%.1f", sum(p.mbps)) })
	row("Jain's index (QPs that completed)", func(p *phase) string { return fmt.Sprintf("%.3f", p.jain) })
	row("bottleneck drops (frames)", func(p *phase) string { return fmt.Sprint(p.drops) })
	row("go-back-N restarts / ACK timeouts", func(p *phase) string { return fmt.Sprintf("%d / %d", p.retransmits, p.timeouts) })
	row("CE marks / CNPs sent / CNPs received", func(p *phase) string { return fmt.Sprintf("%d / %d / %d", p.marks, p.cnpsSent, p.cnpsRecv) })
	row("queueing delay, mean per frame passed", func(p *phase) string { return p.meanWait.Round(10 * time.Microsecond).String() })
	row("sender 1's QP rates half-way (vrnicctl qps cc_rate_bps), Mb/s", func(p *phase) string {
		s := make([]string, len(p.rates))
		for i, r := range p.rates {
			s[i] = fmt.Sprintf("%.1f", float64(r)/1e6)
		}
		return strings.Join(s, ", ")
	})
	row("probe WRITE latency p50 / p90 / p99", func(p *phase) string {
		ds := slices.Clone(p.probe)
		slices.Sort(ds)
		return fmt.Sprintf("%v / %v / %v (%d samples, %d failed)", quantile(ds, .5).Round(10*time.Microsecond),
			quantile(ds, .9).Round(10*time.Microsecond), quantile(ds, .99).Round(10*time.Microsecond), len(ds), p.probeLost)
	})
	t.Logf("congestion scenario (%d QPs, %d Mb/s bottleneck):\n%s", len(on.mbps), bottleneckBPS/1_000_000, b.String())
	if f := os.Getenv("VRNIC_CC_REPORT"); f != "" {
		require.NoError(t, os.WriteFile(f, []byte(b.String()), 0o644))
	}

	// Without congestion control nothing answers the marks.
	assert.Zero(t, off.cnpsSent)
	assert.NotZero(t, off.marks, "the queue built up without congestion control")
	// With DCQCN: CNPs flow, the QPs share fairly, the queue drops less
	// and holds less.
	assert.NotZero(t, on.cnpsSent)
	assert.Equal(t, on.cnpsSent, on.cnpsRecv, "every CNP reached its sender")
	assert.Zero(t, on.failed)
	assert.Len(t, on.mbps, len(tp.senders)*qpsPerSender)
	assert.GreaterOrEqual(t, on.jain, 0.9, "Jain's index with DCQCN: %v", on.mbps)
	assert.Less(t, on.drops, off.drops, "bottleneck drops")
	assert.Less(t, on.retransmits, off.retransmits, "go-back-N restarts")
	assert.Less(t, on.meanWait, off.meanWait, "mean queueing delay")
	assert.Zero(t, on.probeLost)
	// vrnicctl qps shows the limited QPs' rates (0: not limited): with
	// DCQCN some of sender 1's are limited, below the line rate;
	// without, none is.
	limited := 0
	for _, r := range on.rates {
		if r != 0 {
			limited++
			assert.Less(t, r, uint64(1_000_000_000))
		}
	}
	assert.NotZero(t, limited, "rates half-way: %v", on.rates)
	for _, r := range off.rates {
		assert.Zero(t, r)
	}
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func fmtFloats(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(s, ", ")
}

// TestKernelCEMark: a CE mark the kernel puts in the IP header reaches
// the engine through the UDP link (IP_RECVTOS: link/udp_ecn.go). An eBPF
// program on the tc egress hook of the receiver's bridge port (vrnicctl
// tcfault, action ecn) marks a share of the RoCE v2 frames on their way;
// the receiver (-cc dcqcn, no fault rule of its own) counts them as CE
// and answers with CNPs, which reach the sender.
func TestKernelCEMark(t *testing.T) {
	tp := newTopo(t)
	dir, err := os.MkdirTemp("", "cc-kernel-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	socks, stopDaemons := tp.daemons(t, dir, []string{"-cc", "dcqcn"})
	defer stopDaemons()
	vrnicctl := filepath.Join(bin, "vrnicctl")
	target := []string{"dev=pr", "hook=egress", "netns=" + tp.ns["br"]}
	out, err := exec.Command(vrnicctl, append([]string{"tcfault", "attach"}, target...)...).CombinedOutput()
	if err != nil && strings.Contains(string(out), "not supported") {
		t.Skipf("no tc BPF attachment here: %s", out)
	}
	require.NoError(t, err, "tcfault attach: %s", out)
	t.Cleanup(func() {
		if out, err := exec.Command(vrnicctl, append([]string{"tcfault", "detach"}, target...)...).CombinedOutput(); err != nil {
			t.Errorf("tcfault detach: %v: %s", err, out)
		}
	})
	out, err = exec.Command(vrnicctl, append(append([]string{"tcfault", "add"}, target...), "action=ecn", "prob=0.2", "seed=7")...).CombinedOutput()
	require.NoError(t, err, "tcfault add: %s", out)

	perf := filepath.Join(bin, "vrnic-perf")
	addr := fmt.Sprintf("127.0.44.61:%d", 48000+os.Getpid()%1000)
	srvOut := &launch.Buffer{}
	srv, err := launch.Start(launch.Spec{Name: "vrnic-perf server", Bin: perf, Args: []string{"server", "-dev", socks["r"], "-listen", addr},
		Stdout: srvOut, Stderr: srvOut})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Stop(0, 5*time.Second) })
	require.Eventually(t, func() bool { return dialable(addr) }, 10*time.Second, 10*time.Millisecond, "%s", srvOut.String())
	cliOut := &launch.Buffer{}
	cli, err := launch.Start(launch.Spec{Name: "vrnic-perf client", Bin: perf, Args: []string{"client", "-dev", socks["s1"], "-server", addr,
		"-test", "write_bw", "-size", "65536", "-depth", "4", "-mtu", fmt.Sprint(mtu), "-iters", "200", "-json"}, Stdout: cliOut, Stderr: cliOut})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Stop(0, 5*time.Second) })
	require.True(t, cli.Wait(120*time.Second), "vrnic-perf client: %s", cliOut.String())
	require.NoError(t, cli.Err(), "%s", cliOut.String())

	var r, s admin.Info
	require.NoError(t, json.Unmarshal(ctl(t, socks["r"], "-json", "info"), &r))
	require.NoError(t, json.Unmarshal(ctl(t, socks["s1"], "-json", "info"), &s))
	t.Logf("receiver: ce_received %d, cnps_sent %d; sender: cnps_received %d", r.DataPath.CEReceived, r.Wire.CNPsSent, s.Wire.CNPsReceived)
	assert.NotZero(t, r.DataPath.CEReceived, "the kernel's CE marks reached the engine")
	assert.NotZero(t, r.Wire.CNPsSent)
	assert.LessOrEqual(t, r.Wire.CNPsSent, r.DataPath.CEReceived)
	assert.Equal(t, r.Wire.CNPsSent, s.Wire.CNPsReceived)
}
