package main

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/ebpf"
	"github.com/vrnic/vrnic/roce"
)

const tcfaultUsage = `usage: vrnicctl [-bpffs DIR] tcfault attach dev=IFACE hook=ingress|egress [netns=NAME] [mode=tcx|cls_bpf]
       vrnicctl tcfault add dev=IFACE hook=HOOK [netns=NAME] action=drop|corrupt|duplicate|ecn [KEY=VALUE...]
       vrnicctl [-json] tcfault list [dev=IFACE hook=HOOK [netns=NAME]]
       vrnicctl tcfault clear|detach dev=IFACE hook=HOOK [netns=NAME]
rule keys: qpn op psn prob seed skip limit offset xor copies
  qpn=N          BTH destination QP
  op=NAME|N[/MASK]|rc|uc|ud   BTH opcode (e.g. RC_SEND_ONLY, 0x04, 0x06/0xfe), or a transport
  psn=N|A-B      BTH PSN, or an inclusive range
  prob=P seed=S  take each match with probability P (0..1) drawn from seed S
                 (a random seed is chosen and printed when none is given)
  skip=N         let the first N matches through;  limit=N  act on at most N frames
  offset=N xor=X corrupt: XOR the byte at N from the BTH (N < 0: from the frame's end) with X (default 0xff)
  copies=N       duplicate: N more copies (1..8, default 1)
e.g.  vrnicctl tcfault attach dev=br0p1 hook=egress
      vrnicctl tcfault add dev=br0p1 hook=egress action=drop qpn=0x11 prob=0.01
The injector is a tc program on the interface's hook for RoCE v2 frames any
sender builds; it stays attached (pinned under DIR/vrnic-tcfault, DIR a bpffs,
mounted there if it is not one) until detach. Needs root.`

// tcfaultDirName is the directory under the bpffs holding the pins.
const tcfaultDirName = "vrnic-tcfault"

// tcTarget is the attachment a tcfault command names.
type tcTarget struct {
	dev, hook, netns string
}

// pinDir is where the target's objects are pinned under root: one
// directory per netns, interface and hook.
func (x tcTarget) pinDir(root string) string {
	ns := x.netns
	if ns == "" {
		ns = "-"
	}
	return filepath.Join(root, tcfaultDirName, ns+":"+x.dev+":"+x.hook)
}

// parseTCTarget reads a pin directory's name back.
func parseTCTarget(name string) (tcTarget, bool) {
	p := strings.Split(name, ":")
	if len(p) != 3 {
		return tcTarget{}, false
	}
	x := tcTarget{netns: p[0], dev: p[1], hook: p[2]}
	if x.netns == "-" {
		x.netns = ""
	}
	return x, true
}

func (x tcTarget) String() string {
	s := x.dev + " " + x.hook
	if x.netns != "" {
		s += " (netns " + x.netns + ")"
	}
	return s
}

