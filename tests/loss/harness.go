package loss

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
)

// Test is a vrnic-perf test the harness runs.
type Test string

// The tests, with the message sizes of the table.
const (
	WriteBW Test = "write_bw" // 64 KiB RDMA WRITEs
	SendLat Test = "send_lat" // 8-byte SEND ping-pong
	ReadLat Test = "read_lat" // 8-byte RDMA READ
)

// Tests is every test, in the order a condition runs them.
var Tests = []Test{WriteBW, SendLat, ReadLat}

// Size is the test's message size.
func (t Test) Size() int {
	if t == WriteBW {
		return 64 << 10
	}
	return 8
}

// Injector says what puts the loss in.
type Injector int

const (
	// Rules: the daemons' own fault rules (vrnicctl fault), on what each
	// daemon sends.
	Rules Injector = iota
	// Kernel: the tc program (vrnicctl tcfault) on the egress hook of
	// the daemons' namespace's lo. Root only.
	Kernel
)

func (i Injector) String() string {
	if i == Kernel {
		return "kernel tc injector"
	}
	return "daemon fault rules"
}

// Bins are the binaries the harness runs.
type Bins struct {
	Vrnicd, Vrnicctl, Perf string
}

// Build builds vrnicd, vrnicctl and vrnic-perf into dir (the go tool's
// output to out).
func Build(dir string, out io.Writer) (Bins, error) {
	var b Bins
	for _, x := range []struct {
		name string
		dst  *string
	}{{"vrnicd", &b.Vrnicd}, {"vrnicctl", &b.Vrnicctl}, {"vrnic-perf", &b.Perf}} {
		p, err := launch.GoBuild("github.com/vrnic/vrnic/cmd/"+x.name, dir, x.name, out)
		if err != nil {
			return b, err
		}
		*x.dst = p
	}
	return b, nil
}

// SRFlag is the vrnic-perf flag (client and server) that turns selective
// repeat on for the QPs it connects; SRArgs are the arguments the
// selective-repeat runs give both: selective repeat and the adaptive
// retransmission timer, the two ECE options the loss issue asks for.
const SRFlag = "-selective-repeat"

// SRArgs: see SRFlag.
var SRArgs = []string{SRFlag, "-ece", "rto"}

// SRSupported reports whether the vrnic-perf binary perf has SRFlag, in
// both roles (from their -h usage).
func SRSupported(perf string) bool {
	for _, role := range []string{"client", "server"} {
		out, _ := exec.Command(perf, role, "-h").CombinedOutput() // -h exits 2
		if !bytes.Contains(out, []byte(SRFlag+" ")) && !bytes.Contains(out, []byte(SRFlag+"\n")) &&
			!bytes.Contains(out, []byte(SRFlag+"\t")) {
			return false
		}
	}
	return true
}

// Config is one run's set-up.
type Config struct {
	Bins     Bins
	Injector Injector
	// SR passes SRArgs to the vrnic-perf server and client.
	SR bool
	// Seed: the daemons' fault seeds are Seed+1 (client) and Seed+2
	// (server); the tc rules draw from Seed+100 on. Default 4800.
	Seed uint64
	// Duration of each test (vrnic-perf -duration); when 0, Iters[test]
	// operations instead (vrnic-perf -iters; 0: its default).
	Duration time.Duration
	Iters    map[Test]int
	// Depth: write_bw's outstanding WRITEs (0: vrnic-perf's 128).
	Depth int
	// Addrs: the daemons' UDP link addresses, client then server
	// (default 127.0.48.1 and 127.0.48.2).
	Addrs [2]netip.Addr
}

// Mode names the transport mode of the run.
func (c *Config) Mode() string {
	if c.SR {
		return "selective repeat"
	}
	return "go-back-N"
}

// Pair is two running daemons (A runs the perf client, B the server) and,
// for the kernel injector, their namespace and its tc attachment.
type Pair struct {
	cfg   Config
	dir   string
	netns string
	names [2]string
	socks [2]string
	procs [2]*launch.Proc
	runs  int
}

const (
	client = 0
	server = 1
)

