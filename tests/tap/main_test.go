package tap

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vrnic/vrnic/internal/testenv"
)

// bin holds the binaries built by TestMain (empty without root).
var bin string

// skipReason is why the tests cannot run here ("" when they can).
var skipReason string

func TestMain(m *testing.M) {
	if os.Getenv(clientEnv) != "" {
		os.Exit(clientMain())
	}
	os.Exit(func() int {
		switch {
		case !testenv.IsRoot():
			skipReason = "TAP end-to-end tests need root (network namespaces, TAP devices, eBPF)"
		default:
			for _, tool := range []string{"ip", "tshark"} {
				if _, err := exec.LookPath(tool); err != nil {
					skipReason = fmt.Sprintf("TAP end-to-end tests need %s", tool)
				}
			}
		}
		if skipReason != "" {
			return m.Run()
		}
		dir, err := os.MkdirTemp("", "vrnic-tap-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"vrnicd", "vrnicctl", "vrnic-run"} {
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
