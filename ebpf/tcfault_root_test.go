package ebpf

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
)

// vethPair is two network namespaces joined by a veth pair: tfa in A
// (10.81.0.1) and tfb in B (10.81.0.2). Removed at cleanup.
type vethPair struct {
	nsA, nsB netns.NsHandle
	a, b     netip.Addr
}

func newVethPair(t *testing.T) *vethPair {
	t.Helper()
	testenv.NeedRoot(t, "needs root (network namespaces, veth, tc programs)")
	testenv.NeedTool(t, "ip")
	names := [2]string{fmt.Sprintf("vrtcfa%d", os.Getpid()), fmt.Sprintf("vrtcfb%d", os.Getpid())}
	ip := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		require.NoError(t, err, "ip %v: %s", args, out)
	}
	for _, n := range names {
		ip("netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
	}
	ip("-n", names[0], "link", "add", "tfa", "type", "veth", "peer", "name", "tfb", "netns", names[1])
	ip("-n", names[0], "addr", "add", "10.81.0.1/24", "dev", "tfa")
	ip("-n", names[1], "addr", "add", "10.81.0.2/24", "dev", "tfb")
	ip("-n", names[0], "link", "set", "tfa", "up")
	ip("-n", names[1], "link", "set", "tfb", "up")
	p := &vethPair{a: netip.MustParseAddr("10.81.0.1"), b: netip.MustParseAddr("10.81.0.2")}
	var err error
	p.nsA, err = netns.GetFromName(names[0])
	require.NoError(t, err)
	t.Cleanup(func() { p.nsA.Close() })
	p.nsB, err = netns.GetFromName(names[1])
	require.NoError(t, err)
	t.Cleanup(func() { p.nsB.Close() })
	return p
}

// udpSocketIn returns a UDP socket created in ns and bound to addr:port
// (closed at cleanup), with a 4 MiB receive buffer and IP_RECVTOS.
func udpSocketIn(t *testing.T, ns netns.NsHandle, addr netip.Addr, port uint16) int {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			ch <- result{-1, err}
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		}
		if err == nil {
			err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		}
		if err == nil {
			err = unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)})
		}
		ch <- result{fd, err}
	}()
	r := <-ch
	require.NoError(t, r.err)
	t.Cleanup(func() { unix.Close(r.fd) })
	return r.fd
}

const (
	tcTestQPN     = 0x123
	tcTestSrcPort = 50000
	tcTestFrames  = 300
)

// sendFrames sends frames PSN 0..n-1 to QP tcTestQPN from A to B: RC
// SEND_ONLY of 64 bytes, ICRC over the UDP pseudo header.
func (p *vethPair) sendFrames(t *testing.T, fd, n int) {
	t.Helper()
	path := &roce.Path{Mode: roce.ModeUDP, Src: p.a, Dst: p.b, SrcPort: tcTestSrcPort, DstPort: roce.UDPPort}
	to := &unix.SockaddrInet4{Addr: p.b.As4(), Port: roce.UDPPort}
	buf := make([]byte, 512)
	for psn := range uint32(n) {
		h := &roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: tcTestQPN, PSN: psn}}
		off := path.Headroom(h.BTH.Opcode)
		for i := range 64 {
			buf[off+i] = byte(psn) + byte(i)
		}
		f, err := path.Build(buf, off, 64, h)
		require.NoError(t, err)
		require.NoError(t, unix.Sendto(fd, f, 0, to))
	}
}

// received is one datagram B got: its PSN, whether its ICRC held, and
// its IP ECN field.
type received struct {
	psn   uint32
	valid bool
	ecn   byte
}

