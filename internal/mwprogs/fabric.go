package mwprogs

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/launch"
	"github.com/vrnic/vrnic/internal/testenv"
)

// FIInfoEntry is one fi_info entry: provider, domain and endpoint type.
type FIInfoEntry struct{ Prov, Domain, Type string }

// ParseFIInfo reads fi_info's default output (provider:, then indented
// fabric:, domain:, version:, type:, protocol: lines).
func ParseFIInfo(out string) []FIInfoEntry {
	var es []FIInfoEntry
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		switch k {
		case "provider":
			es = append(es, FIInfoEntry{Prov: v})
		case "domain":
			if len(es) > 0 {
				es[len(es)-1].Domain = v
			}
		case "type":
			if len(es) > 0 {
				es[len(es)-1].Type = v
			}
		}
	}
	return es
}

// HasFIEntry tells whether es holds the entry.
func HasFIEntry(es []FIInfoEntry, prov, domain, typ string) bool {
	for _, e := range es {
		if e.Prov == prov && e.Domain == domain && e.Type == typ {
			return true
		}
	}
	return false
}

// FIInfo checks fi_info -p verbs run on device dev: a MSG endpoint
// (verbs, RC), a DGRAM endpoint (verbs, UD, domain DEV-dgram) and RDM
// endpoints (verbs;ofi_rxm over MSG, verbs;ofi_rxd over DGRAM), and no
// entry of another device.
func FIInfo(t *testing.T, e Env, dev string) {
	testenv.NeedTool(t, "fi_info")
	p, out := e.start(t, "fi_info", dev, nil, "fi_info", "-p", "verbs")
	wait(t, p, out, 60*time.Second, "fi_info")
	es := ParseFIInfo(out.String())
	assert.True(t, HasFIEntry(es, "verbs", dev, "FI_EP_MSG"), "device %s: no MSG endpoint:\n%s", dev, out)
	assert.True(t, HasFIEntry(es, "verbs", dev+"-dgram", "FI_EP_DGRAM"), "device %s: no DGRAM endpoint:\n%s", dev, out)
	assert.True(t, HasFIEntry(es, "verbs;ofi_rxm", dev, "FI_EP_RDM"), "device %s: no RDM endpoint over MSG:\n%s", dev, out)
	assert.True(t, HasFIEntry(es, "verbs;ofi_rxd", dev+"-dgram", "FI_EP_RDM"), "device %s: no RDM endpoint over DGRAM:\n%s", dev, out)
	for _, x := range es {
		assert.True(t, x.Domain == dev || x.Domain == dev+"-dgram", "device %s: entry of another domain: %+v", dev, x)
	}
}

// FIRow is one line of fi_pingpong's table.
type FIRow struct {
	Bytes, Sent, Ack int
	MBps, Usec       float64
}

var fiRowRE = regexp.MustCompile(`(?m)^(\d+)([kmg]?)\s+(\d+)([kmg]?)\s+=(\d+)([kmg]?)\s+\S+\s+\S+s\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+\s*$`)

// ParseFIPingpong reads fi_pingpong's table: bytes, #sent, #ack, total,
// time, MB/sec, usec/xfer, Mxfers/sec. Sizes of 1024 bytes and more
// carry a binary suffix (1k, 64k, 1m), counts of 1000 and more a decimal
// one (2k).
func ParseFIPingpong(out string) []FIRow {
	var rows []FIRow
	for _, m := range fiRowRE.FindAllStringSubmatch(out, -1) {
		var r FIRow
		r.Bytes, _ = strconv.Atoi(m[1])
		r.Bytes <<= map[string]int{"": 0, "k": 10, "m": 20, "g": 30}[m[2]]
		r.Sent = decimal(m[3], m[4])
		r.Ack = decimal(m[5], m[6])
		r.MBps, _ = strconv.ParseFloat(m[7], 64)
		r.Usec, _ = strconv.ParseFloat(m[8], 64)
		rows = append(rows, r)
	}
	return rows
}

// decimal is fi_pingpong's count n with its suffix (k, m, g: powers of
// 1000).
func decimal(n, suffix string) int {
	v, _ := strconv.Atoi(n)
	return v * map[string]int{"": 1, "k": 1000, "m": 1000000, "g": 1000000000}[suffix]
}

// FIPingpong runs fi_pingpong once with messages of size bytes: the
// server on Devs[0], the client on Devs[1] connecting to Addrs[0]; both
// must exit 0 within their timeouts, and the client's table must show
// iters messages, acked (with check, fi_pingpong's -c data check).
func FIPingpong(t *testing.T, e Env, prov, ep string, check bool, iters, size int) FIRow {
	t.Helper()
	return fiPingpong(t, e, prov, ep, nil, check, iters, size)
}

// rxmSRX makes ofi_rxm post its receives to one shared receive context
// instead of each connection's endpoint: the way around libfabric 1.17's
// teardown crash (rxmTeardownCrash).
const rxmSRX = "FI_OFI_RXM_USE_SRX=1"

