// Package k8s tests the Kubernetes device plugin (cmd/vrnic-device-plugin)
// against the kubelet's side of the device plugin API, played by the
// test: the registration service on kubelet.sock, then the plugin's own
// gRPC service (GetDevicePluginOptions, ListAndWatch, Allocate), then a
// container started from the allocation alone (container_test.go) running
// unmodified RDMA programs against a daemon of another node.
package k8s

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/deviceplugin"
	"github.com/vrnic/vrnic/ibverbs"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(containerEnv); spec != "" {
		runContainerStage(spec)
	}
	os.Exit(m.Run())
}

// The addresses of the test's daemons: node A holds a1 and a2, node B
// (another runtime directory, as another machine's) holds b1.
var (
	addrA1 = netip.MustParseAddr("127.0.41.1")
	addrB1 = netip.MustParseAddr("127.0.41.2")
	addrA2 = netip.MustParseAddr("127.0.41.3")
)

const (
	// socketGID is the daemons' group: their sockets (mode 0660) are
	// group-owned by it, and the container's process, which runs as
	// containerUID, has it as a supplementary group (a pod's
	// supplementalGroups), as in deploy/k8s.
	socketGID    = 4791
	containerUID = 1000
)

// daemon is one vrnicd.
type daemon struct {
	name, rundir string
	addr         netip.Addr
	cmd          *exec.Cmd
	done         chan struct{}
}

func (d *daemon) sock() string { return admin.SocketPath(d.rundir, d.name) }

// startDaemon starts vrnicd as root with group socketGID and waits until
// it answers.
func startDaemon(t *testing.T, bin, logDir, name, rundir string, addr netip.Addr) *daemon {
	t.Helper()
	d := &daemon{name: name, rundir: rundir, addr: addr, done: make(chan struct{})}
	logf, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	defer logf.Close()
	d.cmd = exec.Command(bin, "-name", name, "-runtime-dir", rundir, "-link", "udp",
		"-local", netip.AddrPortFrom(addr, 4791).String(), "-workers", "1")
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL,
		Credential: &syscall.Credential{Uid: 0, Gid: socketGID}}
	require.NoError(t, d.cmd.Start())
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() { d.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := admin.Serving(d.sock()); err == nil {
			return d
		}
		select {
		case <-d.done:
			b, _ := os.ReadFile(filepath.Join(logDir, name+".log"))
			t.Fatalf("vrnicd %s exited during start-up:\n%s", name, b)
		default:
		}
		require.True(t, time.Now().Before(deadline), "vrnicd %s does not answer", name)
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops the daemon by its PID (SIGTERM, then SIGKILL).
func (d *daemon) stop() {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// fakeKubelet is the kubelet's registration service.
type fakeKubelet struct {
	pb.UnimplementedRegistrationServer
	reqs chan *pb.RegisterRequest
	srv  *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pb.RegisterRequest) (*pb.Empty, error) {
	k.reqs <- r
	return &pb.Empty{}, nil
}

// startKubelet serves the registration service on dir/kubelet.sock, as a
// kubelet does at start: it first removes every socket in dir.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Type()&os.ModeSocket != 0 {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	require.NoError(t, err)
	k := &fakeKubelet{reqs: make(chan *pb.RegisterRequest, 4), srv: grpc.NewServer()}
	pb.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(l)
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) waitRegister(t *testing.T, timeout time.Duration) *pb.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(timeout):
		t.Fatalf("no registration within %v", timeout)
		return nil
	}
}

// listing is one ListAndWatch message and when it arrived.
type listing struct {
	at     time.Time
	health map[string]string
}

// watchList reads a ListAndWatch stream into a channel.
func watchList(t *testing.T, ctx context.Context, c pb.DevicePluginClient) <-chan listing {
	t.Helper()
	s, err := c.ListAndWatch(ctx, &pb.Empty{})
	require.NoError(t, err)
	ch := make(chan listing, 64)
	go func() {
		defer close(ch)
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			l := listing{at: time.Now(), health: map[string]string{}}
			for _, d := range r.GetDevices() {
				l.health[d.GetID()] = d.GetHealth()
			}
			ch <- l
		}
	}()
	return ch
}