// runTCFault runs "vrnicctl tcfault ..." (args after "tcfault").
func runTCFault(root string, args []string, asJSON bool, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(tcfaultUsage)
	}
	op, kv, err := args[0], map[string]string{}, error(nil)
	for _, a := range args[1:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return fmt.Errorf("tcfault %s: %q is not KEY=VALUE", op, a)
		}
		if _, dup := kv[k]; dup {
			return fmt.Errorf("tcfault %s: %s given twice", op, k)
		}
		kv[k] = v
	}
	take := func(k string) string {
		v := kv[k]
		delete(kv, k)
		return v
	}
	x := tcTarget{dev: take("dev"), hook: take("hook"), netns: take("netns")}
	needTarget := func() error {
		if x.dev == "" || (x.hook != "ingress" && x.hook != "egress") {
			return fmt.Errorf("tcfault %s: dev=IFACE and hook=ingress|egress are required", op)
		}
		if strings.ContainsAny(x.dev+x.netns, ":/") {
			return fmt.Errorf("tcfault %s: a device or netns name with ':' or '/'", op)
		}
		return nil
	}
	noMore := func() error {
		for k := range kv {
			return fmt.Errorf("tcfault %s: unknown key %q\n%s", op, k, tcfaultUsage)
		}
		return nil
	}
	switch op {
	case "attach":
		mode := take("mode")
		if err = needTarget(); err == nil {
			err = noMore()
		}
		if err == nil && mode != "" && mode != "tcx" && mode != "cls_bpf" {
			err = fmt.Errorf("tcfault attach: mode %q (tcx or cls_bpf)", mode)
		}
		if err != nil {
			return err
		}
		return tcAttach(root, x, mode == "cls_bpf", stdout)
	case "add":
		if err := needTarget(); err != nil {
			return err
		}
		r, seeded, err := parseTCRule(kv)
		if err != nil {
			return err
		}
		return withTCFaults(root, x, false, func(f *ebpf.TCFaults) error {
			i, err := f.AddRule(r)
			if err != nil {
				return err
			}
			rules, err := f.Rules() // as installed, defaults filled in
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "added rule %d on %s: %s\n", i, x, describeTCRule(rules[i]))
			if seeded {
				fmt.Fprintf(stdout, "seed %d (chosen now: give seed=%d to draw the same faults again)\n", r.Seed, r.Seed)
			}
			return nil
		})
	case "clear", "detach":
		if err = needTarget(); err == nil {
			err = noMore()
		}
		if err != nil {
			return err
		}
		if op == "detach" && x.netns != "" {
			if _, err := os.Stat(filepath.Join("/run/netns", x.netns)); errors.Is(err, os.ErrNotExist) {
				// The namespace and its interfaces are gone, and with
				// them the hook: only the pins hold the program now.
				if err := os.RemoveAll(x.pinDir(root)); err != nil {
					return err
				}
				fmt.Fprintf(stdout, "netns %s is gone: removed the pins of %s\n", x.netns, x)
				return nil
			}
		}
		return withTCFaults(root, x, op == "detach", func(f *ebpf.TCFaults) error {
			if op == "clear" {
				return f.SetRules(nil)
			}
			return f.Detach()
		})
	case "list":
		if len(kv) > 0 || x != (tcTarget{}) {
			if err = needTarget(); err == nil {
				err = noMore()
			}
			if err != nil {
				return err
			}
		}
		return tcList(root, x, asJSON, stdout)
	}
	return fmt.Errorf("unknown tcfault operation %q\n%s", op, tcfaultUsage)
}

// bpffsMagic is BPF_FS_MAGIC (statfs f_type of a bpffs).
const bpffsMagic = 0xcafe4a11

// ensureBPFFS mounts a bpffs on root unless it is one already.
func ensureBPFFS(root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("bpffs %s: %w", root, err)
	}
	if uint32(st.Type) == bpffsMagic {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("%s is not a bpffs and mounting one there failed: %w", root, err)
	}
	return nil
}

// netnsOf opens the named network namespace (0 for "": this one); the
// caller closes it.
func netnsOf(name string) (netns.NsHandle, error) {
	if name == "" {
		return 0, nil
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		return 0, fmt.Errorf("netns %s: %w", name, err)
	}
	return h, nil
}

func tcAttach(root string, x tcTarget, legacy bool, stdout io.Writer) error {
	if err := ensureBPFFS(root); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(root, tcfaultDirName), 0o700); err != nil {
		return err
	}
	ns, err := netnsOf(x.netns)
	if err != nil {
		return err
	}
	if ns != 0 {
		defer ns.Close()
	}
	f, err := ebpf.AttachTCFaults(ebpf.TCFaultConfig{Interface: x.dev, Netns: ns, Ingress: x.hook == "ingress",
		Legacy: legacy, PinDir: x.pinDir(root)})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "attached to %s (%s, ifindex %d): no rules yet\n", x, f.Mode(), f.Ifindex())
	return f.Close()
}

// withTCFaults opens the pinned attachment of x and runs fn on it; with
// inNS it opens x's network namespace too (what Detach of a cls_bpf
// filter needs; reading rules and counters does not).
func withTCFaults(root string, x tcTarget, inNS bool, fn func(*ebpf.TCFaults) error) error {
	var ns netns.NsHandle
	if inNS {
		var err error
		if ns, err = netnsOf(x.netns); err != nil {
			return err
		}
		if ns != 0 {
			defer ns.Close()
		}
	}
	f, err := ebpf.OpenTCFaults(ebpf.TCFaultConfig{Interface: x.dev, Netns: ns, PinDir: x.pinDir(root)})
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no injector attached to %s (vrnicctl tcfault attach dev=%s hook=%s)", x, x.dev, x.hook)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return fn(f)
}

