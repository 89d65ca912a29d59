package ibverbs_test

import (
	"fmt"
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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// viewScript prints what a program finds in /dev and /sys/class through
// vrnic-run: per uverbsN its ibdev, whether /dev/infiniband/uverbsN is a
// character device open for reading and writing, and that device's
// node_guid, port state, link layer, GID 0 with its type and net device;
// then whether /sys/class/net/lo is there, whether each device's
// device/net interface is in /sys/class/net, and the uid.
const viewScript = `
cat /sys/class/infiniband_verbs/abi_version
for d in /sys/class/infiniband_verbs/uverbs*; do
	u=$(basename $d); ib=$(cat $d/ibdev); s=/sys/class/infiniband/$ib/ports/1
	if test -c /dev/infiniband/$u && test -r /dev/infiniband/$u && test -w /dev/infiniband/$u && : > /dev/infiniband/$u; then c=chr; else c=nochr; fi
	echo "$u $ib $c $(cat $d/abi_version) $(cat /sys/class/infiniband/$ib/node_guid) $(cat /sys/class/infiniband/$ib/node_type | tr ' ' _)" \
		"$(cat $s/state | tr ' ' _) $(cat $s/link_layer) $(cat $s/gids/0) $(cat $s/gid_attrs/types/0 | tr ' ' _) $(cat $s/gid_attrs/ndevs/0)"
done
test -e /sys/class/net/lo/ifindex && echo net-ok
for d in /sys/class/infiniband/*; do
	nd=$(ls $d/device/net)
	test -e /sys/class/net/$nd/ifindex && echo "netdev-ok $(basename $d) $nd"
done
echo uid=$(id -u)
`

// viewLine matches one device line of viewScript.
var viewLine = regexp.MustCompile(`(?m)^(uverbs\d+) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+) (\S+) (\S*)$`)

// devinfo is what ibv_devinfo -v says of a device.
type devinfo struct{ guid, gid0 string }

func parseDevinfo(t *testing.T, out string) map[string]devinfo {
	t.Helper()
	m := map[string]devinfo{}
	for _, blk := range strings.Split(out, "hca_id:\t")[1:] {
		name := strings.SplitN(blk, "\n", 2)[0]
		g := regexp.MustCompile(`node_guid:\s+(\S+)`).FindStringSubmatch(blk)
		gid := regexp.MustCompile(`GID\[\s*0\]:\s+([^,]+), RoCE v2`).FindStringSubmatch(blk)
		require.NotNil(t, g, blk)
		require.NotNil(t, gid, blk)
		m[name] = devinfo{guid: g[1], gid0: gid[1]}
	}
	return m
}

// kernelGIDOf writes an IPv4-mapped address as the kernel writes the GID.
func kernelGIDOf(a string) string {
	b := netip.MustParseAddr(a).As16()
	var parts []string
	for i := 0; i < 16; i += 2 {
		parts = append(parts, fmt.Sprintf("%02x%02x", b[i], b[i+1]))
	}
	return strings.Join(parts, ":")
}

// checkView checks viewScript's output against ibv_devinfo -v's, both run
// through vrnic-run: the same devices, node GUIDs and GIDs, numbered in
// name order, each with a usable char device, and the real classes still
// there.
func checkView(t *testing.T, view, devinfoOut string, uid int) {
	t.Helper()
	info := parseDevinfo(t, devinfoOut)
	require.Len(t, info, 2, devinfoOut)
	lines := viewLine.FindAllStringSubmatch(view, -1)
	require.Len(t, lines, 2, view)
	assert.Regexp(t, `(?m)^6$`, view)
	for i, l := range lines {
		name := []string{"a", "b"}[i]
		want, ok := info[l[2]]
		require.True(t, ok, "view device %s not listed by ibv_devinfo:\n%s", l[2], view)
		assert.Equal(t, fmt.Sprintf("uverbs%d", i), l[1])
		assert.Equal(t, name, l[2])
		assert.Equal(t, "chr", l[3], "/dev/infiniband/%s", l[1])
		assert.Equal(t, "1", l[4])
		assert.Equal(t, want.guid, l[5])
		assert.Equal(t, "1:_CA", l[6])
		assert.Equal(t, "4:_ACTIVE", l[7])
		assert.Equal(t, "Ethernet", l[8])
		assert.Equal(t, kernelGIDOf(want.gid0), l[9])
		assert.Equal(t, "RoCE_v2", l[10])
		assert.Equal(t, "vrnic-"+name, l[11], "the interface vrnic-run gives a device on a loopback address")
	}
	assert.Contains(t, view, "\nnet-ok\n")
	assert.Contains(t, view, "\nnetdev-ok a vrnic-a\nnetdev-ok b vrnic-b\n")
	assert.Contains(t, view, fmt.Sprintf("\nuid=%d\n", uid))
}

// TestSystemView runs, through vrnic-run, a shell script reading the
// /dev/infiniband and /sys/class entries of the devices and a libibverbs
// program opening /dev/infiniband/<dev_name> as UCX does, and checks them
// against ibv_devinfo -v; outside, /dev/infiniband stays absent.
func TestSystemView(t *testing.T) {
	testenv.NeedTool(t, "ibv_devinfo")
	p := startPair(t)
	view, err := p.run(t, 60*time.Second, "sh", "-c", viewScript)
	require.NoError(t, err, view)
	info, err := p.run(t, 30*time.Second, "ibv_devinfo", "-v")
	require.NoError(t, err, info)
	checkView(t, view, info, os.Getuid())

	prog := buildC(t, "view_open.c")
	out, err := p.run(t, 30*time.Second, prog)
	require.NoError(t, err, out)
	devs := parseDevinfo(t, info)
	assert.Equal(t, fmt.Sprintf("a uverbs0 %s a open-ok\nb uverbs1 %s b open-ok\n", devs["a"].guid, devs["b"].guid), out)

	// -d: one device, uverbs0.
	out, err = p.run(t, 30*time.Second, "-d", "b", prog)
	require.NoError(t, err, out)
	assert.Equal(t, fmt.Sprintf("b uverbs0 %s b open-ok\n", devs["b"].guid), out)

	// The exit status and a fatal signal are the program's.
	_, err = p.run(t, 30*time.Second, "sh", "-c", "exit 7")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 7, ee.ExitCode())
	_, err = p.run(t, 30*time.Second, "sh", "-c", "kill -USR1 $$")
	require.ErrorAs(t, err, &ee)
	ws := ee.Sys().(syscall.WaitStatus)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGUSR1, "%v", err)

	// -view=false: the system as it is.
	out, err = p.run(t, 30*time.Second, "-view=false", "sh", "-c", "ls /sys/class/infiniband_verbs 2>&1; true")
	require.NoError(t, err, out)
	if _, serr := os.Stat("/sys/class/infiniband_verbs"); serr != nil {
		assert.Contains(t, out, "No such file")
	}
}

