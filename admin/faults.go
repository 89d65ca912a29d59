package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vrnic/vrnic/abi"
)

// FaultCmd manages the fault rules of a live daemon (FaultRequest; reply
// FaultReply): add, list, set, del, clear. Operator only, like CaptureCmd.
// The rule model and what each field means: package faults (faults/doc.go).
const FaultCmd = abi.CmdAdminBase + 12

// Fault operations (FaultRequest.Op).
const (
	FaultAdd   = "add"   // add Rules (IDs assigned when 0); the reply lists the added rules
	FaultList  = "list"  // list the rules with their counters from Start on
	FaultSet   = "set"   // replace the rule of Rules[0].ID, keeping its counters
	FaultDel   = "del"   // remove the rules of IDs
	FaultClear = "clear" // remove every rule
)

// MaxFaultRules bounds the rules of a device.
const MaxFaultRules = 256

// FaultRequest is the JSON request of FaultCmd.
type FaultRequest struct {
	Op    string      `json:"op"`
	Rules []FaultRule `json:"rules,omitempty"`
	IDs   []uint32    `json:"ids,omitempty"`
	Start int         `json:"start,omitempty"`
}

// FaultReply is the JSON reply of FaultCmd: the device's fault seed, and
// rules with their counters (the added or changed ones for add and set,
// the list from Start on for list; Next continues a long list).
type FaultReply struct {
	Seed  uint64          `json:"seed"`
	Total int             `json:"total"`
	Next  int             `json:"next,omitempty"`
	Rules []FaultRuleInfo `json:"rules"`
}

// FaultRuleInfo is a rule with its counters.
type FaultRuleInfo struct {
	FaultRule
	// Matched counts the frames the rule's filters selected (before its
	// probability, count and time window); Applied the frames its action
	// was applied to.
	Matched uint64 `json:"matched"`
	Applied uint64 `json:"applied"`
	// A rate rule's queue: the frames it dropped (they would have waited
	// longer than For), the nanoseconds the frames it held waited in all
	// (the mean queueing delay of what it passed is RateWaitNs over
	// Matched less RateDrops) and the frames it marked CE (CEAbove).
	RateDrops  uint64 `json:"rate_drops,omitempty"`
	RateWaitNs uint64 `json:"rate_wait_ns,omitempty"`
	CEMarked   uint64 `json:"ce_marked,omitempty"`
}

// FaultScenario is what a scenario file (vrnicd -faults FILE, JSON or
// YAML) and the config file's "faults" key hold: the seed of every
// decision and the rules installed at start.
type FaultScenario struct {
	// Seed seeds each rule's decisions (with the rule's id); 0: the
	// daemon picks one from the clock. The seed in use is logged and
	// listed (vrnicctl fault list).
	Seed  uint64      `json:"seed,omitempty"`
	Rules []FaultRule `json:"rules,omitempty"`
}

