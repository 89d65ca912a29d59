package ebpf

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/nsrun"
)

// The kernel-side fault injector (bpf/tcfault.c): a tc program on the
// ingress or egress hook of any interface that drops, corrupts, duplicates
// or ECN-marks RoCE v2 frames, for traffic vrnic does not build itself
// (Soft-RoCE, a hardware RNIC, a bridge between daemons). The engine's own
// injector (package faults) sees QPs and messages; this one sees only
// frames, but any frames.

// MaxTCFaultRules is the number of rules one attachment holds.
const MaxTCFaultRules = 16

// MaxTCFaultCopies is the most extra copies a duplicate rule makes.
const MaxTCFaultCopies = 8

// TCFaultMark is the packet mark a duplicate carries while it re-enters
// the hook (the program clears it there).
const TCFaultMark = 0x76726366

// TCFaultAction is what a rule does to the frames it takes.
type TCFaultAction uint8

// Actions (enum tcfault_action).
const (
	TCDrop      TCFaultAction = 1 + iota // drop the frame
	TCCorrupt                            // XOR one byte (the ICRC then fails)
	TCDuplicate                          // send Copies more copies
	TCECN                                // set the IP ECN field to CE
)

var tcActionNames = [...]string{TCDrop: "drop", TCCorrupt: "corrupt", TCDuplicate: "duplicate", TCECN: "ecn"}

// String returns the action's name as ParseTCFaultAction takes it.
func (a TCFaultAction) String() string {
	if int(a) < len(tcActionNames) && tcActionNames[a] != "" {
		return tcActionNames[a]
	}
	return fmt.Sprintf("TCFaultAction(%d)", uint8(a))
}

