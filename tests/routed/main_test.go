package routed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vrnic/vrnic/internal/testenv"
)

// bin holds the binaries built by TestMain (empty when the tests skip).
var bin string

// skipReason is why the tests cannot run here ("" when they can).
var skipReason string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	os.Exit(func() int {
		switch {
		case !testenv.IsRoot():
			skipReason = "routed multi-host tests need root (network namespaces, veth, bridges, TAP devices, eBPF)"
		default:
			for _, tool := range []string{"ip", "ping", "sysctl"} {
				if _, err := exec.LookPath(tool); err != nil {
					skipReason = fmt.Sprintf("routed multi-host tests need %s", tool)
				}
			}
		}
		if skipReason != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "routed-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"vrnicd", "vrnic-run"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(dir, pkg), "github.com/vrnic/vrnic/cmd/"+pkg)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
				return 1
			}
		}
		bin = dir
		return m.Run()
	}())
}

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.Need(t, skipReason == "", skipReason)
}