// FaultRule is one fault rule: filters (all given ones must match) and
// an action. Field by field: package faults, doc.go.
type FaultRule struct {
	ID       uint32 `json:"id,omitempty"`
	Name     string `json:"name,omitempty"`
	Disabled bool   `json:"disabled,omitempty"`

	// Dir: "tx", "rx" or "both" (default).
	Dir string `json:"dir,omitempty"`
	// Peer: the remote address of the frame (destination on tx, source
	// on rx): an IP, IP:port or prefix.
	Peer string `json:"peer,omitempty"`
	// QPN: the BTH destination QP; SrcQPN: the DETH source QP (UD).
	// For a verb fault, QPN is the local QP the fault hits.
	QPN *uint32 `json:"qpn,omitempty"`
	// CQ: the CQ handle a verb fault (cq_overflow, cqe_delay) hits.
	CQ     *uint32 `json:"cq,omitempty"`
	SrcQPN *uint32 `json:"src_qpn,omitempty"`
	// Op: opcode names (RC_RDMA_WRITE_FIRST, ...) or classes (request,
	// response, ack, nak, rnr_nak, read_response, atomic, atomic_ack,
	// send, write, read, cnp); any of them matches.
	Op []string `json:"op,omitempty"`
	// PSN: "A" or "A-B" (inclusive, 24-bit).
	PSN string `json:"psn,omitempty"`
	// Message selects the Packet-th packet of the Index-th message of
	// Kind on the frame's QP and direction (both 1-based; 0: any).
	Message *FaultMessage `json:"message,omitempty"`
	// Round: the transmission round, "first" (0), "retransmit" (>= 1)
	// or a number.
	Round string `json:"round,omitempty"`
	// Probability of applying the action to a matching frame (default 1).
	Probability *float64 `json:"probability,omitempty"`
	// Count: apply at most this many times (0: no bound).
	Count uint64 `json:"count,omitempty"`
	// After and Until bound the rule in time from when it was installed
	// (Go durations).
	After string `json:"after,omitempty"`
	Until string `json:"until,omitempty"`

	Action FaultAction `json:"action"`
}

// FaultMessage is FaultRule.Message.
type FaultMessage struct {
	Kind   string `json:"kind"`
	Index  uint64 `json:"index,omitempty"`
	Packet uint64 `json:"packet,omitempty"`
}

// FaultAction is what a rule does to a frame it applies to.
type FaultAction struct {
	// Type: drop, duplicate, reorder, corrupt, delay, rate, ecn, down,
	// verb (a verb-level fault: Verb names which).
	Type string `json:"type"`
	// duplicate: copies sent besides the frame (default 1).
	Copies int `json:"copies,omitempty"`
	// reorder: hold the frame behind this many later frames (default 3)
	// or For, whichever comes first.
	Frames int `json:"frames,omitempty"`
	// reorder: longest hold (default 1ms); down: how long the link stays
	// down.
	For string `json:"for,omitempty"`
	// delay: Dist "fixed" (Delay), "uniform" (Min..Max), "normal"
	// (Delay as the mean, Stddev).
	Dist   string `json:"dist,omitempty"`
	Delay  string `json:"delay,omitempty"`
	Min    string `json:"min,omitempty"`
	Max    string `json:"max,omitempty"`
	Stddev string `json:"stddev,omitempty"`
	// corrupt: Field "payload" (default), "bth" or "icrc"; Offset in the
	// field (default: a byte drawn at random); Mask the bits flipped
	// (default: drawn, not 0); FixICRC recomputes the ICRC after, so that
	// the receiver accepts the bad data.
	Field   string `json:"field,omitempty"`
	Offset  *int   `json:"offset,omitempty"`
	Mask    uint8  `json:"mask,omitempty"`
	FixICRC bool   `json:"fix_icrc,omitempty"`
	// rate: bits per second (BPS) or packets per second (PPS) over the
	// frames the rule matches, with a burst of Burst frames (default 1);
	// frames beyond it wait, up to For (default 100ms), then are dropped.
	BPS   uint64 `json:"bps,omitempty"`
	PPS   uint64 `json:"pps,omitempty"`
	Burst int    `json:"burst,omitempty"`
	// rate: CEAbove, when set, marks Congestion Experienced (as the ecn
	// action) on the frames that wait longer than this: a queue that
	// marks above a threshold, as a switch's does for DCQCN.
	CEAbove string `json:"ce_above,omitempty"`
	// verb: the verb-level fault, one of FaultVerbs. cqe_delay takes
	// Delay (how long the CQE is held back); port_flap takes For (how
	// long the port stays down).
	Verb string `json:"verb,omitempty"`
}

