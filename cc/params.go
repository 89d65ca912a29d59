// Package cc is vrnic's RoCE v2 congestion control: the DCQCN reaction
// point (Zhu et al., "Congestion Control for Large-Scale RDMA
// Deployments", SIGCOMM 2015), the notification point's CNP rate limit,
// and the token-bucket pacer the reaction point drives. Everything here
// is pure: state machines over a caller's nanosecond clock, no timers, no
// goroutines, no allocation, so the engine runs them on its workers (its
// per-worker timer heap fires the deadlines they return) and the tests
// drive them with a fake clock.
//
// The parts, as the IBTA RoCE v2 annex (A17.9) names them:
//
//   - the congestion point (a switch or a qdisc) marks ECN Congestion
//     Experienced on ECT packets instead of dropping them;
//   - the notification point (the receiving NIC) answers a CE-marked
//     packet with a Congestion Notification Packet (BTH opcode 0x81) to
//     the sending QP, at most one per QP every MinTimeBetweenCNPs (NP);
//   - the reaction point (the sending NIC) cuts the QP's rate on a CNP
//     and recovers it on timers and byte counters (RP, DCQCN), and a
//     pacer (Pacer) holds the QP to that rate.
//
// The parameters (Params) are those of the Linux mlx5 driver and NVIDIA
// firmware, with their names and units; kernel-notes/congestion.md gives
// their sources.
package cc

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrParam: a parameter name or value is not valid.
var ErrParam = errors.New("cc: invalid parameter")

// Params are the DCQCN parameters. Names in the comments are the mlx5
// ones (sysfs /sys/class/net/<if>/ecn/roce_rp|roce_np/..., mlxconfig);
// rates are in bits per second, times in nanoseconds, alpha and g in
// 1/1024.
type Params struct {
	// LineRate is the rate of a QP that is not limited and the rate set
	// on the first CNP when RateOnFirstCNP is 0: the port speed a NIC
	// would have. vrnic has none, so it is a parameter (default 10 Gb/s).
	LineRate uint64
	// RateOnFirstCNP (rate_to_set_on_first_cnp): current and target rate
	// on a QP's first CNP; 0 means LineRate. Default 0.
	RateOnFirstCNP uint64
	// MinRate (rpg_min_rate): the lowest rate a QP is cut to. Default
	// 1 Mb/s.
	MinRate uint64
	// AIRate (rpg_ai_rate): the target's step in additive increase.
	// Default 5 Mb/s.
	AIRate uint64
	// HAIRate (rpg_hai_rate): the target's step in hyper increase.
	// Default 50 Mb/s.
	HAIRate uint64
	// TimeReset (rpg_time_reset): the rate-increase timer's period.
	// Default 300 µs.
	TimeReset time.Duration
	// ByteReset (rpg_byte_reset): bytes sent per byte-counter expiry.
	// Default 32767.
	ByteReset uint64
	// Threshold (rpg_threshold): expiries of a counter before the
	// increase leaves fast recovery (F of the paper). Default 1.
	Threshold uint32
	// GD (rpg_gd): the cut is rate × alpha / 2^GD with alpha in 1/1024,
	// so 11 is the paper's rate × α/2. Default 11.
	GD uint32
	// MinDecFac (rpg_min_dec_fac), percent: one cut leaves at least this
	// share of the rate. Default 50.
	MinDecFac uint32
	// AlphaG (dce_tcp_g), 1/1024: per alpha period alpha becomes
	// alpha×g/1024, plus (1024-g)/1024 when a CNP came. Default 1019
	// (the paper's g = 1/256, about).
	AlphaG uint32
	// AlphaPeriod (dce_tcp_rtt): the alpha update period. Default 1 µs.
	AlphaPeriod time.Duration
	// InitialAlpha (initial_alpha_value), 1/1024: alpha on a QP's first
	// CNP. Default 1023.
	InitialAlpha uint32
	// MinTimeBetweenCNPs (min_time_between_cnps): the notification
	// point sends a QP at most one CNP per this time. Default 4 µs.
	MinTimeBetweenCNPs time.Duration
	// PaceBurst is the pacer's bucket depth in bytes: what a limited QP
	// may send at once (at least one frame). Default 16 KiB.
	PaceBurst uint64
	// LinkRate, when not 0, limits what the device's QPs send together
	// to this rate, as a port's speed does: each engine worker (link
	// queue) gets LinkRate / workers. Default 0: no limit beyond the
	// QPs' own.
	LinkRate uint64
}

