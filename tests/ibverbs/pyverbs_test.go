package ibverbs_test

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// rdma-core's own verbs test suite, as Debian packages it (python3-pyverbs:
// the pyverbs module, and the tests under the rdma-core documentation).
const (
	pyverbsPython = "/usr/bin/python3"
	pyverbsTests  = "/usr/share/doc/rdma-core/tests"
	// pyverbsMinOK is the fewest passing tests a run may show. Linux
	// Soft-RoCE (kernel 6.1, rdma-core 44) passes 86 (PYVERBS.md).
	pyverbsMinOK = 138
	// pyverbsRuns: the counts must be the same in this many runs in a row.
	pyverbsRuns = 5
)

// pyResult is one test's outcome: "ok", "FAIL", "ERROR", or "skip" with
// its reason.
type pyResult struct {
	Module, Name, Outcome, Reason string
}

var (
	pyTestStart = regexp.MustCompile(`^(\w+) \((tests\.(\w+)\.\w+\.\w+)\)(.*)$`)
	pyOutcome   = regexp.MustCompile(`^(ok|FAIL|ERROR|expected failure|unexpected success|skipped '(.*)'|skipped "(.*)")$`)
	pyRan       = regexp.MustCompile(`(?m)^Ran (\d+) tests? in `)
	pySummary   = regexp.MustCompile(`(?m)^(OK|FAILED)(?: \((.*)\))?$`)
)

// outcomeOf reads a result token (the text after " ... ", or a line of its
// own when the test printed something first).
func outcomeOf(s string) (outcome, reason string, ok bool) {
	m := pyOutcome.FindStringSubmatch(s)
	if m == nil {
		return "", "", false
	}
	switch {
	case strings.HasPrefix(m[1], "skipped"):
		return "skip", m[2] + m[3], true
	case m[1] == "expected failure":
		return "ok", "", true
	case m[1] == "unexpected success":
		return "FAIL", "unexpected success", true
	}
	return m[1], "", true
}

// parsePyverbs reads unittest's verbose report: each test's outcome, and
// the summary's totals, which must agree with the outcomes.
func parsePyverbs(out string) ([]pyResult, error) {
	var res []pyResult
	var cur *pyResult
	record := func(tail string) bool {
		o, r, ok := outcomeOf(tail)
		if ok {
			cur.Outcome, cur.Reason = o, r
			res = append(res, *cur)
			cur = nil
		}
		return ok
	}
	for _, line := range strings.Split(out, "\n") {
		if m := pyTestStart.FindStringSubmatch(line); m != nil {
			if cur != nil {
				return nil, fmt.Errorf("%s: no outcome before the next test", cur.Name)
			}
			cur = &pyResult{Module: m[3], Name: m[2]}
			if i := strings.Index(m[4], " ... "); i >= 0 {
				record(m[4][i+5:])
			}
			continue
		}
		if cur == nil {
			continue
		}
		if record(line) {
			continue
		}
		if i := strings.LastIndex(line, " ... "); i >= 0 {
			record(line[i+5:])
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s: no outcome", cur.Name)
	}
	m := pyRan.FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("no \"Ran N tests\" line")
	}
	if n, _ := strconv.Atoi(m[1]); n != len(res) {
		return nil, fmt.Errorf("the report says %d tests ran, %d outcomes read", n, len(res))
	}
	s := pySummary.FindStringSubmatch(out)
	if s == nil {
		return nil, fmt.Errorf("no summary line")
	}
	want := map[string]int{}
	for _, kv := range strings.Split(s[2], ", ") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			want[k], _ = strconv.Atoi(v)
		}
	}
	got := map[string]int{}
	for _, r := range res {
		got[map[string]string{"FAIL": "failures", "ERROR": "errors", "skip": "skipped"}[r.Outcome]]++
	}
	for _, k := range []string{"failures", "errors", "skipped"} {
		if want[k] != got[k] {
			return nil, fmt.Errorf("summary %q: %s %d, outcomes read %d", s[0], k, want[k], got[k])
		}
	}
	return res, nil
}