// FaultVerbs are the verb-level faults (FaultAction.Verb):
//
//	rnr          a receive that would take a posted RQE is answered with
//	             an RNR NAK instead (count: how many)
//	qp_err       the QP goes to ERR at its next send WQE fetch or request
//	             received, as a catastrophic error (QP_FATAL, flushes)
//	cq_overflow  the next completion into the CQ overflows it (CQ_ERR,
//	             the QP to ERR)
//	cqe_delay    the next completion into the CQ is held back for delay
//	             (with every later one of that CQ, in order)
//	bad_wqe      the next send WQE fetched is treated as malformed
//	             (LOC_QP_OP_ERR, the QP to ERR)
//	port_flap    the port goes down for for (PORT_ERR to every context,
//	             every frame dropped), then up again (PORT_ACTIVE)
var FaultVerbs = []string{"rnr", "qp_err", "cq_overflow", "cqe_delay", "bad_wqe", "port_flap"}

// Fault action types.
var FaultActions = []string{"drop", "duplicate", "reorder", "corrupt", "delay", "rate", "ecn", "down", "verb"}

// FaultOpClasses are the opcode classes FaultRule.Op accepts besides
// opcode names.
var FaultOpClasses = []string{"request", "response", "ack", "nak", "rnr_nak", "read_response", "atomic", "atomic_ack",
	"send", "write", "read", "cnp"}

// FaultMessageKinds are the message kinds of FaultMessage.Kind.
var FaultMessageKinds = []string{"send", "write", "read", "read_response", "atomic", "atomic_ack", "ack"}

// ErrFaultRule wraps every rule validation error.
var ErrFaultRule = errors.New("bad fault rule")

func ruleErr(r *FaultRule, format string, a ...any) error {
	what := "rule"
	if r.ID != 0 {
		what = fmt.Sprintf("rule %d", r.ID)
	}
	return fmt.Errorf("%w: %s: %s", ErrFaultRule, what, fmt.Sprintf(format, a...))
}

// DecodeFaultRules decodes JSON rules strictly: unknown fields, trailing
// data and invalid rules are errors naming what is wrong. b is a rule
// object or an array of them.
func DecodeFaultRules(b []byte) ([]FaultRule, error) {
	b = bytes.TrimSpace(b)
	var rules []FaultRule
	if len(b) > 0 && b[0] == '{' {
		var r FaultRule
		if err := StrictJSON(b, &r); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFaultRule, err)
		}
		rules = []FaultRule{r}
	} else if err := StrictJSON(b, &rules); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFaultRule, err)
	}
	for i := range rules {
		if err := rules[i].Validate(); err != nil {
			return nil, err
		}
	}
	return rules, nil
}

// StrictJSON decodes one JSON value into v: unknown fields and trailing
// data are errors.
func StrictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// Validate checks r and says what is wrong: unknown values, impossible
// ranges, fields its action does not take. (The opcode names are
// checked by the daemon against its opcode table.)
func (r *FaultRule) Validate() error {
	if len(r.Name) > 64 {
		return ruleErr(r, "name longer than 64 bytes")
	}
	switch r.Dir {
	case "", "tx", "rx", "both":
	default:
		return ruleErr(r, "dir %q: want tx, rx or both", r.Dir)
	}
	if r.Peer != "" {
		if _, err := ParseFaultPeer(r.Peer); err != nil {
			return ruleErr(r, "%v", err)
		}
	}
	for _, q := range []*uint32{r.QPN, r.SrcQPN} {
		if q != nil && *q > 0xffffff {
			return ruleErr(r, "QPN %#x does not fit 24 bits", *q)
		}
	}
	if len(r.Op) > 32 {
		return ruleErr(r, "more than 32 opcodes")
	}
	for _, o := range r.Op {
		if o == "" || len(o) > 48 {
			return ruleErr(r, "opcode %q: want an opcode name or one of %s", o, strings.Join(FaultOpClasses, ", "))
		}
	}
	if r.PSN != "" {
		if _, _, err := ParseFaultPSN(r.PSN); err != nil {
			return ruleErr(r, "%v", err)
		}
	}
	if m := r.Message; m != nil {
		if !isOneOf(m.Kind, FaultMessageKinds) {
			return ruleErr(r, "message kind %q: want one of %s", m.Kind, strings.Join(FaultMessageKinds, ", "))
		}
		if m.Index > 1<<32 || m.Packet > 1<<24 {
			return ruleErr(r, "message index %d or packet %d out of range", m.Index, m.Packet)
		}
	}
	if r.Round != "" {
		if _, _, err := ParseFaultRound(r.Round); err != nil {
			return ruleErr(r, "%v", err)
		}
	}
	if p := r.Probability; p != nil && (math.IsNaN(*p) || *p < 0 || *p > 1) {
		return ruleErr(r, "probability %v not in [0, 1]", *p)
	}
	after, err := faultDuration("after", r.After, true)
	if err != nil {
		return ruleErr(r, "%v", err)
	}
	until, err := faultDuration("until", r.Until, true)
	if err != nil {
		return ruleErr(r, "%v", err)
	}
	if r.Until != "" && until <= after {
		return ruleErr(r, "until %s is not after after %s: the rule could never apply", r.Until, orZero(r.After))
	}
	if err := r.Action.validate(); err != nil {
		return ruleErr(r, "%v", err)
	}
	if err := r.checkVerbFilters(); err != nil {
		return ruleErr(r, "%v", err)
	}
	return nil
}

