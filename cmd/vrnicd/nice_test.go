package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
)

// threadNices returns the nice value of every thread of process pid
// (field 19 of /proc/PID/task/TID/stat).
func threadNices(t *testing.T, pid int) map[int]int {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	require.NoError(t, err)
	nices := map[int]int{}
	for _, e := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// The command name (field 2) may hold spaces: count from its ')'.
		rest := string(b[bytes.LastIndexByte(b, ')')+2:])
		f := strings.Fields(rest) // f[0] is field 3 (state)
		n, err := strconv.Atoi(f[19-3])
		require.NoError(t, err)
		tid, _ := strconv.Atoi(e.Name())
		nices[tid] = n
	}
	return nices
}

// TestNice starts the daemon with -nice (a positive value, which anybody
// may set; and a negative one as root) and checks that every one of its
// threads runs at that value once it serves, traffic-carrying threads
// started after the setting included; an out-of-range value is refused
// with the range.
func TestNice(t *testing.T) {
	bin, err := launch.GoBuild(launch.VrnicdPackage, t.TempDir(), "vrnicd", os.Stderr)
	require.NoError(t, err)
	values := []int{7}
	if os.Geteuid() == 0 {
		values = append(values, -4)
	} else {
		t.Log("not root: the negative value is not tried")
	}
	for _, n := range values {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			dir := t.TempDir()
			var logs launch.Buffer
			p, err := launch.Start(launch.Spec{Name: "vrnicd", Bin: bin, Stderr: &logs,
				Args: []string{"-name", "nice0", "-runtime-dir", dir, "-link", "mem", "-workers", "2", "-nice", strconv.Itoa(n)}})
			require.NoError(t, err)
			t.Cleanup(func() { p.Stop(0, 10*time.Second) })
			require.NoError(t, launch.WaitReady(context.Background(), p, admin.SocketPath(dir, "nice0"), 30*time.Second), "%s", logs.String())
			nices := threadNices(t, p.Pid())
			require.NotEmpty(t, nices)
			for tid, got := range nices {
				assert.Equal(t, n, got, "thread %d of %d", tid, len(nices))
			}
			assert.Contains(t, logs.String(), "scheduling priority set")
		})
	}
	var stderr bytes.Buffer
	err = run(context.Background(), []string{"-name", "nice1", "-runtime-dir", t.TempDir(), "-link", "mem", "-nice", "40"}, &stderr)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-20..19")
}
