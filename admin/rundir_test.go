package admin

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestListenLiveStaleAndForeign(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.sock")
	l, err := Listen(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o660), fi.Mode().Perm())

	// A live socket is refused.
	_, err = Listen(path)
	assert.ErrorIs(t, err, ErrSocketInUse)

	// A stale one (its listener gone without unlinking) is replaced.
	l.SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	require.FileExists(t, path)
	l2, err := Listen(path)
	require.NoError(t, err)
	c, err := net.Dial("unixpacket", path)
	require.NoError(t, err, "the new listener answers")
	c.Close()
	require.NoError(t, l2.Close())
	assert.NoFileExists(t, path, "Close removes the socket")

	// Anything else at the path is left alone.
	require.NoError(t, os.WriteFile(path, []byte("data"), 0o600))
	_, err = Listen(path)
	assert.ErrorContains(t, err, "not a socket")
	b, _ := os.ReadFile(path)
	assert.Equal(t, "data", string(b))
}

func TestRuntimeDir(t *testing.T) {
	assert.Equal(t, "/run/vrnic", runtimeDirFor(0, "/run/user/0", "/tmp"))
	assert.Equal(t, "/run/user/1000/vrnic", runtimeDirFor(1000, "/run/user/1000", "/tmp"))
	assert.Equal(t, "/tmp/vrnic-1000", runtimeDirFor(1000, "", "/tmp"))
	assert.Equal(t, runtimeDirFor(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR"), os.TempDir()), RuntimeDir())
	dir := filepath.Join(t.TempDir(), "rt")
	_, err := CreateRuntimeDir(dir)
	require.NoError(t, err)
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	require.NoError(t, os.Chmod(dir, 0o777))
	_, err = CreateRuntimeDir(dir)
	assert.ErrorContains(t, err, "writable by group or others")
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err = CreateRuntimeDir(f)
	assert.Error(t, err)
	assert.Equal(t, "/r/vr0.sock", SocketPath("/r", "vr0"))
}

// TestCreateRuntimeDirTracked: CreateRuntimeDir reports the directories it
// made, and RemoveCreatedDirs removes those, innermost first, only while
// they are empty; a directory that existed is never reported.
func TestCreateRuntimeDirTracked(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "rt")
	created, err := CreateRuntimeDir(dir)
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(base, "a"), filepath.Join(base, "a", "b"), dir}, created)
	again, err := CreateRuntimeDir(dir)
	require.NoError(t, err)
	assert.Empty(t, again, "it exists now")

	// Something in the runtime dir keeps all of them.
	sock := filepath.Join(dir, "other.sock")
	require.NoError(t, os.WriteFile(sock, nil, 0o600))
	assert.Empty(t, RemoveCreatedDirs(created))
	assert.DirExists(t, dir)
	// Something beside it keeps the parents only.
	require.NoError(t, os.Remove(sock))
	require.NoError(t, os.WriteFile(filepath.Join(base, "a", "keep"), nil, 0o600))
	assert.Equal(t, []string{dir, filepath.Join(base, "a", "b")}, RemoveCreatedDirs(append(created, dir)))
	assert.NoDirExists(t, filepath.Join(base, "a", "b"))
	assert.FileExists(t, filepath.Join(base, "a", "keep"))

	// A file put where a directory was is not removed.
	require.NoError(t, os.WriteFile(filepath.Join(base, "a", "b"), nil, 0o600))
	assert.Empty(t, RemoveCreatedDirs([]string{filepath.Join(base, "a", "b")}))
	assert.FileExists(t, filepath.Join(base, "a", "b"))
}