// ParseTCFaultAction returns the action named s (drop, corrupt, duplicate,
// ecn).
func ParseTCFaultAction(s string) (TCFaultAction, error) {
	for a, n := range tcActionNames {
		if n != "" && n == s {
			return TCFaultAction(a), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown action %q (drop, corrupt, duplicate, ecn)", ErrConfig, s)
}

// Rule flags (enum tcfault_flag).
const (
	tcFlagQPN  = 1 << 0
	tcFlagPSN  = 1 << 1
	tcFlagProb = 1 << 2
)

// TCFaultRule is one rule of a TCFaults. A frame matches when every field
// set matches; the rule then counts the match (its index k from 0), lets
// the first Skip matches through, takes match k with probability Prob
// (drawn from Seed and k: TCFaultTakes), and applies Action to at most
// Limit frames. Rules are tried in order; the first that applies ends the
// frame's turn. A GSO packet (frames the kernel has not segmented yet) is
// one frame: its first frame's headers are matched, the action applies to
// all of it.
type TCFaultRule struct {
	Action TCFaultAction
	// QPN, if set, is the BTH destination QP (24 bits).
	QPN *uint32
	// Opcode and OpcodeMask match BTH opcodes with (op & mask) == (Opcode
	// & mask): mask 0xff one opcode, 0xe0 a transport (0x00 RC, 0x20 UC,
	// 0x60 UD), 0 every opcode.
	Opcode, OpcodeMask uint8
	// PSN, if set, is an inclusive range [first, last] of BTH PSNs.
	PSN *[2]uint32
	// Prob in (0, 1) takes that fraction of the matches, drawn from Seed;
	// 0 and 1 take every match.
	Prob float64
	Seed uint64
	// Skip lets the first Skip matches through ("the 3rd frame": Skip 2,
	// Limit 1).
	Skip uint32
	// Limit is the most frames the action is applied to; 0 is no limit.
	Limit uint32
	// CorruptOffset is the byte TCCorrupt changes: from the BTH when >= 0,
	// from the end of the frame when < 0 (-1 is the ICRC's last byte).
	CorruptOffset int32
	// CorruptXOR is what the byte is XORed with; 0 means 0xff.
	CorruptXOR uint8
	// Copies is the number of extra copies TCDuplicate sends, 1 to
	// MaxTCFaultCopies; 0 means 1.
	Copies uint32
}

// TCFaultCount is what a rule did since SetRules installed it.
type TCFaultCount struct {
	Matched uint64 `json:"matched"` // frames that matched its fields
	Taken   uint64 `json:"taken"`   // of those, past Skip and the draw (Limit counts these)
	Applied uint64 `json:"applied"` // frames the action was applied to
	Failed  uint64 `json:"failed"`  // the kernel refused the action (a helper failed)
}

// TCFaultDraw is the program's k-th draw for seed: splitmix64 of seed +
// (k+1) times the golden ratio, high 32 bits.
func TCFaultDraw(seed, k uint64) uint32 {
	z := seed + (k+1)*0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return uint32((z ^ z>>31) >> 32)
}

// TCFaultTakes reports whether r takes its match number k (from 0),
// before its Limit: what the program decides, computed in user space.
func TCFaultTakes(r TCFaultRule, k uint64) bool {
	if k < uint64(r.Skip) {
		return false
	}
	threshold, ok := probThreshold(r.Prob)
	return !ok || TCFaultDraw(r.Seed, k) < threshold
}

// probThreshold returns prob as a fraction of 2^32 and whether a draw is
// needed at all.
func probThreshold(p float64) (uint32, bool) {
	if p <= 0 || p >= 1 {
		return 0, false
	}
	return uint32(math.Min(p*(1<<32), math.MaxUint32)), true
}

// encode checks r and returns it in the program's layout.
func (r TCFaultRule) encode() (tcfaultTcfaultRule, error) {
	e := tcfaultTcfaultRule{Action: uint8(r.Action), Opcode: r.Opcode, OpcodeMask: r.OpcodeMask,
		Skip: r.Skip, Limit: r.Limit, Seed: r.Seed}
	switch r.Action {
	case TCDrop, TCECN:
	case TCCorrupt:
		e.CorruptOff, e.CorruptXor = r.CorruptOffset, r.CorruptXOR
		if e.CorruptXor == 0 {
			e.CorruptXor = 0xff
		}
	case TCDuplicate:
		e.Copies = max(r.Copies, 1)
		if e.Copies > MaxTCFaultCopies {
			return e, fmt.Errorf("%w: %d copies (1..%d)", ErrConfig, r.Copies, MaxTCFaultCopies)
		}
	default:
		return e, fmt.Errorf("%w: unknown action %d", ErrConfig, r.Action)
	}
	if r.QPN != nil {
		if *r.QPN > 0xffffff {
			return e, fmt.Errorf("%w: QPN %#x is wider than 24 bits", ErrConfig, *r.QPN)
		}
		e.Flags |= tcFlagQPN
		e.Qpn = *r.QPN
	}
	if r.PSN != nil {
		if r.PSN[0] > r.PSN[1] || r.PSN[1] > 0xffffff {
			return e, fmt.Errorf("%w: PSN range %d-%d (24-bit, first <= last)", ErrConfig, r.PSN[0], r.PSN[1])
		}
		e.Flags |= tcFlagPSN
		e.PsnFirst, e.PsnLast = r.PSN[0], r.PSN[1]
	}
	if math.IsNaN(r.Prob) || r.Prob < 0 || r.Prob > 1 {
		return e, fmt.Errorf("%w: probability %v (0..1)", ErrConfig, r.Prob)
	}
	if t, ok := probThreshold(r.Prob); ok {
		e.Flags |= tcFlagProb
		e.Prob = t
	}
	return e, nil
}

// TCFaultConfig says where to attach a TCFaults.
type TCFaultConfig struct {
	// Interface is the name of the interface, in Netns.
	Interface string
	// Netns is the network namespace of the interface; 0 is the
	// caller's.
	Netns netns.NsHandle
	// Ingress attaches to the ingress hook (frames the interface
	// receives), else to egress (frames it sends).
	Ingress bool
	// Legacy attaches as a cls_bpf filter on a clsact qdisc even where
	// tcx (Linux 6.6) exists. Without tcx that is what happens anyway.
	Legacy bool
	// PinDir, if set, is a directory to create on a BPF file system
	// (bpffs) where the attachment is pinned (its program, maps and tcx
	// link), so that it outlives the process: OpenTCFaults finds it
	// again, Close leaves it attached, Detach removes it.
	PinDir string
}

// Names of the pinned objects in TCFaultConfig.PinDir.
const (
	pinProg   = "prog"
	pinLink   = "link"
	pinRules  = "rules"
	pinCounts = "counts"
	pinConf   = "conf"
)

// ErrTCFaultsPinned: PinDir exists (the attachment is there already).
var ErrTCFaultsPinned = errors.New("ebpf: a tc fault injector is pinned there already")

// TCFaults is one attachment of the kernel-side fault injector. Its
// methods may be called from several goroutines. The program stays
// attached until Close, or with a PinDir until Detach (or until the
// interface is removed).
type TCFaults struct {
	cfg     TCFaultConfig
	ifindex int
	objs    tcfaultObjects

	mu        sync.Mutex // serialises SetRules, AddRule, Close and Detach
	tcx       link.Link
	clsBPF    bool // attached as a cls_bpf filter
	ownsQdisc bool // attachClsBPF added the clsact qdisc
	closed    bool
}

// AttachTCFaults loads the injector with no rules and attaches it. Needs
// CAP_NET_ADMIN and CAP_BPF (or root).
func AttachTCFaults(cfg TCFaultConfig) (*TCFaults, error) {
	if cfg.Interface == "" {
		return nil, fmt.Errorf("%w: no interface", ErrConfig)
	}
	if cfg.PinDir != "" {
		if err := os.Mkdir(cfg.PinDir, 0o700); err != nil {
			if errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("%w: %s", ErrTCFaultsPinned, cfg.PinDir)
			}
			return nil, fmt.Errorf("ebpf: pin directory: %w", err)
		}
	}
	f, err := loadTCFaults(cfg)
	if err == nil {
		if err = nsrun.Run(cfg.Netns, f.attach); err != nil {
			f.objs.Close()
			err = fmt.Errorf("ebpf: attach tc fault program to %s %s: %w", cfg.Interface, f.Hook(), err)
		}
	}
	if err == nil {
		if err = f.writeConf(); err == nil && cfg.PinDir != "" {
			err = f.pin()
		}
		if err != nil {
			f.detach()
		}
	}
	if err != nil {
		if cfg.PinDir != "" {
			os.RemoveAll(cfg.PinDir)
		}
		return nil, err
	}
	return f, nil
}

// writeConf records where the program is attached in its config map.
func (f *TCFaults) writeConf() error {
	c := tcfaultTcfaultConfig{Ifindex: uint32(f.ifindex)}
	if f.cfg.Ingress {
		c.Ingress = 1
	}
	if f.ownsQdisc {
		c.OwnsQdisc = 1
	}
	if err := f.objs.TcfaultConf.Put(uint32(0), c); err != nil {
		return fmt.Errorf("ebpf: tc fault config: %w", err)
	}
	return nil
}

// pin pins the program, the maps and the tcx link in cfg.PinDir.
func (f *TCFaults) pin() error {
	for _, o := range []struct {
		name string
		pin  func(string) error
	}{
		{pinProg, f.objs.VrnicTcfault.Pin},
		{pinRules, f.objs.TcfaultRules.Pin},
		{pinCounts, f.objs.TcfaultCounts.Pin},
		{pinConf, f.objs.TcfaultConf.Pin},
	} {
		if err := o.pin(filepath.Join(f.cfg.PinDir, o.name)); err != nil {
			return fmt.Errorf("ebpf: pin %s: %w", o.name, err)
		}
	}
	if f.tcx != nil {
		if err := f.tcx.Pin(filepath.Join(f.cfg.PinDir, pinLink)); err != nil {
			return fmt.Errorf("ebpf: pin %s: %w", pinLink, err)
		}
	}
	return nil
}

// OpenTCFaults opens the attachment pinned in cfg.PinDir by
// AttachTCFaults. cfg.Netns must be the interface's namespace (Detach of
// a cls_bpf attachment removes its filter there); the hook, the
// interface index and the mode are read from the pinned objects.
func OpenTCFaults(cfg TCFaultConfig) (*TCFaults, error) {
	if cfg.PinDir == "" {
		return nil, fmt.Errorf("%w: no pin directory", ErrConfig)
	}
	f := &TCFaults{cfg: cfg}
	var err error
	load := func(name string) *ebpf.Map {
		if err != nil {
			return nil
		}
		var m *ebpf.Map
		if m, err = ebpf.LoadPinnedMap(filepath.Join(cfg.PinDir, name), nil); err != nil {
			err = fmt.Errorf("ebpf: open pinned %s: %w", name, err)
		}
		return m
	}
	f.objs.TcfaultRules, f.objs.TcfaultCounts, f.objs.TcfaultConf = load(pinRules), load(pinCounts), load(pinConf)
	if err == nil {
		if f.objs.VrnicTcfault, err = ebpf.LoadPinnedProgram(filepath.Join(cfg.PinDir, pinProg), nil); err != nil {
			err = fmt.Errorf("ebpf: open pinned %s: %w", pinProg, err)
		}
	}
	var c tcfaultTcfaultConfig
	if err == nil {
		err = f.objs.TcfaultConf.Lookup(uint32(0), &c)
	}
	if err == nil {
		f.ifindex, f.cfg.Ingress, f.ownsQdisc = int(c.Ifindex), c.Ingress == 1, c.OwnsQdisc == 1
		switch l, lerr := link.LoadPinnedLink(filepath.Join(cfg.PinDir, pinLink), nil); {
		case lerr == nil:
			f.tcx = l
		case errors.Is(lerr, os.ErrNotExist):
			f.clsBPF = true
		default:
			err = fmt.Errorf("ebpf: open pinned %s: %w", pinLink, lerr)
		}
	}
	if err != nil {
		f.objs.Close()
		return nil, err
	}
	return f, nil
}

// loadTCFaults loads the program and its maps for cfg, unattached and
// with an empty config (AttachTCFaults writes it once attached: until
// rules are added the program reads nothing else).
func loadTCFaults(cfg TCFaultConfig) (*TCFaults, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("ebpf: raise memlock limit: %w", err)
	}
	f := &TCFaults{cfg: cfg}
	if err := loadTcfaultObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("ebpf: load tc fault program: %w", err)
	}
	return f, nil
}

