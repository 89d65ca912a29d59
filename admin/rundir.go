package admin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SocketSuffix is the file name suffix of a device's control socket: the
// socket of device "vr0" is "vr0.sock" in the runtime directory.
const SocketSuffix = ".sock"

// RuntimeDir returns the directory that holds the control sockets and lock
// files of the devices of this user:
//
//   - root (euid 0): /run/vrnic
//   - others, XDG_RUNTIME_DIR set: $XDG_RUNTIME_DIR/vrnic
//   - others, XDG_RUNTIME_DIR unset: $TMPDIR/vrnic-<uid> (os.TempDir), a
//     directory private to the user (mode 0700, ownership checked by
//     CreateRuntimeDir).
//
// vrnicd and vrnicctl use the same rule, so vrnicctl finds the sockets of
// the daemons of the same user without flags.
func RuntimeDir() string {
	return runtimeDirFor(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR"), os.TempDir())
}

func runtimeDirFor(euid int, xdg, tmp string) string {
	if euid == 0 {
		return "/run/vrnic"
	}
	if xdg != "" {
		return filepath.Join(xdg, "vrnic")
	}
	return filepath.Join(tmp, "vrnic-"+strconv.Itoa(euid))
}

// SocketPath returns the default control socket path of device name in dir.
func SocketPath(dir, name string) string {
	return filepath.Join(dir, name+SocketSuffix)
}

// CreateRuntimeDir creates dir (mode 0700) if needed and checks that it is
// a directory owned by the current user and not writable by others, so
// another user cannot plant sockets in it. It returns the directories it
// created itself (dir and the missing parents, outermost first; none if
// dir existed), for RemoveCreatedDirs at exit; a directory another process
// creates at the same moment is not counted.
//
// As root the directory is created 0755 so that clients of other users
// can reach sockets whose own mode (0660) and group allow them; otherwise
// 0700.
func CreateRuntimeDir(dir string) (created []string, err error) {
	mode := os.FileMode(0o700)
	if os.Geteuid() == 0 {
		mode = 0o755
	}
	if created, err = mkdirAllTracked(dir, mode); err != nil {
		return created, fmt.Errorf("runtime dir %s: %w", dir, err)
	}
	return created, checkRuntimeDir(dir)
}

// mkdirAllTracked is os.MkdirAll that reports the directories it made:
// each missing one is made with Mkdir, and only those whose Mkdir
// succeeded are reported (EEXIST: someone else made it meanwhile).
func mkdirAllTracked(dir string, mode os.FileMode) ([]string, error) {
	var missing []string
	for p := filepath.Clean(dir); ; {
		if _, err := os.Lstat(p); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, p)
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], mode)
		switch {
		case err == nil:
			created = append(created, missing[i])
		case errors.Is(err, os.ErrExist):
		default:
			return created, err
		}
	}
	return created, nil
}

// RemoveCreatedDirs removes, innermost first, the directories of created
// (from CreateRuntimeDir) that are empty: rmdir never removes a directory
// that still holds something, such as another daemon's socket or lock
// file. It stops at the first one it cannot remove (its parents are not
// empty either) and returns the directories it removed.
func RemoveCreatedDirs(created []string) (removed []string) {
	dirs := slices.Clone(created)
	// Innermost first: a directory's path is longer than its parent's.
	slices.SortFunc(dirs, func(a, b string) int {
		if c := len(b) - len(a); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	dirs = slices.Compact(dirs)
	for _, d := range dirs {
		err := syscall.Rmdir(d)
		switch {
		case err == nil:
			removed = append(removed, d)
		case errors.Is(err, os.ErrNotExist):
		default:
			return removed
		}
	}
	return removed
}

func checkRuntimeDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("runtime dir %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("runtime dir %s: not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("runtime dir %s: owned by uid %d, not %d", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("runtime dir %s: writable by group or others (mode %v)", dir, fi.Mode().Perm())
	}
	return nil
}

// ErrSocketInUse is returned by Listen when a live daemon already serves the
// socket path.
var ErrSocketInUse = errors.New("control socket in use by a running daemon")

// Listen creates the SOCK_SEQPACKET control socket at path (mode 0600 by
// default umask handling: the socket is chmod-ed to 0660 so a group may be
// granted access through the directory). An existing socket file is probed:
// if a connect succeeds, another daemon is alive and Listen fails with
// ErrSocketInUse; if the connect fails with ECONNREFUSED the socket is stale
// (its daemon crashed) and is replaced. Any other file at path is left alone
// and reported.
func Listen(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		c, err := net.DialTimeout("unixpacket", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", path, ErrSocketInUse)
		case errors.Is(err, syscall.ECONNREFUSED):
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
			}
		default:
			return nil, fmt.Errorf("listen %s: probing existing socket: %w", path, err)
		}
	}
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// Close removes the socket file; the daemon relies on that at shutdown.
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return l, nil
}
