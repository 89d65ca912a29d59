package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/vrnic/vrnic/admin"
)

// VrnicdPackage is the import path of the daemon.
const VrnicdPackage = "github.com/vrnic/vrnic/cmd/vrnicd"

// GoBuild builds the command pkg with the go tool into dir/name and
// returns the binary's path. The build's output goes to out.
func GoBuild(pkg, dir, name string, out io.Writer) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	return bin, nil
}

// FindVrnicd returns the daemon binary to run: explicit if not empty,
// else a vrnicd beside the running executable, else one built with the
// go tool into dir (announced on out, which also gets the build's
// output; this works from within the module's tree).
func FindVrnicd(explicit, dir string, out io.Writer) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "vrnicd")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	fmt.Fprintln(out, "building vrnicd ...")
	bin, err := GoBuild(VrnicdPackage, dir, "vrnicd", out)
	if err != nil {
		return "", fmt.Errorf("build vrnicd (run from the repository, or pass -vrnicd): %w", err)
	}
	return bin, nil
}

// ErrNotReady: a daemon did not answer on its control socket in time.
var ErrNotReady = errors.New("no control socket")

// ErrExited: a process exited while it was expected to start up.
var ErrExited = errors.New("exited during start-up")

// WaitReady waits until the daemon p answers an INFO request on its
// control socket sock. It fails with ErrExited (with the end of p's log)
// if p exits first, and with ErrNotReady after timeout or when ctx ends.
func WaitReady(ctx context.Context, p *Proc, sock string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := admin.Serving(sock); err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("%s %w:\n%s", p.Name, ErrExited, p.Tail(10))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: %w at %s", p.Name, ErrNotReady, sock)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
