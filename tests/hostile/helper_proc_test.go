package hostile

// Helper processes that run beside a probe (the flood, the clients killed
// mid-traffic): started, read line by line while they run, and stopped by
// their PID.

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/internal/launch"
)

// hostileSeedEnv overrides the seed of the seeded probes (flood,
// SIGKILL, fairness), to replay a failed run.
const hostileSeedEnv = "VRNIC_HOSTILE_SEED"

// hostileSeed returns the seed of a seeded probe, $VRNIC_HOSTILE_SEED or
// a fresh one, and logs it.
func hostileSeed(t testing.TB) uint64 {
	t.Helper()
	seed := rand.Uint64() >> 1
	if s := os.Getenv(hostileSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", hostileSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (%s=%d replays it)", seed, hostileSeedEnv, seed)
	return seed
}

// opsProc is a helper process (TestOpsHelperProcess in a mode) running
// beside the probe.
type opsProc struct {
	cmd   *exec.Cmd
	out   launch.Buffer // everything it printed
	lines chan string   // its OPS lines as they come, without the prefix; closed at its end
	done  chan struct{} // closed once it exited
	err   error         // its exit status, once done is closed
}

// opsStart starts the helper in mode against socket under the
// credentials as, with env added to its environment. The test's cleanup
// kills it by its PID if it still runs. It returns an error rather than
// failing t, so that the goroutines of a probe may start helpers.
func (e *opsEnv) opsStart(t testing.TB, as opsAs, mode, socket string, env ...string) (*opsProc, error) {
	cmd := e.opsHelperCmd(as, mode, socket, env...)
	p := &opsProc{lines: make(chan string, 64), done: make(chan struct{})}
	cmd.Stderr = &p.out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("helper %s: %w", mode, err)
	}
	p.cmd = cmd
	t.Cleanup(p.kill)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.out.Write(append(sc.Bytes(), '\n'))
			if l, ok := strings.CutPrefix(sc.Text(), "OPS "); ok {
				select {
				case p.lines <- l:
				default: // nobody reads them: they stay in out
				}
			}
		}
		close(p.lines)
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// next returns the helper's next OPS line; false when it ended first or
// nothing came within timeout.
func (p *opsProc) next(timeout time.Duration) (string, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l, ok := <-p.lines:
		return l, ok
	case <-t.C:
		return "", false
	}
}

// wait waits up to timeout for the helper to exit by itself (killing it
// after that) and returns its OPS lines.
func (p *opsProc) wait(timeout time.Duration) ([]string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.kill()
		return opsLines(p.out.String()), fmt.Errorf("helper still running after %v: killed", timeout)
	}
	return opsLines(p.out.String()), p.err
}

// kill sends SIGKILL to the helper by its PID, unless it has exited, and
// waits for its end.
func (p *opsProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL) // by its pidfd: no other process if it has just been reaped
	<-p.done
}

// closeRights closes every descriptor that came in the control message
// oob (a reply's: the probes' raw clients need none of them).
func closeRights(oob []byte) {
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, cm := range cms {
		fds, _ := unix.ParseUnixRights(&cm)
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}
