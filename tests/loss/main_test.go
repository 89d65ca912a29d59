package loss

import (
	"fmt"
	"os"
	"testing"
)

// bins are the binaries TestMain built; srSupported says whether their
// vrnic-perf has SRFlag.
var (
	bins        Bins
	srSupported bool
)

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "vloss-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if bins, err = Build(dir, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		srSupported = SRSupported(bins.Perf)
		return m.Run()
	}())
}
