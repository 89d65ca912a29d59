package tap_test

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/tap"
)

// BenchmarkQueueWriteBatch writes 32 frames of 1 KiB per batch into a TAP
// queue in a test namespace (the kernel drops them: they are addressed to
// a MAC that is not the interface's). Each iteration also writes the same
// frames with one raw write(2) each on the same fd, the baseline measured
// under the same machine load; ratio_vs_raw_write ≈ 1 means the batched,
// poller-integrated path adds nothing to the system calls themselves.
func BenchmarkQueueWriteBatch(b *testing.B) {
	testenv.NeedRoot(b, "needs root (CAP_NET_ADMIN) for a TAP device and a network namespace")
	_, ns := newNetNS(b)
	dev, err := tap.Create(tap.Config{Queues: 1, MAC: nicMAC, Addrs: []netip.Addr{nic4}, NetNS: ns})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	frames := roceFrames(32, 1024, tap.MAC{0x02, 0xee, 0, 0, 0, 1})
	q := dev.Queue(0)
	var batchNs, rawNs time.Duration

	b.ReportAllocs()
	b.SetBytes(int64(32 * 1024))
	for b.Loop() {
		t0 := time.Now()
		if _, err := q.WriteBatch(frames, 64); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := dev.Control(func(fd int) error {
			for _, f := range frames {
				if _, err := unix.Write(fd, f[64:]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		batchNs += t1.Sub(t0)
		rawNs += time.Since(t1)
	}
	b.ReportMetric(float64(batchNs.Nanoseconds())/float64(b.N*32), "batch_ns/frame")
	b.ReportMetric(float64(rawNs.Nanoseconds())/float64(b.N*32), "raw_ns/frame")
	b.ReportMetric(float64(batchNs)/float64(rawNs), "ratio_vs_raw_write")
}
