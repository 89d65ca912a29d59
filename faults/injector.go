package faults

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/roce"
)

// Config configures an Injector.
type Config struct {
	// Mode and Local describe the links' frames as for the engine: in
	// roce.ModeUDP a frame is a UDP payload and Local the link's
	// address (the pseudo header of a recomputed ICRC).
	Mode  roce.Mode
	Local netip.AddrPort
	// Seed seeds every decision (0: one is drawn from the clock; Seed
	// says which).
	Seed uint64
	// Logger gets a line per injected fault (at most LogLimit per rule)
	// and the rule changes.
	Logger *slog.Logger
	// LogLimit bounds the fault lines logged per rule (default 1000).
	LogLimit uint64
}

// Injector holds a device's fault rules and wraps its links. The rules
// the links read are an immutable set behind an atomic pointer, nil when
// no rule is enabled: a link then passes every frame through for the
// cost of that load. Changes build a new set under mu.
type Injector struct {
	cfg   Config
	seed  uint64
	start time.Time    // the clock of the rules: nanoseconds since start
	clock func() int64 // replaces it in tests

	set atomic.Pointer[ruleSet] // enabled rules; nil: none

	// verbs: the enabled verb rules the engine asks (VerbFault); nil:
	// none, and the engine has no VerbFaults.
	verbs atomic.Pointer[[]*rule]

	mu     sync.Mutex
	eng    VerbTarget    // AttachEngine
	port   func(up bool) // AttachPort
	rules  []*rule       // every rule, by id
	nextID uint32
	gen    uint64
}

// ruleSet is the immutable set of enabled rules the links read.
type ruleSet struct {
	gen   uint64
	rules []*rule
}

// New returns an Injector with no rule.
func New(cfg Config) *Injector {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogLimit == 0 {
		cfg.LogLimit = 1000
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	return &Injector{cfg: cfg, seed: seed, start: time.Now(), nextID: 1}
}

// Seed returns the seed of every decision.
func (inj *Injector) Seed() uint64 { return inj.seed }

// now is the rules' clock.
func (inj *Injector) now() int64 {
	if inj.clock != nil {
		return inj.clock()
	}
	return int64(time.Since(inj.start))
}

// Wrap returns l with the fault layer on it; obs, when not nil, sees
// every frame with what the rules did to it (a packet capture). The
// result implements engine.ReadyArmer (passing ArmReady on when l has
// it). The link must be used by one goroutine, as the engine's workers
// do.
func (inj *Injector) Wrap(l engine.Link, obs Observer) engine.Link {
	w := &Link{inner: l, inj: inj, obs: obs, udp: inj.cfg.Mode == roce.ModeUDP}
	if a, ok := l.(engine.ReadyArmer); ok {
		w.arm = a
	}
	return w
}

// Add installs rules (ids assigned to those with id 0) and returns them
// with their counters. Nothing is installed when one is bad.
func (inj *Injector) Add(specs []admin.FaultRule) ([]admin.FaultRuleInfo, error) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	if len(inj.rules)+len(specs) > admin.MaxFaultRules {
		return nil, fmt.Errorf("%w: at most %d rules", admin.ErrFaultRule, admin.MaxFaultRules)
	}
	now := inj.now()
	next := inj.nextID
	var added []*rule
	for _, s := range specs {
		if s.ID == 0 {
			for inj.find(next) != nil || slices.ContainsFunc(added, func(r *rule) bool { return r.id == next }) {
				next++
			}
			s.ID = next
			next++
		} else if inj.find(s.ID) != nil || slices.ContainsFunc(added, func(r *rule) bool { return r.id == s.ID }) {
			return nil, fmt.Errorf("%w: rule %d exists (use set to change it)", admin.ErrFaultRule, s.ID)
		}
		r, err := compile(s, inj.seed, now)
		if err != nil {
			return nil, err
		}
		added = append(added, r)
	}
	for _, r := range added {
		inj.nextID = max(inj.nextID, r.id+1)
		inj.rules = append(inj.rules, r)
		if r.port && !r.spec.Disabled {
			inj.startFlap(r)
		}
		inj.cfg.Logger.Info("fault rule added", "rule", r.id, "action", r.act.typ, "seed", inj.seed)
	}
	slices.SortFunc(inj.rules, func(a, b *rule) int { return int(a.id) - int(b.id) })
	inj.publish()
	return infos(added), nil
}

// Set replaces rule spec.ID by spec, keeping its counters; its
// decisions start afresh (message counts and PRNG).
func (inj *Injector) Set(spec admin.FaultRule) (admin.FaultRuleInfo, error) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	old := inj.find(spec.ID)
	if old == nil {
		return admin.FaultRuleInfo{}, fmt.Errorf("%w: no rule %d", admin.ErrFaultRule, spec.ID)
	}
	r, err := compile(spec, inj.seed, inj.now())
	if err != nil {
		return admin.FaultRuleInfo{}, err
	}
	r.matched.Store(old.matched.Load())
	r.applied.Store(old.applied.Load())
	if r.count > 0 && r.applied.Load() > r.count {
		r.applied.Store(r.count)
	}
	for i := range inj.rules {
		if inj.rules[i] == old {
			inj.rules[i] = r
		}
	}
	inj.stopFlap(old)
	if r.port && !r.spec.Disabled {
		inj.startFlap(r)
	}
	inj.cfg.Logger.Info("fault rule changed", "rule", r.id, "action", r.act.typ)
	inj.publish()
	return infos([]*rule{r})[0], nil
}