// attach runs in the interface's namespace: tcx first (unless Legacy),
// cls_bpf on clsact where tcx is missing.
func (f *TCFaults) attach(h *netlink.Handle) error {
	l, err := h.LinkByName(f.cfg.Interface)
	if err != nil {
		return err
	}
	f.ifindex = l.Attrs().Index
	if !f.cfg.Legacy {
		at := ebpf.AttachTCXEgress
		if f.cfg.Ingress {
			at = ebpf.AttachTCXIngress
		}
		tl, err := link.AttachTCX(link.TCXOptions{Interface: f.ifindex, Program: f.objs.VrnicTcfault, Attach: at})
		if err == nil {
			f.tcx = tl
			return nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("tcx: %w", err)
		}
	}
	return f.attachClsBPF(h)
}

// attachClsBPF adds a clsact qdisc if the interface has none and a
// direct-action cls_bpf filter on its ingress or egress, with a priority
// the kernel picks; the filter is then found again by program id.
func (f *TCFaults) attachClsBPF(h *netlink.Handle) error {
	switch err := h.QdiscAdd(f.clsact()); {
	case err == nil:
		f.ownsQdisc = true
	case !errors.Is(err, unix.EEXIST):
		return fmt.Errorf("clsact qdisc: %w", err)
	}
	filter := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: f.ifindex, Parent: f.hookParent(),
		Protocol: unix.ETH_P_ALL}, Fd: f.objs.VrnicTcfault.FD(), Name: "vrnic_tcfault", DirectAction: true}
	if err := h.FilterAdd(filter); err != nil {
		f.delQdisc(h)
		return fmt.Errorf("cls_bpf filter: %w", err)
	}
	f.clsBPF = true
	if _, err := f.findFilter(h); err != nil {
		h.FilterDel(filter)
		f.delQdisc(h)
		return err
	}
	return nil
}

