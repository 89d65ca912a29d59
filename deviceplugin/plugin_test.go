package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheckResourceName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{DefaultResourceName, true},
		{"example.com/rdma_shared-1", true},
		{"rdma", false},
		{"/rdma", false},
		{"vrnic.io/", false},
		{"vrnic.io/a/b", false},
		{"kubernetes.io/rdma", false},
		{"node.kubernetes.io/rdma", false},
		{"vrnic.io/rdma dev", false},
	} {
		err := CheckResourceName(c.name)
		assert.Equal(t, c.ok, err == nil, "%q: %v", c.name, err)
	}
}

// The table's changed channel closes at each change and only then.
func TestTableChanges(t *testing.T) {
	tb := newTable()
	_, v0, ch := tb.snapshot()
	require.True(t, tb.add("b"))
	require.False(t, tb.add("b"), "added twice")
	select {
	case <-ch:
	default:
		t.Fatal("add did not signal")
	}
	_, v1, ch := tb.snapshot()
	assert.Greater(t, v1, v0)
	assert.False(t, tb.set("b", false), "setting the same health is no change")
	select {
	case <-ch:
		t.Fatal("no change signalled")
	default:
	}
	assert.True(t, tb.set("b", true))
	tb.add("a")
	devs, _, _ := tb.snapshot()
	assert.Equal(t, []device{{"a", false}, {"b", true}}, devs)
	assert.True(t, tb.known("a"))
	assert.False(t, tb.known("c"))
}

// installLibs copies the libraries into a directory named by their
// content: the same content, the same directory; new content, another.
func TestInstallLibs(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	_, err := installLibs(src, dst)
	assert.Error(t, err, "no libibverbs.so.1")
	require.NoError(t, os.WriteFile(filepath.Join(src, "libibverbs.so.1"), []byte("one"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(src, "unrelated.c"), []byte("x"), 0o644))
	d1, err := installLibs(src, dst)
	require.NoError(t, err)
	ents, _ := os.ReadDir(d1)
	require.Len(t, ents, 1)
	b, _ := os.ReadFile(filepath.Join(d1, "libibverbs.so.1"))
	assert.Equal(t, "one", string(b))
	d2, err := installLibs(src, dst)
	require.NoError(t, err)
	assert.Equal(t, d1, d2)
	require.NoError(t, os.WriteFile(filepath.Join(src, "librdmacm.so.1"), []byte("cm"), 0o644))
	d3, err := installLibs(src, dst)
	require.NoError(t, err)
	assert.NotEqual(t, d1, d3)
	ents, _ = os.ReadDir(dst)
	assert.Len(t, ents, 2, "no temporary directory left: %v", ents)
}

type registrar struct {
	pb.UnimplementedRegistrationServer
	reqs chan *pb.RegisterRequest
}

func (r *registrar) Register(_ context.Context, req *pb.RegisterRequest) (*pb.Empty, error) {
	r.reqs <- req
	return &pb.Empty{}, nil
}

// serveKubelet removes the sockets of dir, as a starting kubelet does,
// and serves the registration service there.
func serveKubelet(t *testing.T, dir string) (*registrar, func()) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	require.NoError(t, err)
	r := &registrar{reqs: make(chan *pb.RegisterRequest, 4)}
	s := grpc.NewServer()
	pb.RegisterRegistrationServer(s, r)
	go s.Serve(l)
	return r, s.Stop
}

func recvRegister(t *testing.T, r *registrar) *pb.RegisterRequest {
	t.Helper()
	select {
	case req := <-r.reqs:
		return req
	case <-time.After(20 * time.Second):
		t.Fatal("no registration")
		return nil
	}
}

