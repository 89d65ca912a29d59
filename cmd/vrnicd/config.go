package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/cc"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/faults"
)

// Config is vrnicd's configuration: the JSON config file (strict: unknown
// fields are an error) overridden by command-line flags given explicitly.
type Config struct {
	// Name is the device name; it names the socket (<name>.sock) and the
	// lock file (<name>.lock) in the runtime directory.
	Name string `json:"name"`
	// RuntimeDir holds sockets and lock files. Default: /run/vrnic as root,
	// $XDG_RUNTIME_DIR/vrnic otherwise, or $TMPDIR/vrnic-<uid> without
	// XDG_RUNTIME_DIR.
	RuntimeDir string `json:"runtime_dir,omitempty"`
	// Socket is the control socket path (default <runtime_dir>/<name>.sock).
	Socket string `json:"socket,omitempty"`
	// Link configures the port.
	Link LinkConfig `json:"link"`
	// Workers is the number of engine workers (default: number of CPUs).
	Workers int `json:"workers,omitempty"`
	// PollSpin is how long the doorbell poller keeps polling after the
	// last doorbell or completion it saw, before it asks clients to kick
	// (a Go duration; default 1ms). While it polls, posting costs a
	// client no system call; a longer spin keeps it so across longer
	// pauses of the clients, for the CPU it spins on.
	PollSpin string `json:"poll_spin,omitempty"`
	// LogLevel: debug, info, warn or error.
	LogLevel string `json:"log_level,omitempty"`
	// Limits bounds clients and the device; zero fields take defaults.
	Limits device.Limits `json:"limits"`
	// MaxRdAtomic is how many RDMA READs and atomics a QP may have
	// outstanding, as requester and as responder: the device's
	// max_qp_rd_atom and max_qp_init_rd_atom, and the most MODIFY_QP
	// takes for max_rd_atomic and max_dest_rd_atomic (1..255; default
	// 16). Soft-RoCE offers 128; rdma_cm programs such as perftest
	// offer their device's value, and the CM clamps what a peer offers
	// to this one.
	MaxRdAtomic int `json:"max_rd_atomic,omitempty"`
	// Nice is the scheduling priority (nice value, -20..19) every thread
	// of the daemon runs at; 0 leaves the one it was started with. An
	// emulated NIC competes for the CPU with its clients, which often
	// busy-poll: a negative value gives the workers the CPU first when a
	// frame or a doorbell wakes them (on a loaded host, far shorter
	// hops), but an idle worker's polling then also keeps it from the
	// clients (on a quiet host, longer hops and fewer messages: README).
	// Below the starting value it needs CAP_SYS_NICE or RLIMIT_NICE (a
	// systemd unit's Nice= needs neither).
	Nice int `json:"nice,omitempty"`
	// OperatorGroup names a group whose members may use the operator
	// commands (vrnicctl) besides root and the daemon's own uid; empty:
	// none. An unknown group is an error at start.
	OperatorGroup string `json:"operator_group,omitempty"`
	// MetricsAddr is where Prometheus metrics are served over HTTP
	// (host:port, path /metrics); empty: not served.
	MetricsAddr string `json:"metrics_addr,omitempty"`
	// Faults are the fault rules installed at start and the seed of
	// every fault decision (package faults; vrnicctl fault changes them
	// at run time). -faults FILE replaces them with a scenario file's,
	// -fault-seed sets the seed.
	Faults *admin.FaultScenario `json:"faults,omitempty"`
	// FaultsFile is the scenario file of -faults (flag only).
	FaultsFile string `json:"-"`
	// CC configures RoCE v2 congestion control (-cc, -cc-param).
	CC CCConfig `json:"congestion_control,omitzero"`
	// ECE says whether the device negotiates vrnic's transport options
	// (selective repeat, the adaptive retransmission timer) with peers
	// that are vrnic devices too (-ece; default true): its CM offers them
	// in REQs and takes them from REQs, and MODIFY_QP sets them. false:
	// it offers and takes none, and its REQs and REPs are those of a
	// device without ECE.
	ECE *bool `json:"ece,omitempty"`
	// CPUProfile, when set (flag only), is a file the daemon writes a CPU
	// profile of its whole run to.
	CPUProfile string `json:"-"`
	// Trace, when set (flag only), is a file the daemon writes a Go
	// execution trace of the run to (go tool trace): scheduling and
	// wake-up latencies of the workers, pollers and waiters.
	Trace string `json:"-"`
}

