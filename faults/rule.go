package faults

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/roce"
)

// rule is a compiled admin.FaultRule with the state its decisions share
// across the links (workers): counters, the count limit, the PRNG, the
// rate limiter, the link-down deadline.
type rule struct {
	spec admin.FaultRule
	id   uint32

	tx, rx  bool
	peer    netip.Prefix // invalid: any
	qpn     int64        // -1: any
	srcQPN  int64        // -1: any
	ops     *[256]uint8  // nil: any opcode; else opMatch bits per opcode
	psnLo   uint32
	psnHi   uint32
	hasPSN  bool
	msgKind kind // kindNone: no message filter
	msgIdx  uint64
	msgPkt  uint64
	roundLo uint32
	roundHi uint32
	hasRnd  bool
	prob    float64
	count   uint64
	after   int64 // nanoseconds since installed
	until   int64 // 0: no end
	act     action

	installed int64 // on the injector's clock

	matched atomic.Uint64
	applied atomic.Uint64
	logged  atomic.Uint64
	// rate: frames dropped, total wait (ns), frames marked CE.
	rateDrops, rateWait, ceMarked atomic.Uint64

	// downUntil is the end of a link-down period (injector clock; 0:
	// the link is up).
	downUntil atomic.Int64

	// Verb rules: the engine point (0: a frame rule or port_flap), the
	// CQ filter (-1: any); port_flap: its period and timers.
	point            engine.VerbPoint
	cq               int64
	port             bool
	downFrom         int64
	flapDown, flapUp *time.Timer

	mu  sync.Mutex // guards rng and tat
	rng *rand.Rand
	tat int64 // rate: theoretical arrival time of the next frame
}

// opMatch bits of rule.ops: opAny matches every frame of the opcode;
// for ACKNOWLEDGE, bit 1<<(1+syndrome kind) matches that kind only.
const opAny = 1

// action is a compiled admin.FaultAction.
type action struct {
	typ     string
	copies  int
	frames  int
	hold    int64 // reorder: longest hold; rate: longest wait; down: period
	dist    string
	delay   int64 // fixed delay or normal mean
	lo, hi  int64 // uniform
	stddev  int64
	field   string
	offset  int // -1: drawn
	mask    uint8
	fixICRC bool
	bps     uint64
	pps     uint64
	burst   int
	ceAbove int64 // rate: mark CE on frames waiting longer (0: never)
	verb    string
}

// opSet returns the opMatch bits of an opcode name or class.
func opSet(name string) (*[256]uint8, error) {
	var s [256]uint8
	if op, ok := roce.OpcodeByName(name); ok {
		s[op] = opAny
		return &s, nil
	}
	if strings.HasPrefix(name, "0x") {
		if n, err := strconv.ParseUint(name[2:], 16, 8); err == nil && roce.Opcode(n).Valid() {
			s[n] = opAny
			return &s, nil
		}
	}
	syn := func(k roce.SyndromeKind) uint8 { return 1 << (1 + k) }
	found := true
	for i := range 256 {
		op := roce.Opcode(i)
		if !op.Valid() {
			continue
		}
		f := op.Info().Flags
		var hit uint8
		switch name {
		case "request":
			hit = b2u(f&roce.OpRequest != 0)
		case "response":
			hit = b2u(f&roce.OpResponse != 0)
		case "ack":
			if op == roce.OpRCAck {
				hit = syn(roce.SyndromeACK)
			}
		case "nak":
			if op == roce.OpRCAck {
				hit = syn(roce.SyndromeNAK) | syn(roce.SyndromeRNRNAK)
			}
		case "rnr_nak":
			if op == roce.OpRCAck {
				hit = syn(roce.SyndromeRNRNAK)
			}
		case "read_response":
			hit = b2u(f&(roce.OpRead|roce.OpResponse) == roce.OpRead|roce.OpResponse)
		case "atomic":
			hit = b2u(f&(roce.OpAtomic|roce.OpRequest) == roce.OpAtomic|roce.OpRequest)
		case "atomic_ack":
			hit = b2u(op == roce.OpRCAtomicAck)
		case "send":
			hit = b2u(f&roce.OpSend != 0)
		case "write":
			hit = b2u(f&roce.OpWrite != 0)
		case "read":
			hit = b2u(f&(roce.OpRead|roce.OpRequest) == roce.OpRead|roce.OpRequest)
		case "cnp":
			hit = b2u(op == roce.OpCNP)
		default:
			found = false
		}
		s[i] = hit
	}
	if !found {
		return nil, fmt.Errorf("opcode %q: want an opcode name (e.g. RC_RDMA_WRITE_FIRST), 0xNN, or one of %s",
			name, strings.Join(admin.FaultOpClasses, ", "))
	}
	return &s, nil
}

func b2u(b bool) uint8 {
	if b {
		return opAny
	}
	return 0
}

// ruleSeed mixes the injector's seed and a rule id into a PCG seed pair
// (SplitMix64 steps), so that rules of one seed draw independent streams.
func ruleSeed(seed uint64, id uint32) (uint64, uint64) {
	mix := func(x uint64) uint64 {
		x += 0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		return x ^ x>>31
	}
	a := mix(seed ^ uint64(id)<<32)
	return a, mix(a ^ uint64(id))
}