// recvFrames reads datagrams on fd until want arrived or 10 s passed,
// then any more that come within 100 ms (too many must be seen).
func (p *vethPair) recvFrames(t *testing.T, fd, want int) []received {
	t.Helper()
	ps := &roce.Pseudo{Src: p.a, SrcPort: tcTestSrcPort, Dst: p.b, DstPort: roce.UDPPort}
	buf, oob := make([]byte, 2048), make([]byte, 256)
	var got []received
	deadline := time.Now().Add(10 * time.Second)
	for {
		wait := time.Until(deadline)
		if len(got) >= want {
			wait = 100 * time.Millisecond
		}
		if wait <= 0 {
			return got
		}
		tv := unix.NsecToTimeval(wait.Nanoseconds())
		require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv))
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
		if err == unix.EAGAIN || err == unix.EWOULDBLOCK {
			return got
		}
		require.NoError(t, err)
		r := received{ecn: 0xff}
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		require.NoError(t, err)
		for _, c := range cms {
			if c.Header.Level == unix.IPPROTO_IP && c.Header.Type == unix.IP_TOS && len(c.Data) > 0 {
				r.ecn = c.Data[0] & 3
			}
		}
		var pkt roce.Packet
		err = roce.ParseUDP(buf[:n], ps, &pkt)
		r.valid = err == nil
		require.GreaterOrEqual(t, n, roce.BTHLen)
		r.psn = roce.BTH(buf[:n]).PSN()
		got = append(got, r)
		if len(got) > want+tcTestFrames {
			return got
		}
	}
}

func psns(rs []received, keep func(received) bool) []uint32 {
	var out []uint32
	for _, r := range rs {
		if keep(r) {
			out = append(out, r.psn)
		}
	}
	slices.Sort(out)
	return out
}