// waitListing returns the first listing that satisfies ok.
func waitListing(t *testing.T, ch <-chan listing, timeout time.Duration, what string, ok func(map[string]string) bool) listing {
	t.Helper()
	deadline := time.After(timeout)
	var last map[string]string
	for {
		select {
		case l, open := <-ch:
			require.True(t, open, "ListAndWatch stream ended while waiting for %s", what)
			if ok(l.health) {
				return l
			}
			last = l.health
		case <-deadline:
			t.Fatalf("no listing with %s within %v; last: %v", what, timeout, last)
		}
	}
}

func TestKubeletDevicePlugin(t *testing.T) {
	testenv.NeedRoot(t, "the test plays the kubelet and a container runtime: mount namespaces, bind mounts, pivot_root, uid changes")
	testenv.NeedTool(t, "cc")
	for _, tool := range []string{"ibv_rc_pingpong", "ib_write_bw", "ibv_devices"} {
		testenv.NeedTool(t, tool)
	}
	for _, a := range []netip.Addr{addrA1, addrA2, addrB1} {
		testenv.Need(t, launch.UDPFree(a), fmt.Sprintf("UDP %v:4791 is taken", a))
	}
	work, err := os.MkdirTemp("", "k8s-plugin-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(work) })
	require.NoError(t, os.Chmod(work, 0o755)) // the container's uid walks into the node's runtime directory
	dir := func(n string) string {
		p := filepath.Join(work, n)
		require.NoError(t, os.MkdirAll(p, 0o755))
		return p
	}
	binDir, logDir := dir("bin"), dir("log")
	rundirA, rundirB := dir("run-a"), dir("run-b")
	pluginDir, stateDir := dir("device-plugins"), dir("state")
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"a1", "a2", "b1", "plugin"} {
				if b, err := os.ReadFile(filepath.Join(logDir, f+".log")); err == nil {
					t.Logf("%s.log:\n%s", f, b)
				}
			}
		}
	})
	bins := map[string]string{}
	for _, c := range []struct{ pkg, name string }{
		{launch.VrnicdPackage, "vrnicd"},
		{"github.com/vrnic/vrnic/cmd/vrnic-device-plugin", "vrnic-device-plugin"},
		{"github.com/vrnic/vrnic/cmd/vrnic-run", "vrnic-run"},
	} {
		var out strings.Builder
		bin, err := launch.GoBuild(c.pkg, binDir, c.name, &out)
		require.NoError(t, err, out.String())
		bins[c.name] = bin
	}
	libDir, err := ibverbs.Build(ibverbs.Options{})
	require.NoError(t, err)

	startDaemon(t, bins["vrnicd"], logDir, "a1", rundirA, addrA1)
	a2 := startDaemon(t, bins["vrnicd"], logDir, "a2", rundirA, addrA2)
	b1 := startDaemon(t, bins["vrnicd"], logDir, "b1", rundirB, addrB1)

	kubelet := startKubelet(t, pluginDir)
	mport, err := launch.FreeTCPPort()
	require.NoError(t, err)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", mport)
	startPlugin(t, bins["vrnic-device-plugin"], logDir, pluginDir, rundirA, stateDir, libDir, fmt.Sprintf("127.0.0.1:%d", mport))

	// Registration: the API version, the plugin's socket in the kubelet's
	// directory, the resource, and no PreStartContainer or preferred
	// allocation.
	reg := kubelet.waitRegister(t, 60*time.Second)
	assert.Equal(t, pb.Version, reg.GetVersion())
	assert.Equal(t, deviceplugin.DefaultEndpoint, reg.GetEndpoint())
	assert.Equal(t, deviceplugin.DefaultResourceName, reg.GetResourceName())
	assert.False(t, reg.GetOptions().GetPreStartRequired())
	assert.False(t, reg.GetOptions().GetGetPreferredAllocationAvailable())
	st, err := os.Stat(filepath.Join(pluginDir, reg.GetEndpoint()))
	require.NoError(t, err, "the endpoint the plugin registered")
	require.NotZero(t, st.Mode()&os.ModeSocket, "endpoint is not a socket")

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, reg.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	dp := pb.NewDevicePluginClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts, err := dp.GetDevicePluginOptions(ctx, &pb.Empty{})
	require.NoError(t, err)
	assert.False(t, opts.GetPreStartRequired())
	assert.False(t, opts.GetGetPreferredAllocationAvailable())

	// ListAndWatch: node A's two devices, healthy; not node B's.
	list := watchList(t, ctx, dp)
	// Each daemon is two devices (-shares 2).
	bothHealthy := func(h map[string]string) bool {
		return len(h) == 4 && h["a1#0"] == pb.Healthy && h["a1#1"] == pb.Healthy && h["a2#0"] == pb.Healthy && h["a2#1"] == pb.Healthy
	}
	waitListing(t, list, 30*time.Second, "a1 and a2 healthy", bothHealthy)

	// a2's daemon dies: unhealthy on the stream, seen from its control
	// connection closing (the watcher waits on it), not from an INFO
	// that timed out or a later check; a1 stays healthy. The plugin's
	// log says why it marked a2 unhealthy: the hangup, or an INFO that
	// was under way when the kernel closed the connection (EOF, reset,
	// broken pipe), never an i/o timeout. (How long that took is the
	// scheduler's business on a loaded machine; it is only logged.)
	killed := time.Now()
	require.NoError(t, a2.cmd.Process.Signal(syscall.SIGKILL))
	l := waitListing(t, list, 30*time.Second, "a2 unhealthy", func(h map[string]string) bool {
		return h["a2#0"] == pb.Unhealthy && h["a2#1"] == pb.Unhealthy
	})
	t.Logf("a2 unhealthy on the stream %v after SIGKILL", l.at.Sub(killed))
	why := pluginUnhealthyReason(t, filepath.Join(logDir, "plugin.log"), "a2", 1)
	t.Logf("the plugin marked a2 unhealthy: %s", why)
	assert.Regexp(t, `^(the daemon closed its control connection|INFO: .*(EOF|connection reset by peer|broken pipe))$`, why,
		"a2 unhealthy for its control connection closing")
	assert.Equal(t, pb.Healthy, l.health["a1#0"])
	assert.Equal(t, pb.Healthy, l.health["a1#1"])
	<-a2.done

	// It comes back: healthy again.
	restarted := time.Now()
	a2 = startDaemon(t, bins["vrnicd"], logDir, "a2", rundirA, addrA2)
	l = waitListing(t, list, 30*time.Second, "a2 healthy again", bothHealthy)
	t.Logf("a2 healthy on the stream %v after its restart began", l.at.Sub(restarted))

	// a2's daemon stops answering (stopped, its socket open): unhealthy
	// once an INFO goes unanswered (-health-interval 200ms, then the
	// plugin's 2 s call timeout); healthy again when it answers.
	require.NoError(t, a2.cmd.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()
	l = waitListing(t, list, 30*time.Second, "a2 unhealthy while stopped", func(h map[string]string) bool {
		return h["a2#0"] == pb.Unhealthy && h["a2#1"] == pb.Unhealthy
	})
	t.Logf("a2 unhealthy on the stream %v after SIGSTOP", l.at.Sub(stopped))
	plog, err := os.ReadFile(filepath.Join(logDir, "plugin.log"))
	require.NoError(t, err)
	assert.Regexp(t, `msg="device unhealthy" device=a2 reason="INFO: .*i/o timeout"`, string(plog), "a2 unhealthy for its unanswered INFO")
	require.NoError(t, a2.cmd.Process.Signal(syscall.SIGCONT))
	waitListing(t, list, 30*time.Second, "a2 healthy after SIGCONT", bothHealthy)

	// Allocate: an unknown device is refused; a2's second share gets
	// a2's view.
	for _, bad := range []string{"nope", "a2", "a2#2"} {
		_, err = dp.Allocate(ctx, &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: []string{bad}}}})
		assert.Equal(t, codes.FailedPrecondition, status.Code(err), "allocating %q: %v", bad, err)
	}
	resp, err := dp.Allocate(ctx, &pb.AllocateRequest{ContainerRequests: []*pb.ContainerAllocateRequest{{DevicesIds: []string{"a2#1"}}}})
	require.NoError(t, err)
	require.Len(t, resp.GetContainerResponses(), 1)
	car := resp.GetContainerResponses()[0]
	checkAllocation(t, car, rundirA)

	// The plugin's metrics: a2 went down twice, the allocations.
	assert.NoError(t, testutil.ScrapeAndCompare(metricsURL, strings.NewReader(`
# HELP vrnic_plugin_device_unhealthy_transitions_total Times the daemon was seen to go from healthy to unhealthy.
# TYPE vrnic_plugin_device_unhealthy_transitions_total counter
vrnic_plugin_device_unhealthy_transitions_total{device="a1"} 0
vrnic_plugin_device_unhealthy_transitions_total{device="a2"} 2
# HELP vrnic_plugin_allocations_total Containers the kubelet asked devices for, by result (allocated, refused).
# TYPE vrnic_plugin_allocations_total counter
vrnic_plugin_allocations_total{result="allocated"} 1
vrnic_plugin_allocations_total{result="refused"} 3
# HELP vrnic_plugin_advertised_devices Devices listed to the kubelet (each daemon's shares), by health.
# TYPE vrnic_plugin_advertised_devices gauge
vrnic_plugin_advertised_devices{health="healthy"} 4
vrnic_plugin_advertised_devices{health="unhealthy"} 0
`), "vrnic_plugin_device_unhealthy_transitions_total", "vrnic_plugin_allocations_total", "vrnic_plugin_advertised_devices"))

	c := newContainer(work, car)

	// What the container sees: its one device, in libibverbs, sysfs and
	// /dev, and nothing of the host but the image.
	out, err := c.run(t, "sh", "-c", `set -e
ibv_devices
echo "ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev)"
echo "gid0=$(cat /sys/class/infiniband/a2/ports/1/gids/0)"
echo "ndev0=$(cat /sys/class/infiniband/a2/ports/1/gid_attrs/ndevs/0)"
echo "sockets=$(ls /run/vrnic | tr '\n' ' ')"
test -c /dev/infiniband/uverbs0 && : >/dev/infiniband/uverbs0 && echo uverbs0=rw
echo "root=$(ls / | tr '\n' ' ')"
echo "uid=$(id -u) groups=$(id -G)"`)
	require.NoError(t, err, out)
	assert.Regexp(t, `(?m)^\s+a2\s+[0-9a-f]{16}$`, out, "ibv_devices lists a2")
	assert.NotContains(t, out, "a1 ", "ibv_devices lists only the allocated device")
	for _, want := range []string{
		"ibdev=a2\n", "gid0=0000:0000:0000:0000:0000:ffff:7f00:2903\n", "ndev0=vrnic-a2\n",
		"sockets=a2.sock node \n", "uverbs0=rw\n",
		"root=bin dev lib lib64 opt proc run sbin sys tmp usr \n",
		fmt.Sprintf("uid=%d groups=%d %d\n", containerUID, containerUID, socketGID),
	} {
		assert.Contains(t, out, want)
	}

	// ibv_rc_pingpong: the container is the server, node B's side the
	// client, run with vrnic-run on b1.
	before := counters(t, a2, b1)
	port, err := launch.FreeTCPPort()
	require.NoError(t, err)
	srv := c.start(t, "ibv_rc_pingpong", "-g", "0", "-p", fmt.Sprint(port), "-s", "4096", "-n", "200")
	waitListening(t, port, srv.done)
	cli, err := peer(bins["vrnic-run"], rundirB, "b1", "ibv_rc_pingpong", "-g", "0", "-p", fmt.Sprint(port), "-s", "4096", "-n", "200", addrA2.String())
	require.NoError(t, err, "node B's ibv_rc_pingpong:\n%s", cli)
	sout := srv.wait(t)
	for who, o := range map[string]string{"container": sout, "node B": cli} {
		// ibv_rc_pingpong counts the bytes both ways: 2 × 4096 × 200.
		assert.Regexp(t, `(?m)^1638400 bytes in [0-9.]+ seconds = `, o, who)
		assert.Regexp(t, `(?m)^200 iters in [0-9.]+ seconds = `, o, who)
	}
	assert.Contains(t, sout, "GID ::ffff:"+addrA2.String(), "the container's local GID is a2's")
	assert.Contains(t, sout, "GID ::ffff:"+addrB1.String(), "the container's remote GID is b1's")
	after := counters(t, a2, b1)
	// 200 round trips of 4096 bytes: at least 200 packets each way.
	assert.GreaterOrEqual(t, after[0].PacketsSent-before[0].PacketsSent, uint64(200))
	assert.GreaterOrEqual(t, after[1].PacketsReceived-before[1].PacketsReceived, uint64(200))

	// ib_write_bw: node B's side the server, the container the client.
	const iters, size = 500, 65536
	before = after
	port, err = launch.FreeTCPPort()
	require.NoError(t, err)
	server, err := startPeer(bins["vrnic-run"], rundirB, "b1", "ib_write_bw", "-x", "0", "-p", fmt.Sprint(port), "-s", fmt.Sprint(size), "-n", fmt.Sprint(iters))
	require.NoError(t, err)
	t.Cleanup(func() { server.kill() })
	waitListening(t, port, server.done)
	out, err = c.run(t, "ib_write_bw", "-x", "0", "-p", fmt.Sprint(port), "-s", fmt.Sprint(size), "-n", fmt.Sprint(iters), addrB1.String())
	require.NoError(t, err, "the container's ib_write_bw:\n%s", out)
	sout, err = server.wait(2 * time.Minute)
	require.NoError(t, err, "node B's ib_write_bw:\n%s", sout)
	report := regexp.MustCompile(fmt.Sprintf(`(?m)^ %d\s+%d\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s*$`, size, iters))
	assert.Regexp(t, report, out, "the container's report")
	assert.Regexp(t, report, sout, "node B's report")
	after = counters(t, a2, b1)
	// Each 64 KiB WRITE is at least 16 packets (the largest MTU is
	// 4096), from a2 to b1.
	minPkts := uint64(iters * size / 4096)
	sent, recv := after[0].PacketsSent-before[0].PacketsSent, after[1].PacketsReceived-before[1].PacketsReceived
	t.Logf("ib_write_bw: a2 sent %d packets, b1 received %d", sent, recv)
	assert.GreaterOrEqual(t, sent, minPkts)
	assert.GreaterOrEqual(t, recv, minPkts)
	// The daemon took the container's programs for what they are: clients
	// of uid 1000 (its per-uid limits and operator rules key on it).
	alog, err := os.ReadFile(filepath.Join(logDir, "a2.log"))
	require.NoError(t, err)
	for _, prog := range []string{"ibv_devices", "ibv_rc_pingpong", "ib_write_bw"} {
		assert.Regexp(t, fmt.Sprintf(`msg="context opened" device=a2 ctx=\d+ client=ibv:%s pid=\d+ uid=%d\n`, prog, containerUID), string(alog))
	}

	// The kubelet restarts: it removes the sockets of its directory and
	// serves a new kubelet.sock; the plugin registers again and serves.
	cancel()
	conn.Close()
	kubelet.srv.Stop()
	kubelet2 := startKubelet(t, pluginDir)
	reg = kubelet2.waitRegister(t, 30*time.Second)
	assert.Equal(t, deviceplugin.DefaultResourceName, reg.GetResourceName())
	conn2, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, reg.GetEndpoint()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn2.Close()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	waitListing(t, watchList(t, ctx2, pb.NewDevicePluginClient(conn2)), 30*time.Second, "a1 and a2 healthy after the kubelet's restart", bothHealthy)
}

