package main

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// BenchmarkUDPSendLat measures send_lat (8-byte SEND ping-pong, one-way
// latency = round trip / 2) between two vrnicd daemons joined by the UDP
// link on two loopback addresses, as vrnic-perf run does it, and reports
// its p50, p99 and p99.9. The baseline, in the same run: an 8-byte UDP
// ping-pong between two sockets on the same two addresses (a goroutine
// echoing), the kernel's loopback round trip with no RDMA logic; the
// ratios are vrnic's percentiles over the baseline's. ns/op is vrnic's
// mean one-way latency. At least 2000 iterations are measured whatever
// b.N is; -benchtime 20000x gives b.N of them.
func BenchmarkUDPSendLat(b *testing.B) {
	a, c, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(b, err)
	da := startDaemon(b, "bench-udp-a", "-link", "udp", "-local", netip.AddrPortFrom(a, launch.RoCEPort).String())
	dc := startDaemon(b, "bench-udp-b", "-link", "udp", "-local", netip.AddrPortFrom(c, launch.RoCEPort).String())
	iters := max(b.N, 2000)
	b.ResetTimer()
	rs := perfJSON(b, da.sock, dc.sock, "-test", "send_lat", "-size", "8", "-iters", strconv.Itoa(iters))
	b.StopTimer()
	require.Len(b, rs, 1)
	l := rs[0].Latency
	require.NotNil(b, l)
	require.Equal(b, uint64(iters), l.Samples)
	base := udpPingPong(b, a, c, iters)
	b.ReportMetric(l.Avg, "ns/op")
	b.ReportMetric(float64(l.P50), "p50-ns")
	b.ReportMetric(float64(l.P99), "p99-ns")
	b.ReportMetric(float64(l.P999), "p99.9-ns")
	b.ReportMetric(float64(rs[0].Retransmits), "retx")
	b.ReportMetric(float64(base[0]), "udp-p50-ns")
	b.ReportMetric(float64(base[1]), "udp-p99-ns")
	b.ReportMetric(float64(l.P50)/float64(base[0]), "p50-ratio")
	b.ReportMetric(float64(l.P99)/float64(base[1]), "p99-ratio")
}

// udpPingPong sends n 8-byte datagrams from a socket on a to an echoing
// socket on c, one at a time, and returns the p50 and p99 of half the
// round trip, in nanoseconds.
func udpPingPong(b *testing.B, a, c netip.Addr, n int) [2]int64 {
	pa, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	require.NoError(b, err)
	defer pa.Close()
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(c, 0)))
	require.NoError(b, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64)
		for {
			k, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := pc.WriteToUDPAddrPort(buf[:k], from); err != nil {
				return
			}
		}
	}()
	defer func() { pc.Close(); <-done }()
	to := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	msg, buf := make([]byte, 8), make([]byte, 64)
	d := make([]int64, n)
	require.NoError(b, pa.SetReadDeadline(time.Now().Add(time.Minute)))
	for i := range n {
		msg[0] = byte(i)
		t0 := time.Now()
		_, err := pa.WriteToUDPAddrPort(msg, to)
		require.NoError(b, err)
		k, _, err := pa.ReadFromUDPAddrPort(buf)
		require.NoError(b, err)
		require.Equal(b, msg, buf[:k])
		d[i] = int64(time.Since(t0)) / 2
	}
	slices.Sort(d)
	return [2]int64{d[n/2], d[min(n-1, n*99/100)]}
}
