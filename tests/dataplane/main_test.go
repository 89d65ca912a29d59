package dataplane

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
)

// bin holds the binaries built by TestMain.
var bin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "vrnic-dataplane-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"vrnicd", "vrnic-demo", "vrnicctl"} {
			if _, err := launch.GoBuild("github.com/vrnic/vrnic/cmd/"+pkg, dir, pkg, os.Stderr); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		bin = dir
		return m.Run()
	}())
}

// freeLoopback returns a 127.0.0.0/8 address whose UDP port 4791 is free.
func freeLoopback(t testing.TB) netip.Addr {
	t.Helper()
	a, err := launch.FreeLoopback()
	require.NoError(t, err)
	return a
}