// hookParent is the clsact parent of the hook.
func (f *TCFaults) hookParent() uint32 {
	if f.cfg.Ingress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// findFilter returns the cls_bpf filter that runs f's program (the kernel
// picked its priority and handle).
func (f *TCFaults) findFilter(h *netlink.Handle) (*netlink.BpfFilter, error) {
	info, err := f.objs.VrnicTcfault.Info()
	if err != nil {
		return nil, err
	}
	id, _ := info.ID()
	list, err := h.FilterList(f.dummy(), f.hookParent())
	if err != nil {
		return nil, fmt.Errorf("list filters: %w", err)
	}
	for _, x := range list {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Id == int(id) {
			return b, nil
		}
	}
	return nil, fmt.Errorf("no cls_bpf filter of program %d on %s", id, f.Hook())
}

// clsact is the interface's clsact qdisc, as netlink adds and removes it.
func (f *TCFaults) clsact() netlink.Qdisc {
	return &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: f.ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
}

// dummy names the interface for netlink's per-link calls.
func (f *TCFaults) dummy() netlink.Link {
	return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: f.ifindex}}
}

// delQdisc removes the clsact qdisc attachClsBPF added, if no filter is
// left on either of its hooks (another program's filters keep it).
func (f *TCFaults) delQdisc(h *netlink.Handle) error {
	if !f.ownsQdisc {
		return nil
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		if l, err := h.FilterList(f.dummy(), parent); err != nil || len(l) > 0 {
			return err
		}
	}
	if err := h.QdiscDel(f.clsact()); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("ebpf: remove clsact qdisc: %w", err)
	}
	return nil
}