// TestSystemViewUnprivileged is TestSystemView's view for an unprivileged
// user (nobody) running the daemons and vrnic-run: the view comes from a
// user namespace mapping nobody to itself, and the program runs as
// nobody.
func TestSystemViewUnprivileged(t *testing.T) {
	testenv.NeedTool(t, "ibv_devinfo")
	u := startUnprivileged(t)
	view := u.output(t, "-v", "sh", "-c", viewScript)
	if strings.Contains(view, "running without the system view") {
		t.Skipf("no user namespace for nobody here: %s", view)
	}
	checkView(t, view, u.output(t, "ibv_devinfo", "-v"), unprivUID)
}

// TestUCXUnprivileged runs UCX's ucx_perftest (tag_lat, then ucp_put_bw)
// over rc_verbs and ud_verbs as the unprivileged user nobody, daemons
// included: UCX needs the view (a user namespace then), no root.
func TestUCXUnprivileged(t *testing.T) {
	testenv.NeedTool(t, "ucx_perftest")
	u := startUnprivileged(t)
	if v := u.output(t, "-v", "true"); strings.Contains(v, "running without the system view") {
		t.Skipf("no user namespace for nobody here: %s", v)
	}
	for _, test := range []string{"tag_lat", "ucp_put_bw"} {
		port := freeTCPPort(t)
		env := []string{"UCX_TLS=rc_verbs,ud_verbs", "UCX_WARN_UNUSED_ENV_VARS=n"}
		var sout launch.Buffer // written by exec's copying goroutine
		srv := u.command("-d", "b", "ucx_perftest", "-p", strconv.Itoa(port))
		srv.Env = append(srv.Env, env...)
		srv.Stdout, srv.Stderr = &sout, &sout
		require.NoError(t, srv.Start())
		done := make(chan struct{})
		go func() { srv.Wait(); close(done) }()
		t.Cleanup(func() {
			srv.Process.Kill()
			<-done
		})
		require.Eventually(t, func() bool { return listening(port) }, 60*time.Second, 20*time.Millisecond, "server: %s", &sout)
		cli := u.command("-d", "a", "ucx_perftest", "-p", strconv.Itoa(port), "-t", test, "-n", "1000", "127.0.0.1")
		cli.Env = append(cli.Env, env...)
		out, err := cli.CombinedOutput()
		require.NoError(t, err, "client: %s\nserver: %s", out, &sout)
		assert.Regexp(t, `(?m)^Final:\s+1000\s`, string(out), "every iteration reported")
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("server did not exit: %s", &sout)
		}
	}
}