// checkVerbFilters: a verb fault hits a local QP or CQ, not frames, so
// the frame filters mean nothing to it; a frame rule has no CQ.
func (r *FaultRule) checkVerbFilters() error {
	if r.Action.Type != "verb" {
		if r.CQ != nil {
			return fmt.Errorf("cq applies to verb faults only (action %s)", r.Action.Type)
		}
		return nil
	}
	v := r.Action.Verb
	for _, f := range []struct {
		name string
		set  bool
	}{{"dir", r.Dir != ""}, {"peer", r.Peer != ""}, {"src_qpn", r.SrcQPN != nil}, {"op", len(r.Op) > 0},
		{"psn", r.PSN != ""}, {"message", r.Message != nil}, {"round", r.Round != ""}} {
		if f.set {
			return fmt.Errorf("verb fault %s does not take %s (a frame filter); it takes qpn, cq, probability, count, after, until", v, f.name)
		}
	}
	if r.CQ != nil && v != "cq_overflow" && v != "cqe_delay" {
		return fmt.Errorf("verb fault %s does not take cq (only cq_overflow and cqe_delay do)", v)
	}
	if v == "port_flap" && (r.QPN != nil || r.Probability != nil || r.Count != 0 || r.Until != "") {
		return errors.New("verb fault port_flap takes after and action for only: it flaps the whole port once")
	}
	return nil
}

func orZero(s string) string {
	if s == "" {
		return "0s"
	}
	return s
}

func isOneOf(s string, set []string) bool {
	for _, v := range set {
		if s == v {
			return true
		}
	}
	return false
}

// maxFaultDuration bounds every duration of a rule.
const maxFaultDuration = 24 * time.Hour

// faultDuration parses a rule duration ("" is 0).
func faultDuration(name, s string, zeroOK bool) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a duration such as 100us or 2ms", name, s)
	}
	if d < 0 || d == 0 && !zeroOK || d > maxFaultDuration {
		return 0, fmt.Errorf("%s %s out of range (0 to %s)", name, s, maxFaultDuration)
	}
	return d, nil
}

// FaultDuration returns a duration field of a validated rule (0 when
// empty).
func FaultDuration(s string) time.Duration {
	d, _ := time.ParseDuration(s)
	return d
}

// maxHoldDuration bounds how long a frame may be held back (delay,
// reorder, rate): a frame the link keeps is a buffer not in use.
const maxHoldDuration = 10 * time.Second