// Hook names the attachment point: "ingress" or "egress".
func (f *TCFaults) Hook() string {
	if f.cfg.Ingress {
		return "ingress"
	}
	return "egress"
}

// Mode is "tcx" or "cls_bpf", how the program is attached.
func (f *TCFaults) Mode() string {
	if f.clsBPF {
		return "cls_bpf"
	}
	return "tcx"
}

// Ifindex is the interface's index in its namespace.
func (f *TCFaults) Ifindex() int { return f.ifindex }

// ErrTCFaultsClosed is returned by the methods of a closed TCFaults.
var ErrTCFaultsClosed = errors.New("ebpf: tc fault injector closed")

// SetRules replaces the rules and resets their counters. At most
// MaxTCFaultRules; none removes every rule. An invalid rule changes
// nothing.
func (f *TCFaults) SetRules(rules []TCFaultRule) error {
	if len(rules) > MaxTCFaultRules {
		return fmt.Errorf("%w: %d rules (at most %d)", ErrConfig, len(rules), MaxTCFaultRules)
	}
	enc := make([]tcfaultTcfaultRule, MaxTCFaultRules)
	for i, r := range rules {
		var err error
		if enc[i], err = r.encode(); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrTCFaultsClosed
	}
	// Every slot is emptied (action 0) first, so no frame is counted
	// against an old rule after its counters are reset or sees a
	// half-written rule with an action; then each slot gets its counters
	// from zero and its rule (empty past the last).
	for i := range uint32(MaxTCFaultRules) {
		if err := f.objs.TcfaultRules.Put(i, tcfaultTcfaultRule{}); err != nil {
			return fmt.Errorf("ebpf: clear rule %d: %w", i, err)
		}
	}
	for i := range uint32(MaxTCFaultRules) {
		if err := f.putRule(i, enc[i]); err != nil {
			return err
		}
	}
	return nil
}

// putRule resets the counters of slot i and writes rule e there.
func (f *TCFaults) putRule(i uint32, e tcfaultTcfaultRule) error {
	if err := f.objs.TcfaultCounts.Put(i, tcfaultTcfaultCount{}); err != nil {
		return fmt.Errorf("ebpf: reset counters %d: %w", i, err)
	}
	if err := f.objs.TcfaultRules.Put(i, e); err != nil {
		return fmt.Errorf("ebpf: write rule %d: %w", i, err)
	}
	return nil
}

