package dataplane

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/capture"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
	"github.com/vrnic/vrnic/roce"
)

// TestCaptureFromDaemon: vrnicctl capture records what one of two daemons
// sends and receives over the UDP link while the C client runs its
// operations: a pcapng file that tshark decodes as RoCE v2 (InfiniBand
// over UDP 4791) frame by frame, none malformed, each with a valid ICRC.
func TestCaptureFromDaemon(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	tshark := testenv.NeedTool(t, "tshark")
	cl := filepath.Join(t.TempDir(), "rc_ops")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I", "../../abi", "-o", cl, "../../examples/rc_ops.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)
	a := startDaemon(t, "cap0", "-link", "udp", "-workers", "1", "-local", freeLoopback(t).String()+":4791")
	b := startDaemon(t, "cap1", "-link", "udp", "-workers", "1", "-local", freeLoopback(t).String()+":4791")

	const frames = 12
	file := filepath.Join(t.TempDir(), "a.pcapng")
	ctl := exec.Command(filepath.Join(bin, "vrnicctl"), "-s", a.socket, "-w", file, "-c", "12", "-t", "30s", "capture")
	ctlErr := &launch.Buffer{} // written by exec's copying goroutine
	ctl.Stderr = ctlErr
	require.NoError(t, ctl.Start())
	t.Cleanup(func() {
		if ctl.ProcessState == nil {
			ctl.Process.Kill()
			ctl.Wait()
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(a.logs.String(), "capture started") },
		10*time.Second, 5*time.Millisecond, "the capture did not start")

	run := exec.Command(cl, a.socket, b.socket)
	out, err = run.CombinedOutput()
	require.NoError(t, err, "rc_ops: %s", out)
	require.NoError(t, ctl.Wait(), "vrnicctl capture: %s", ctlErr.String())
	assert.Contains(t, ctlErr.String(), "wrote")
	assert.Contains(t, a.logs.String(), "capture ended")

	cmd := exec.Command(tshark, "-r", file, "-T", "fields", "-e", "frame.protocols", "-e", "_ws.malformed",
		"-e", "infiniband.bth.opcode")
	var tsErr bytes.Buffer
	cmd.Stderr = &tsErr
	b2, err := cmd.Output()
	require.NoError(t, err, "%s%s", b2, tsErr.String())
	lines := strings.Split(strings.TrimRight(string(b2), "\n"), "\n")
	require.Len(t, lines, frames, "%s", b2)
	for i, l := range lines {
		col := strings.Split(l, "\t")
		require.Len(t, col, 3, "frame %d: %q", i+1, l)
		assert.Contains(t, col[0], "udp:infiniband", "frame %d", i+1)
		assert.Empty(t, col[1], "frame %d malformed", i+1)
		assert.NotEmpty(t, col[2], "frame %d: BTH opcode", i+1)
	}
	// And each frame's ICRC verifies (roce's parser checks it).
	raw, err := os.ReadFile(file)
	require.NoError(t, err)
	fs, err := capture.ReadFrames(raw)
	require.NoError(t, err)
	require.Len(t, fs, frames)
	for i, f := range fs {
		var p roce.Packet
		assert.NoError(t, roce.Parse(f.Data, &p), "frame %d", i+1)
	}
}
