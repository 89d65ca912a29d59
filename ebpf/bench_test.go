package ebpf

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/vrnic/vrnic/internal/testenv"
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
	perRun := func(prog *ebpf.Program) time.Duration { return testRunTime(b, prog, frame) }
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

// BenchmarkTCFaultProgram is what the kernel-side injector costs a RoCE
// v2 frame it lets pass, with BPF_PROG_TEST_RUN, against a baseline
// measured in the same run (the same program type returning a constant):
// with no rule (one map lookup, no parsing), and with 1 and 16 rules of
// which none matches (the frame is parsed, each rule read and compared;
// 16 is the worst case for a frame that passes).
func BenchmarkTCFaultProgram(b *testing.B) {
	testenv.NeedRoot(b, "needs root (CAP_BPF) to load the tc program and run BPF_PROG_TEST_RUN")
	f, err := loadTCFaults(TCFaultConfig{Interface: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	spec, err := loadTcfault()
	if err != nil {
		b.Fatal(err)
	}
	ps := spec.Programs["vrnic_tcfault"].Copy()
	ps.Instructions = asmReturn(-1)
	base, err := ebpf.NewProgram(ps)
	if err != nil {
		b.Fatal(err)
	}
	defer base.Close()
	frame := tcFrame(false, 0x04, 0x123, 1, true)
	miss := make([]TCFaultRule, MaxTCFaultRules)
	for i := range miss {
		q := uint32(0x200 + i)
		miss[i] = TCFaultRule{Action: TCDrop, QPN: &q, Prob: 0.5, Seed: uint64(i)}
	}
	perRun := func(prog *ebpf.Program) time.Duration { return testRunTime(b, prog, frame) }
	for _, c := range []struct {
		name  string
		rules []TCFaultRule
	}{{"no_rules", nil}, {"1_rule_no_match", miss[:1]}, {"16_rules_no_match", miss}} {
		b.Run(c.name, func(b *testing.B) {
			if err := f.SetRules(c.rules); err != nil {
				b.Fatal(err)
			}
			var prog, baseline time.Duration
			for b.Loop() {
				prog += perRun(f.objs.VrnicTcfault)
				baseline += perRun(base)
			}
			b.ReportMetric(float64(prog.Nanoseconds())/float64(b.N), "tcfault_ns/frame")
			b.ReportMetric(float64(baseline.Nanoseconds())/float64(b.N), "empty_ns/frame")
			b.ReportMetric(float64(prog)/float64(baseline), "ratio_vs_empty")
		})
	}
}

// testRunTime is the time per run of prog on frame over 1000 runs of
// BPF_PROG_TEST_RUN inside the kernel (one system call).
func testRunTime(b *testing.B, prog *ebpf.Program, frame []byte) time.Duration {
	_, d, err := prog.Benchmark(frame, 1000, nil)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