// CCConfig configures RoCE v2 congestion control (kernel-notes/congestion.md).
type CCConfig struct {
	// Mode is "off" (the default) or "dcqcn". Off, the device's packets
	// are exactly those of a NIC without congestion control (IP ECN
	// field 0), it sends no CNP and ignores those it receives. DCQCN:
	// its packets are ECN-capable (ECT(0)), it answers CE-marked ones
	// with CNPs and paces each QP at the rate DCQCN gives it from the
	// CNPs it receives.
	Mode string `json:"mode,omitempty"`
	// Params change DCQCN parameters from the mlx5 defaults:
	// "name=value" with the mlx5 names (rpg_time_reset=300, ...), rates
	// in Mb/s, times in µs; see package cc.
	Params []string `json:"params,omitempty"`
}

// params returns the DCQCN parameters, nil when congestion control is
// off.
func (c *CCConfig) params() (*cc.Params, error) {
	switch c.Mode {
	case "", "off":
		if len(c.Params) > 0 {
			return nil, fmt.Errorf("cc-param given with congestion control off (-cc dcqcn turns it on)")
		}
		return nil, nil
	case "dcqcn":
	default:
		return nil, fmt.Errorf("congestion control %q: want off or dcqcn", c.Mode)
	}
	p := cc.DefaultParams()
	for _, kv := range c.Params {
		if err := p.Set(kv); err != nil {
			return nil, err
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// LinkConfig selects the link and its addresses.
type LinkConfig struct {
	// Type: "udp" (default, unprivileged), "mem" (in-process tests) or
	// "tap" (a multi-queue TAP device; root).
	Type string `json:"type"`
	// Local is the UDP link's local ip:port (default 127.0.0.1:4791); its
	// IP is the device's GID 0.
	Local string `json:"local,omitempty"`
	// Peers are the ip:port of the other devices on the UDP link.
	Peers []string `json:"peers,omitempty"`
	// MTU is the largest path MTU in bytes (256..4096, default 4096).
	// The port's active MTU is the smaller of it and what the link
	// carries (see mtu.go): a 1500-byte interface gives 1024.
	MTU int `json:"mtu,omitempty"`
	// SegmentIPv4 says whether the IPv4 UDP link sends a message's
	// frames as one UDP_SEGMENT datagram: true on any address (faster;
	// but a segment after the first leaves with IPv4 identification k,
	// which its ICRC does not cover: only vrnic peers accept it off
	// loopback), false never, absent on a loopback address only, where
	// no segment is ever cut where it could be read. IPv6 links segment
	// anyway.
	SegmentIPv4 *bool `json:"segment_ipv4,omitempty"`
	// TAP configures the TAP link.
	TAP TAPConfig `json:"tap,omitempty"`
}

// TAPConfig configures the TAP link (-link tap).
type TAPConfig struct {
	// Name is the interface name (default: the device name when it fits
	// an interface name, else the kernel's tapN).
	Name string `json:"name,omitempty"`
	// Addrs are the NIC's addresses with their on-link prefixes
	// ("10.77.0.1/24", "fd00::1/64"), GID 0 first. Peers on one of
	// these prefixes are reached directly (their MAC by ARP/ND); others
	// through the gateway of their address family (Gateways).
	Addrs []string `json:"addrs,omitempty"`
	// Gateways are the NIC's default routers, at most one IPv4 and one
	// IPv6 address, each on one of the NIC's prefixes ("10.77.0.254").
	// A peer off every prefix is reached through the gateway of its
	// family: frames go to the gateway's MAC (resolved by ARP/ND) with
	// the peer's IP address, as a host's default route sends them.
	// Without one, such a peer is unreachable (EHOSTUNREACH at RTR).
	Gateways []string `json:"gateways,omitempty"`
	// MAC is the NIC's Ethernet address (default: derived from the
	// device name, locally administered).
	MAC string `json:"mac,omitempty"`
	// NetNS names a network namespace (/run/netns/NAME) to create the
	// interface in; default: the daemon's.
	NetNS string `json:"netns,omitempty"`
	// VerifySteering runs the steering program on test frames at start
	// and refuses to start if it disagrees with the engine's QP owners.
	VerifySteering bool `json:"verify_steering,omitempty"`
	// MTU is the interface's MTU in bytes (1280..4200; default 4200,
	// which carries path MTU 4096). Set it to the network's (1500 for
	// Ethernet peers such as Soft-RoCE hosts): the port's active MTU
	// follows it (1500: path MTU 1024).
	MTU int `json:"mtu,omitempty"`
}

// loadConfigFile decodes a config file strictly.
func loadConfigFile(path string, c *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: trailing data after the JSON object", path)
	}
	return nil
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// parseConfig builds the configuration from args (without the program
// name).
func parseConfig(args []string, stderr io.Writer) (*Config, error) {
	fs := flag.NewFlagSet("vrnicd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfgFile  = fs.String("config", "", "JSON config file (unknown fields are an error); flags override it")
		name     = fs.String("name", "vrnic0", "device name (socket <name>.sock in the runtime dir)")
		rundir   = fs.String("runtime-dir", "", "directory for sockets and lock files (default: /run/vrnic as root, $XDG_RUNTIME_DIR/vrnic, or $TMPDIR/vrnic-<uid>)")
		socket   = fs.String("socket", "", "control socket path (default <runtime-dir>/<name>.sock)")
		link     = fs.String("link", "udp", "link type: udp, mem or tap")
		local    = fs.String("udp-local", "127.0.0.1:4791", "UDP link: local ip:port (its IP is GID 0)")
		mtu      = fs.Int("mtu", 4096, "largest path MTU in bytes")
		seg4     optBool
		workers  = fs.Int("workers", 0, "engine workers (default: number of CPUs)")
		pollSpin = fs.String("poll-spin", "", "how long the doorbell poller keeps polling after the last traffic before clients must kick it, e.g. 1ms (default 200µs)")
		level    = fs.String("log-level", "info", "log level: debug, info, warn, error")
		peers    stringList
		tapName  = fs.String("tap-name", "", "TAP link: interface name (default: the device name)")
		tapMAC   = fs.String("tap-mac", "", "TAP link: the NIC's MAC address (default: derived from the device name)")
		tapNS    = fs.String("tap-netns", "", "TAP link: network namespace (ip netns name) to create the interface in")
		tapVer   = fs.Bool("tap-verify-steering", false, "TAP link: check the eBPF steering program against the engine's QP owners at start")
		tapMTU   = fs.Int("tap-mtu", 0, "TAP link: the interface's MTU, 1280..4200 (default 4200; 1500 gives path MTU 1024)")
		tapAddr  stringList
		tapGW    stringList
		cpuProf  = fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
		traceTo  = fs.String("trace", "", "write a Go execution trace of the run to this file")
		metrics  = fs.String("metrics-addr", "", "serve Prometheus metrics over HTTP on this host:port (path /metrics); default: none")
		opGroup  = fs.String("operator-group", "", "group whose members may use the operator commands (vrnicctl) besides root and the daemon's uid")
		fltFile  = fs.String("faults", "", "fault scenario file (JSON, or YAML by its .yaml/.yml name): the seed and the fault rules installed at start")
		fltSeed  = fs.Uint64("fault-seed", 0, "seed of every fault decision (default: the scenario's, else drawn from the clock; logged)")
		nice     = fs.Int("nice", 0, "scheduling priority of the daemon's threads, -20..19 (0: as started; below that needs CAP_SYS_NICE)")
		ccMode   = fs.String("cc", "off", "RoCE v2 congestion control: off, or dcqcn (ECT(0) on the packets, CNPs for CE-marked ones, DCQCN rate control and pacing per QP)")
		rdAtom   = fs.Int("max-rd-atomic", 0, "outstanding RDMA READs and atomics per QP, each way: max_qp_rd_atom and max_qp_init_rd_atom, 1..255 (default 16; Soft-RoCE has 128)")
		ece      = fs.Bool("ece", true, "negotiate vrnic's transport options (selective repeat, adaptive retransmission timer) with vrnic peers through ECE; false: offer and accept none")
	)
	fs.Var(&tapAddr, "tap-addr", "TAP link: the NIC's address/prefix, e.g. 10.77.0.1/24 (repeatable; the first is GID 0)")
	fs.Var(&tapGW, "tap-gateway", "TAP link: the default router for peers off the -tap-addr prefixes, e.g. 10.77.0.254 (one per address family)")
	fs.StringVar(local, "local", "127.0.0.1:4791", "same as -udp-local")
	fs.Var(&seg4, "udp-segment-ipv4", "UDP link on IPv4: send a message's frames as one UDP_SEGMENT datagram: true (faster; off loopback only vrnic peers accept the ICRC of segments after the first), false, or auto (the default): on a loopback address only")
	var ccParams stringList
	fs.Var(&ccParams, "cc-param", "a DCQCN parameter, name=value with the mlx5 names (rates in Mb/s, times in µs), e.g. rpg_time_reset=300 (repeatable; -cc dcqcn)")
	fs.Var(&peers, "udp-peer", "UDP link: a peer's ip:port (repeatable; peers are also found from the QPs' destination GIDs)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	tapCfg := TAPConfig{Name: *tapName, Addrs: tapAddr, Gateways: tapGW, MAC: *tapMAC, NetNS: *tapNS, VerifySteering: *tapVer, MTU: *tapMTU}
	c := &Config{Name: *name, Link: LinkConfig{Type: *link, Local: *local, MTU: *mtu, SegmentIPv4: seg4.v, TAP: tapCfg}, LogLevel: *level, Workers: *workers, PollSpin: *pollSpin,
		OperatorGroup: *opGroup, MaxRdAtomic: *rdAtom, MetricsAddr: *metrics, Nice: *nice, CC: CCConfig{Mode: *ccMode, Params: ccParams},
		ECE: ece}
	if *cfgFile != "" {
		fileCfg := Config{}
		if err := loadConfigFile(*cfgFile, &fileCfg); err != nil {
			return nil, err
		}
		// Start from the file; fill what it leaves empty with flag
		// defaults; then apply the flags given explicitly.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		merged := fileCfg
		pick := func(flagName string, dst *string, v string) {
			if set[flagName] || *dst == "" {
				*dst = v
			}
		}
		pick("name", &merged.Name, *name)
		pick("link", &merged.Link.Type, *link)
		if set["local"] {
			set["udp-local"] = true
		}
		pick("udp-local", &merged.Link.Local, *local)
		pick("log-level", &merged.LogLevel, *level)
		if set["runtime-dir"] {
			merged.RuntimeDir = *rundir
		}
		if set["socket"] {
			merged.Socket = *socket
		}
		if set["mtu"] || merged.Link.MTU == 0 {
			merged.Link.MTU = *mtu
		}
		if set["workers"] {
			merged.Workers = *workers
		}
		if set["poll-spin"] {
			merged.PollSpin = *pollSpin
		}
		if set["udp-peer"] {
			merged.Link.Peers = peers
		}
		if set["udp-segment-ipv4"] {
			merged.Link.SegmentIPv4 = seg4.v
		}
		if set["tap-name"] {
			merged.Link.TAP.Name = *tapName
		}
		if set["tap-addr"] {
			merged.Link.TAP.Addrs = tapAddr
		}
		if set["tap-gateway"] {
			merged.Link.TAP.Gateways = tapGW
		}
		if set["tap-mac"] {
			merged.Link.TAP.MAC = *tapMAC
		}
		if set["tap-netns"] {
			merged.Link.TAP.NetNS = *tapNS
		}
		if set["tap-verify-steering"] {
			merged.Link.TAP.VerifySteering = *tapVer
		}
		if set["tap-mtu"] {
			merged.Link.TAP.MTU = *tapMTU
		}
		if set["operator-group"] {
			merged.OperatorGroup = *opGroup
		}
		if set["max-rd-atomic"] {
			merged.MaxRdAtomic = *rdAtom
		}
		if set["nice"] {
			merged.Nice = *nice
		}
		if set["metrics-addr"] {
			merged.MetricsAddr = *metrics
		}
		if set["cc"] {
			merged.CC.Mode = *ccMode
			if *ccMode == "off" && !set["cc-param"] {
				merged.CC.Params = nil // -cc off over a file: its parameters go too
			}
		}
		if set["cc-param"] {
			merged.CC.Params = ccParams
		}
		if set["ece"] {
			merged.ECE = ece
		}
		c = &merged
	} else {
		c.RuntimeDir, c.Socket, c.Link.Peers = *rundir, *socket, peers
	}
	c.CPUProfile = *cpuProf
	c.Trace = *traceTo
	if *fltFile != "" {
		sc, err := faults.LoadScenario(*fltFile)
		if err != nil {
			return nil, err
		}
		c.Faults, c.FaultsFile = &sc, *fltFile
	}
	if *fltSeed != 0 {
		if c.Faults == nil {
			c.Faults = &admin.FaultScenario{}
		}
		c.Faults.Seed = *fltSeed
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.Name == "" || strings.ContainsAny(c.Name, "/\x00") || len(c.Name) > 64 {
		return fmt.Errorf("invalid device name %q", c.Name)
	}
	switch c.Link.Type {
	case "udp", "mem":
	case "tap":
		if err := c.Link.TAP.validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown link type %q (want udp, mem or tap)", c.Link.Type)
	}
	if c.Link.Type == "udp" {
		if _, err := netip.ParseAddrPort(c.Link.Local); err != nil {
			return fmt.Errorf("udp-local %q: %w", c.Link.Local, err)
		}
		for _, p := range c.Link.Peers {
			if _, err := netip.ParseAddrPort(p); err != nil {
				return fmt.Errorf("udp-peer %q: %w", p, err)
			}
		}
	}
	if _, ok := mtuCode(c.Link.MTU); !ok {
		return fmt.Errorf("mtu %d: want 256, 512, 1024, 2048 or 4096", c.Link.MTU)
	}
	if c.Nice < -20 || c.Nice > 19 {
		return fmt.Errorf("nice %d: want -20..19 (0: as started)", c.Nice)
	}
	if c.MaxRdAtomic < 0 || c.MaxRdAtomic > 255 {
		return fmt.Errorf("max_rd_atomic %d: want 1..255 (0: the default, 16)", c.MaxRdAtomic)
	}
	if c.Workers < 0 || c.Workers > 1024 {
		return fmt.Errorf("workers %d out of range", c.Workers)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if _, err := c.CC.params(); err != nil {
		return err
	}
	if _, err := c.pollSpin(); err != nil {
		return err
	}
	if c.Faults != nil {
		if err := faults.CheckRules(c.Faults.Rules); err != nil {
			return fmt.Errorf("faults: %w", err)
		}
	}
	for _, v := range []int{c.Limits.PerClient.Contexts, c.Limits.PerClient.HostMem, c.Limits.PerClient.PD, c.Limits.PerClient.MR,
		c.Limits.PerClient.CQ, c.Limits.PerClient.QP, c.Limits.PerClient.SRQ, c.Limits.PerClient.AH, c.Limits.PerClient.MW,
		c.Limits.PerDevice.Contexts, c.Limits.PerDevice.HostMem, c.Limits.PerDevice.PD, c.Limits.PerDevice.MR,
		c.Limits.PerDevice.CQ, c.Limits.PerDevice.QP, c.Limits.PerDevice.SRQ, c.Limits.PerDevice.AH, c.Limits.PerDevice.MW,
		c.Limits.PerUID.Contexts, c.Limits.PerUID.Connections, c.Limits.PerUID.FDs} {
		if v < 0 {
			return errors.New("limits must not be negative")
		}
	}
	return nil
}

// operatorGroup resolves the configured operator group to its gid (nil
// when none is configured).
func (c *Config) operatorGroup() (*device.OperatorGroup, error) {
	if c.OperatorGroup == "" {
		return nil, nil
	}
	g, err := user.LookupGroup(c.OperatorGroup)
	if err != nil {
		return nil, fmt.Errorf("operator group %q: %w", c.OperatorGroup, err)
	}
	gid, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("operator group %q: gid %q: %w", c.OperatorGroup, g.Gid, err)
	}
	return &device.OperatorGroup{Name: g.Name, GID: uint32(gid)}, nil
}

func mtuCode(bytes int) (uint32, bool) {
	for code := uint32(1); code <= 5; code++ {
		if 128<<code == bytes {
			return code, true
		}
	}
	return 0, false
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// pollSpin is PollSpin parsed (0: the data plane's default).
func (c *Config) pollSpin() (time.Duration, error) {
	if c.PollSpin == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(c.PollSpin)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("poll-spin %q: want a positive duration such as 1ms", c.PollSpin)
	}
	return d, nil
}

// optBool is a boolean flag that may also be left to its default (auto):
// -f and -f=true set it, -f=false clears it, -f=auto (or not giving it)
// leaves v nil.
type optBool struct{ v *bool }

func (o *optBool) String() string {
	if o == nil || o.v == nil {
		return "auto"
	}
	return strconv.FormatBool(*o.v)
}

func (o *optBool) Set(s string) error {
	if s == "auto" {
		o.v = nil
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false or auto: %q", s)
	}
	o.v = &b
	return nil
}

// IsBoolFlag lets the flag be given bare (-f means -f=true).
func (o *optBool) IsBoolFlag() bool { return true }

// eceOptions returns the ECE options the device offers and takes:
// every one unless the configuration switched ECE off.
func (c *Config) eceOptions() uint32 {
	if c.ECE != nil && !*c.ECE {
		return 0
	}
	return abi.ECEOptions
}
