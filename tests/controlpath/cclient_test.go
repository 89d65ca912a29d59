package controlpath

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestCClient builds a client in C from abi/vrnic_abi.h and libc only,
// runs it against vrnicd, checks with vrnicctl that its QP reached RTS
// with the PSN it set, then kills it and checks the daemon is clean.
func TestCClient(t *testing.T) {
	gcc := testenv.NeedTool(t, "gcc")
	bin := filepath.Join(t.TempDir(), "cclient")
	out, err := exec.Command(gcc, "-std=c11", "-Wall", "-Werror", "-O1", "-I", "../../abi", "-I", "../testdata", "-o", bin, "testdata/cclient.c").CombinedOutput()
	require.NoError(t, err, "gcc: %s", out)

	_, vrnicctl := tools(t)
	dir := runtimeDir(t)
	d := startDaemon(t, dir, "c0")
	cmd := exec.Command(bin, d.socket)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	f := strings.Fields(line)
	require.Len(t, f, 4, "C client said %q", line)
	require.Equal(t, "OK", f[0], line)
	assert.Equal(t, "3", f[2], "QUERY_QP state RTS")
	assert.Equal(t, "4660", f[3], "sq_psn 0x1234")

	out, err = exec.Command(vrnicctl, "-runtime-dir", dir, "-json", "qps").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var qps []admin.QPInfo
	require.NoError(t, json.Unmarshal(out, &qps))
	require.Len(t, qps, 1)
	assert.Equal(t, f[1], strings.TrimSpace(string(mustJSON(t, qps[0].QPN))))
	assert.Equal(t, "RTS", qps[0].State)
	assert.Equal(t, uint32(0x1234), qps[0].SQPSN)
	assert.Equal(t, uint32(7), qps[0].RQPSN)
	var ctxs []admin.ContextInfo
	out, err = exec.Command(vrnicctl, "-runtime-dir", dir, "-json", "contexts").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, json.Unmarshal(out, &ctxs))
	require.Len(t, ctxs, 1)
	assert.Equal(t, "c-client", ctxs[0].Client)
	assert.Equal(t, admin.ResourceCounts{HostMem: 1, PD: 1, MR: 1, CQ: 1, QP: 1}, ctxs[0].Resources)

	stdin.Close() // the client exits; the daemon cleans up
	require.NoError(t, cmd.Wait())
	require.Eventually(t, func() bool { return d.info(t).Resources == admin.ResourceCounts{} }, 10*time.Second, 10*time.Millisecond)
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}
