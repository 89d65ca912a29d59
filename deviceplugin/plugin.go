package deviceplugin

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	// DefaultResourceName is the extended resource the plugin advertises:
	// a pod asks for it in resources.limits ("vrnic.io/rdma": 1).
	DefaultResourceName = "vrnic.io/rdma"
	// DefaultEndpoint is the plugin's socket in the kubelet's device
	// plugin directory.
	DefaultEndpoint = "vrnic.sock"
	// DefaultRuntimeDir holds the daemons' control sockets on the node
	// (vrnicd's default as root, admin.RuntimeDir).
	DefaultRuntimeDir = "/run/vrnic"
	// DefaultStateDir is where the plugin keeps the drop-in libraries
	// and the allocations' views on the node.
	DefaultStateDir = "/var/lib/vrnic/device-plugin"

	// ContainerRuntimeDir is where a container finds the control sockets
	// of its devices (VRNIC_RUNTIME_DIR).
	ContainerRuntimeDir = "/run/vrnic"
	// ContainerLibDir is where a container finds the drop-in
	// libibverbs.so.1, librdmacm.so.1 and the interface shim
	// (LD_LIBRARY_PATH).
	ContainerLibDir = "/opt/vrnic/lib"
	// nodeSubdir is the mount point, under ContainerRuntimeDir, of the
	// node's runtime directory; the devices' sockets are symlinks into it.
	nodeSubdir = "node"
)

// Config configures a Plugin. Paths are the node's: the plugin hands them
// to the kubelet as mount sources, so a plugin running in a container must
// see the node's directories at the same paths.
type Config struct {
	// ResourceName is the extended resource; default DefaultResourceName.
	ResourceName string
	// PluginDir is the kubelet's device plugin directory, which holds
	// its registration socket (kubelet.sock) and the plugin's;
	// default pb.DevicePluginPath.
	PluginDir string
	// Endpoint is the plugin's socket file name in PluginDir; default
	// DefaultEndpoint.
	Endpoint string
	// RuntimeDir holds the daemons' control sockets; default
	// DefaultRuntimeDir.
	RuntimeDir string
	// StateDir is the plugin's own directory; default DefaultStateDir.
	StateDir string
	// LibDir holds the built drop-in libraries (ibverbs.Build); they are
	// copied into StateDir, which the containers mount. Required.
	LibDir string
	// Shares is how many containers may use one daemon at once: each
	// daemon is advertised as that many devices (IDs NAME#0 ..
	// NAME#Shares-1; with 1, the ID is NAME). A daemon serves many
	// clients; the per-uid limits of the daemon, not the count, bound
	// what each takes. Default 1.
	Shares int
	// SysfsView mounts /sys/class/infiniband and
	// /sys/class/infiniband_verbs describing the container's devices.
	// The container runtime needs those directories to exist in the
	// container's sysfs to mount over them: they do on a node whose
	// kernel has the RDMA core loaded (modprobe ib_uverbs; no hardware
	// needed), and not otherwise, where the container would fail to
	// start. See SysfsClassesPresent.
	SysfsView bool
	// PollInterval is how often the runtime directory is scanned for new
	// sockets, an unhealthy daemon tried again and the kubelet's socket
	// checked for a restart; default 200ms.
	PollInterval time.Duration
	// HealthInterval is how often a healthy daemon is asked for INFO
	// (its exit is seen at once in between); default 1s.
	HealthInterval time.Duration
	// CallTimeout bounds an INFO call; default 2s.
	CallTimeout time.Duration
	// Log gets lifecycle events (devices found, health changes,
	// registrations, allocations); nil discards them.
	Log *slog.Logger
}

// Plugin is the device plugin of one node: it advertises every vrnicd
// control socket in the runtime directory as a device of the extended
// resource, healthy while its daemon answers, and gives a container its
// devices (Allocate).
type Plugin struct {
	pb.UnimplementedDevicePluginServer
	cfg    Config
	log    *slog.Logger
	devs   *table
	libDir string // the installed libraries, under StateDir
	count  counters
}

var _ pb.DevicePluginServer = (*Plugin)(nil)