// pyModuleRow is one module's line of the table.
type pyModuleRow struct {
	Module                     string
	Ran, OK, Fail, Error, Skip int
}

func pyverbsTable(res []pyResult) (rows []pyModuleRow, total pyModuleRow) {
	by := map[string]*pyModuleRow{}
	for _, r := range res {
		row := by[r.Module]
		if row == nil {
			row = &pyModuleRow{Module: r.Module}
			by[r.Module] = row
		}
		for _, x := range []*pyModuleRow{row, &total} {
			x.Ran++
			switch r.Outcome {
			case "ok":
				x.OK++
			case "FAIL":
				x.Fail++
			case "ERROR":
				x.Error++
			case "skip":
				x.Skip++
			}
		}
	}
	for _, r := range by {
		rows = append(rows, *r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Module < rows[j].Module })
	total.Module = "total"
	return rows, total
}

// pyverbsMarkdown renders the per-module table and the skip reasons, as
// PYVERBS.md shows them.
func pyverbsMarkdown(res []pyResult) string {
	rows, total := pyverbsTable(res)
	var b strings.Builder
	b.WriteString("| module | ran | ok | fail | error | skip |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range append(rows, total) {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", r.Module, r.Ran, r.OK, r.Fail, r.Error, r.Skip)
	}
	reasons := map[string]map[string]int{}
	for _, r := range res {
		if r.Outcome == "skip" {
			if reasons[r.Reason] == nil {
				reasons[r.Reason] = map[string]int{}
			}
			reasons[r.Reason][r.Module]++
		}
	}
	keys := make([]string, 0, len(reasons))
	for k := range reasons {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("\n| skip reason (as the suite prints it) | tests |\n|---|---|\n")
	for _, k := range keys {
		var mods []string
		for m, n := range reasons[k] {
			mods = append(mods, fmt.Sprintf("%s %d", m, n))
		}
		sort.Strings(mods)
		fmt.Fprintf(&b, "| `%s` | %s |\n", k, strings.Join(mods, ", "))
	}
	return b.String()
}

// copyPyverbsTests copies the suite into dir, unpacking the files Debian
// compressed.
func copyPyverbsTests(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(pyverbsTests)
	require.NoError(t, err)
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		in, err := os.Open(filepath.Join(pyverbsTests, e.Name()))
		require.NoError(t, err)
		var r io.Reader = in
		name := e.Name()
		if strings.HasSuffix(name, ".gz") {
			zr, err := gzip.NewReader(in)
			require.NoError(t, err, name)
			r, name = zr, strings.TrimSuffix(name, ".gz")
		}
		data, err := io.ReadAll(r)
		in.Close()
		require.NoError(t, err, e.Name())
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
}

