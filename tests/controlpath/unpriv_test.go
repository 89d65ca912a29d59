package controlpath

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/testenv"
)

// TestUnprivilegedDaemon runs vrnicd and vrnicctl as an unprivileged user
// (nobody) without XDG_RUNTIME_DIR: the socket goes to $TMPDIR/vrnic-<uid>
// (mode 0700), vrnicctl finds it there by the same rule, a client of the
// same user is served, and SIGINT removes the socket.
func TestUnprivilegedDaemon(t *testing.T) {
	testenv.NeedRoot(t, "needs root to switch to the unprivileged user nobody")
	const uid, gid = 65534, 65534
	vrnicd, vrnicctl := tools(t)
	require.NoError(t, os.Chmod(filepath.Dir(vrnicd), 0o755))
	tmp, err := os.MkdirTemp("", "vrnic-unpriv-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	require.NoError(t, os.Chown(tmp, uid, gid))
	env := []string{"TMPDIR=" + tmp, "PATH=/usr/bin:/bin"}
	asNobody := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		return cmd
	}
	d := asNobody(exec.Command(vrnicd, "-name", "u0", "-local", freeLoopback(t).String()+":4791"))
	var stderr strings.Builder
	d.Stderr = &stderr
	require.NoError(t, d.Start())
	t.Cleanup(func() {
		if d.ProcessState == nil {
			d.Process.Kill()
			d.Wait()
		}
	})
	rt := filepath.Join(tmp, "vrnic-65534")
	sock := filepath.Join(rt, "u0.sock")
	require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 10*time.Second, 10*time.Millisecond, "%s", &stderr)
	fi, err := os.Stat(rt)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	assert.Equal(t, uint32(uid), fi.Sys().(*syscall.Stat_t).Uid)

	out, err := asNobody(exec.Command(vrnicctl, "devices")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Regexp(t, `u0\s+up\s+udp`, string(out))

	// A client process of the same user: this test binary, copied where
	// nobody may execute it.
	self, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	clientBin := filepath.Join(filepath.Dir(vrnicd), "client.test")
	require.NoError(t, os.WriteFile(clientBin, self, 0o755))
	c := exec.Command(clientBin, "-test.run=^$")
	c.Env = append(env, "VRNIC_TEST_CLIENT=exit", "VRNIC_TEST_SOCKET="+sock)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err = c.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.True(t, strings.HasPrefix(string(out), "READY "), "%s", out)

	// An rdma_cm client of that user: listening on port 80 needs
	// CAP_NET_BIND_SERVICE, as in Linux; its CM IDs are in its uid's
	// account until it goes.
	c = exec.Command(clientBin, "-test.run=^$")
	c.Env = append(env, "VRNIC_TEST_CLIENT=cm", "VRNIC_TEST_SOCKET="+sock)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	cout, err := c.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.Start())
	t.Cleanup(func() {
		if c.ProcessState == nil {
			c.Process.Kill()
			c.Wait()
		}
	})
	lines := bufio.NewScanner(cout)
	require.True(t, lines.Scan())
	assert.Regexp(t, `^PRIV .*port 80 is below 1024.*CAP_NET_BIND_SERVICE`, lines.Text())
	require.True(t, lines.Scan())
	require.Equal(t, "READY", lines.Text())
	cmIDs := func() int {
		out, err := exec.Command(vrnicctl, "-s", sock, "-json", "accounts").Output()
		require.NoError(t, err, "%s", out)
		var accts []admin.AccountInfo
		require.NoError(t, json.Unmarshal(out, &accts), "%s", out)
		for _, a := range accts {
			if a.UID == uid {
				return a.CMIDs
			}
		}
		return 0
	}
	assert.Equal(t, 3, cmIDs())
	require.NoError(t, c.Process.Kill())
	c.Wait()
	require.Eventually(t, func() bool { return cmIDs() == 0 }, 10*time.Second, 20*time.Millisecond)

	require.NoError(t, d.Process.Signal(syscall.SIGINT))
	require.NoError(t, d.Wait(), "%s", &stderr)
	assert.NoFileExists(t, sock)
	assert.NoFileExists(t, filepath.Join(rt, "u0.lock"))
}