// checkAllocation checks the response for a2 against what the package
// promises (deviceplugin/allocate.go).
func checkAllocation(t *testing.T, car *pb.ContainerAllocateResponse, rundir string) {
	t.Helper()
	env := car.GetEnvs()
	assert.Equal(t, deviceplugin.ContainerLibDir, env["LD_LIBRARY_PATH"])
	assert.Equal(t, deviceplugin.ContainerRuntimeDir, env["VRNIC_RUNTIME_DIR"])
	assert.Equal(t, deviceplugin.ContainerLibDir+"/libvrnic-netdev.so", env["LD_PRELOAD"])
	assert.Regexp(t, `^vrnic-a2,\d+,1500,[0-9a-f:]{17},127\.0\.41\.3/32$`, env["VRNIC_NETDEVS"])
	mounts := map[string]*pb.Mount{}
	for _, m := range car.GetMounts() {
		assert.True(t, m.GetReadOnly(), "mount %s is writable", m.GetContainerPath())
		mounts[m.GetContainerPath()] = m
	}
	for _, p := range []string{deviceplugin.ContainerLibDir, deviceplugin.ContainerRuntimeDir, deviceplugin.ContainerRuntimeDir + "/node",
		"/sys/class/infiniband", "/sys/class/infiniband_verbs"} {
		assert.Contains(t, mounts, p)
	}
	if m := mounts[deviceplugin.ContainerRuntimeDir+"/node"]; m != nil {
		assert.Equal(t, rundir, m.GetHostPath())
	}
	if m := mounts[deviceplugin.ContainerLibDir]; m != nil {
		for _, f := range []string{ibverbs.LibName, ibverbs.CMLibName, ibverbs.NetDevLibName} {
			assert.FileExists(t, filepath.Join(m.GetHostPath(), f))
		}
	}
	require.Len(t, car.GetDevices(), 1)
	d := car.GetDevices()[0]
	assert.Equal(t, "/dev/infiniband/uverbs0", d.GetContainerPath())
	assert.Equal(t, "/dev/null", d.GetHostPath())
	assert.Equal(t, "rw", d.GetPermissions())
}