// Start starts the daemons (and for Kernel, creates their namespace and
// attaches the tc program to its lo). t's cleanup stops and removes it
// all, also on failure.
func Start(t testing.TB, cfg Config) *Pair {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 4800
	}
	if !cfg.Addrs[0].IsValid() {
		cfg.Addrs = [2]netip.Addr{netip.AddrFrom4([4]byte{127, 0, 48, 1}), netip.AddrFrom4([4]byte{127, 0, 48, 2})}
	}
	dir, err := os.MkdirTemp("", "vloss-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &Pair{cfg: cfg, dir: dir, names: [2]string{"vla", "vlb"}}
	var prefix []string
	extra := []string{}
	if cfg.Injector == Kernel {
		p.netns = fmt.Sprintf("vl%d", os.Getpid())
		p.setupNetns(t)
		prefix = []string{"netns", "exec", p.netns}
		// One datagram per frame at the tc hook (doc.go).
		extra = append(extra, "-udp-segment-ipv4=false")
	} else {
		for _, a := range cfg.Addrs {
			require.True(t, launch.UDPFree(a), "UDP port %d of %v is taken (a daemon left behind?)", launch.RoCEPort, a)
		}
	}
	for i, name := range p.names {
		args := append([]string{"-name", name, "-runtime-dir", dir, "-link", "udp",
			"-local", netip.AddrPortFrom(cfg.Addrs[i], launch.RoCEPort).String(), "-workers", "1",
			"-fault-seed", strconv.FormatUint(cfg.Seed+1+uint64(i), 10)}, extra...)
		bin := cfg.Bins.Vrnicd
		if prefix != nil {
			args = append(append(append([]string{}, prefix...), bin), args...)
			bin = "ip"
		}
		proc, err := launch.Start(launch.Spec{Name: "vrnicd-" + name, Bin: bin, Args: args, Dir: dir})
		require.NoError(t, err)
		p.procs[i] = proc
		t.Cleanup(func() {
			if err := proc.Stop(0, 10*time.Second); err != nil || proc.Killed() {
				t.Errorf("vrnicd %s: %v (killed %v)\n%s", name, err, proc.Killed(), proc.Tail(20))
			}
		})
		p.socks[i] = admin.SocketPath(dir, name)
		require.NoError(t, launch.WaitReady(t.Context(), proc, p.socks[i], 20*time.Second))
	}
	return p
}

// setupNetns creates the namespace with lo up and attaches the tc
// program to lo's egress; the cleanups detach it (its pins) and delete
// the namespace.
func (p *Pair) setupNetns(t testing.TB) {
	t.Helper()
	run := func(name string, args ...string) ([]byte, error) {
		return exec.Command(name, args...).CombinedOutput()
	}
	out, err := run("ip", "netns", "add", p.netns)
	require.NoError(t, err, "ip netns add %s: %s", p.netns, out)
	t.Cleanup(func() {
		if out, err := run("ip", "netns", "del", p.netns); err != nil {
			t.Errorf("ip netns del %s: %v: %s", p.netns, err, out)
		}
	})
	out, err = run("ip", "-n", p.netns, "link", "set", "lo", "up")
	require.NoError(t, err, "lo up in %s: %s", p.netns, out)
	out, err = run(p.cfg.Bins.Vrnicctl, append([]string{"tcfault", "attach"}, p.tcTarget()...)...)
	if err != nil && strings.Contains(string(out), "not supported") {
		t.Skipf("no tc BPF attachment on this kernel: %s", out)
	}
	require.NoError(t, err, "tcfault attach: %s", out)
	t.Cleanup(func() {
		if out, err := run(p.cfg.Bins.Vrnicctl, append([]string{"tcfault", "detach"}, p.tcTarget()...)...); err != nil {
			t.Errorf("tcfault detach: %v: %s", err, out)
		}
	})
}

func (p *Pair) tcTarget() []string {
	return []string{"dev=lo", "hook=egress", "netns=" + p.netns}
}

// Socket returns the control socket of daemon A (0, the perf client's)
// or B (1, the server's).
func (p *Pair) Socket(i int) string { return p.socks[i] }

// Addr returns the UDP link address (the GID) of daemon A (0) or B (1).
func (p *Pair) Addr(i int) netip.Addr { return p.cfg.Addrs[i] }