// tcListing is one attachment as list -json prints it.
type tcListing struct {
	Dev   string        `json:"dev"`
	Hook  string        `json:"hook"`
	Netns string        `json:"netns,omitempty"`
	Mode  string        `json:"mode"`
	Rules []tcRuleState `json:"rules"`
}

type tcRuleState struct {
	Rule string `json:"rule"`
	ebpf.TCFaultCount
}

func tcList(root string, x tcTarget, asJSON bool, stdout io.Writer) error {
	var targets []tcTarget
	if x != (tcTarget{}) {
		targets = []tcTarget{x}
	} else {
		ents, err := os.ReadDir(filepath.Join(root, tcfaultDirName))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		for _, e := range ents {
			if t, ok := parseTCTarget(e.Name()); ok {
				targets = append(targets, t)
			}
		}
	}
	out := []tcListing{}
	for _, t := range targets {
		err := withTCFaults(root, t, false, func(f *ebpf.TCFaults) error {
			rules, err := f.Rules()
			if err != nil {
				return err
			}
			counts, err := f.Counts(len(rules))
			if err != nil {
				return err
			}
			l := tcListing{Dev: t.dev, Hook: t.hook, Netns: t.netns, Mode: f.Mode(), Rules: []tcRuleState{}}
			for i, r := range rules {
				l.Rules = append(l.Rules, tcRuleState{describeTCRule(r), counts[i]})
			}
			out = append(out, l)
			return nil
		})
		if err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintln(stdout, "no tc fault injector attached")
		return nil
	}
	for _, l := range out {
		fmt.Fprintf(stdout, "%s (%s): %d rules\n", tcTarget{l.Dev, l.Hook, l.Netns}, l.Mode, len(l.Rules))
		if len(l.Rules) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "#\tMATCHED\tTAKEN\tAPPLIED\tFAILED\tRULE")
		for i, r := range l.Rules {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%s\n", i, r.Matched, r.Taken, r.Applied, r.Failed, r.Rule)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// tcTransports are the op= classes: the transport bits of the opcode.
var tcTransports = map[string]uint8{"rc": 0x00, "uc": 0x20, "ud": 0x60}

// parseTCRule builds a rule from the KEY=VALUE pairs of "tcfault add";
// seeded reports a seed chosen here.
func parseTCRule(kv map[string]string) (r ebpf.TCFaultRule, seeded bool, err error) {
	num := func(k string, bits int) (uint64, bool, error) {
		v, ok := kv[k]
		if !ok {
			return 0, false, nil
		}
		n, err := strconv.ParseUint(v, 0, bits)
		if err != nil {
			return 0, false, fmt.Errorf("%s=%q: %w", k, v, err)
		}
		return n, true, nil
	}
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch k {
		case "action", "qpn", "op", "psn", "prob", "seed", "skip", "limit", "offset", "xor", "copies":
		default:
			return r, false, fmt.Errorf("tcfault add: unknown key %q\n%s", k, tcfaultUsage)
		}
	}
	if kv["action"] == "" {
		return r, false, errors.New("tcfault add: action= is required (drop, corrupt, duplicate, ecn)")
	}
	if r.Action, err = ebpf.ParseTCFaultAction(kv["action"]); err != nil {
		return r, false, err
	}
	if n, ok, err := num("qpn", 24); err != nil {
		return r, false, err
	} else if ok {
		q := uint32(n)
		r.QPN = &q
	}
	if v, ok := kv["op"]; ok {
		if r.Opcode, r.OpcodeMask, err = parseTCOp(v); err != nil {
			return r, false, err
		}
	}
	if v, ok := kv["psn"]; ok {
		first, last, err := admin.ParseFaultPSN(v)
		if err != nil {
			return r, false, err
		}
		r.PSN = &[2]uint32{first, last}
	}
	if v, ok := kv["prob"]; ok {
		if r.Prob, err = strconv.ParseFloat(v, 64); err != nil {
			return r, false, fmt.Errorf("prob=%q: %w", v, err)
		}
	}
	var n uint64
	var ok bool
	if n, ok, err = num("seed", 64); err != nil {
		return r, false, err
	} else if ok {
		r.Seed = n
	} else if r.Prob > 0 && r.Prob < 1 {
		var b [8]byte
		if _, err := crand.Read(b[:]); err != nil {
			return r, false, err
		}
		r.Seed, seeded = binary.LittleEndian.Uint64(b[:]), true
	}
	for _, f := range []struct {
		k   string
		dst *uint32
	}{{"skip", &r.Skip}, {"limit", &r.Limit}, {"copies", &r.Copies}} {
		if n, ok, err = num(f.k, 32); err != nil {
			return r, false, err
		} else if ok {
			*f.dst = uint32(n)
		}
	}
	if v, ok := kv["offset"]; ok {
		o, err := strconv.ParseInt(v, 0, 32)
		if err != nil {
			return r, false, fmt.Errorf("offset=%q: %w", v, err)
		}
		r.CorruptOffset = int32(o)
	}
	if n, ok, err = num("xor", 8); err != nil {
		return r, false, err
	} else if ok {
		if n == 0 {
			return r, false, errors.New("xor=0 would change nothing")
		}
		r.CorruptXOR = uint8(n)
	}
	if _, ok := kv["offset"]; (ok || kv["xor"] != "") && r.Action != ebpf.TCCorrupt {
		return r, false, errors.New("offset and xor are for action=corrupt")
	}
	if _, ok := kv["copies"]; ok && r.Action != ebpf.TCDuplicate {
		return r, false, errors.New("copies is for action=duplicate")
	}
	if _, ok := kv["seed"]; ok && (r.Prob <= 0 || r.Prob >= 1) {
		return r, false, errors.New("seed is for a probability between 0 and 1 (prob=)")
	}
	return r, seeded, nil
}

// parseTCOp reads op=: an opcode name, a number with an optional mask,
// or a transport.
func parseTCOp(v string) (op, mask uint8, err error) {
	if m, ok := tcTransports[strings.ToLower(v)]; ok {
		return m, 0xe0, nil
	}
	if o, ok := roce.OpcodeByName(v); ok {
		return uint8(o), 0xff, nil
	}
	a, b, hasMask := strings.Cut(v, "/")
	o, err1 := strconv.ParseUint(a, 0, 8)
	m, err2 := uint64(0xff), error(nil)
	if hasMask {
		m, err2 = strconv.ParseUint(b, 0, 8)
	}
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("op=%q: an opcode name (e.g. RC_SEND_ONLY), a number with an optional /mask, or rc, uc, ud", v)
	}
	return uint8(o), uint8(m), nil
}

