// Package testenv states what a test needs from the machine it runs on: a
// tool on PATH, root. When the need is not met the test skips, with the
// reason, except under CI (environment variable CI=true): the CI machine
// runs as root and installs every tool the tests use
// (scripts/install-deps.sh), so there a missing requirement fails the test
// instead of letting it skip and the run go green without it.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where every
// requirement must be met.
func InCI() bool { return os.Getenv("CI") == "true" }

// IsRoot reports whether the process runs as root (effective UID 0).
func IsRoot() bool { return geteuid() == 0 }

var geteuid = os.Geteuid // replaced by the package's tests

// Need skips t with why when ok is false; under CI it fails t instead.
func Need(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("%s (CI=true: the CI environment must provide this, so the test fails instead of skipping)", why)
		return
	}
	t.Skip(why)
}

// NeedTool returns the path of the command name, found on PATH. Without
// it t skips, or fails under CI.
func NeedTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Need(t, false, name+" not installed: "+err.Error())
		return ""
	}
	return path
}

// NeedRoot skips t unless it runs as root, or fails it under CI (which runs
// as root). why says what root is needed for; it is the skip reason.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if why == "" {
		why = "needs root"
	}
	Need(t, IsRoot(), why)
}
