package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// unitDir holds the systemd units and example configurations.
const unitDir = "../../deploy/systemd"

// execStart returns the unit's ExecStart words.
func execStart(t *testing.T, unit []byte) []string {
	t.Helper()
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatal("no ExecStart")
	return nil
}

// TestSystemdUnits checks each unit in deploy/systemd with
// systemd-analyze verify (no warning at all: verify reports unknown keys
// and bad values on stderr but exits 0), with ExecStart pointed at an
// executable here, and parses the unit's vrnicd command line with the
// daemon's own flag parser against the example configuration of its
// link type, so that a renamed flag or a config the daemon refuses fails
// here.
func TestSystemdUnits(t *testing.T) {
	units, err := filepath.Glob(filepath.Join(unitDir, "*@.service"))
	require.NoError(t, err)
	require.Len(t, units, 2)
	self, err := os.Executable()
	require.NoError(t, err)
	for _, u := range units {
		t.Run(filepath.Base(u), func(t *testing.T) {
			b, err := os.ReadFile(u)
			require.NoError(t, err)
			words := execStart(t, b)
			require.Equal(t, "/usr/local/bin/vrnicd", words[0])
			assert.Contains(t, string(b), "\nType=notify\n", "readiness through sd_notify")

			example := "example.json"
			if strings.Contains(filepath.Base(u), "-tap") {
				example = "example-tap.json"
				assert.Contains(t, string(b), "\nCapabilityBoundingSet=CAP_NET_ADMIN CAP_BPF\n")
			} else {
				assert.Contains(t, string(b), "\nCapabilityBoundingSet=\n", "the UDP link needs no capability")
			}
			args := append([]string{}, words[1:]...)
			for i, a := range args {
				a = strings.ReplaceAll(a, "/etc/vrnic/%i.json", filepath.Join(unitDir, example))
				args[i] = strings.ReplaceAll(a, "%i", "vrnic0")
			}
			var stderr bytes.Buffer
			cfg, err := parseConfig(args, &stderr)
			require.NoError(t, err, "%v: %s", args, &stderr)
			assert.Equal(t, "vrnic0", cfg.Name)
			assert.Equal(t, "/run/vrnic", cfg.RuntimeDir)

			analyze := testenv.NeedTool(t, "systemd-analyze")
			dir := t.TempDir()
			name := strings.Replace(filepath.Base(u), "@.service", "@vrnic0.service", 1)
			unit := strings.Replace(string(b), "ExecStart=/usr/local/bin/vrnicd", "ExecStart="+self, 1)
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(u)), []byte(unit), 0o644))
			cmd := exec.Command(analyze, "verify", "--man=no", filepath.Join(dir, name))
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			require.NoError(t, cmd.Run(), "%s%s", &out, &errb)
			assert.Empty(t, strings.TrimSpace(errb.String()+out.String()), "systemd-analyze verify warned")
		})
	}
}
