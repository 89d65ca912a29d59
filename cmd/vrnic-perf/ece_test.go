package main

import (
	"bytes"
	"encoding/json"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roles runs the server with serverArgs and the client with clientArgs
// (ECE options) for a 50-WRITE write_bw of 4 KiB on the device sock, and
// returns the client's results, checked.
func roles(t *testing.T, sock string, serverArgs, clientArgs []string) []result {
	t.Helper()
	rs := runRoles(t, sock, serverArgs, append([]string{"-test", "write_bw", "-size", "4096", "-iters", "50"}, clientArgs...))
	checkResult(t, rs[0], writeBW, 4096, 50)
	return rs
}

// runRoles runs the two roles as separate commands over TCP, as a user
// does on two hosts: the server with serverArgs, the client with
// clientArgs (the test's options) and -json, both on the device sock; it
// returns the client's one result.
func runRoles(t *testing.T, sock string, serverArgs, clientArgs []string) []result {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	srv := make(chan int, 1)
	var srvErr bytes.Buffer
	go func() {
		code, _, e := perf(t, append([]string{"server", "-dev", sock, "-listen", addr}, serverArgs...)...)
		srvErr.WriteString(e)
		srv <- code
	}()
	code, out, errOut := perf(t, append([]string{"client", "-dev", sock, "-server", addr, "-json"}, clientArgs...)...)
	require.Equal(t, 0, code, "client stderr:\n%s", errOut)
	require.Equal(t, 0, <-srv, "server stderr:\n%s", srvErr.String())
	var r report
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Len(t, r.Results, 1)
	return r.Results
}

// TestECENegotiation: the client offers the ECE options it asks for
// (-selective-repeat, -ece) over the control connection, the server takes
// those it asks for too, and the options in force on the QPs (QUERY_QP,
// the report's ece) are the intersection, bounded by what the devices
// support: none when either side asks for none or ECE is switched off.
func TestECENegotiation(t *testing.T) {
	on := startDaemon(t, "perf-ece", "-link", "mem")
	off := startDaemon(t, "perf-noece", "-link", "mem", "-ece=false")
	for _, c := range []struct {
		name           string
		sock           string
		server, client []string
		want           string
	}{
		{"both sr", on.sock, []string{"-selective-repeat"}, []string{"-selective-repeat"}, "sr"},
		{"server none", on.sock, nil, []string{"-selective-repeat"}, "none"},
		{"client none", on.sock, []string{"-selective-repeat"}, nil, "none"},
		{"all and rto", on.sock, []string{"-ece", "rto"}, []string{"-ece", "all"}, "rto"},
		{"all and all", on.sock, []string{"-ece", "all"}, []string{"-ece", "sr,rto"}, "sr,rto"},
		{"switched off", off.sock, []string{"-ece", "all"}, []string{"-ece", "all"}, "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := roles(t, c.sock, c.server, c.client)
			assert.Equal(t, c.want, rs[0].ECE)
		})
	}
}

// TestECERun: run passes -selective-repeat to both roles; the table says
// which options were in force.
func TestECERun(t *testing.T) {
	d := startDaemon(t, "perf-ece-run", "-link", "mem")
	code, out, errOut := perf(t, "run", "-dev-a", d.sock, "-dev-b", d.sock, "-selective-repeat", "-size", "4096", "-iters", "50")
	require.Equal(t, 0, code, "stderr:\n%s", errOut)
	assert.Regexp(t, `write_bw: 1 QP\(s\), .*, ECE sr\n`, out)
	code, out, errOut = perf(t, "run", "-dev-a", d.sock, "-dev-b", d.sock, "-size", "4096", "-iters", "50")
	require.Equal(t, 0, code, "stderr:\n%s", errOut)
	assert.Regexp(t, `write_bw: 1 QP\(s\), .*, ECE none\n`, out)
	// Options of RC QPs only; names it knows only.
	code, _, errOut = perf(t, "client", "-dev", d.sock, "-server", "127.0.0.1:1", "-transport", "uc", "-selective-repeat")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "they are options of RC QPs")
	code, _, errOut = perf(t, "server", "-dev", d.sock, "-ece", "sack")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `ECE option "sack"`)
}
