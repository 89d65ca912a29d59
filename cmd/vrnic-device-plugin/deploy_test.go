package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/deviceplugin"
	"github.com/vrnic/vrnic/internal/k8smanifest"
)

// k8sDir holds the Kubernetes manifests.
const k8sDir = "../../deploy/k8s"

// daemonSet loads the manifest file and returns its one DaemonSet's pod.
func daemonSet(t *testing.T, file string) *k8smanifest.PodSpec {
	t.Helper()
	objs, err := k8smanifest.Load(filepath.Join(k8sDir, file))
	require.NoError(t, err)
	var pod *k8smanifest.PodSpec
	for i := range objs {
		if objs[i].Kind == "DaemonSet" {
			require.Nil(t, pod, "two DaemonSets")
			pod = objs[i].Pod()
		}
	}
	require.NotNil(t, pod, "no DaemonSet in %s", file)
	return pod
}

func caps(c *k8smanifest.Container) (add, drop []string) {
	if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
		return nil, nil
	}
	return c.SecurityContext.Capabilities.Add, c.SecurityContext.Capabilities.Drop
}

// flagValue returns the value of -name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if (a == "-"+name || a == "--"+name) && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
	}
	return ""
}

// TestDaemonSets checks the DaemonSets of deploy/k8s against the code:
// the plugin's command line parses with its own parser and names the
// resource of the code; the node's directories the plugin hands to the
// kubelet are mounted at the same paths; vrnicd and the plugin share the
// runtime directory; capabilities: none but the TAP link's two, and none
// for the plugin; the libraries' directory is the one the image fills.
func TestDaemonSets(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(k8sDir, "Dockerfile"))
	require.NoError(t, err)
	for file, vrnicdCaps := range map[string][]string{
		"vrnic-node.yaml":     nil,
		"vrnic-node-tap.yaml": {"BPF", "NET_ADMIN"},
	} {
		t.Run(file, func(t *testing.T) {
			pod := daemonSet(t, file)
			assert.True(t, pod.HostNetwork, "the daemon's address is the node's")
			plugin, vrnicd := pod.Container("device-plugin"), pod.Container("vrnicd")
			require.NotNil(t, plugin)
			require.NotNil(t, vrnicd)

			require.Len(t, plugin.Command, 1)
			assert.Equal(t, "vrnic-device-plugin", filepath.Base(plugin.Command[0]))
			args := plugin.ExpandArgs(map[string]string{"NODE_IP": "192.0.2.10"})[1:]
			o, err := parseFlags(args, io.Discard)
			require.NoError(t, err, "%q", args)
			assert.Equal(t, "192.0.2.10:9465", o.metricsAddr)
			assert.Equal(t, deviceplugin.DefaultResourceName, o.cfg.ResourceName)
			for _, d := range []string{o.cfg.PluginDir, o.cfg.RuntimeDir, o.cfg.StateDir} {
				assert.Equal(t, filepath.Clean(d), pod.HostPathOf(plugin, filepath.Clean(d)),
					"%s: the plugin must see the node's directory at the node's path", d)
			}
			assert.Equal(t, deviceplugin.DefaultRuntimeDir, o.cfg.RuntimeDir)
			require.NotEmpty(t, o.cfg.LibDir, "the image's libraries, not a build at start")
			assert.Contains(t, string(dockerfile), "COPY --from=build /out/lib/ "+o.cfg.LibDir+"/")

			rd := flagValue(vrnicd.Args, "runtime-dir")
			assert.Equal(t, o.cfg.RuntimeDir, rd, "vrnicd's sockets are where the plugin looks")
			assert.Equal(t, pod.HostPathOf(plugin, o.cfg.RuntimeDir), pod.HostPathOf(vrnicd, rd), "one runtime directory")

			add, drop := caps(plugin)
			assert.Empty(t, add, "the plugin needs no capability")
			assert.Equal(t, []string{"ALL"}, drop)
			add, drop = caps(vrnicd)
			add = slices.Sorted(slices.Values(add))
			assert.Equal(t, vrnicdCaps, add, "vrnicd's capabilities")
			assert.Equal(t, []string{"ALL"}, drop)
			for _, c := range []*k8smanifest.Container{plugin, vrnicd} {
				require.NotNil(t, c.SecurityContext)
				assert.Nil(t, c.SecurityContext.Privileged, c.Name)
				if assert.NotNil(t, c.SecurityContext.AllowPrivilegeEscalation, c.Name) {
					assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation, c.Name)
				}
			}
			require.NotNil(t, vrnicd.SecurityContext.RunAsGroup, "the sockets' group")
		})
	}
}

// TestExamplePod checks the example pods: each asks for one device of the
// code's resource, runs unmodified ib_write_bw as a uid other than root
// with the group of the daemons' sockets, the client against the server's
// Service.
func TestExamplePod(t *testing.T) {
	ds := daemonSet(t, "vrnic-node.yaml")
	sockGroup := *ds.Container("vrnicd").SecurityContext.RunAsGroup
	objs, err := k8smanifest.Load(filepath.Join(k8sDir, "example-pod.yaml"))
	require.NoError(t, err)
	var service string
	var pods int
	for _, o := range objs {
		if o.Kind == "Service" {
			service = o.Metadata.Name
		}
	}
	require.NotEmpty(t, service)
	for _, o := range objs {
		pod := o.Pod()
		if pod == nil {
			continue
		}
		pods++
		sc := pod.SecurityContext
		require.NotNil(t, sc, o.Metadata.Name)
		if assert.NotNil(t, sc.RunAsUser, o.Metadata.Name) {
			assert.NotZero(t, *sc.RunAsUser, "%s runs as root: an operator of the daemon", o.Metadata.Name)
		}
		assert.Contains(t, sc.SupplementalGroups, sockGroup, "%s cannot reach the sockets", o.Metadata.Name)
		require.Len(t, pod.Containers, 1)
		c := pod.Containers[0]
		assert.Equal(t, "1", c.Resources.Limits[deviceplugin.DefaultResourceName], o.Metadata.Name)
		require.NotEmpty(t, c.Command)
		assert.Equal(t, "ib_write_bw", c.Command[0])
		if o.Kind == "Job" {
			assert.Equal(t, service, c.Command[len(c.Command)-1], "the client connects to the server's Service")
		}
	}
	assert.Equal(t, 2, pods)
}
