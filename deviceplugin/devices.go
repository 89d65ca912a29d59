package deviceplugin

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vrnic/vrnic/admin"
)

// table is the plugin's view of the node's devices: one entry per control
// socket ever seen in the runtime directory, with its health. Watchers
// (one goroutine per device) and the discovery loop write it; ListAndWatch
// streams read it. Every change closes the current changed channel and
// makes a new one, so a reader waits for "something changed since the
// snapshot I sent" without missing an update.
type table struct {
	mu      sync.Mutex
	devs    map[string]bool   // device name → healthy
	downs   map[string]uint64 // device name → healthy-to-unhealthy transitions
	changed chan struct{}
	version uint64
}

func newTable() *table {
	return &table{devs: map[string]bool{}, downs: map[string]uint64{}, changed: make(chan struct{})}
}

// device is one device in a snapshot.
type device struct {
	Name    string
	Healthy bool
}

// snapshot returns the devices by name, the version and the channel closed
// at the next change.
func (t *table) snapshot() ([]device, uint64, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]device, 0, len(t.devs))
	for n, h := range t.devs {
		out = append(out, device{n, h})
	}
	slices.SortFunc(out, func(a, b device) int { return strings.Compare(a.Name, b.Name) })
	return out, t.version, t.changed
}

// stats returns the devices and their healthy-to-unhealthy transitions.
func (t *table) stats() ([]device, map[string]uint64) {
	devs, _, _ := t.snapshot()
	t.mu.Lock()
	defer t.mu.Unlock()
	downs := make(map[string]uint64, len(t.downs))
	for k, v := range t.downs {
		downs[k] = v
	}
	return devs, downs
}

// add adds name (unhealthy) and reports whether it is new.
func (t *table) add(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.devs[name]; ok {
		return false
	}
	t.devs[name] = false
	t.bump()
	return true
}

// set records name's health; it reports whether that changed it.
func (t *table) set(name string, healthy bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.devs[name]
	if ok && h == healthy {
		return false
	}
	if h && !healthy {
		t.downs[name]++
	}
	t.devs[name] = healthy
	t.bump()
	return true
}

// known reports whether name is a device of the table.
func (t *table) known(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.devs[name]
	return ok
}

func (t *table) bump() {
	t.version++
	close(t.changed)
	t.changed = make(chan struct{})
}

// discover adds a device for every control socket (NAME.sock) in dir, now
// and every interval, and starts a watcher for each new one. It returns
// when ctx ends.
func (p *Plugin) discover(ctx context.Context, wg *sync.WaitGroup) {
	tick := time.NewTicker(p.cfg.PollInterval)
	defer tick.Stop()
	lastErr := ""
	for {
		ents, err := os.ReadDir(p.cfg.RuntimeDir)
		if err != nil && !os.IsNotExist(err) && err.Error() != lastErr {
			p.log.Warn("reading the runtime directory", "dir", p.cfg.RuntimeDir, "err", err) // once per distinct error
		}
		lastErr = ""
		if err != nil {
			lastErr = err.Error()
		}
		for _, e := range ents {
			n := e.Name()
			if e.Type()&os.ModeSocket == 0 || len(n) <= len(admin.SocketSuffix) || !strings.HasSuffix(n, admin.SocketSuffix) {
				continue
			}
			name := strings.TrimSuffix(n, admin.SocketSuffix)
			if p.devs.add(name) {
				p.log.Info("device found", "device", name)
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.watch(ctx, name)
				}()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// watch keeps device name's health: healthy while its daemon answers INFO
// on its control socket. The connection stays open between the checks and
// the watcher waits on it, so the daemon's exit (the kernel closes its end)
// is seen at once; a daemon that stops answering is seen within
// HealthInterval plus CallTimeout. An unhealthy device's socket is tried
// again every PollInterval.
func (p *Plugin) watch(ctx context.Context, name string) {
	sock := admin.SocketPath(p.cfg.RuntimeDir, name)
	for ctx.Err() == nil {
		reason := p.watchOnce(ctx, name, sock)
		if p.devs.set(name, false) {
			p.log.Warn("device unhealthy", "device", name, "reason", reason)
		}
		select {
		case <-ctx.Done():
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

// watchOnce connects to the daemon and checks it until it fails; it
// returns why.
func (p *Plugin) watchOnce(ctx context.Context, name, sock string) string {
	c, err := admin.Dial(sock)
	if err != nil {
		return err.Error()
	}
	defer c.Close()
	c.SetTimeout(p.cfg.CallTimeout)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	for {
		if _, err := c.Info(); err != nil {
			return "INFO: " + err.Error()
		}
		if p.devs.set(name, true) {
			p.log.Info("device healthy", "device", name)
		}
		closed, err := c.WaitClosed(p.cfg.HealthInterval)
		switch {
		case ctx.Err() != nil:
			return "stopping"
		case closed:
			return "the daemon closed its control connection"
		case err != nil:
			return err.Error()
		}
	}
}

// logger returns l, or a logger that discards.
func logger(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}