// A stale socket (no daemon behind it) is a device, unhealthy, and cannot
// be allocated; the plugin registers with the kubelet again after the
// kubelet restarts; Run stops every goroutine it started.
func TestRunWithoutDaemons(t *testing.T) {
	base := t.TempDir()
	plugDir, runDir, stateDir, libDir := filepath.Join(base, "dp"), filepath.Join(base, "run"), filepath.Join(base, "state"), filepath.Join(base, "lib")
	for _, d := range []string{plugDir, runDir, libDir} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(libDir, "libibverbs.so.1"), []byte("lib"), 0o644))
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(runDir, "gone.sock"), Net: "unixpacket"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	l.Close() // the socket file stays, nobody listens: a daemon that died

	p, err := New(Config{PluginDir: plugDir, RuntimeDir: runDir, StateDir: stateDir, LibDir: libDir, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	kubelet, stop := serveKubelet(t, plugDir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		assert.NoError(t, <-done)
	}()

	req := recvRegister(t, kubelet)
	assert.Equal(t, pb.Version, req.GetVersion())
	assert.Equal(t, DefaultResourceName, req.GetResourceName())
	conn, err := grpc.NewClient("unix://"+filepath.Join(plugDir, req.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c := pb.NewDevicePluginClient(conn)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	s, err := c.ListAndWatch(sctx, &pb.Empty{})
	require.NoError(t, err)
	for {
		r, err := s.Recv()
		require.NoError(t, err)
		if len(r.GetDevices()) == 1 {
			assert.Equal(t, "gone", r.GetDevices()[0].GetID())
			assert.Equal(t, pb.Unhealthy, r.GetDevices()[0].GetHealth())
			break
		}
	}
	_, err = c.Allocate(ctx, &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: []string{"gone"}}}})
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	assert.ErrorContains(t, err, "does not answer")
	_, err = c.Allocate(ctx, &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: []string{"gone", "gone"}}}})
	assert.ErrorContains(t, err, "twice")
	scancel()

	stop()
	kubelet, stop = serveKubelet(t, plugDir)
	defer stop()
	req = recvRegister(t, kubelet)
	assert.Equal(t, DefaultEndpoint, req.GetEndpoint())

	// The metrics say what happened: two registrations, two refused
	// allocations, one unhealthy device that was never healthy. (The
	// plugin counts a registration when the kubelet's answer reaches it,
	// after the kubelet saw the request.)
	require.Eventually(t, func() bool { return p.count.registrations.Load() == 2 }, 20*time.Second, time.Millisecond)
	problems, err := testutil.CollectAndLint(p.Collector())
	require.NoError(t, err)
	assert.Empty(t, problems)
	assert.NoError(t, testutil.CollectAndCompare(p.Collector(), strings.NewReader(`
# HELP vrnic_plugin_advertised_devices Devices listed to the kubelet (each daemon's shares), by health.
# TYPE vrnic_plugin_advertised_devices gauge
vrnic_plugin_advertised_devices{health="healthy"} 0
vrnic_plugin_advertised_devices{health="unhealthy"} 1
# HELP vrnic_plugin_allocations_total Containers the kubelet asked devices for, by result (allocated, refused).
# TYPE vrnic_plugin_allocations_total counter
vrnic_plugin_allocations_total{result="allocated"} 0
vrnic_plugin_allocations_total{result="refused"} 2
# HELP vrnic_plugin_device_healthy 1 while the daemon answers on its control socket, else 0.
# TYPE vrnic_plugin_device_healthy gauge
vrnic_plugin_device_healthy{device="gone"} 0
# HELP vrnic_plugin_device_unhealthy_transitions_total Times the daemon was seen to go from healthy to unhealthy.
# TYPE vrnic_plugin_device_unhealthy_transitions_total counter
vrnic_plugin_device_unhealthy_transitions_total{device="gone"} 0
# HELP vrnic_plugin_kubelet_registrations_total Successful registrations with the kubelet (one at start, one after each kubelet restart).
# TYPE vrnic_plugin_kubelet_registrations_total counter
vrnic_plugin_kubelet_registrations_total 2
`), "vrnic_plugin_advertised_devices", "vrnic_plugin_allocations_total", "vrnic_plugin_device_healthy",
		"vrnic_plugin_device_unhealthy_transitions_total", "vrnic_plugin_kubelet_registrations_total"))
}

// With shares, a daemon is several devices; their IDs map back to it and
// nothing else does.
func TestShares(t *testing.T) {
	p := &Plugin{cfg: Config{Shares: 3}, devs: newTable()}
	p.devs.add("a#b")
	p.devs.add("c")
	assert.Equal(t, []string{"a#b#0", "a#b#1", "a#b#2"}, p.deviceIDs("a#b"))
	for id, want := range map[string]string{"a#b#0": "a#b", "a#b#2": "a#b", "c#1": "c"} {
		n, ok := p.daemonOf(id)
		assert.True(t, ok, id)
		assert.Equal(t, want, n, id)
	}
	for _, id := range []string{"c", "c#3", "c#-1", "c#01", "c#", "d#0", "a#b"} {
		_, ok := p.daemonOf(id)
		assert.False(t, ok, id)
	}
	p.cfg.Shares = 1
	assert.Equal(t, []string{"c"}, p.deviceIDs("c"))
	n, ok := p.daemonOf("c")
	assert.True(t, ok)
	assert.Equal(t, "c", n)
	_, ok = p.daemonOf("c#0")
	assert.False(t, ok)
}