func fiPingpong(t *testing.T, e Env, prov, ep string, env []string, check bool, iters, size int) FIRow {
	t.Helper()
	testenv.NeedTool(t, "fi_pingpong")
	port, err := launch.FreeTCPPort()
	require.NoError(t, err)
	args := []string{"fi_pingpong", "-p", prov, "-e", ep, "-I", strconv.Itoa(iters), "-S", strconv.Itoa(size)}
	if check {
		args = append(args, "-c")
	}
	srv, sout := e.start(t, "fi_pingpong server", e.Devs[0], env, append(args, "-B", strconv.Itoa(port))...)
	waitTCP(t, port, srv, sout)
	cli, cout := e.start(t, "fi_pingpong client", e.Devs[1], env, append(args, "-P", strconv.Itoa(port), e.Addrs[0])...)
	// The crash is tolerated only where it can happen: ofi_rxm posting
	// receives to each connection's endpoint.
	rxm := prov == "verbs" && ep == "rdm" && !slices.Contains(env, rxmSRX)
	if rxm && rxmTeardownCrash(cli, cout, 30*time.Second) {
		// The same libfabric defect on the client's side: its table
		// must be complete (checked below) before the crash.
		t.Logf("known libfabric 1.17 defect: fi_pingpong's client crashed in ofi_rxm's teardown after its report:\n%s", cout)
	} else {
		wait(t, cli, cout, 30*time.Second, "fi_pingpong client ("+prov+" "+ep+"; server: "+sout.String()+")")
	}
	if rxm && rxmTeardownCrash(srv, sout, 30*time.Second) {
		require.Len(t, ParseFIPingpong(sout.String()), 1, "the crashed server reported its ping-pong first:\n%s", sout)
		t.Logf("known libfabric 1.17 defect: fi_pingpong's server crashed in ofi_rxm's teardown after its report:\n%s", sout)
	} else {
		wait(t, srv, sout, 30*time.Second, "fi_pingpong server")
	}
	got := ParseFIPingpong(cout.String())
	require.Len(t, got, 1, "client table:\n%s", cout)
	r := got[0]
	assert.Equal(t, size, r.Bytes)
	assert.Equal(t, iters, r.Sent)
	assert.Equal(t, iters, r.Ack)
	assert.Greater(t, r.Usec, 0.0)
	assert.Less(t, r.Usec, 1e6, "a second per transfer")
	return r
}

// rxmTeardownCrash waits for p and tells whether it ended with
// libfabric's report of a segmentation fault. libfabric 1.17's ofi_rxm
// (Debian 12) crashes so when a connection's shutdown event is handled
// while a successful receive completion of that connection is still in
// the CQ: rxm_close_conn (prov/rxm/src/rxm_conn.c) closes the
// connection's MSG endpoint, then drains the CQ, and the drained receive
// is reposted (rxm_free_rx_buf, rxm_post_recv) through the closed
// endpoint, whose ops are gone: fi_recv calls through NULL. Any verbs
// device can get there (the shutdown is read between two CQ reads, and a
// descheduled process widens that window); libfabric fixed it later by
// draining first. With FI_OFI_RXM_USE_SRX=1 the receive goes back to the
// shared receive context, which outlives the connection.
func rxmTeardownCrash(p *launch.Proc, out *launch.Buffer, d time.Duration) bool {
	if !p.Wait(d) {
		return false // wait() reports it
	}
	return p.Err() != nil && strings.Contains(out.String(), "terminated with signal 11")
}

// FIPingpongSuite runs fi_pingpong runs times in a row for each endpoint
// type, MSG (RC), RDM over ofi_rxm (RC; also with a shared receive context,
// where no crash is tolerated) and over ofi_rxd (UD), and DGRAM
// (UD), alternating two sizes and every other run with -c; each run is
// bounded by a timeout, so a hang fails it. Afterwards each daemon must
// have sent at least a packet per message.
func FIPingpongSuite(t *testing.T, e Env, runs int) {
	cases := []struct {
		name, prov, ep string
		env            []string
		sizes          []int
	}{
		{"msg", "verbs", "msg", nil, []int{64, 65536}},
		{"rdm", "verbs", "rdm", nil, []int{64, 65536}},
		// The same over a shared receive context: no crash tolerated.
		{"rdm-srx", "verbs", "rdm", []string{rxmSRX}, []int{64, 65536}},
		{"dgram", "verbs", "dgram", nil, []int{64, 1024}},
		{"rdm-rxd", "verbs;ofi_rxd", "rdm", nil, []int{64, 4096}},
	}
	const iters = 10
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := e.counters(t)
			for i := range runs {
				fiPingpong(t, e, c.prov, c.ep, c.env, i%2 == 1, iters, c.sizes[i%len(c.sizes)])
				if t.Failed() {
					t.Fatalf("run %d of %d failed", i+1, runs)
				}
			}
			after := e.counters(t)
			for i := range after {
				assert.GreaterOrEqual(t, after[i].Sent-before[i].Sent, uint64(runs*iters),
					"daemon %s sent fewer packets than ping-pong messages", e.Devs[i])
			}
		})
	}
}
