// Package congestion holds the RoCE v2 congestion-control scenario:
// several vrnicd daemons, each in its own network namespace, write into
// one receiver through a bottleneck, once without congestion control and
// once with DCQCN, and the test compares what the QPs got. It needs root
// (network namespaces) and skips with a message otherwise.
//
// # Topology
//
//	netns <p>s1: vrnicd s1 ─┐
//	netns <p>s2: vrnicd s2 ─┼── br0 (netns <p>br) ── vrnicd r :netns <p>r
//	netns <p>s3: vrnicd s3 ─┘
//
// The daemons use the UDP link on 10.144.0.0/24 (veth pairs into a
// bridge). The bottleneck is the receiver's: a fault rule on its receive
// side (action rate: a queue served at a fixed rate, dropping what would
// wait longer than its limit, marking CE on what waits longer than a
// threshold K, as a switch queue configured for DCQCN does). The kernel
// this runs on offers no AQM qdisc with ECN marking (no red, fq_codel,
// pie), so the marking queue is the fault layer's; with one, a tc qdisc
// on the receiver's bridge port would do the same (the UDP link reads the
// IP ECN field: link/udp_ecn.go).
package congestion

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// bin holds the binaries TestMain built (empty when skipping).
var bin string

// skipReason is why the scenario cannot run here ("" when it can).
var skipReason string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if !testenv.IsRoot() {
			skipReason = "the congestion scenario needs root (network namespaces)"
		} else if _, err := exec.LookPath("ip"); err != nil {
			skipReason = "the congestion scenario needs ip(8)"
		}
		if skipReason != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "cc-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"vrnicd", "vrnicctl", "vrnic-perf"} {
			if _, err := launch.GoBuild("github.com/vrnic/vrnic/cmd/"+pkg, dir, pkg, os.Stderr); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		bin = dir
		return m.Run()
	}())
}
