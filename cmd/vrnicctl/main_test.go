package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

func ctl(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	rc := run(args, &out, &errb)
	return rc, out.String(), errb.String()
}

func TestVrnicctl(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{Name: "ctl0"})
	require.NoError(t, err)
	defer s.Close()
	dir := filepath.Dir(s.SocketPath)
	c, err := verbs.Open(s.SocketPath, verbs.WithClientName("ctl-client"))
	require.NoError(t, err)
	defer c.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	require.NoError(t, err)
	require.NoError(t, qp.ToInit(0, 0))

	rc, out, _ := ctl("-runtime-dir", dir, "devices")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `ctl0\s+up\s+mem\s+1\s+1`, out)

	rc, out, _ = ctl("-runtime-dir", dir, "qps")
	require.Equal(t, 0, rc, "the only device is the default")
	assert.Contains(t, out, "QPN")
	assert.Contains(t, out, "COUNTERS.PACKETS_SENT")
	assert.Regexp(t, `RC\s+INIT`, out)

	rc, out, _ = ctl("-s", s.SocketPath, "-json", "qps")
	require.Equal(t, 0, rc)
	var qps []device.QPInfo
	require.NoError(t, json.Unmarshal([]byte(out), &qps))
	require.Len(t, qps, 1)
	assert.Equal(t, qp.QPN, qps[0].QPN)
	assert.Equal(t, "INIT", qps[0].State)

	rc, out, _ = ctl("-d", "ctl0", "-runtime-dir", dir, "contexts")
	require.Equal(t, 0, rc)
	assert.Contains(t, out, "ctl-client")
	rc, out, _ = ctl("-s", s.SocketPath, "info")
	require.Equal(t, 0, rc)
	assert.Contains(t, out, "resources")
	assert.Contains(t, out, "qp=1")
	rc, out, _ = ctl("-s", s.SocketPath, "counters")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `resources\.qp\s+1\n`, out)
	assert.Regexp(t, `commands\s+\d+`, out)
	rc, out, _ = ctl("-s", s.SocketPath, "--json", "counters")
	require.Equal(t, 0, rc)
	var counters map[string]int64
	require.NoError(t, json.Unmarshal([]byte(out), &counters))
	assert.Equal(t, int64(1), counters["resources.cq"])
	assert.Positive(t, counters["contexts_opened"])
	rc, out, _ = ctl("-s", s.SocketPath, "srqs")
	require.Equal(t, 0, rc)
	assert.Equal(t, "no srqs\n", out)
	rc, out, _ = ctl("-s", s.SocketPath, "-json", "srqs")
	require.Equal(t, 0, rc)
	assert.JSONEq(t, "[]", out)

	// Errors.
	rc, _, errs := ctl("-s", s.SocketPath, "frobnicate")
	assert.Equal(t, 2, rc)
	assert.Contains(t, errs, `unknown command "frobnicate"`)
	rc, _, errs = ctl("-s", filepath.Join(dir, "none.sock"), "qps")
	assert.Equal(t, 1, rc)
	assert.Contains(t, errs, "connect")
	empty := t.TempDir()
	rc, _, errs = ctl("-runtime-dir", empty, "qps")
	assert.Equal(t, 1, rc)
	assert.Contains(t, errs, "no device sockets")
	rc, out, _ = ctl("-runtime-dir", filepath.Join(empty, "missing"), "devices")
	assert.Equal(t, 0, rc)
	assert.Contains(t, out, "DEVICE")
	// A stale socket (its daemon gone) is listed as down.
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: filepath.Join(empty, "old.sock"), Net: "unixpacket"})
	require.NoError(t, err)
	l.SetUnlinkOnClose(false)
	l.Close()
	require.NoError(t, os.WriteFile(filepath.Join(empty, "notasocket.sock"), nil, 0o600))
	rc, out, _ = ctl("-runtime-dir", empty, "devices")
	assert.Equal(t, 0, rc)
	assert.Regexp(t, `old\s+down: .*connection refused`, out)
	assert.NotContains(t, out, "notasocket")
	rc, _, _ = ctl()
	assert.Equal(t, 2, rc, "usage")
}
