package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// BenchmarkUDPWrite measures RDMA WRITE between two vrnicd daemons joined
// by the UDP link on two loopback addresses (one worker each, vrnic-perf
// write_bw, path MTU 4096, data verified) against the raw UDP baselines
// of rawudp_test.go on the same two addresses, which move frames of the
// size the WRITEs put on the wire:
//
//   - 1MiB: 1 MiB WRITEs, 8 in flight; goodput (payload bytes per second)
//     against 4096 payload bytes per 4112-byte frame (BTH, payload,
//     ICRC: a WRITE Middle) of the baseline.
//   - 8B: 8-byte WRITEs, 128 in flight; messages per second against
//     40-byte frames per second (BTH, RETH, 8 bytes, ICRC: a WRITE Only).
//
// Each runs with a client that busy-polls its CQ (poll, as perftest
// does; it gives its CPU away every 64 empty polls) and one that waits
// for completion events (events): on two cores shared by two daemons the
// polling client takes time the daemons need, and the baselines have no
// client at all.
//
// Every iteration is one round: the baselines (sendmmsg/recvmmsg;
// UDP_SEGMENT/UDP_GRO; UDP_SEGMENT/UDP_GRO with the per-frame work of
// building, checking and placing the frames, rawGSOWork; the same with
// only the two copies, rawGSOCopy), the vrnic run, the baselines again;
// each baseline's figure is the mean of its two runs (the machine drifts
// within a round). Reported per sub-benchmark: vrnic's rate, the
// baselines' and vrnic's ratio to each (ratio-mmsg, ratio-gso,
// ratio-gso+work, ratio-gso+copy), averaged over the rounds; -benchtime
// 1x -count N gives N rounds as N lines.
func BenchmarkUDPWrite(b *testing.B) {
	// The default on a loopback address: UDP_SEGMENT and UDP_GRO.
	b.Run("default", func(b *testing.B) { benchUDPWrite(b) })
	// One datagram per frame (sendmmsg/recvmmsg batches, GRO receive),
	// the IPv4 default off loopback.
	b.Run("no-segment", func(b *testing.B) { benchUDPWrite(b, "-udp-segment-ipv4=false") })
}

func benchUDPWrite(b *testing.B, extra ...string) {
	a, c, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(b, err)
	da := startDaemon(b, "bench-udpw-a", append([]string{"-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String()}, extra...)...)
	dc := startDaemon(b, "bench-udpw-b", append([]string{"-link", "udp", "-local", netip.AddrPortFrom(c, launch.RoCEPort).String()}, extra...)...)
	for _, tc := range []struct {
		name         string
		size, depth  int
		frame, goods int // baseline frame length, and what counts of it
	}{
		{"1MiB", 1 << 20, 8, 4112, 4096},
		{"8B", 8, 128, 40, 1},
	} {
		for _, cl := range []struct {
			name string
			args []string
		}{{"poll", nil}, {"events", []string{"-events"}}} {
			b.Run(tc.name+"/"+cl.name, func(b *testing.B) { benchUDPWriteCase(b, da, dc, a, c, tc.size, tc.depth, tc.frame, tc.goods, cl.args) })
		}
	}
}

// benchUDPWriteCase is one sub-benchmark of BenchmarkUDPWrite: write_bw of
// size bytes at depth between da and dc (vrnic-perf with the client
// arguments cl), against the baselines of frame-byte frames between a
// and c, goods of each frame counting (payload bytes, or 1 per message).
func benchUDPWriteCase(b *testing.B, da, dc *daemon, a, c netip.Addr, size, depth, frame, goods int, cl []string) {
	const vrnicTime, rawTime = 2 * time.Second, time.Second
	modes := []rawMode{rawMmsg, rawGSO, rawGSOWork, rawGSOCopy}
	var base, ratio, sum [4]float64
	var vsum float64
	for range b.N {
		base = [4]float64{}
		for _, m := range modes {
			base[m] += rawUDP(b, a, c, frame, m, rawTime) / 2
		}
		rs := perfJSON(b, da.sock, dc.sock, append([]string{"-test", "write_bw", "-size", strconv.Itoa(size),
			"-depth", strconv.Itoa(depth), "-duration", vrnicTime.String()}, cl...)...)
		require.Len(b, rs, 1)
		for _, m := range modes {
			base[m] += rawUDP(b, a, c, frame, m, rawTime) / 2
		}
		v := rs[0].MBps * 1e6 // goodput
		if goods == 1 {
			v = rs[0].Mops * 1e6
		}
		vsum += v
		msg := fmt.Sprintf("%d B %q: vrnic %.4g", size, cl, v)
		for _, m := range modes {
			base[m] *= float64(goods)
			sum[m] += base[m]
			ratio[m] += v / base[m]
			msg += fmt.Sprintf(", raw %s %.4g (ratio %.2f)", m, base[m], v/base[m])
		}
		b.Logf("%s; gso+work/gso %.2f, gso+copy/gso %.2f; retransmissions %d", msg,
			base[rawGSOWork]/base[rawGSO], base[rawGSOCopy]/base[rawGSO], rs[0].Retransmits)
	}
	unit := "B/s"
	if goods == 1 {
		unit = "msg/s"
	}
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(vsum/n, "vrnic-"+unit)
	for _, m := range modes {
		b.ReportMetric(sum[m]/n, m.String()+"-"+unit)
		b.ReportMetric(ratio[m]/n, "ratio-"+m.String())
	}
}
