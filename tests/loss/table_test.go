package loss

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// The table's settings (environment; scripts/loss-table.sh sets them).
const (
	envTable      = "VRNIC_LOSS_TABLE"      // 1: run TestLossTable
	envReps       = "VRNIC_LOSS_REPS"       // repetitions (default 3)
	envDuration   = "VRNIC_LOSS_DURATION"   // each test's duration (default 3s)
	envModes      = "VRNIC_LOSS_MODES"      // gbn, sr or both, comma-separated (default gbn,sr)
	envInjectors  = "VRNIC_LOSS_INJECTORS"  // rules, kernel or both (default rules,kernel)
	envDepth      = "VRNIC_LOSS_DEPTH"      // write_bw's outstanding WRITEs (default vrnic-perf's 128)
	envReport     = "VRNIC_LOSS_REPORT"     // write the Markdown here instead of standard output
	envConditions = "VRNIC_LOSS_CONDITIONS" // keys of the conditions besides none (default drop0.1,drop1,mix)
)

func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// cpuModel is lscpu's model name (or /proc/cpuinfo's).
func cpuModel() string {
	out, err := exec.Command("lscpu").Output()
	if err != nil {
		out, _ = os.ReadFile("/proc/cpuinfo")
	}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (strings.TrimSpace(k) == "Model name" || strings.TrimSpace(k) == "model name") {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAvg is the 1-minute load average (/proc/loadavg).
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// TestLossTable measures the loss table: for each repetition, each
// injector and each transport mode, fresh daemons run write_bw, send_lat
// and read_lat clean and under each loss condition (the clean run is the
// baseline of that repetition's ratios). It prints the tables as
// Markdown. On demand only (VRNIC_LOSS_TABLE=1, scripts/loss-table.sh):
// it takes minutes. Nothing is asserted but that the harness ran; the
// figures are for BENCHMARKS.md.
func TestLossTable(t *testing.T) {
	if os.Getenv(envTable) != "1" {
		t.Skipf("the loss table runs on demand: %s=1 (scripts/loss-table.sh)", envTable)
	}
	reps := 3
	if v := os.Getenv(envReps); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, envReps)
		reps = n
	}
	dur := 3 * time.Second
	if v := os.Getenv(envDuration); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, envDuration)
		dur = d
	}
	depth := 0
	if v := os.Getenv(envDepth); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, envDepth)
		depth = n
	}
	conds := []Condition{Clean}
	for _, k := range envList(envConditions, "drop0.1,drop1,mix") {
		found := false
		for _, c := range Conditions[1:] {
			if c.Key == k {
				conds, found = append(conds, c), true
			}
		}
		require.True(t, found, "%s: unknown condition %q", envConditions, k)
	}

	var notes []string
	var modes []bool
	for _, m := range envList(envModes, "gbn,sr") {
		switch m {
		case "gbn":
			modes = append(modes, false)
		case "sr":
			if !srSupported {
				notes = append(notes, fmt.Sprintf("selective repeat: skipped, vrnic-perf has no %s flag", SRFlag))
				continue
			}
			modes = append(modes, true)
		default:
			t.Fatalf("%s: unknown mode %q (gbn, sr)", envModes, m)
		}
	}
	var injectors []Injector
	for _, i := range envList(envInjectors, "rules,kernel") {
		switch i {
		case "rules":
			injectors = append(injectors, Rules)
		case "kernel":
			if !testenv.IsRoot() {
				notes = append(notes, "kernel tc injector: skipped, it needs root")
				continue
			}
			injectors = append(injectors, Kernel)
		default:
			t.Fatalf("%s: unknown injector %q (rules, kernel)", envInjectors, i)
		}
	}
	for _, n := range notes {
		t.Log(n)
	}

	load0 := loadAvg()
	series := map[[2]int]*Series{}
	var order []*Series
	for k := range reps {
		for _, inj := range injectors {
			for _, sr := range modes {
				key := [2]int{int(inj), map[bool]int{false: 0, true: 1}[sr]}
				s := series[key]
				if s == nil {
					s = &Series{Injector: inj, SR: sr}
					series[key] = s
					order = append(order, s)
				}
				cfg := Config{Bins: bins, Injector: inj, SR: sr, Duration: dur, Depth: depth}
				t.Run(fmt.Sprintf("run%d/%s/%s", k+1, map[Injector]string{Rules: "rules", Kernel: "kernel"}[inj], cfg.Mode()), func(t *testing.T) {
					p := Start(t, cfg)
					rep := p.RunAll(t, conds)
					for _, r := range rep {
						t.Log(r.Summary())
					}
					s.Reps = append(s.Reps, rep)
				})
			}
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "CPU: %s (lscpu model name), %d CPUs, Linux %s, %s; load average %s at the start, %s at the end; %d run(s) of %v per test, write_bw depth %s; ranges are min–max over the runs, ratios against the clean run of the same run.\n\n",
		cpuModel(), runtime.NumCPU(), kernelRelease(), runtime.Version(), load0, loadAvg(), reps, dur,
		map[bool]string{true: "128 (vrnic-perf's default)", false: strconv.Itoa(depth)}[depth == 0])
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	if len(notes) > 0 {
		fmt.Fprintln(&b)
	}
	for _, s := range order {
		s.WriteTables(&b, conds)
	}
	var w io.Writer = os.Stdout
	if f := os.Getenv(envReport); f != "" {
		require.NoError(t, os.WriteFile(f, b.Bytes(), 0o644))
		w = io.Discard
	}
	w.Write(b.Bytes())
}
