package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/vrnic/vrnic/admin"
)

const faultUsage = `usage: vrnicctl [-d name|-s socket] [-json] fault list
       vrnicctl fault add KEY=VALUE...      (or: fault add -f RULES.json)
       vrnicctl fault set ID KEY=VALUE...   (replaces rule ID, keeping its counters)
       vrnicctl fault del ID...
       vrnicctl fault clear
keys: ` + "id name disabled dir peer qpn src_qpn cq op psn msg pkt round prob count after until action\n" +
	"      copies frames for dist delay min max stddev field offset mask fix_icrc bps pps burst ce_above verb\n" +
	`e.g.  vrnicctl fault add dir=tx qpn=0x1234 msg=write:2 pkt=3 round=first action=drop`

// runFault runs "vrnicctl fault ..." (args after "fault").
func runFault(sock string, args []string, asJSON bool, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(faultUsage)
	}
	req := admin.FaultRequest{Op: args[0]}
	rest := args[1:]
	switch req.Op {
	case admin.FaultList, admin.FaultClear:
		if len(rest) > 0 {
			return fmt.Errorf("fault %s takes no arguments", req.Op)
		}
	case admin.FaultAdd:
		if len(rest) == 2 && rest[0] == "-f" {
			b, err := os.ReadFile(rest[1])
			if err != nil {
				return err
			}
			if req.Rules, err = admin.DecodeFaultRules(b); err != nil {
				return err
			}
			break
		}
		r, err := parseFaultRule(rest)
		if err != nil {
			return err
		}
		req.Rules = []admin.FaultRule{r}
	case admin.FaultSet:
		if len(rest) < 2 {
			return errors.New("fault set ID KEY=VALUE...: the rule's id and its new fields")
		}
		id, err := strconv.ParseUint(rest[0], 0, 32)
		if err != nil || id == 0 {
			return fmt.Errorf("fault set: rule id %q is not a number above 0", rest[0])
		}
		r, err := parseFaultRule(rest[1:])
		if err != nil {
			return err
		}
		if r.ID != 0 && r.ID != uint32(id) {
			return fmt.Errorf("fault set %d: id=%d differs", id, r.ID)
		}
		r.ID = uint32(id)
		req.Rules = []admin.FaultRule{r}
	case admin.FaultDel:
		if len(rest) == 0 {
			return errors.New("fault del ID...: which rules")
		}
		for _, s := range rest {
			id, err := strconv.ParseUint(s, 0, 32)
			if err != nil || id == 0 {
				return fmt.Errorf("fault del: rule id %q is not a number above 0", s)
			}
			req.IDs = append(req.IDs, uint32(id))
		}
	default:
		return fmt.Errorf("unknown fault operation %q\n%s", req.Op, faultUsage)
	}
	a, err := admin.Dial(sock)
	if err != nil {
		return err
	}
	defer a.Close()
	reply, err := callFault(a, req)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, reply)
	}
	switch req.Op {
	case admin.FaultAdd, admin.FaultSet:
		for _, r := range reply.Rules {
			verb := "added"
			if req.Op == admin.FaultSet {
				verb = "changed"
			}
			fmt.Fprintf(stdout, "%s rule %d: %s\n", verb, r.ID, describeRule(&r.FaultRule))
		}
		return nil
	case admin.FaultDel, admin.FaultClear:
		return nil
	}
	return printFaults(stdout, reply)
}

// callFault sends a fault request; a list is fetched page by page.
func callFault(a *admin.Client, req admin.FaultRequest) (admin.FaultReply, error) {
	var all admin.FaultReply
	for {
		b, err := a.Call(admin.FaultCmd, req)
		if err != nil {
			return all, err
		}
		var page admin.FaultReply
		if err := json.Unmarshal(b, &page); err != nil {
			return all, err
		}
		rules := append(all.Rules, page.Rules...)
		all, all.Rules = page, rules
		if req.Op != admin.FaultList || page.Next <= req.Start {
			all.Next = 0
			return all, nil
		}
		req.Start = page.Next
	}
}

