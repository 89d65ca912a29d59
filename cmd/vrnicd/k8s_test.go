package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/k8smanifest"
)

// TestK8sDaemonSets parses the vrnicd command line of each DaemonSet in
// deploy/k8s with the daemon's own flag parser, its $(VAR)s as the kubelet
// would expand them on a node and its -config from the manifest's
// ConfigMap, so that a renamed flag or a configuration the daemon refuses
// fails here.
func TestK8sDaemonSets(t *testing.T) {
	for file, link := range map[string]string{"vrnic-node.yaml": "udp", "vrnic-node-tap.yaml": "tap"} {
		t.Run(file, func(t *testing.T) {
			objs, err := k8smanifest.Load(filepath.Join("../../deploy/k8s", file))
			require.NoError(t, err)
			cfgDir := t.TempDir()
			var c *k8smanifest.Container
			for i := range objs {
				switch objs[i].Kind {
				case "ConfigMap":
					for k, v := range objs[i].Data {
						require.NoError(t, os.WriteFile(filepath.Join(cfgDir, k), []byte(v), 0o644))
					}
				case "DaemonSet":
					c = objs[i].Pod().Container("vrnicd")
				}
			}
			require.NotNil(t, c)
			words := c.ExpandArgs(map[string]string{"NODE_IP": "192.0.2.10", "NODE_NAME": "node-a"})
			require.Equal(t, "/usr/local/bin/vrnicd", words[0])
			args := words[1:]
			for i, a := range args {
				if strings.HasPrefix(a, "/etc/vrnic/") {
					args[i] = filepath.Join(cfgDir, strings.TrimPrefix(a, "/etc/vrnic/"))
				}
			}
			var stderr bytes.Buffer
			cfg, err := parseConfig(args, &stderr)
			require.NoError(t, err, "%q: %s", args, &stderr)
			assert.Equal(t, "vrnic0", cfg.Name)
			assert.Equal(t, "/run/vrnic", cfg.RuntimeDir)
			assert.Equal(t, link, cfg.Link.Type)
			assert.Equal(t, "192.0.2.10:9464", cfg.MetricsAddr)
			if link == "udp" {
				assert.Equal(t, "192.0.2.10:4791", cfg.Link.Local, "the node's address")
			}
		})
	}
}