// unprivUID is the user (and group) the unprivileged tests run as.
const unprivUID = 65534

// unprivileged is a pair of daemons run as nobody, in a runtime directory
// of theirs, with vrnic-run run as nobody too.
type unprivileged struct {
	rd, tmp string
	env     []string
	cred    *syscall.SysProcAttr
}

// startUnprivileged starts daemons a and b as nobody over the UDP link.
func startUnprivileged(t *testing.T) *unprivileged {
	testenv.NeedRoot(t, "needs root to switch to the unprivileged user nobody")
	const uid, gid = unprivUID, unprivUID
	tmp, err := os.MkdirTemp("", "vrnic-view-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	require.NoError(t, os.Chown(tmp, uid, gid))
	for _, d := range []string{filepath.Dir(bin), bin} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	rd := filepath.Join(tmp, "run")
	require.NoError(t, os.Mkdir(rd, 0o700))
	require.NoError(t, os.Chown(rd, uid, gid))
	u := &unprivileged{rd: rd, tmp: tmp, cred: &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}},
		env: []string{"TMPDIR=" + tmp, "HOME=" + tmp, "PATH=/usr/bin:/bin"}}
	a, b, err := launch.LoopbackPair(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	require.NoError(t, err)
	for i, name := range []string{"a", "b"} {
		d := exec.Command(filepath.Join(bin, "vrnicd"), "-name", name, "-runtime-dir", rd, "-link", "udp",
			"-workers", "1", "-local", []netip.Addr{a, b}[i].String()+":4791")
		d.Env, d.SysProcAttr = u.env, u.cred
		logb := &launch.Buffer{}
		d.Stderr = logb
		require.NoError(t, d.Start())
		t.Cleanup(func() {
			d.Process.Signal(syscall.SIGTERM)
			d.Wait()
		})
		require.Eventually(t, func() bool {
			_, err := admin.Serving(admin.SocketPath(rd, name))
			return err == nil
		}, 15*time.Second, 20*time.Millisecond, "vrnicd %s: %s", name, logb)
	}
	return u
}

// command is vrnic-run ARGS as nobody on u's daemons.
func (u *unprivileged) command(args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(bin, "vrnic-run"), append([]string{"-runtime-dir", u.rd,
		"-cache-dir", filepath.Join(u.tmp, "cache")}, args...)...)
	c.Env, c.SysProcAttr = append([]string{}, u.env...), u.cred
	return c
}

// output runs vrnic-run ARGS as nobody; it must exit 0.
func (u *unprivileged) output(t *testing.T, args ...string) string {
	out, err := u.command(args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}
