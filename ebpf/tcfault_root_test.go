package ebpf

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/nettest"
)

const (
	tcTestQPN    = 0x123
	tcTestFrames = 300
)

// TestTCFaultsVeth: the injector on a real interface, as tcx and as a
// cls_bpf filter, on the egress of the sender's veth and on the ingress
// of the receiver's, faults real RoCE v2 traffic between two namespaces
// exactly as its rules say: seeded drops (the PSNs lost are the ones
// TCFaultTakes names), duplicates, corruption caught by the receiver's
// ICRC check, ECN CE marks. After Close every frame passes again and a
// cls_bpf attachment leaves no filter or qdisc behind.
func TestTCFaultsVeth(t *testing.T) {
	for _, mode := range []struct {
		name    string
		ingress bool
		legacy  bool
	}{
		{"tcx_egress", false, false},
		{"tcx_ingress", true, false},
		{"cls_bpf_egress", false, true},
		{"cls_bpf_ingress", true, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			p := nettest.NewVethPair(t, "vrtcf")
			cfg := TCFaultConfig{Interface: p.IfA, Netns: p.NsA, Ingress: mode.ingress, Legacy: mode.legacy}
			if mode.ingress {
				cfg.Interface, cfg.Netns = p.IfB, p.NsB
			}
			f, err := AttachTCFaults(cfg)
			require.NoError(t, err)
			closed := false
			t.Cleanup(func() {
				if !closed {
					f.Close()
				}
			})
			wantMode := "tcx"
			if mode.legacy {
				wantMode = "cls_bpf"
			}
			assert.Equal(t, wantMode, f.Mode())
			fl := p.NewFlow(t, tcTestQPN)
			every := nettest.Seq(tcTestFrames)
			qpn := uint32(tcTestQPN)

			t.Run("drop", func(t *testing.T) {
				rule := TCFaultRule{Action: TCDrop, QPN: &qpn, Prob: 0.25, Seed: 99}
				require.NoError(t, f.SetRules([]TCFaultRule{rule, {Action: TCDrop, QPN: u32(tcTestQPN + 1)}}))
				var kept []uint32
				for k := range uint32(tcTestFrames) {
					if !TCFaultTakes(rule, uint64(k)) {
						kept = append(kept, k)
					}
				}
				fl.Send(t, tcTestFrames)
				got := fl.Recv(t, len(kept))
				assert.Equal(t, kept, nettest.PSNs(got, nil), "the PSNs that arrive are those the seed spares")
				assert.Equal(t, nettest.PSNs(got, nil), nettest.PSNs(got, func(r nettest.Received) bool { return r.Valid }))
				c, err := f.Counts(2)
				require.NoError(t, err)
				dropped := uint64(tcTestFrames - len(kept))
				assert.Equal(t, TCFaultCount{Matched: tcTestFrames, Taken: dropped, Applied: dropped}, c[0])
				assert.Equal(t, TCFaultCount{}, c[1], "a rule for another QP matches nothing")
				assert.InDelta(t, 0.25*tcTestFrames, dropped, 0.08*tcTestFrames)
			})
			t.Run("duplicate", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCDuplicate, PSN: &[2]uint32{10, 19}, Copies: 2}}))
				want := slices.Clone(every)
				for psn := range uint32(10) {
					want = append(want, 10+psn, 10+psn)
				}
				slices.Sort(want)
				fl.Send(t, tcTestFrames)
				got := fl.Recv(t, len(want))
				assert.Equal(t, want, nettest.PSNs(got, nil), "PSNs 10-19 three times, the others once")
				assert.Len(t, nettest.PSNs(got, func(r nettest.Received) bool { return r.Valid }), len(want), "copies are intact")
				c, err := f.Counts(1)
				require.NoError(t, err)
				assert.Equal(t, TCFaultCount{Matched: 10, Taken: 10, Applied: 10}, c[0])
			})
			t.Run("corrupt", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCCorrupt, Skip: 5, Limit: 3, CorruptOffset: 20}}))
				fl.Send(t, tcTestFrames)
				got := fl.Recv(t, tcTestFrames)
				assert.Equal(t, every, nettest.PSNs(got, nil), "corrupted frames still arrive")
				assert.Equal(t, []uint32{5, 6, 7}, nettest.PSNs(got, func(r nettest.Received) bool { return !r.Valid }),
					"the 6th to 8th frames fail their ICRC")
				c, err := f.Counts(1)
				require.NoError(t, err)
				assert.Equal(t, TCFaultCount{Matched: tcTestFrames, Taken: tcTestFrames - 5, Applied: 3}, c[0])
			})
			t.Run("ecn", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCECN, PSN: &[2]uint32{0, 49}}}))
				fl.Send(t, tcTestFrames)
				got := fl.Recv(t, tcTestFrames)
				assert.Equal(t, every, nettest.PSNs(got, nil))
				assert.Equal(t, every[:50], nettest.PSNs(got, func(r nettest.Received) bool { return r.ECN == 3 }), "CE on PSNs 0-49")
				assert.Equal(t, every[50:], nettest.PSNs(got, func(r nettest.Received) bool { return r.ECN == 0 }), "Not-ECT on the rest")
				assert.Len(t, nettest.PSNs(got, func(r nettest.Received) bool { return r.Valid }), tcTestFrames, "the ICRC masks the ECN field")
			})
			t.Run("close", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCDrop}}))
				fl.Send(t, 10)
				assert.Empty(t, fl.Recv(t, 0), "drop everything")
				require.NoError(t, f.Close())
				closed = true
				assert.ErrorIs(t, f.SetRules(nil), ErrTCFaultsClosed)
				fl.Send(t, tcTestFrames)
				assert.Equal(t, every, nettest.PSNs(fl.Recv(t, tcTestFrames), nil), "detached: everything passes")
				assertNoClsact(t, cfg.Netns, cfg.Interface)
			})
		})
	}
}