// counters returns the data-path counters of the daemons.
func counters(t *testing.T, ds ...*daemon) []admin.QPCounters {
	t.Helper()
	var out []admin.QPCounters
	for _, d := range ds {
		info, err := admin.Serving(d.sock())
		require.NoError(t, err, d.name)
		out = append(out, info.DataPath)
	}
	return out
}

// waitListening waits until something listens on TCP port, or fails if
// done closes first.
func waitListening(t *testing.T, port int, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !launch.TCPListening(port) {
		select {
		case <-done:
			t.Fatalf("the server exited before listening on port %d", port)
		default:
		}
		require.True(t, time.Now().Before(deadline), "nothing listens on port %d", port)
		time.Sleep(20 * time.Millisecond)
	}
}

// container is an allocation turned into a container (container_test.go).
type container struct {
	work string
	spec containerSpec
}

func newContainer(work string, car *pb.ContainerAllocateResponse) *container {
	spec := containerSpec{UID: containerUID, GID: containerUID, Groups: []int{socketGID}}
	spec.Env = []string{"PATH=/usr/bin:/bin"}
	for k, v := range car.GetEnvs() {
		spec.Env = append(spec.Env, k+"="+v)
	}
	for _, m := range car.GetMounts() {
		spec.Binds = append(spec.Binds, bindSpec{Container: m.GetContainerPath(), Host: m.GetHostPath(), ReadOnly: m.GetReadOnly()})
	}
	for _, d := range car.GetDevices() {
		spec.Binds = append(spec.Binds, bindSpec{Container: d.GetContainerPath(), Host: d.GetHostPath()})
	}
	return &container{work: work, spec: spec}
}