// Config returns the pair's configuration (defaults filled in).
func (p *Pair) Config() Config { return p.cfg }

// ctl runs vrnicctl with args and returns its standard output.
func (p *Pair) ctl(args ...string) ([]byte, error) {
	var out, errb bytes.Buffer
	cmd := exec.Command(p.cfg.Bins.Vrnicctl, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("vrnicctl %s: %w: %s%s", strings.Join(args, " "), err, out.Bytes(), errb.Bytes())
	}
	return out.Bytes(), nil
}

// Install installs the condition's rules (after removing any).
func (p *Pair) Install(c Condition) error {
	if err := p.ClearRules(); err != nil {
		return err
	}
	if p.cfg.Injector == Kernel {
		for _, r := range c.KernelRules(p.cfg.Seed + 100) {
			if _, err := p.ctl(append(append([]string{"tcfault", "add"}, p.tcTarget()...), r...)...); err != nil {
				return err
			}
		}
		return nil
	}
	for _, s := range p.socks {
		for _, r := range c.DaemonRules() {
			if _, err := p.ctl(append([]string{"-s", s, "fault", "add"}, r...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// ClearRules removes every rule of the run's injector.
func (p *Pair) ClearRules() error {
	if p.cfg.Injector == Kernel {
		_, err := p.ctl(append([]string{"tcfault", "clear"}, p.tcTarget()...)...)
		return err
	}
	for _, s := range p.socks {
		if _, err := p.ctl("-s", s, "fault", "clear"); err != nil {
			return err
		}
	}
	return nil
}

// RuleCount is what one rule did during a test.
type RuleCount struct {
	Name    string // daemon rules: the rule's name; tc rules: its description
	Action  string // drop, corrupt, duplicate, reorder
	Matched uint64
	Applied uint64
}

// Side is one daemon's counters over one test (differences).
type Side struct {
	DataPath admin.QPCounters
	Wire     admin.WireCounters
	// All has every counter of data_path and wire ("wire." prefixed)
	// that changed, also the ones this package does not know by name.
	All map[string]uint64
	// Rules: the daemon rules on this daemon (Injector Rules).
	Rules []RuleCount
	// SocketDrops: datagrams the kernel dropped on the daemon's UDP
	// socket (/proc/PID/net/udp); with segmentation offload one may
	// carry several frames.
	SocketDrops uint64
}

// applied sums the Applied of the rules with the given actions.
func applied(rs []RuleCount, actions ...string) uint64 {
	var n uint64
	for _, r := range rs {
		for _, a := range actions {
			if r.Action == a {
				n += r.Applied
			}
		}
	}
	return n
}

// Perf is the part of vrnic-perf's JSON result the harness uses.
type Perf struct {
	Size     int     `json:"size"`
	MTU      int     `json:"mtu"`
	Depth    int     `json:"depth"`
	Ops      uint64  `json:"ops"`
	Bytes    uint64  `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MBps     float64 `json:"mbps"`
	Verified bool    `json:"verified"`
	Latency  *struct {
		Samples uint64 `json:"samples"`
		P50     uint64 `json:"p50_ns"`
		P99     uint64 `json:"p99_ns"`
		Max     uint64 `json:"max_ns"`
	} `json:"latency"`
	Client struct {
		PacketsSent uint64 `json:"packets_sent"`
		Retransmits uint64 `json:"retransmits"`
	} `json:"client_counters"`
	Server struct {
		PacketsSent uint64 `json:"packets_sent"`
		Retransmits uint64 `json:"retransmits"`
	} `json:"server_counters"`
}

// P50 and P99 are the latency percentiles (0 for bandwidth tests).
func (p *Perf) P50() time.Duration {
	if p.Latency == nil {
		return 0
	}
	return time.Duration(p.Latency.P50)
}

func (p *Perf) P99() time.Duration {
	if p.Latency == nil {
		return 0
	}
	return time.Duration(p.Latency.P99)
}

// Result is one test under one condition.
type Result struct {
	Test     Test
	Cond     Condition
	Injector Injector
	SR       bool
	Perf     Perf
	// Client and Server: daemons A and B.
	Client, Server Side
	// Kernel: the tc rules (Injector Kernel).
	Kernel []RuleCount
	// Err: vrnic-perf failed (a completion in error, a stall, data that
	// did not verify); Output has both roles' output then.
	Err    error
	Output string
}

// Needed is the number of request packets the completed operations
// needed from the client (write_bw only: 0 for the others, whose
// clients also send ACKs).
func (r *Result) Needed() uint64 {
	if r.Test != WriteBW || r.Perf.MTU == 0 {
		return 0
	}
	per := uint64((r.Perf.Size + r.Perf.MTU - 1) / r.Perf.MTU)
	return r.Perf.Ops * per
}

// Resent is the requests the client sent more than once (write_bw:
// its packets sent less Needed); ok is false for the other tests.
func (r *Result) Resent() (n uint64, ok bool) {
	need := r.Needed()
	if need == 0 || r.Client.DataPath.PacketsSent < need {
		return 0, false
	}
	return r.Client.DataPath.PacketsSent - need, true
}

// Lost is the client's requests the injector dropped or corrupted
// (write_bw, where the client sends nothing else); ok is false where
// that cannot be told apart (other tests, the kernel injector's mix,
// which also hits the server's ACKs).
func (r *Result) Lost() (n uint64, ok bool) {
	if r.Test != WriteBW {
		return 0, false
	}
	if r.Injector == Kernel {
		if r.Cond.Mix {
			return 0, false
		}
		return applied(r.Kernel, "drop", "corrupt"), true
	}
	return applied(r.Client.Rules, "drop", "corrupt"), true
}

// ResentPerLost is Resent / Lost (write_bw with losses).
func (r *Result) ResentPerLost() (float64, bool) {
	re, ok1 := r.Resent()
	lo, ok2 := r.Lost()
	if !ok1 || !ok2 || lo == 0 {
		return 0, false
	}
	return float64(re) / float64(lo), true
}

// snapshot is what is read of a daemon before and after a test.
type snapshot struct {
	counters map[string]uint64
	drops    uint64
}

func (p *Pair) snap(i int) (snapshot, error) {
	b, err := p.ctl("-s", p.socks[i], "-json", "info")
	if err != nil {
		return snapshot{}, err
	}
	var raw struct {
		DataPath map[string]uint64 `json:"data_path"`
		Wire     map[string]uint64 `json:"wire"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return snapshot{}, fmt.Errorf("vrnicctl info: %w", err)
	}
	s := snapshot{counters: raw.DataPath}
	for k, v := range raw.Wire {
		s.counters["wire."+k] = v
	}
	s.drops, err = socketDrops(p.procs[i].Pid(), netip.AddrPortFrom(p.cfg.Addrs[i], launch.RoCEPort))
	return s, err
}

// side turns two snapshots into a Side.
func side(a, b snapshot) (Side, error) {
	s := Side{All: map[string]uint64{}, SocketDrops: b.drops - a.drops}
	dp, wire := map[string]uint64{}, map[string]uint64{}
	for k, v := range b.counters {
		d := v - a.counters[k]
		if d != 0 {
			s.All[k] = d
		}
		if w, ok := strings.CutPrefix(k, "wire."); ok {
			wire[w] = d
		} else {
			dp[k] = d
		}
	}
	for _, x := range []struct {
		m   map[string]uint64
		dst any
	}{{dp, &s.DataPath}, {wire, &s.Wire}} {
		j, _ := json.Marshal(x.m)
		if err := json.Unmarshal(j, x.dst); err != nil {
			return s, err
		}
	}
	return s, nil
}

// socketDrops sums the drops column of /proc/PID/net/udp (the process's
// namespace) over the sockets bound to addr.
func socketDrops(pid int, addr netip.AddrPort) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/udp", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	a := addr.Addr().As4()
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], addr.Port())
	var n uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 13 || fs[1] != want {
			continue
		}
		d, err := strconv.ParseUint(fs[12], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/net/udp: drops %q: %w", pid, fs[12], err)
		}
		n += d
	}
	return n, sc.Err()
}

