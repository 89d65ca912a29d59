package device_test

import (
	"testing"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/verbs"
	"golang.org/x/sys/unix"
)

// echoRoundTripNs measures n round trips of a size-byte datagram over a
// SOCK_SEQPACKET socketpair with a goroutine echoing: the cost of the
// transport alone.
func echoRoundTripNs(b *testing.B, n, size int) float64 {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fds[0])
	go func() {
		defer unix.Close(fds[1])
		buf := make([]byte, 4096)
		for {
			m, err := unix.Read(fds[1], buf)
			if err != nil || m == 0 {
				return
			}
			unix.Write(fds[1], buf[:m])
		}
	}()
	msg := make([]byte, size)
	buf := make([]byte, 4096)
	start := time.Now()
	for range n {
		unix.Write(fds[0], msg)
		unix.Read(fds[0], buf)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// BenchmarkCommandRoundTrip measures a QUERY_QP command through the
// control server (verbs client, socket, strict decode, device lock, reply)
// and reports it relative to a bare echo of the same size over a
// socketpair (x-echo).
func BenchmarkCommandRoundTrip(b *testing.B) {
	srv := startServer(b, device.Limits{})
	c := open(b, srv)
	pd, err := c.AllocPD()
	if err != nil {
		b.Fatal(err)
	}
	cq, err := c.CreateCQ(16, nil)
	if err != nil {
		b.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		b.Fatal(err)
	}
	base := echoRoundTripNs(b, max(b.N, 2000), 16+abi.Sizeof(&abi.RespQueryQP{}))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := qp.Query(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(ns/base, "x-echo")
}