// Counts returns the counters of the first n rules (as SetRules numbered
// them).
func (f *TCFaults) Counts(n int) ([]TCFaultCount, error) {
	if n < 0 || n > MaxTCFaultRules {
		return nil, fmt.Errorf("%w: %d rules", ErrConfig, n)
	}
	out := make([]TCFaultCount, n)
	for i := range out {
		var c tcfaultTcfaultCount
		if err := f.objs.TcfaultCounts.Lookup(uint32(i), &c); err != nil {
			return nil, fmt.Errorf("ebpf: read counters %d: %w", i, err)
		}
		out[i] = TCFaultCount{Matched: c.Matched, Taken: c.Taken, Applied: c.Applied, Failed: c.Failed}
	}
	return out, nil
}

// Close releases f. An attachment without PinDir is detached and freed;
// a pinned one stays attached (Detach removes it).
func (f *TCFaults) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	if f.cfg.PinDir != "" {
		var err error
		if f.tcx != nil {
			err = f.tcx.Close()
		}
		return errors.Join(err, f.objs.Close())
	}
	return f.detach()
}

// Detach removes the program from the hook, removes the pins (if any)
// and frees f.
func (f *TCFaults) Detach() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return ErrTCFaultsClosed
	}
	f.closed = true
	return f.detach()
}

// detach: see Detach (f.mu held, or f not yet shared).
func (f *TCFaults) detach() error {
	var err error
	if f.tcx != nil {
		if f.cfg.PinDir != "" {
			err = f.tcx.Unpin()
		}
		err = errors.Join(err, f.tcx.Close())
	}
	if f.clsBPF {
		err = errors.Join(err, nsrun.Run(f.cfg.Netns, func(h *netlink.Handle) error {
			filter, e := f.findFilter(h)
			if e == nil {
				e = h.FilterDel(filter)
			}
			if e != nil && !errors.Is(e, unix.ENOENT) && !errors.Is(e, unix.ENODEV) {
				return fmt.Errorf("ebpf: remove cls_bpf filter: %w", e)
			}
			return f.delQdisc(h)
		}))
	}
	if f.cfg.PinDir != "" {
		if e := os.RemoveAll(f.cfg.PinDir); e != nil {
			err = errors.Join(err, fmt.Errorf("ebpf: remove pins: %w", e))
		}
	}
	return errors.Join(err, f.objs.Close())
}

// Rules returns the installed rules, in order.
func (f *TCFaults) Rules() ([]TCFaultRule, error) {
	var out []TCFaultRule
	for i := range uint32(MaxTCFaultRules) {
		var e tcfaultTcfaultRule
		if err := f.objs.TcfaultRules.Lookup(i, &e); err != nil {
			return nil, fmt.Errorf("ebpf: read rule %d: %w", i, err)
		}
		if e.Action == 0 {
			break
		}
		out = append(out, decodeRule(e))
	}
	return out, nil
}

// decodeRule is encode's inverse.
func decodeRule(e tcfaultTcfaultRule) TCFaultRule {
	r := TCFaultRule{Action: TCFaultAction(e.Action), Opcode: e.Opcode, OpcodeMask: e.OpcodeMask,
		Skip: e.Skip, Limit: e.Limit, Seed: e.Seed}
	switch r.Action {
	case TCCorrupt:
		r.CorruptOffset, r.CorruptXOR = e.CorruptOff, e.CorruptXor
	case TCDuplicate:
		r.Copies = e.Copies
	}
	if e.Flags&tcFlagQPN != 0 {
		q := e.Qpn
		r.QPN = &q
	}
	if e.Flags&tcFlagPSN != 0 {
		r.PSN = &[2]uint32{e.PsnFirst, e.PsnLast}
	}
	if e.Flags&tcFlagProb != 0 {
		r.Prob = float64(e.Prob) / (1 << 32)
	}
	return r
}

// AddRule appends r after the installed rules, with counters from zero,
// and returns its index; the others keep theirs.
func (f *TCFaults) AddRule(r TCFaultRule) (int, error) {
	e, err := r.encode()
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, ErrTCFaultsClosed
	}
	n, err := f.Rules()
	if err != nil {
		return 0, err
	}
	i := uint32(len(n))
	if i == MaxTCFaultRules {
		return 0, fmt.Errorf("%w: %d rules installed already", ErrConfig, MaxTCFaultRules)
	}
	if err := f.putRule(i, e); err != nil {
		return 0, err
	}
	return int(i), nil
}