// daemonRules reads the rules of daemon i.
func (p *Pair) daemonRules(i int) ([]RuleCount, error) {
	b, err := p.ctl("-s", p.socks[i], "-json", "fault", "list")
	if err != nil {
		return nil, err
	}
	var r admin.FaultReply
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	var rs []RuleCount
	for _, x := range r.Rules {
		rs = append(rs, RuleCount{Name: x.Name, Action: x.Action.Type, Matched: x.Matched, Applied: x.Applied})
	}
	return rs, nil
}

// kernelRules reads the tc rules.
func (p *Pair) kernelRules() ([]RuleCount, error) {
	b, err := p.ctl(append([]string{"-json", "tcfault", "list"}, p.tcTarget()...)...)
	if err != nil {
		return nil, err
	}
	var atts []struct {
		Rules []struct {
			Rule    string `json:"rule"`
			Matched uint64 `json:"matched"`
			Applied uint64 `json:"applied"`
		} `json:"rules"`
	}
	if err := json.Unmarshal(b, &atts); err != nil {
		return nil, fmt.Errorf("tcfault list: %w: %s", err, b)
	}
	if len(atts) != 1 {
		return nil, fmt.Errorf("tcfault list: %d attachments for %v", len(atts), p.tcTarget())
	}
	var rs []RuleCount
	for _, r := range atts[0].Rules {
		act, _, _ := strings.Cut(strings.TrimPrefix(r.Rule, "action="), " ")
		rs = append(rs, RuleCount{Name: r.Rule, Action: act, Matched: r.Matched, Applied: r.Applied})
	}
	return rs, nil
}

