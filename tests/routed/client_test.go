package routed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/internal/launch"
)

// hostClient is the test's end of one host's helper process.
type hostClient struct {
	host   int
	cmd    *exec.Cmd
	stderr *launch.Buffer
	done   chan struct{} // closed when the process exited
	err    error         // its exit status, after done

	inMu sync.Mutex
	in   io.WriteCloser

	mu      sync.Mutex
	next    int
	waiting map[int]chan reply
	eof     chan struct{} // closed when its stdout ended
}

// startHelper starts host i's helper in the host's namespace, as a client
// of daemon d; t.Cleanup stops it by its PID.
func startHelper(t *testing.T, tp *topo, d *daemon) *hostClient {
	t.Helper()
	a, err := json.Marshal(helperArgs{Socket: d.sock, Host: d.host})
	require.NoError(t, err)
	c := &hostClient{host: d.host, stderr: &launch.Buffer{}, done: make(chan struct{}), waiting: map[int]chan reply{}, eof: make(chan struct{})}
	c.cmd = exec.Command("ip", "netns", "exec", tp.hosts[d.host], os.Args[0], "-test.run=^$")
	c.cmd.Env = append(os.Environ(), helperEnv+"="+string(a))
	c.cmd.Stderr = c.stderr
	// The kernel kills it if the test dies without stopping it.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.in, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	out, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	go c.read(out)
	go func() {
		<-c.eof
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// read dispatches the helper's replies to their callers.
func (c *hostClient) read(out io.Reader) {
	defer close(c.eof)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintf(c.stderr, "test: bad reply %q: %v\n", sc.Text(), err)
			continue
		}
		c.mu.Lock()
		ch := c.waiting[r.ID]
		delete(c.waiting, r.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// stop closes the helper's stdin (it exits when its requests are
// served), then SIGKILLs it by its PID if it is still there after 10 s.
func (c *hostClient) stop(t *testing.T) {
	c.inMu.Lock()
	c.in.Close()
	c.inMu.Unlock()
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	if c.err != nil && t.Failed() {
		t.Logf("helper h%d: %v:\n%s", c.host, c.err, c.stderr.String())
	}
}

// kill SIGKILLs the helper by its PID and waits for it.
func (c *hostClient) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

// call sends r and waits for its reply (two minutes at most). A reply's
// Err is returned as an error.
func (c *hostClient) call(r request) (reply, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	c.next++
	r.ID = c.next
	c.waiting[r.ID] = ch
	c.mu.Unlock()
	b, err := json.Marshal(r)
	if err != nil {
		return reply{}, err
	}
	c.inMu.Lock()
	_, err = c.in.Write(append(b, '\n'))
	c.inMu.Unlock()
	if err != nil {
		return reply{}, fmt.Errorf("h%d %s: write request: %w", c.host, r.Op, err)
	}
	select {
	case rep := <-ch:
		if rep.Err != "" {
			return rep, errors.New(rep.Err)
		}
		return rep, nil
	case <-c.eof:
		return reply{}, fmt.Errorf("h%d %s peer h%d: the helper exited:\n%s", c.host, r.Op, r.Peer, c.stderr.String())
	case <-time.After(2 * time.Minute):
		return reply{}, fmt.Errorf("h%d %s peer h%d: no reply in 2 minutes", c.host, r.Op, r.Peer)
	}
}

// postExpect posts a work request of kind on c's QP to peer and checks
// that it completes with want.
func (c *hostClient) postExpect(peer int, kind abi.WROpcode, size int, seed uint32, want abi.WCStatus) error {
	rep, err := c.call(request{Op: "post", Peer: peer, Kind: kind, Size: size, Seed: seed})
	if err != nil {
		return err
	}
	if rep.Status != want {
		return fmt.Errorf("h%d → h%d %v of %d bytes: completion status %v, want %v", c.host, peer, kind, size, rep.Status, want)
	}
	return nil
}

// connectPair creates a new QP on i to j and on j to i (replacing any
// before) and connects them, from GID index gid on both sides.
func connectPair(hs []*hostClient, i, j, gid int) error {
	a, err := hs[i].call(request{Op: "create", Peer: j, GID: gid})
	if err != nil {
		return err
	}
	b, err := hs[j].call(request{Op: "create", Peer: i, GID: gid})
	if err != nil {
		return err
	}
	if _, err := hs[i].call(request{Op: "connect", Peer: j, Info: b.Info}); err != nil {
		return err
	}
	_, err = hs[j].call(request{Op: "connect", Peer: i, Info: a.Info})
	return err
}

// sizes are the message sizes the rounds go through: one byte, a path
// MTU (1024) and either side of it, several MTUs, the largest.
var sizes = []int{1, 1023, 1024, 1025, 3*1024 + 17, 16 << 10, maxMsg}

// pairRound moves data from i to j on their QPs, one operation at a time,
// each checked where the data lands: a WRITE (j checks its memory), a
// SEND (j checks the receive completion and the data), a READ of what j
// put in its memory (i checks what it read).
func pairRound(hs []*hostClient, i, j, round int) error {
	seed := uint32(round*nHosts*nHosts+i*nHosts+j)*3 + 1
	size := sizes[(round+i+2*j)%len(sizes)]
	if err := hs[i].postExpect(j, abi.WRRDMAWrite, size, seed, abi.WCSuccess); err != nil {
		return err
	}
	if _, err := hs[j].call(request{Op: "checkwrite", Peer: i, Size: size, Seed: seed}); err != nil {
		return err
	}
	if _, err := hs[j].call(request{Op: "postrecv", Peer: i}); err != nil {
		return err
	}
	if err := hs[i].postExpect(j, abi.WRSend, size, seed+1, abi.WCSuccess); err != nil {
		return err
	}
	if _, err := hs[j].call(request{Op: "checkrecv", Peer: i, Size: size, Seed: seed + 1}); err != nil {
		return err
	}
	if _, err := hs[j].call(request{Op: "fill", Peer: i, Size: size, Seed: seed + 2}); err != nil {
		return err
	}
	return hs[i].postExpect(j, abi.WRRDMARead, size, seed+2, abi.WCSuccess)
}

// pair is an ordered pair of hosts: traffic from I to J.
type pair struct{ I, J int }

func (p pair) String() string { return fmt.Sprintf("h%d→h%d", p.I, p.J) }

// allPairs returns every ordered pair of distinct hosts not in skip.
func allPairs(skip ...int) []pair {
	var out []pair
	for i := range nHosts {
		for j := range nHosts {
			if i != j && !slices.Contains(skip, i) && !slices.Contains(skip, j) {
				out = append(out, pair{i, j})
			}
		}
	}
	return out
}

// runRounds runs rounds first..first+n-1 on every pair at once (a
// goroutine per pair) and returns the errors.
func runRounds(hs []*hostClient, pairs []pair, first, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(pairs))
	for k, p := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := first; r < first+n; r++ {
				if err := pairRound(hs, p.I, p.J, r); err != nil {
					errs[k] = fmt.Errorf("%v round %d: %w", p, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// loops keeps rounds running on some pairs until stopped, counting the
// rounds each pair completed.
type loops struct {
	pairs []pair
	stopc chan struct{}
	wg    sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond
	rounds []int
	err    error
}

// startLoops starts a goroutine per pair running rounds from round first.
func startLoops(hs []*hostClient, pairs []pair, first int) *loops {
	l := &loops{pairs: pairs, stopc: make(chan struct{}), rounds: make([]int, len(pairs))}
	l.cond = sync.NewCond(&l.mu)
	for k, p := range pairs {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for r := first; ; r++ {
				select {
				case <-l.stopc:
					return
				default:
				}
				err := pairRound(hs, p.I, p.J, r)
				l.mu.Lock()
				if err != nil && l.err == nil {
					l.err = fmt.Errorf("%v round %d: %w", p, r, err)
				}
				if err == nil {
					l.rounds[k]++
				}
				l.cond.Broadcast()
				l.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	return l
}

// counts returns the rounds each pair completed so far.
func (l *loops) counts() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.rounds...)
}

// waitEach waits until every pair completed more than base[k]+n-1 rounds
// (n more than base; base nil: n in all), or a round failed.
func (l *loops) waitEach(base []int, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.err != nil {
			return l.err
		}
		done := true
		for k, c := range l.rounds {
			b := 0
			if base != nil {
				b = base[k]
			}
			if c < b+n {
				done = false
			}
		}
		if done {
			return nil
		}
		l.cond.Wait()
	}
}

// stop stops the loops after their current round and returns the first
// error.
func (l *loops) stop() error {
	close(l.stopc)
	l.wg.Wait()
	return l.err
}

// connectAll connects every pair of hosts (i < j) over GID index gid(i, j).
func connectAll(hs []*hostClient, gid func(i, j int) int) error {
	for i := range nHosts {
		for j := i + 1; j < nHosts; j++ {
			if err := connectPair(hs, i, j, gid(i, j)); err != nil {
				return err
			}
		}
	}
	return nil
}