// Mbps is a rate of n megabits per second in bits per second.
func Mbps(n uint64) uint64 { return n * 1_000_000 }

// DefaultParams returns the mlx5 defaults (kernel-notes/congestion.md)
// with a line rate of 10 Gb/s and a 16 KiB pacing burst.
func DefaultParams() Params {
	return Params{
		LineRate:           Mbps(10_000),
		RateOnFirstCNP:     0,
		MinRate:            Mbps(1),
		AIRate:             Mbps(5),
		HAIRate:            Mbps(50),
		TimeReset:          300 * time.Microsecond,
		ByteReset:          32767,
		Threshold:          1,
		GD:                 11,
		MinDecFac:          50,
		AlphaG:             1019,
		AlphaPeriod:        time.Microsecond,
		InitialAlpha:       1023,
		MinTimeBetweenCNPs: 4 * time.Microsecond,
		PaceBurst:          16 << 10,
	}
}

// Validate checks the parameters.
func (p *Params) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrParam, fmt.Sprintf(f, a...)) }
	switch {
	case p.LineRate < Mbps(1) || p.LineRate > Mbps(10_000_000):
		return bad("line_rate %d b/s: want 1 Mb/s .. 10 Tb/s", p.LineRate)
	case p.RateOnFirstCNP > p.LineRate:
		return bad("rate_to_set_on_first_cnp %d above the line rate", p.RateOnFirstCNP)
	case p.MinRate == 0 || p.MinRate > p.LineRate:
		return bad("rpg_min_rate %d: want 1 .. line rate", p.MinRate)
	case p.AIRate > p.LineRate || p.HAIRate > p.LineRate:
		return bad("rpg_ai_rate and rpg_hai_rate must not exceed the line rate")
	case p.TimeReset <= 0 || p.TimeReset > time.Second:
		return bad("rpg_time_reset %v: want (0, 1s]", p.TimeReset)
	case p.ByteReset == 0 || p.ByteReset > 1<<32:
		return bad("rpg_byte_reset %d: want 1 .. 2^32", p.ByteReset)
	case p.Threshold == 0 || p.Threshold > 31:
		return bad("rpg_threshold %d: want 1..31", p.Threshold)
	case p.GD < 10 || p.GD > 20:
		return bad("rpg_gd %d: want 10..20", p.GD)
	case p.MinDecFac > 100:
		return bad("rpg_min_dec_fac %d: want 0..100", p.MinDecFac)
	case p.AlphaG == 0 || p.AlphaG > 1023:
		return bad("dce_tcp_g %d: want 1..1023", p.AlphaG)
	case p.AlphaPeriod <= 0 || p.AlphaPeriod > time.Second:
		return bad("dce_tcp_rtt %v: want (0, 1s]", p.AlphaPeriod)
	case p.InitialAlpha == 0 || p.InitialAlpha > 1023:
		return bad("initial_alpha_value %d: want 1..1023", p.InitialAlpha)
	case p.MinTimeBetweenCNPs < 0 || p.MinTimeBetweenCNPs > time.Second:
		return bad("min_time_between_cnps %v: want [0, 1s]", p.MinTimeBetweenCNPs)
	case p.PaceBurst < 4096 || p.PaceBurst > 64<<20:
		return bad("pace_burst %d: want 4096 .. 64 MiB", p.PaceBurst)
	case p.LinkRate != 0 && (p.LinkRate < Mbps(1) || p.LinkRate > Mbps(10_000_000)):
		return bad("link_rate %d b/s: want 0 (none) or 1 Mb/s .. 10 Tb/s", p.LinkRate)
	}
	return nil
}

// param is one entry of the table Set and String use.
type param struct {
	name string
	kind byte // 'r' rate (Mb/s), 't' time (µs), 'n' number
	u64  func(*Params) *uint64
	u32  func(*Params) *uint32
	dur  func(*Params) *time.Duration
}

