package hostile

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/internal/launch"
)

// daemonEnv names a vrnicd binary the probes run instead of building one
// from this tree: with it the same probes run against another version of
// the daemon (an older commit, to show what they catch there).
const daemonEnv = "VRNIC_HOSTILE_VRNICD"

var (
	daemonOnce sync.Once
	daemonDir  string // the built binary's directory, removed by TestMain
	daemonBin  string
	daemonErr  error
	daemonOut  launch.Buffer
)

func TestMain(m *testing.M) {
	code := m.Run()
	if daemonDir != "" {
		os.RemoveAll(daemonDir)
	}
	os.Exit(code)
}

// vrnicdBinary returns the vrnicd every probe runs: $VRNIC_HOSTILE_VRNICD
// when set, otherwise one built from this tree (once per test binary) in
// a directory every uid can reach.
func vrnicdBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(daemonEnv); p != "" {
		abs, err := filepath.Abs(p)
		require.NoError(t, err)
		st, err := os.Stat(abs)
		require.NoError(t, err, "%s", daemonEnv)
		require.True(t, st.Mode().IsRegular() && st.Mode()&0o111 != 0, "%s=%s is not an executable file", daemonEnv, abs)
		return abs
	}
	daemonOnce.Do(func() {
		daemonDir, daemonErr = os.MkdirTemp("", "vrnic-hostile-bin-")
		if daemonErr != nil {
			return
		}
		if daemonErr = os.Chmod(daemonDir, 0o755); daemonErr != nil {
			return
		}
		daemonBin, daemonErr = launch.GoBuild(launch.VrnicdPackage, daemonDir, "vrnicd", &daemonOut)
	})
	require.NoError(t, daemonErr, "%s", &daemonOut)
	return daemonBin
}