// proc is a process started in a container or on node B.
type proc struct {
	cmd  *exec.Cmd
	out  *strings.Builder
	done chan struct{}
	err  error
}

func startCmd(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, out: &strings.Builder{}, done: make(chan struct{})}
	// One writer for both: exec.Cmd then writes from one goroutine.
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits up to timeout for the process and returns its output.
func (p *proc) wait(timeout time.Duration) (string, error) {
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.kill()
		return p.out.String(), fmt.Errorf("still running after %v: killed", timeout)
	}
	return p.out.String(), p.err
}

func (c *container) start(t *testing.T, args ...string) *cproc {
	t.Helper()
	root, err := os.MkdirTemp(c.work, "root-")
	require.NoError(t, err)
	spec := c.spec
	spec.Root, spec.Args = root, args
	cmd, err := containerCmd(spec)
	require.NoError(t, err)
	p, err := startCmd(cmd)
	require.NoError(t, err)
	t.Cleanup(func() { p.kill(); os.Remove(root) })
	return &cproc{p}
}

// run runs args in a fresh container and returns its output.
func (c *container) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return c.start(t, args...).proc.wait(2 * time.Minute)
}

type cproc struct{ *proc }

func (p *cproc) wait(t *testing.T) string {
	t.Helper()
	out, err := p.proc.wait(2 * time.Minute)
	require.NoError(t, err, "container:\n%s", out)
	return out
}