func printFaults(w io.Writer, r admin.FaultReply) error {
	fmt.Fprintf(w, "seed %d, %d rules\n", r.Seed, len(r.Rules))
	if len(r.Rules) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tMATCHED\tAPPLIED\tRULE")
	for _, x := range r.Rules {
		state := "on"
		if x.Disabled {
			state = "off"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\n", x.ID, dash(x.Name), state, x.Matched, x.Applied, describeRule(&x.FaultRule))
	}
	return tw.Flush()
}

// describeRule prints a rule as the KEY=VALUE words that make it.
func describeRule(r *admin.FaultRule) string {
	var w []string
	add := func(k, v string) {
		if v != "" {
			w = append(w, k+"="+v)
		}
	}
	add("dir", r.Dir)
	add("peer", r.Peer)
	if r.QPN != nil {
		add("qpn", fmt.Sprintf("%#x", *r.QPN))
	}
	if r.SrcQPN != nil {
		add("src_qpn", fmt.Sprintf("%#x", *r.SrcQPN))
	}
	if r.CQ != nil {
		add("cq", strconv.FormatUint(uint64(*r.CQ), 10))
	}
	add("op", strings.Join(r.Op, ","))
	add("psn", r.PSN)
	if m := r.Message; m != nil {
		s := m.Kind
		if m.Index != 0 {
			s += ":" + strconv.FormatUint(m.Index, 10)
		}
		add("msg", s)
		if m.Packet != 0 {
			add("pkt", strconv.FormatUint(m.Packet, 10))
		}
	}
	add("round", r.Round)
	if r.Probability != nil {
		add("prob", strconv.FormatFloat(*r.Probability, 'g', -1, 64))
	}
	if r.Count != 0 {
		add("count", strconv.FormatUint(r.Count, 10))
	}
	add("after", r.After)
	add("until", r.Until)
	a := &r.Action
	add("action", a.Type)
	if a.Copies != 0 {
		add("copies", strconv.Itoa(a.Copies))
	}
	if a.Frames != 0 {
		add("frames", strconv.Itoa(a.Frames))
	}
	add("for", a.For)
	add("dist", a.Dist)
	add("delay", a.Delay)
	add("min", a.Min)
	add("max", a.Max)
	add("stddev", a.Stddev)
	add("field", a.Field)
	if a.Offset != nil {
		add("offset", strconv.Itoa(*a.Offset))
	}
	if a.Mask != 0 {
		add("mask", fmt.Sprintf("%#02x", a.Mask))
	}
	if a.FixICRC {
		add("fix_icrc", "true")
	}
	if a.BPS != 0 {
		add("bps", strconv.FormatUint(a.BPS, 10))
	}
	if a.PPS != 0 {
		add("pps", strconv.FormatUint(a.PPS, 10))
	}
	if a.Burst != 0 {
		add("burst", strconv.Itoa(a.Burst))
	}
	add("ce_above", a.CEAbove)
	add("verb", a.Verb)
	return strings.Join(w, " ")
}

// parseFaultRule builds a rule from KEY=VALUE words and validates it.
func parseFaultRule(words []string) (admin.FaultRule, error) {
	var r admin.FaultRule
	seen := map[string]bool{}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || v == "" {
			return r, fmt.Errorf("%q: want KEY=VALUE", w)
		}
		if seen[k] {
			return r, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		if err := setFaultKey(&r, k, v); err != nil {
			return r, fmt.Errorf("%s=%s: %w", k, v, err)
		}
	}
	if seen["pkt"] && r.Message == nil {
		return r, errors.New("pkt needs msg=KIND[:INDEX]")
	}
	return r, r.Validate()
}

func setFaultKey(r *admin.FaultRule, k, v string) error {
	u64 := func(bits int) (uint64, error) { return strconv.ParseUint(v, 0, bits) }
	a := &r.Action
	var err error
	switch k {
	case "id":
		var n uint64
		n, err = u64(32)
		r.ID = uint32(n)
	case "name":
		r.Name = v
	case "disabled":
		r.Disabled, err = strconv.ParseBool(v)
	case "dir":
		r.Dir = v
	case "peer":
		r.Peer = v
	case "qpn", "src_qpn", "cq":
		var n uint64
		if n, err = u64(32); err == nil {
			q := uint32(n)
			switch k {
			case "qpn":
				r.QPN = &q
			case "cq":
				r.CQ = &q
			default:
				r.SrcQPN = &q
			}
		}
	case "op":
		r.Op = strings.Split(v, ",")
	case "psn":
		r.PSN = v
	case "msg":
		kind, idx, hasIdx := strings.Cut(v, ":")
		if r.Message == nil {
			r.Message = &admin.FaultMessage{}
		}
		r.Message.Kind = kind
		if hasIdx {
			r.Message.Index, err = strconv.ParseUint(idx, 10, 32)
		}
	case "pkt":
		if r.Message == nil {
			r.Message = &admin.FaultMessage{}
		}
		r.Message.Packet, err = strconv.ParseUint(v, 10, 32)
	case "round":
		r.Round = v
	case "prob", "probability":
		var p float64
		if p, err = strconv.ParseFloat(v, 64); err == nil {
			r.Probability = &p
		}
	case "count":
		r.Count, err = u64(64)
	case "after":
		r.After = v
	case "until":
		r.Until = v
	case "action":
		a.Type = v
	case "copies", "frames", "burst", "offset":
		var n int
		if n, err = strconv.Atoi(v); err == nil {
			switch k {
			case "copies":
				a.Copies = n
			case "frames":
				a.Frames = n
			case "burst":
				a.Burst = n
			default:
				a.Offset = &n
			}
		}
	case "for":
		a.For = v
	case "dist":
		a.Dist = v
	case "delay":
		a.Delay = v
	case "min":
		a.Min = v
	case "max":
		a.Max = v
	case "stddev":
		a.Stddev = v
	case "field":
		a.Field = v
	case "mask":
		var n uint64
		n, err = u64(8)
		a.Mask = uint8(n)
	case "fix_icrc":
		a.FixICRC, err = strconv.ParseBool(v)
	case "bps":
		a.BPS, err = u64(64)
	case "pps":
		a.PPS, err = u64(64)
	case "verb":
		a.Verb = v
	case "ce_above":
		a.CEAbove = v
	default:
		keys := strings.Fields("id name disabled dir peer qpn src_qpn cq op psn msg pkt round prob count after until action " +
			"copies frames for dist delay min max stddev field offset mask fix_icrc bps pps burst ce_above verb")
		sort.Strings(keys)
		return fmt.Errorf("unknown key (want one of %s)", strings.Join(keys, " "))
	}
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) {
			return fmt.Errorf("%q is not a valid value", v)
		}
	}
	return err
}