// bpffs mounts a BPF file system on a new temporary directory (unmounted
// at cleanup) and returns it.
func bpffs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, unix.Mount("bpf", dir, "bpf", 0, ""), "mount bpffs on %s", dir)
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// TestTCFaultsPinned: a pinned attachment outlives its handle: after
// Close the rules still act, OpenTCFaults finds the rules and counters
// again and can add to them, a second attach to the same pins is
// refused, and Detach removes the program, the pins and (cls_bpf) the
// filter and qdisc.
func TestTCFaultsPinned(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			p := nettest.NewVethPair(t, "vrtcf")
			pins := filepath.Join(bpffs(t), "tfa-egress")
			cfg := TCFaultConfig{Interface: p.IfA, Netns: p.NsA, Legacy: legacy, PinDir: pins}
			f, err := AttachTCFaults(cfg)
			require.NoError(t, err)
			rule := TCFaultRule{Action: TCDrop, QPN: u32(tcTestQPN), PSN: &[2]uint32{0, 99}, Prob: 0.5, Seed: 3}
			require.NoError(t, f.SetRules([]TCFaultRule{rule}))
			require.NoError(t, f.Close(), "a pinned attachment stays")
			_, err = AttachTCFaults(cfg)
			assert.ErrorIs(t, err, ErrTCFaultsPinned)

			fl := p.NewFlow(t, tcTestQPN)
			var kept []uint32
			for k := range uint32(tcTestFrames) {
				if k >= 100 || !TCFaultTakes(rule, uint64(k)) {
					kept = append(kept, k)
				}
			}
			fl.Send(t, tcTestFrames)
			assert.Equal(t, kept, nettest.PSNs(fl.Recv(t, len(kept)), nil), "the rule acts with no handle open")

			g, err := OpenTCFaults(TCFaultConfig{Netns: p.NsA, PinDir: pins})
			require.NoError(t, err)
			assert.Equal(t, "egress", g.Hook())
			assert.Equal(t, map[bool]string{false: "tcx", true: "cls_bpf"}[legacy], g.Mode())
			rules, err := g.Rules()
			require.NoError(t, err)
			assert.Equal(t, []TCFaultRule{rule}, rules)
			i, err := g.AddRule(TCFaultRule{Action: TCECN})
			require.NoError(t, err)
			assert.Equal(t, 1, i)
			c, err := g.Counts(2)
			require.NoError(t, err)
			dropped := uint64(tcTestFrames - len(kept))
			assert.Equal(t, []TCFaultCount{{Matched: 100, Taken: dropped, Applied: dropped}, {}}, c)
			fl.Send(t, 10)
			c, err = g.Counts(2)
			require.NoError(t, err)
			assert.Equal(t, uint64(110), c[0].Matched, "counters go on")
			left := 10 - int(c[0].Applied-dropped)
			assert.Equal(t, uint64(left), c[1].Applied, "what the first rule left, the second marks")
			got := fl.Recv(t, left)
			assert.Len(t, got, left)
			assert.Len(t, nettest.PSNs(got, func(r nettest.Received) bool { return r.ECN == 3 }), left)

			require.NoError(t, g.Detach())
			_, err = os.Stat(pins)
			assert.ErrorIs(t, err, os.ErrNotExist, "pins removed")
			fl.Send(t, tcTestFrames)
			assert.Equal(t, nettest.Seq(tcTestFrames), nettest.PSNs(fl.Recv(t, tcTestFrames), nil), "detached")
			assertNoClsact(t, p.NsA, p.IfA)
		})
	}
}

// assertNoClsact checks that interface dev in ns has no clsact qdisc
// (the one the injector added is gone).
func assertNoClsact(t *testing.T, ns netns.NsHandle, dev string) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer h.Close()
	l, err := h.LinkByName(dev)
	require.NoError(t, err)
	qs, err := h.QdiscList(l)
	require.NoError(t, err)
	for _, q := range qs {
		assert.NotEqual(t, "clsact", q.Type(), "the clsact qdisc the injector added is gone")
	}
}