func (a *FaultAction) validate() error {
	type field struct {
		name string
		set  bool
	}
	fields := []field{
		{"copies", a.Copies != 0}, {"frames", a.Frames != 0}, {"for", a.For != ""}, {"dist", a.Dist != ""},
		{"delay", a.Delay != ""}, {"min", a.Min != ""}, {"max", a.Max != ""}, {"stddev", a.Stddev != ""},
		{"field", a.Field != ""}, {"offset", a.Offset != nil}, {"mask", a.Mask != 0}, {"fix_icrc", a.FixICRC},
		{"bps", a.BPS != 0}, {"pps", a.PPS != 0}, {"burst", a.Burst != 0}, {"verb", a.Verb != ""},
		{"ce_above", a.CEAbove != ""},
	}
	takes := map[string][]string{
		"drop":      nil,
		"ecn":       nil,
		"duplicate": {"copies"},
		"reorder":   {"frames", "for"},
		"corrupt":   {"field", "offset", "mask", "fix_icrc"},
		"delay":     {"dist", "delay", "min", "max", "stddev"},
		"rate":      {"bps", "pps", "burst", "for", "ce_above"},
		"down":      {"for"},
		"verb":      {"verb", "delay", "for"},
	}
	allowed, ok := takes[a.Type]
	if !ok {
		if a.Type == "" {
			return errors.New("no action type: want one of " + strings.Join(FaultActions, ", "))
		}
		return fmt.Errorf("unknown action %q: want one of %s", a.Type, strings.Join(FaultActions, ", "))
	}
	for _, f := range fields {
		if f.set && !isOneOf(f.name, allowed) {
			return fmt.Errorf("action %s does not take %s", a.Type, f.name)
		}
	}
	hold := func(name, s string, zeroOK bool) (time.Duration, error) {
		d, err := faultDuration(name, s, zeroOK)
		if err == nil && d > maxHoldDuration {
			err = fmt.Errorf("%s %s longer than %s", name, s, maxHoldDuration)
		}
		return d, err
	}
	switch a.Type {
	case "duplicate":
		if a.Copies < 0 || a.Copies > 16 {
			return fmt.Errorf("copies %d out of range (1 to 16)", a.Copies)
		}
	case "reorder":
		if a.Frames < 0 || a.Frames > 64 {
			return fmt.Errorf("frames %d out of range (1 to 64)", a.Frames)
		}
		if _, err := hold("for", a.For, false); err != nil {
			return err
		}
	case "corrupt":
		switch a.Field {
		case "", "payload", "bth", "icrc":
		default:
			return fmt.Errorf("field %q: want payload, bth or icrc", a.Field)
		}
		if a.Offset != nil && (*a.Offset < 0 || *a.Offset > 1<<16) {
			return fmt.Errorf("offset %d out of range", *a.Offset)
		}
		if a.Field == "bth" && a.Offset != nil && *a.Offset >= 12 {
			return fmt.Errorf("offset %d beyond the 12-byte BTH", *a.Offset)
		}
		if a.Field == "icrc" && a.Offset != nil && *a.Offset >= 4 {
			return fmt.Errorf("offset %d beyond the 4-byte ICRC", *a.Offset)
		}
		if a.Field == "icrc" && a.FixICRC {
			return errors.New("fix_icrc would undo a corrupted ICRC")
		}
	case "delay":
		if _, err := hold("delay", a.Delay, true); err != nil {
			return err
		}
		if _, err := hold("stddev", a.Stddev, true); err != nil {
			return err
		}
		lo, err := hold("min", a.Min, true)
		if err != nil {
			return err
		}
		hi, err := hold("max", a.Max, true)
		if err != nil {
			return err
		}
		switch a.Dist {
		case "", "fixed":
			if a.Delay == "" || a.Min != "" || a.Max != "" || a.Stddev != "" {
				return errors.New("a fixed delay takes delay (and no min, max, stddev)")
			}
		case "uniform":
			if a.Min == "" || a.Max == "" || a.Delay != "" || a.Stddev != "" {
				return errors.New("a uniform delay takes min and max")
			}
			if hi < lo {
				return fmt.Errorf("uniform delay: max %s below min %s", a.Max, a.Min)
			}
		case "normal":
			if a.Delay == "" || a.Stddev == "" || a.Min != "" || a.Max != "" {
				return errors.New("a normal delay takes delay (the mean) and stddev")
			}
		default:
			return fmt.Errorf("dist %q: want fixed, uniform or normal", a.Dist)
		}
	case "rate":
		if (a.BPS == 0) == (a.PPS == 0) {
			return errors.New("rate takes one of bps and pps")
		}
		if a.Burst < 0 || a.Burst > 1<<16 {
			return fmt.Errorf("burst %d out of range", a.Burst)
		}
		if _, err := hold("for", a.For, false); err != nil {
			return err
		}
		if a.CEAbove != "" {
			if _, err := hold("ce_above", a.CEAbove, false); err != nil {
				return err
			}
		}
	case "down":
		if a.For == "" {
			return errors.New("down takes for (how long the link stays down)")
		}
		if _, err := faultDuration("for", a.For, false); err != nil {
			return err
		}
	case "verb":
		if !isOneOf(a.Verb, FaultVerbs) {
			return fmt.Errorf("verb %q: want one of %s", orNone(a.Verb), strings.Join(FaultVerbs, ", "))
		}
		if a.Delay != "" && a.Verb != "cqe_delay" {
			return fmt.Errorf("verb %s does not take delay (cqe_delay does)", a.Verb)
		}
		if a.For != "" && a.Verb != "port_flap" {
			return fmt.Errorf("verb %s does not take for (port_flap does)", a.Verb)
		}
		switch a.Verb {
		case "cqe_delay":
			if a.Delay == "" {
				return errors.New("cqe_delay takes delay (how long the CQE is held back)")
			}
			if _, err := hold("delay", a.Delay, false); err != nil {
				return err
			}
		case "port_flap":
			if a.For == "" {
				return errors.New("port_flap takes for (how long the port stays down)")
			}
			if _, err := hold("for", a.For, false); err != nil {
				return err
			}
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none named"
	}
	return s
}

// ParseFaultPeer parses FaultRule.Peer: an address, address:port or
// prefix.
func ParseFaultPeer(s string) (netip.Prefix, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		// A port narrows nothing the link-level peer check uses beyond
		// the address; keep the address as a /32 or /128.
		a := ap.Addr().Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	return netip.Prefix{}, fmt.Errorf("peer %q: want an IP address, IP:port or prefix", s)
}

// ParseFaultPSN parses FaultRule.PSN: "A" or "A-B", 24-bit, A <= B.
func ParseFaultPSN(s string) (from, to uint32, err error) {
	a, b, isRange := strings.Cut(s, "-")
	p := func(v string) (uint32, error) {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 0, 32)
		if err != nil || n > 0xffffff {
			return 0, fmt.Errorf("psn %q: %q is not a 24-bit number", s, v)
		}
		return uint32(n), nil
	}
	if from, err = p(a); err != nil {
		return 0, 0, err
	}
	to = from
	if isRange {
		if to, err = p(b); err != nil {
			return 0, 0, err
		}
		if to < from {
			return 0, 0, fmt.Errorf("psn range %q is empty (%d > %d)", s, from, to)
		}
	}
	return from, to, nil
}

// ParseFaultRound parses FaultRule.Round: "first" is [0, 0],
// "retransmit" [1, max], a number n [n, n].
func ParseFaultRound(s string) (lo, hi uint32, err error) {
	switch s {
	case "first":
		return 0, 0, nil
	case "retransmit":
		return 1, math.MaxUint32, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n > 255 {
		return 0, 0, fmt.Errorf("round %q: want first, retransmit or a number 0 to 255", s)
	}
	return uint32(n), uint32(n), nil
}