// perfArgs are the client's test options.
func (p *Pair) perfArgs(test Test) []string {
	a := []string{"-test", string(test), "-size", strconv.Itoa(test.Size()), "-json"}
	if p.cfg.Duration > 0 {
		a = append(a, "-duration", p.cfg.Duration.String())
	} else if n := p.cfg.Iters[test]; n > 0 {
		a = append(a, "-iters", strconv.Itoa(n))
	}
	if test == WriteBW && p.cfg.Depth > 0 {
		a = append(a, "-depth", strconv.Itoa(p.cfg.Depth))
	}
	if test == WriteBW {
		// The client waits for completion events instead of polling its
		// CQ: on two CPUs a polling client takes one from the two
		// daemons' workers, and the goodput then measures the
		// scheduler more than the transport (clean runs varied 2x).
		a = append(a, "-events")
	}
	if p.cfg.SR {
		a = append(a, SRArgs...)
	}
	return a
}

// clientWait bounds a vrnic-perf client's run.
func (p *Pair) clientWait() time.Duration {
	return p.cfg.Duration + 5*time.Minute
}

// Run runs test under condition c: installs its rules, runs a vrnic-perf
// server on B and a client on A, reads the counters before and after, and
// removes the rules. A failure of the harness (a daemon, vrnicctl) fails
// t; a failure of vrnic-perf is the Result's Err.
func (p *Pair) Run(t testing.TB, test Test, c Condition) *Result {
	t.Helper()
	require.NoError(t, p.Install(c))
	defer func() { require.NoError(t, p.ClearRules()) }()
	var before [2]snapshot
	for i := range p.socks {
		var err error
		before[i], err = p.snap(i)
		require.NoError(t, err)
	}

	p.runs++
	ctrl := "unix:" + filepath.Join(p.dir, fmt.Sprintf("perf-%d.sock", p.runs))
	srvArgs := []string{"server", "-dev", p.socks[server], "-listen", ctrl}
	if p.cfg.SR {
		srvArgs = append(srvArgs, SRArgs...)
	}
	srvOut, cliOut := &launch.Buffer{}, &launch.Buffer{}
	srv, err := launch.Start(launch.Spec{Name: "vrnic-perf server", Bin: p.cfg.Bins.Perf, Args: srvArgs, Stdout: srvOut, Stderr: srvOut})
	require.NoError(t, err)
	defer srv.Stop(0, 5*time.Second)
	cli, err := launch.Start(launch.Spec{Name: "vrnic-perf client", Bin: p.cfg.Bins.Perf,
		Args:   append([]string{"client", "-dev", p.socks[client], "-server", ctrl}, p.perfArgs(test)...),
		Stdout: cliOut, Stderr: cliOut})
	require.NoError(t, err)
	defer cli.Stop(0, 5*time.Second)

	r := &Result{Test: test, Cond: c, Injector: p.cfg.Injector, SR: p.cfg.SR}
	if !cli.Wait(p.clientWait()) {
		r.Err = fmt.Errorf("vrnic-perf client still running after %v", p.clientWait())
	} else if err := cli.Err(); err != nil {
		r.Err = fmt.Errorf("vrnic-perf client: %w", err)
	}
	if !srv.Wait(10 * time.Second) {
		srv.Stop(0, 5*time.Second)
		if r.Err == nil {
			r.Err = errors.New("vrnic-perf server did not exit after its client")
		}
	} else if err := srv.Err(); err != nil && r.Err == nil {
		r.Err = fmt.Errorf("vrnic-perf server: %w", err)
	}
	if r.Err == nil {
		var rep struct{ Results []Perf }
		if err := json.Unmarshal([]byte(cliOut.String()), &rep); err != nil || len(rep.Results) != 1 {
			r.Err = fmt.Errorf("vrnic-perf client output (%v, %d results)", err, len(rep.Results))
		} else {
			r.Perf = rep.Results[0]
		}
	}
	if r.Err != nil {
		r.Output = "client:\n" + cliOut.String() + "\nserver:\n" + srvOut.String()
	}

	for i, sd := range []*Side{&r.Client, &r.Server} {
		after, err := p.snap(i)
		require.NoError(t, err)
		*sd, err = side(before[i], after)
		require.NoError(t, err)
		if p.cfg.Injector == Rules {
			sd.Rules, err = p.daemonRules(i)
			require.NoError(t, err)
		}
	}
	if p.cfg.Injector == Kernel {
		r.Kernel, err = p.kernelRules()
		require.NoError(t, err)
	}
	return r
}