// params is the table of parameters by their mlx5 names (and three of
// vrnic's: line_rate, pace_burst, link_rate). Rates are given in Mb/s,
// times in µs.
var params = []param{
	{name: "line_rate", kind: 'r', u64: func(p *Params) *uint64 { return &p.LineRate }},
	{name: "rate_to_set_on_first_cnp", kind: 'r', u64: func(p *Params) *uint64 { return &p.RateOnFirstCNP }},
	{name: "rpg_min_rate", kind: 'r', u64: func(p *Params) *uint64 { return &p.MinRate }},
	{name: "rpg_ai_rate", kind: 'r', u64: func(p *Params) *uint64 { return &p.AIRate }},
	{name: "rpg_hai_rate", kind: 'r', u64: func(p *Params) *uint64 { return &p.HAIRate }},
	{name: "rpg_time_reset", kind: 't', dur: func(p *Params) *time.Duration { return &p.TimeReset }},
	{name: "rpg_byte_reset", kind: 'n', u64: func(p *Params) *uint64 { return &p.ByteReset }},
	{name: "rpg_threshold", kind: 'n', u32: func(p *Params) *uint32 { return &p.Threshold }},
	{name: "rpg_gd", kind: 'n', u32: func(p *Params) *uint32 { return &p.GD }},
	{name: "rpg_min_dec_fac", kind: 'n', u32: func(p *Params) *uint32 { return &p.MinDecFac }},
	{name: "dce_tcp_g", kind: 'n', u32: func(p *Params) *uint32 { return &p.AlphaG }},
	{name: "dce_tcp_rtt", kind: 't', dur: func(p *Params) *time.Duration { return &p.AlphaPeriod }},
	{name: "initial_alpha_value", kind: 'n', u32: func(p *Params) *uint32 { return &p.InitialAlpha }},
	{name: "min_time_between_cnps", kind: 't', dur: func(p *Params) *time.Duration { return &p.MinTimeBetweenCNPs }},
	{name: "pace_burst", kind: 'n', u64: func(p *Params) *uint64 { return &p.PaceBurst }},
	{name: "link_rate", kind: 'r', u64: func(p *Params) *uint64 { return &p.LinkRate }},
}

// Names returns the parameter names Set takes, in table order.
func Names() []string {
	out := make([]string, len(params))
	for i, e := range params {
		out[i] = e.name
	}
	return out
}

// Set sets one parameter from "name=value": rates in Mb/s, times in µs
// (both may have a fraction), the others plain integers. It does not
// validate the whole (Validate does).
func (p *Params) Set(kv string) error {
	name, val, ok := strings.Cut(kv, "=")
	if !ok {
		return fmt.Errorf("%w: %q: want name=value", ErrParam, kv)
	}
	name, val = strings.TrimSpace(name), strings.TrimSpace(val)
	for _, e := range params {
		if e.name != name {
			continue
		}
		switch e.kind {
		case 'r', 't':
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f < 0 || f > 1e10 {
				return fmt.Errorf("%w: %s=%q", ErrParam, name, val)
			}
			if e.kind == 'r' {
				*e.u64(p) = uint64(f * 1e6)
			} else {
				*e.dur(p) = time.Duration(f * 1e3)
			}
		default:
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: %s=%q", ErrParam, name, val)
			}
			if e.u32 != nil {
				if n > 1<<32-1 {
					return fmt.Errorf("%w: %s=%q", ErrParam, name, val)
				}
				*e.u32(p) = uint32(n)
			} else {
				*e.u64(p) = n
			}
		}
		return nil
	}
	return fmt.Errorf("%w: unknown parameter %q (known: %s)", ErrParam, name, strings.Join(Names(), ", "))
}

// String lists every parameter as name=value in Set's units.
func (p *Params) String() string {
	var b strings.Builder
	for i, e := range params {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.name)
		b.WriteByte('=')
		switch e.kind {
		case 'r':
			b.WriteString(strconv.FormatFloat(float64(*e.u64(p))/1e6, 'g', -1, 64))
		case 't':
			b.WriteString(strconv.FormatFloat(float64(*e.dur(p))/1e3, 'g', -1, 64))
		default:
			if e.u32 != nil {
				b.WriteString(strconv.FormatUint(uint64(*e.u32(p)), 10))
			} else {
				b.WriteString(strconv.FormatUint(*e.u64(p), 10))
			}
		}
	}
	return b.String()
}