// startPeer starts prog with vrnic-run on node B's device dev.
func startPeer(vrnicRun, rundir, dev string, args ...string) (*proc, error) {
	cmd := exec.Command(vrnicRun, append([]string{"-runtime-dir", rundir, "-d", dev}, args...)...)
	return startCmd(cmd)
}

// peer runs prog with vrnic-run on node B's device dev.
func peer(vrnicRun, rundir, dev string, args ...string) (string, error) {
	p, err := startPeer(vrnicRun, rundir, dev, args...)
	if err != nil {
		return "", err
	}
	return p.wait(2 * time.Minute)
}

// pluginUnhealthyReason returns the reason of the nth "device unhealthy"
// line of device dev in the plugin's log (the plugin updates its
// listings, then logs: the line may follow the listing); the 30 s
// deadline only ends a wait on a hung plugin.
func pluginUnhealthyReason(t *testing.T, logPath, dev string, nth int) string {
	t.Helper()
	re := regexp.MustCompile(`msg="device unhealthy" device=` + regexp.QuoteMeta(dev) + ` reason=("(?:[^"\\]|\\.)*"|\S+)`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(logPath)
		require.NoError(t, err)
		if m := re.FindAllStringSubmatch(string(b), -1); len(m) >= nth {
			why := m[nth-1][1]
			if u, err := strconv.Unquote(why); err == nil {
				why = u
			}
			return why
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line %d of %s unhealthy in the plugin's log:\n%s", nth, dev, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startPlugin starts the device plugin and stops it by its PID at the end.
func startPlugin(t *testing.T, bin, logDir, pluginDir, rundir, stateDir, libDir, metricsAddr string) *proc {
	t.Helper()
	logf, err := os.Create(filepath.Join(logDir, "plugin.log"))
	require.NoError(t, err)
	defer logf.Close()
	cmd := exec.Command(bin, "-plugin-dir", pluginDir, "-runtime-dir", rundir, "-state-dir", stateDir,
		"-lib-dir", libDir, "-shares", "2", "-sysfs-view", "true", "-metrics-addr", metricsAddr, "-health-interval", "200ms", "-poll", "100ms", "-log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, done: make(chan struct{}), out: &strings.Builder{}}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.kill()
		}
	})
	return p
}