// New checks cfg, fills its defaults and installs the libraries into the
// state directory.
func New(cfg Config) (*Plugin, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.ResourceName, DefaultResourceName)
	def(&cfg.PluginDir, pb.DevicePluginPath)
	def(&cfg.Endpoint, DefaultEndpoint)
	def(&cfg.RuntimeDir, DefaultRuntimeDir)
	def(&cfg.StateDir, DefaultStateDir)
	defd := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defd(&cfg.PollInterval, 200*time.Millisecond)
	defd(&cfg.HealthInterval, time.Second)
	defd(&cfg.CallTimeout, 2*time.Second)
	if cfg.Shares == 0 {
		cfg.Shares = 1
	}
	if cfg.Shares < 0 || cfg.Shares > 1024 {
		return nil, fmt.Errorf("shares %d: want 1..1024", cfg.Shares)
	}
	if err := CheckResourceName(cfg.ResourceName); err != nil {
		return nil, err
	}
	if strings.ContainsRune(cfg.Endpoint, '/') {
		return nil, fmt.Errorf("endpoint %q: a file name in the plugin directory, without '/'", cfg.Endpoint)
	}
	for _, d := range []*string{&cfg.PluginDir, &cfg.RuntimeDir, &cfg.StateDir} {
		if !filepath.IsAbs(*d) {
			return nil, fmt.Errorf("%q: the plugin needs absolute paths (they are mount sources on the node)", *d)
		}
		*d = filepath.Clean(*d)
	}
	if cfg.LibDir == "" {
		return nil, errors.New("no library directory (the built libibverbs.so.1 and librdmacm.so.1)")
	}
	p := &Plugin{cfg: cfg, log: logger(cfg.Log), devs: newTable()}
	lib, err := installLibs(cfg.LibDir, filepath.Join(cfg.StateDir, "lib"))
	if err != nil {
		return nil, err
	}
	p.libDir = lib
	return p, nil
}

// CheckResourceName checks that name is an extended resource name a device
// plugin may register: DOMAIN/NAME, the domain not kubernetes.io's.
func CheckResourceName(name string) error {
	dom, n, ok := strings.Cut(name, "/")
	if !ok || dom == "" || n == "" || strings.Contains(n, "/") {
		return fmt.Errorf("resource name %q: want DOMAIN/NAME, e.g. %s", name, DefaultResourceName)
	}
	if dom == "kubernetes.io" || strings.HasSuffix(dom, ".kubernetes.io") {
		return fmt.Errorf("resource name %q: the kubernetes.io domain is reserved", name)
	}
	for _, part := range []string{dom, n} {
		for _, r := range part {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
				return fmt.Errorf("resource name %q: character %q not allowed", name, r)
			}
		}
	}
	return nil
}

// SysfsClassesPresent reports whether this node's sysfs has the
// infiniband and infiniband_verbs classes, over which Config.SysfsView
// mounts a container's.
func SysfsClassesPresent() bool {
	for _, c := range []string{"/sys/class/infiniband", "/sys/class/infiniband_verbs"} {
		if fi, err := os.Stat(c); err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// libFiles are the files of a library directory that containers need.
var libFiles = []string{"libibverbs.so.1", "librdmacm.so.1", "libvrnic-netdev.so"}

// installLibs copies the libraries of src into a directory under dst
// named by a hash of their contents (so a container keeps the libraries it
// started with when the plugin installs newer ones) and returns it.
func installLibs(src, dst string) (string, error) {
	h := sha256.New()
	var have []string
	for _, f := range libFiles {
		b, err := os.ReadFile(filepath.Join(src, f))
		if errors.Is(err, os.ErrNotExist) && f != libFiles[0] {
			continue // no librdmacm on the build host, or no shim
		}
		if err != nil {
			return "", fmt.Errorf("library directory %s: %w", src, err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
		have = append(have, f)
	}
	dir := filepath.Join(dst, hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dst, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	for _, f := range have {
		if err := copyFile(filepath.Join(src, f), filepath.Join(tmp, f), 0o755); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			return dir, nil // installed by another plugin meanwhile
		}
		return "", err
	}
	return dir, nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// shareSep separates a daemon's name from the share number in a device
// ID.
const shareSep = "#"

// deviceIDs returns the IDs of daemon name's devices.
func (p *Plugin) deviceIDs(name string) []string {
	if p.cfg.Shares == 1 {
		return []string{name}
	}
	ids := make([]string, p.cfg.Shares)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%s%d", name, shareSep, i)
	}
	return ids
}

// daemonOf returns the daemon of device ID id, if the plugin advertises
// it.
func (p *Plugin) daemonOf(id string) (string, bool) {
	name := id
	if p.cfg.Shares > 1 {
		i := strings.LastIndex(id, shareSep)
		if i < 0 {
			return "", false
		}
		var k int
		if _, err := fmt.Sscanf(id[i+len(shareSep):], "%d", &k); err != nil || k < 0 || k >= p.cfg.Shares ||
			id[i+len(shareSep):] != fmt.Sprint(k) {
			return "", false
		}
		name = id[:i]
	}
	return name, p.devs.known(name)
}

// LibDir returns the directory of the installed libraries.
func (p *Plugin) LibDir() string { return p.libDir }

func sortedUnique(ids []string) []string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return slices.Compact(s)
}