// compile validates spec and builds its rule; now is the injector's
// clock at install.
func compile(spec admin.FaultRule, seed uint64, now int64) (*rule, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	r := &rule{spec: spec, id: spec.ID, qpn: -1, srcQPN: -1, cq: -1, prob: 1, count: spec.Count, installed: now}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: rule %d: %s", admin.ErrFaultRule, spec.ID, fmt.Sprintf(format, a...))
	}
	r.tx = spec.Dir != "rx"
	r.rx = spec.Dir != "tx"
	if spec.Peer != "" {
		r.peer, _ = admin.ParseFaultPeer(spec.Peer)
	}
	if spec.QPN != nil {
		r.qpn = int64(*spec.QPN)
	}
	if spec.SrcQPN != nil {
		r.srcQPN = int64(*spec.SrcQPN)
	}
	if spec.CQ != nil {
		r.cq = int64(*spec.CQ)
	}
	for _, o := range spec.Op {
		s, err := opSet(o)
		if err != nil {
			return nil, bad("%v", err)
		}
		if r.ops == nil {
			r.ops = new([256]uint8)
		}
		for i := range s {
			r.ops[i] |= s[i]
		}
	}
	if spec.PSN != "" {
		r.psnLo, r.psnHi, _ = admin.ParseFaultPSN(spec.PSN)
		r.hasPSN = true
	}
	if m := spec.Message; m != nil {
		r.msgKind, r.msgIdx, r.msgPkt = kindByName(m.Kind), m.Index, m.Packet
	}
	if spec.Round != "" {
		r.roundLo, r.roundHi, _ = admin.ParseFaultRound(spec.Round)
		r.hasRnd = true
	}
	if spec.Probability != nil {
		r.prob = *spec.Probability
	}
	r.after = int64(admin.FaultDuration(spec.After))
	r.until = int64(admin.FaultDuration(spec.Until))
	a := spec.Action
	c := action{typ: a.Type, copies: max(1, a.Copies), frames: a.Frames, field: a.Field, offset: -1, mask: a.Mask,
		fixICRC: a.FixICRC, bps: a.BPS, pps: a.PPS, burst: max(1, a.Burst), dist: a.Dist, verb: a.Verb}
	if a.Type == "verb" {
		r.point, r.port = verbPoints[a.Verb], a.Verb == "port_flap"
	}
	if a.Offset != nil {
		c.offset = *a.Offset
	}
	if c.field == "" {
		c.field = "payload"
	}
	if c.dist == "" {
		c.dist = "fixed"
	}
	c.hold = int64(admin.FaultDuration(a.For))
	c.ceAbove = int64(admin.FaultDuration(a.CEAbove))
	switch a.Type {
	case "reorder":
		if c.frames == 0 {
			c.frames = 3
		}
		if c.hold == 0 {
			c.hold = int64(time.Millisecond)
		}
	case "rate":
		if c.hold == 0 {
			c.hold = int64(100 * time.Millisecond)
		}
	}
	c.delay = int64(admin.FaultDuration(a.Delay))
	c.lo, c.hi = int64(admin.FaultDuration(a.Min)), int64(admin.FaultDuration(a.Max))
	c.stddev = int64(admin.FaultDuration(a.Stddev))
	r.act = c
	s1, s2 := ruleSeed(seed, spec.ID)
	r.rng = rand.New(rand.NewPCG(s1, s2))
	return r, nil
}

// filter reports whether the frame of v, in direction tx, passes the
// rule's filters other than the message and the round (which need the
// flow's tracking).
func (r *rule) filter(v *view, tx bool) bool {
	if tx && !r.tx || !tx && !r.rx {
		return false
	}
	if r.peer.IsValid() && !r.peer.Contains(v.peer) {
		return false
	}
	if r.qpn >= 0 && int64(v.qpn) != r.qpn || r.srcQPN >= 0 && v.src != r.srcQPN {
		return false
	}
	if r.ops != nil {
		m := r.ops[v.op]
		if m&opAny == 0 && (v.op != roce.OpRCAck || m&(1<<(1+v.syn)) == 0) {
			return false
		}
	}
	if r.hasPSN && (v.psn < r.psnLo || v.psn > r.psnHi) {
		return false
	}
	return true
}

// draw reports whether a matching frame is picked (probability).
func (r *rule) draw() bool {
	if r.prob >= 1 {
		return true
	}
	if r.prob <= 0 {
		return false
	}
	r.mu.Lock()
	hit := r.rng.Float64() < r.prob
	r.mu.Unlock()
	return hit
}

// take counts one application against the count limit; false when the
// limit is reached.
func (r *rule) take() bool {
	if r.count == 0 {
		r.applied.Add(1)
		return true
	}
	for {
		n := r.applied.Load()
		if n >= r.count {
			return false
		}
		if r.applied.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// intN draws from [0, n) with the rule's PRNG.
func (r *rule) intN(n int64) int64 {
	if n <= 1 {
		return 0
	}
	r.mu.Lock()
	v := r.rng.Int64N(n)
	r.mu.Unlock()
	return v
}

// delayFor draws the delay of one frame.
func (r *rule) delayFor() int64 {
	a := &r.act
	switch a.dist {
	case "uniform":
		return a.lo + r.intN(a.hi-a.lo+1)
	case "normal":
		r.mu.Lock()
		d := float64(a.delay) + float64(a.stddev)*r.rng.NormFloat64()
		r.mu.Unlock()
		return int64(math.Max(0, math.Min(d, float64(10*time.Second))))
	}
	return a.delay
}

// rateSlot returns when a frame of n bytes may leave under the rule's
// rate (GCRA), or -1 when it would wait longer than the action's hold.
func (r *rule) rateSlot(now int64, n int) int64 {
	a := &r.act
	var interval int64
	if a.pps > 0 {
		interval = int64(time.Second) / int64(a.pps)
	} else {
		interval = int64(float64(n*8) * float64(time.Second) / float64(a.bps))
	}
	tolerance := int64(a.burst-1) * interval
	r.mu.Lock()
	defer r.mu.Unlock()
	tat := max(r.tat, now)
	at := max(now, tat-tolerance)
	if at-now > a.hold {
		return -1
	}
	r.tat = tat + interval
	return at
}