// Del removes rules by id; unknown ids are an error (and nothing is
// removed).
func (inj *Injector) Del(ids []uint32) error {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, id := range ids {
		if inj.find(id) == nil {
			return fmt.Errorf("%w: no rule %d", admin.ErrFaultRule, id)
		}
	}
	inj.rules = slices.DeleteFunc(inj.rules, func(r *rule) bool {
		gone := slices.Contains(ids, r.id)
		if gone {
			inj.stopFlap(r)
		}
		return gone
	})
	inj.cfg.Logger.Info("fault rules removed", "rules", ids)
	inj.publish()
	return nil
}

// Clear removes every rule.
func (inj *Injector) Clear() {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	for _, r := range inj.rules {
		inj.stopFlap(r)
	}
	inj.rules = nil
	inj.cfg.Logger.Info("fault rules cleared")
	inj.publish()
}

// List returns every rule with its counters, by id.
func (inj *Injector) List() []admin.FaultRuleInfo {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return infos(inj.rules)
}

func (inj *Injector) find(id uint32) *rule {
	for _, r := range inj.rules {
		if r.id == id {
			return r
		}
	}
	return nil
}

// publish stores the enabled rules for the links (mu held).
func (inj *Injector) publish() {
	inj.gen++
	var on, verbs []*rule
	for _, r := range inj.rules {
		switch {
		case r.spec.Disabled:
		case r.point != 0:
			verbs = append(verbs, r)
		default:
			on = append(on, r)
		}
	}
	if len(verbs) == 0 {
		inj.verbs.Store(nil)
	} else {
		inj.verbs.Store(&verbs)
	}
	if inj.eng != nil {
		if len(verbs) == 0 {
			inj.eng.SetVerbFaults(nil)
		} else {
			inj.eng.SetVerbFaults(inj)
		}
	}
	if len(on) == 0 {
		inj.set.Store(nil)
		return
	}
	inj.set.Store(&ruleSet{gen: inj.gen, rules: on})
}

func infos(rs []*rule) []admin.FaultRuleInfo {
	out := make([]admin.FaultRuleInfo, 0, len(rs))
	for _, r := range rs {
		out = append(out, admin.FaultRuleInfo{FaultRule: r.spec, Matched: r.matched.Load(), Applied: r.applied.Load(),
			RateDrops: r.rateDrops.Load(), RateWaitNs: r.rateWait.Load(), CEMarked: r.ceMarked.Load()})
	}
	return out
}

// faultReplyBudget keeps a list reply inside one control datagram.
const faultReplyBudget = 48 << 10

// Serve runs an operator's FaultCmd request.
func (inj *Injector) Serve(req admin.FaultRequest) (admin.FaultReply, error) {
	reply := admin.FaultReply{Seed: inj.seed, Rules: []admin.FaultRuleInfo{}}
	switch req.Op {
	case admin.FaultAdd:
		if len(req.Rules) == 0 || len(req.IDs) > 0 {
			return reply, fmt.Errorf("%w: add takes rules (and no ids)", admin.ErrFaultRule)
		}
		added, err := inj.Add(req.Rules)
		if err != nil {
			return reply, err
		}
		reply.Rules = added
	case admin.FaultSet:
		if len(req.Rules) != 1 || req.Rules[0].ID == 0 || len(req.IDs) > 0 {
			return reply, fmt.Errorf("%w: set takes one rule with its id", admin.ErrFaultRule)
		}
		r, err := inj.Set(req.Rules[0])
		if err != nil {
			return reply, err
		}
		reply.Rules = []admin.FaultRuleInfo{r}
	case admin.FaultDel:
		if len(req.IDs) == 0 || len(req.Rules) > 0 {
			return reply, fmt.Errorf("%w: del takes ids", admin.ErrFaultRule)
		}
		if err := inj.Del(req.IDs); err != nil {
			return reply, err
		}
	case admin.FaultClear:
		if len(req.IDs) > 0 || len(req.Rules) > 0 {
			return reply, fmt.Errorf("%w: clear takes nothing", admin.ErrFaultRule)
		}
		inj.Clear()
	case admin.FaultList:
		if len(req.IDs) > 0 || len(req.Rules) > 0 || req.Start < 0 {
			return reply, fmt.Errorf("%w: list takes only start", admin.ErrFaultRule)
		}
		all := inj.List()
		reply.Total = len(all)
		size := 256
		for i := req.Start; i < len(all); i++ {
			n := approxSize(all[i])
			if size+n > faultReplyBudget && len(reply.Rules) > 0 {
				reply.Next = i
				break
			}
			size += n
			reply.Rules = append(reply.Rules, all[i])
		}
	default:
		return reply, fmt.Errorf("%w: unknown operation %q (want add, list, set, del or clear)", admin.ErrFaultRule, req.Op)
	}
	return reply, nil
}

// approxSize bounds the JSON size of a rule: validated rules are small
// (bounded strings and lists).
func approxSize(r admin.FaultRuleInfo) int {
	n := 1024 + len(r.Name) + len(r.Peer) + len(r.PSN)
	for _, o := range r.Op {
		n += len(o) + 3
	}
	return n
}

// ErrScenario wraps errors of a scenario file.
var ErrScenario = errors.New("fault scenario")