// describeTCRule prints a rule as the KEY=VALUE words that make it.
func describeTCRule(r ebpf.TCFaultRule) string {
	w := []string{"action=" + r.Action.String()}
	if r.QPN != nil {
		w = append(w, fmt.Sprintf("qpn=%#x", *r.QPN))
	}
	switch {
	case r.OpcodeMask == 0:
	case r.OpcodeMask == 0xe0 && (r.Opcode == 0x00 || r.Opcode == 0x20 || r.Opcode == 0x60):
		for n, o := range tcTransports {
			if o == r.Opcode {
				w = append(w, "op="+n)
			}
		}
	case r.OpcodeMask == 0xff && roce.Opcode(r.Opcode).Valid():
		w = append(w, "op="+roce.Opcode(r.Opcode).Info().Name)
	default:
		w = append(w, fmt.Sprintf("op=%#02x/%#02x", r.Opcode, r.OpcodeMask))
	}
	if r.PSN != nil {
		if r.PSN[0] == r.PSN[1] {
			w = append(w, fmt.Sprintf("psn=%d", r.PSN[0]))
		} else {
			w = append(w, fmt.Sprintf("psn=%d-%d", r.PSN[0], r.PSN[1]))
		}
	}
	if r.Prob > 0 {
		w = append(w, "prob="+strconv.FormatFloat(r.Prob, 'g', 6, 64), "seed="+strconv.FormatUint(r.Seed, 10))
	}
	if r.Skip != 0 {
		w = append(w, fmt.Sprintf("skip=%d", r.Skip))
	}
	if r.Limit != 0 {
		w = append(w, fmt.Sprintf("limit=%d", r.Limit))
	}
	switch r.Action {
	case ebpf.TCCorrupt:
		w = append(w, fmt.Sprintf("offset=%d", r.CorruptOffset), fmt.Sprintf("xor=%#02x", r.CorruptXOR))
	case ebpf.TCDuplicate:
		w = append(w, fmt.Sprintf("copies=%d", r.Copies))
	}
	return strings.Join(w, " ")
}