// RunAll runs every test of Tests under each condition on the pair,
// test by test (a test's conditions one after the other, so that its
// clean run, the baseline of its ratios, is measured close in time to
// the others: the load of a shared machine drifts).
func (p *Pair) RunAll(t testing.TB, conds []Condition) []*Result {
	t.Helper()
	var rs []*Result
	for _, test := range Tests {
		for _, c := range conds {
			rs = append(rs, p.Run(t, test, c))
		}
	}
	return rs
}

// Summary is one line about a result, for logs.
func (r *Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s, %s, %s:", r.Cond.Key, r.Test, r.Injector, map[bool]string{false: "go-back-N", true: "selective repeat"}[r.SR])
	if r.Err != nil {
		fmt.Fprintf(&b, " FAILED: %v", r.Err)
		return b.String()
	}
	if r.Perf.Latency != nil {
		fmt.Fprintf(&b, " %d ops, p50 %v, p99 %v;", r.Perf.Ops, r.Perf.P50(), r.Perf.P99())
	} else {
		fmt.Fprintf(&b, " %.1f MB/s, %d ops;", r.Perf.MBps, r.Perf.Ops)
	}
	if n, ok := r.Resent(); ok {
		fmt.Fprintf(&b, " requests needed %d, sent %d, resent %d;", r.Needed(), r.Client.DataPath.PacketsSent, n)
	}
	if n, ok := r.Lost(); ok {
		fmt.Fprintf(&b, " lost to the injector %d;", n)
	}
	for _, s := range []struct {
		name string
		s    *Side
	}{{"A", &r.Client}, {"B", &r.Server}} {
		fmt.Fprintf(&b, " %s: %s", s.name, counterList(s.s.All))
		if s.s.SocketDrops > 0 {
			fmt.Fprintf(&b, " socket_drops=%d", s.s.SocketDrops)
		}
		for _, rc := range s.s.Rules {
			fmt.Fprintf(&b, " rule %s %d/%d", rc.Name, rc.Applied, rc.Matched)
		}
		b.WriteString(";")
	}
	for _, rc := range r.Kernel {
		fmt.Fprintf(&b, " tc %q %d/%d", rc.Name, rc.Applied, rc.Matched)
	}
	return b.String()
}
