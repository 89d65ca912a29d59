package main

import (
	"encoding/json"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serveStatsDoc serves body to every connection on path until the test ends.
func serveStatsDoc(t *testing.T, path, body string) {
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(body))
			c.Close()
		}
	}()
}

func TestLinkCommand(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "t0.sock")
	doc := `{"link":"tap","interface":"vt0","mac":"02:00:00:00:00:01",
		"queues":[{"queue":0,"steered":10,"rx_frames":10,"rx_misqueued":0,"tx_frames":7},{"queue":1,"steered":5,"rx_frames":4,"rx_misqueued":1}],
		"steer_non_roce":3,"filter":{"pass_arp":2,"drop_ethertype":9},"filter_dropped":9,"neighbors":{"ARPRequestsIn":2},"future_field":1}` + "\n"
	serveStatsDoc(t, filepath.Join(dir, "t0.stats"), doc)

	rc, out, errOut := ctl("-s", sock, "link")
	require.Equal(t, 0, rc, errOut)
	assert.Contains(t, out, "vt0")
	assert.Regexp(t, `(?m)^1\s+5\s+4\s+0\s+0\s+0\s+1\s`, out, "queue 1: steered 5, rx 4, misqueued 1")
	assert.Contains(t, out, "filter.drop_ethertype")
	assert.Regexp(t, `filter_dropped\s+9`, out)

	rc, out, errOut = ctl("-s", sock, "-json", "link")
	require.Equal(t, 0, rc, errOut)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	assert.EqualValues(t, 1, m["future_field"], "unknown fields are kept in the JSON output")
	assert.Len(t, m["queues"], 2)

	rc, _, errOut = ctl("-s", filepath.Join(dir, "none.sock"), "link")
	assert.Equal(t, 1, rc)
	assert.Contains(t, errOut, "only the TAP and UDP links serve them")

	serveStatsDoc(t, filepath.Join(dir, "e.stats"), `{"error":"map read failed"}`)
	rc, _, errOut = ctl("-s", filepath.Join(dir, "e.sock"), "link")
	assert.Equal(t, 1, rc)
	assert.Contains(t, errOut, "map read failed")
}

// TestLinkCommandUDP: the UDP link's document prints a line per port with
// the frames per system call (TX 12 frames in 4 calls: 3.0), the offload
// state, and the newest send errno by name.
func TestLinkCommandUDP(t *testing.T) {
	dir := t.TempDir()
	doc := `{"link":"udp","local":"127.0.43.1:4791","ports":[
		{"port":0,"tx_frames":12,"tx_datagrams":6,"tx_calls":4,"rx_frames":9,"rx_calls":0,"gso":true,"gro":false,"tx_gso":3,"send_errors":2,"last_send_errno":111},
		{"port":1,"rx_frames":5,"rx_datagrams":5,"rx_calls":5}]}` + "\n"
	serveStatsDoc(t, filepath.Join(dir, "u0.stats"), doc)
	rc, out, errOut := ctl("-s", filepath.Join(dir, "u0.sock"), "link")
	require.Equal(t, 0, rc, errOut)
	assert.Contains(t, out, "127.0.43.1:4791")
	assert.Regexp(t, `(?m)^0\s+12\s+0\s+6\s+4\s+3\.0\s+9\s+0\s+0\s+0\s+-\s+on\s+off\s+3\s`, out)
	assert.Regexp(t, `(?m)^1\s+0\s+0\s+0\s+0\s+-\s+5\s+0\s+5\s+5\s+1\.0\s`, out)
	assert.Contains(t, out, "connection refused")
}
