package loss

import (
	"fmt"
	"strconv"
)

// Condition is a loss condition: the rules each injector installs for it.
type Condition struct {
	// Key names it in logs and in environment variables (none, drop0.1,
	// drop1, mix); Label in the tables.
	Key, Label string
	// Drop: the probability of dropping a request (0 for none, whose
	// rules drop nothing, and mix).
	Drop float64
	// Mix: 5% dropped each way, plus duplicates, reordering, 1% corrupt.
	Mix bool
}

// The conditions of the table.
var (
	Clean  = Condition{Key: "none", Label: "none"}
	Drop01 = Condition{Key: "drop0.1", Label: "0.1%", Drop: 0.001}
	Drop1  = Condition{Key: "drop1", Label: "1%", Drop: 0.01}
	Mix    = Condition{Key: "mix", Label: "5% each way, plus duplicates, reordering, 1% corruption", Mix: true}
)

// Conditions is every condition, the baseline first.
var Conditions = []Condition{Clean, Drop01, Drop1, Mix}

// The mix's probabilities.
const (
	mixDrop      = 0.05
	mixCorrupt   = 0.01
	mixDuplicate = 0.01
	mixReorder   = 0.01
)

// Rule names of the daemon rules (the name= of vrnicctl fault add), by
// what they do to the frames of the side that sends them.
const (
	ruleDrop      = "drop"
	ruleCorrupt   = "corrupt"
	ruleDuplicate = "duplicate"
	ruleReorder   = "reorder"
)

func prob(p float64) string { return strconv.FormatFloat(p, 'g', -1, 64) }

// DaemonRules returns the vrnicctl fault add arguments of the condition,
// one list per rule, the same on both daemons (each rule acts on what its
// daemon sends: dir=tx). The ids are fixed, so a rule's seeded decisions
// start over each time it is installed.
func (c Condition) DaemonRules() [][]string {
	switch {
	case c.Mix:
		return [][]string{
			{"id=1", "name=" + ruleDrop, "dir=tx", "prob=" + prob(mixDrop), "action=drop"},
			{"id=2", "name=" + ruleCorrupt, "dir=tx", "prob=" + prob(mixCorrupt), "action=corrupt", "field=payload"},
			{"id=3", "name=" + ruleDuplicate, "dir=tx", "prob=" + prob(mixDuplicate), "action=duplicate"},
			{"id=4", "name=" + ruleReorder, "dir=tx", "prob=" + prob(mixReorder), "action=reorder", "frames=3"},
		}
	}
	// Clean installs the drop rule too, with probability 0 (it matches
	// every request and drops none), so that what the injector costs per
	// frame is in the baseline the lossy runs are divided by.
	return [][]string{{"id=1", "name=" + ruleDrop, "dir=tx", "op=request", "prob=" + prob(c.Drop), "action=drop"}}
}

// requestOps are the RC request opcodes as tc rules match them
// (opcode/mask): SEND FIRST .. ONLY with immediate and RDMA WRITE FIRST
// and MIDDLE (0x00-0x07), RDMA WRITE LAST .. ONLY with immediate
// (0x08-0x0b), RDMA READ request (0x0c), the two atomics (0x13, 0x14),
// SEND LAST and ONLY with invalidate (0x16, 0x17).
var requestOps = []string{"0x00/0xf8", "0x08/0xfc", "0x0c", "0x13", "0x14", "0x16/0xfe"}

// KernelRules returns the vrnicctl tcfault add arguments of the
// condition (after dev=, hook=, netns=), one list per rule, in the order
// the program tries them. Rule i draws from seed+i.
func (c Condition) KernelRules(seed uint64) [][]string {
	var rs [][]string
	add := func(kv ...string) {
		rs = append(rs, append(kv, fmt.Sprintf("seed=%d", seed+uint64(len(rs)))))
	}
	switch {
	case c.Mix:
		add("action=drop", "op=rc", "prob="+prob(mixDrop))
		add("action=corrupt", "op=rc", "offset=-5", "prob="+prob(mixCorrupt)) // the last byte before the ICRC
		add("action=duplicate", "op=rc", "prob="+prob(mixDuplicate))
	case c.Drop > 0:
		// (Clean installs none: the program stays attached, and a rule
		// costs it a few instructions per frame.)
		for _, op := range requestOps {
			add("action=drop", "op="+op, "prob="+prob(c.Drop))
		}
	}
	return rs
}
