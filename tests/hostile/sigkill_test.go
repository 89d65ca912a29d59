package hostile

// Clients killed mid-traffic (issue #12): many processes of another uid,
// each with RC QPs running traffic at full speed, SIGKILLed at random
// moments of their work, in the middle of a registration or with a
// command unanswered, while a well-behaved victim on the same daemon goes
// on with RC operations whose data it checks.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSIGKILLMidTraffic: 50 clients of uid nobody, ten at a time, each
// with two RC QPs connected to each other running RDMA WRITEs and READs at
// full speed beside the victim's on the daemon's one worker, are killed
// (SIGKILL) at a point drawn from the seed: at a random moment of the
// traffic, while registering MRs and creating, connecting and destroying
// QPs, right after sending a REG_MR of a scattered 16 MiB page list, or an
// ADD_HOST_MEM of a 64 MiB memfd. Asserted: the victim completes every
// operation with its bytes checked throughout; every client got to its
// point; once they are all gone the daemon shows only the victim's
// contexts, connections and resources, holds no more descriptors than
// before and about its memory (RSS, locked) of before; it logged no
// panic.
func TestSIGKILLMidTraffic(t *testing.T) {
	e := opsSetup(t)
	seed := hostileSeed(t)
	d := e.opsStartDaemon(t, "kill0")
	v := memHelperNewVictim(t, d.socket)
	base := loadBaseline(t, d, v)
	opsBefore, _ := v.progress()

	start := time.Now()
	st := killedRun(t, e, d, seed, 50, 10)
	opsDuring, vst := v.progress()
	t.Logf("50 clients killed in %v, at %v; the victim did %d steps meanwhile, slowest command %v, longest pause %v",
		time.Since(start).Round(time.Millisecond), st.at, opsDuring-opsBefore, vst.maxCtl, vst.maxGap)
	assert.Empty(t, st.errors, "clients that did not get to their kill point")
	d.requireRunning(t)
	if vst.err != nil {
		t.Fatalf("the victim failed while the clients were killed: %v", vst.err)
	}
	assert.Greater(t, opsDuring, opsBefore, "the victim progressed")
	loadCheckRecovered(t, d, v, base)
	v.stopAndWait()
	assert.NoError(t, v.c.Close())
	d.opsCheckHealthy(t)
}