// TestPyverbs runs rdma-core's pyverbs suite, unmodified, through
// vrnic-run against daemon a, pyverbsRuns times: no test may fail or
// error, at least pyverbsMinOK must pass, every run must give each test
// the same outcome, and every skip's reason must be one PYVERBS.md
// explains. VRNIC_PYVERBS_TABLE=FILE writes the table PYVERBS.md shows.
func TestPyverbs(t *testing.T) {
	_, err := os.Stat(filepath.Join(pyverbsTests, "run_tests.py"))
	testenv.Need(t, err == nil, "rdma-core's test suite is not installed (Debian package python3-pyverbs; scripts/install-deps.sh)")
	testenv.Need(t, exec.Command(pyverbsPython, "-c", "import pyverbs").Run() == nil,
		"python3-pyverbs is not installed (scripts/install-deps.sh)")
	doc, err := os.ReadFile("PYVERBS.md")
	require.NoError(t, err)

	dir := filepath.Join(t.TempDir(), "tests")
	require.NoError(t, os.Mkdir(dir, 0o755))
	copyPyverbsTests(t, dir)
	p := startPair(t)
	var first []pyResult
	for run := 1; run <= pyverbsRuns; run++ {
		out, err := p.run(t, 10*time.Minute, "-d", "a", pyverbsPython, filepath.Join(dir, "run_tests.py"),
			"--dev", "a", "--gid", "0", "-v")
		res, perr := parsePyverbs(out)
		require.NoError(t, perr, "run %d (exit: %v):\n%s\n%s", run, err, out, p.daemonLogs())
		_, total := pyverbsTable(res)
		t.Logf("run %d: %d tests: %d ok, %d fail, %d error, %d skip", run, total.Ran, total.OK, total.Fail, total.Error, total.Skip)
		for _, r := range res {
			if r.Outcome == "FAIL" || r.Outcome == "ERROR" {
				t.Errorf("run %d: %s: %s", run, r.Name, r.Outcome)
			}
		}
		if t.Failed() {
			t.Fatalf("run %d output:\n%s\n%s", run, out, p.daemonLogs())
		}
		require.NoError(t, err, "the suite passed but exited non-zero:\n%s", out)
		assert.GreaterOrEqual(t, total.OK, pyverbsMinOK, "tests passing")
		if first == nil {
			first = res
			table := pyverbsMarkdown(res)
			t.Logf("\n%s", table)
			if f := os.Getenv("VRNIC_PYVERBS_TABLE"); f != "" {
				require.NoError(t, os.WriteFile(f, []byte(table), 0o644))
			}
			for _, r := range res {
				if r.Outcome == "skip" && !strings.Contains(string(doc), "`"+r.Reason+"`") {
					t.Errorf("%s skips for a reason PYVERBS.md does not explain: %q", r.Name, r.Reason)
				}
			}
			continue
		}
		require.Equal(t, len(first), len(res), "run %d ran another number of tests", run)
		for i := range res {
			assert.Equal(t, first[i], res[i], "run %d differs from run 1", run)
		}
	}
}

// TestParsePyverbs checks the report reader on unittest's shapes: an
// outcome on the test's line, after a docstring line, after output the
// test printed, and the summary's cross-check.
func TestParsePyverbs(t *testing.T) {
	out := `test_a (tests.test_x.XTest.test_a) ... ok
test_b (tests.test_x.XTest.test_b)
Does b. ... skipped 'No b here'
test_c (tests.test_y.YTest.test_c) ... printed = 1
ok
test_d (tests.test_y.YTest.test_d) ... FAIL

======================================================================
FAIL: test_d (tests.test_y.YTest.test_d)
----------------------------------------------------------------------
Ran 4 tests in 0.010s

FAILED (failures=1, skipped=1)
`
	res, err := parsePyverbs(out)
	require.NoError(t, err)
	assert.Equal(t, []pyResult{
		{"test_x", "tests.test_x.XTest.test_a", "ok", ""},
		{"test_x", "tests.test_x.XTest.test_b", "skip", "No b here"},
		{"test_y", "tests.test_y.YTest.test_c", "ok", ""},
		{"test_y", "tests.test_y.YTest.test_d", "FAIL", ""},
	}, res)
	rows, total := pyverbsTable(res)
	assert.Equal(t, []pyModuleRow{{"test_x", 2, 1, 0, 0, 1}, {"test_y", 2, 1, 1, 0, 0}}, rows)
	assert.Equal(t, pyModuleRow{"total", 4, 2, 1, 0, 1}, total)

	_, err = parsePyverbs(strings.Replace(out, "failures=1", "failures=2", 1))
	assert.ErrorContains(t, err, "failures 2, outcomes read 1")
	_, err = parsePyverbs(strings.Replace(out, "Ran 4", "Ran 5", 1))
	assert.ErrorContains(t, err, "5 tests ran, 4 outcomes read")
	_, err = parsePyverbs(strings.Replace(out, "test_d (tests.test_y.YTest.test_d) ... FAIL", "test_d (tests.test_y.YTest.test_d)", 1))
	assert.Error(t, err, "a test without an outcome")
}
