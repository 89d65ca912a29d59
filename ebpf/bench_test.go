package ebpf

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// BenchmarkSteerProgram runs the steering program on a RoCE v2 frame with
// BPF_PROG_TEST_RUN (Repeat runs inside the kernel, so the syscall cost is
// amortised) and reports its cost against a baseline measured in the same
// run: a two-instruction program returning a constant, on the same frame.
func BenchmarkSteerProgram(b *testing.B) {
	p := loadOrSkip(b, 8)
	spec, err := loadSteer()
	if err != nil {
		b.Fatal(err)
	}
	ps := spec.Programs["vrnic_steer"].Copy()
	ps.Instructions = asmReturn(0)
	base, err := ebpf.NewProgram(ps)
	if err != nil {
		b.Fatal(err)
	}
	defer base.Close()
	frame := buildRoCEFrame(roceFrame{src: src6, dst: dst6, vlan: true, qpn: 0x123456, payload: 256})
	const repeat = 1000
	perRun := func(prog *ebpf.Program) time.Duration {
		_, d, err := prog.Benchmark(frame, repeat, nil)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	var steer, baseline time.Duration
	b.ReportAllocs()
	for b.Loop() {
		steer += perRun(p.SteerProgram())
		baseline += perRun(base)
	}
	b.ReportMetric(float64(steer.Nanoseconds())/float64(b.N), "steer_ns/frame")
	b.ReportMetric(float64(baseline.Nanoseconds())/float64(b.N), "empty_ns/frame")
	b.ReportMetric(float64(steer)/float64(baseline), "ratio_vs_empty")
}