func all(received) bool { return true }

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
			p := newVethPair(t)
			cfg := TCFaultConfig{Interface: "tfa", Netns: p.nsA, Ingress: mode.ingress, Legacy: mode.legacy}
			if mode.ingress {
				cfg.Interface, cfg.Netns = "tfb", p.nsB
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
			tx := udpSocketIn(t, p.nsA, p.a, tcTestSrcPort)
			rx := udpSocketIn(t, p.nsB, p.b, roce.UDPPort)
			every := make([]uint32, tcTestFrames)
			for i := range every {
				every[i] = uint32(i)
			}
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
				p.sendFrames(t, tx, tcTestFrames)
				got := p.recvFrames(t, rx, len(kept))
				assert.Equal(t, kept, psns(got, all), "the PSNs that arrive are those the seed spares")
				assert.Equal(t, psns(got, all), psns(got, func(r received) bool { return r.valid }))
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
				p.sendFrames(t, tx, tcTestFrames)
				got := p.recvFrames(t, rx, len(want))
				assert.Equal(t, want, psns(got, all), "PSNs 10-19 three times, the others once")
				assert.Len(t, psns(got, func(r received) bool { return r.valid }), len(want), "copies are intact")
				c, err := f.Counts(1)
				require.NoError(t, err)
				assert.Equal(t, TCFaultCount{Matched: 10, Taken: 10, Applied: 10}, c[0])
			})
			t.Run("corrupt", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCCorrupt, Skip: 5, Limit: 3, CorruptOffset: 20}}))
				p.sendFrames(t, tx, tcTestFrames)
				got := p.recvFrames(t, rx, tcTestFrames)
				assert.Equal(t, every, psns(got, all), "corrupted frames still arrive")
				assert.Equal(t, []uint32{5, 6, 7}, psns(got, func(r received) bool { return !r.valid }),
					"the 6th to 8th frames fail their ICRC")
				c, err := f.Counts(1)
				require.NoError(t, err)
				assert.Equal(t, TCFaultCount{Matched: tcTestFrames, Taken: tcTestFrames - 5, Applied: 3}, c[0])
			})
			t.Run("ecn", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCECN, PSN: &[2]uint32{0, 49}}}))
				p.sendFrames(t, tx, tcTestFrames)
				got := p.recvFrames(t, rx, tcTestFrames)
				assert.Equal(t, every, psns(got, all))
				assert.Equal(t, every[:50], psns(got, func(r received) bool { return r.ecn == 3 }), "CE on PSNs 0-49")
				assert.Equal(t, every[50:], psns(got, func(r received) bool { return r.ecn == 0 }), "Not-ECT on the rest")
				assert.Len(t, psns(got, func(r received) bool { return r.valid }), tcTestFrames, "the ICRC masks the ECN field")
			})
			t.Run("close", func(t *testing.T) {
				require.NoError(t, f.SetRules([]TCFaultRule{{Action: TCDrop}}))
				p.sendFrames(t, tx, 10)
				assert.Empty(t, p.recvFrames(t, rx, 0), "drop everything")
				require.NoError(t, f.Close())
				closed = true
				assert.ErrorIs(t, f.SetRules(nil), ErrTCFaultsClosed)
				p.sendFrames(t, tx, tcTestFrames)
				assert.Equal(t, every, psns(p.recvFrames(t, rx, tcTestFrames), all), "detached: everything passes")
				h, err := netlink.NewHandleAt(cfg.Netns)
				require.NoError(t, err)
				defer h.Close()
				l, err := h.LinkByName(cfg.Interface)
				require.NoError(t, err)
				qs, err := h.QdiscList(l)
				require.NoError(t, err)
				for _, q := range qs {
					assert.NotEqual(t, "clsact", q.Type(), "the clsact qdisc the injector added is gone")
				}
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
			p := newVethPair(t)
			pins := filepath.Join(bpffs(t), "tfa-egress")
			cfg := TCFaultConfig{Interface: "tfa", Netns: p.nsA, Legacy: legacy, PinDir: pins}
			f, err := AttachTCFaults(cfg)
			require.NoError(t, err)
			rule := TCFaultRule{Action: TCDrop, QPN: u32(tcTestQPN), PSN: &[2]uint32{0, 99}, Prob: 0.5, Seed: 3}
			require.NoError(t, f.SetRules([]TCFaultRule{rule}))
			require.NoError(t, f.Close(), "a pinned attachment stays")
			_, err = AttachTCFaults(cfg)
			assert.ErrorIs(t, err, ErrTCFaultsPinned)

			tx := udpSocketIn(t, p.nsA, p.a, tcTestSrcPort)
			rx := udpSocketIn(t, p.nsB, p.b, roce.UDPPort)
			var kept []uint32
			for k := range uint32(tcTestFrames) {
				if k >= 100 || !TCFaultTakes(rule, uint64(k)) {
					kept = append(kept, k)
				}
			}
			p.sendFrames(t, tx, tcTestFrames)
			assert.Equal(t, kept, psns(p.recvFrames(t, rx, len(kept)), all), "the rule acts with no handle open")

			g, err := OpenTCFaults(TCFaultConfig{Netns: p.nsA, PinDir: pins})
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
			p.sendFrames(t, tx, 10)
			c, err = g.Counts(2)
			require.NoError(t, err)
			assert.Equal(t, uint64(110), c[0].Matched, "counters go on")
			left := 10 - int(c[0].Applied-dropped)
			assert.Equal(t, uint64(left), c[1].Applied, "what the first rule left, the second marks")
			got := p.recvFrames(t, rx, left)
			assert.Len(t, got, left)
			assert.Len(t, psns(got, func(r received) bool { return r.ecn == 3 }), left)

			require.NoError(t, g.Detach())
			_, err = os.Stat(pins)
			assert.ErrorIs(t, err, os.ErrNotExist, "pins removed")
			p.sendFrames(t, tx, tcTestFrames)
			assert.Equal(t, psns(p.recvFrames(t, rx, tcTestFrames), all), func() []uint32 {
				e := make([]uint32, tcTestFrames)
				for i := range e {
					e[i] = uint32(i)
				}
				return e
			}(), "detached")
			h, err := netlink.NewHandleAt(p.nsA)
			require.NoError(t, err)
			defer h.Close()
			l, err := h.LinkByName("tfa")
			require.NoError(t, err)
			qs, err := h.QdiscList(l)
			require.NoError(t, err)
			for _, q := range qs {
				assert.NotEqual(t, "clsact", q.Type())
			}
		})
	}
}
