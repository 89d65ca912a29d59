package tap

import (
	"os/exec"
	"testing"

	"github.com/vrnic/vrnic/internal/mwprogs"
)

// TestFabricOverTAP runs libfabric's verbs provider (Debian's fi_info and
// fi_pingpong, the cases of internal/mwprogs) through vrnic-run between
// the two TAP daemons of the package's topology: fi_info lists MSG, DGRAM
// and both RDM endpoints for each device (whose address no interface of
// the host namespace holds: vrnic-run's interface vrnic-DEV carries it),
// and fi_pingpong runs 10 times in a row over each endpoint type.
// fi_pingpong also reaches its peer's address over TCP for its own
// exchange, and the TAP addresses belong to the daemons, not to a kernel
// interface: its two processes run in a namespace of their own whose
// loopback interface holds both addresses, so that TCP reaches them
// there (the verbs provider skips loopback interfaces: vrnic-run's
// vrnic-DEV interfaces carry the addresses for it, as on the UDP link).
func TestFabricOverTAP(t *testing.T) {
	tp := newTopo(t)
	progNS := tp.pfx + "c"
	ipCmd(t, "netns", "add", progNS)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", progNS).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", progNS, err, out)
		}
	})
	ipCmd(t, "-n", progNS, "link", "set", "lo", "up")
	ipCmd(t, "-n", progNS, "addr", "add", addrA+"/32", "dev", "lo")
	ipCmd(t, "-n", progNS, "addr", "add", addrB+"/32", "dev", "lo")
	e := tp.mwEnv(t, "fa", "fb")
	e.Netns = progNS
	for _, d := range e.Devs {
		t.Run("fi_info/"+d, func(t *testing.T) { mwprogs.FIInfo(t, e, d) })
	}
	mwprogs.FIPingpongSuite(t, e, 10)
}
