package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
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
	ch, err := verbs.NewCompChannel()
	require.NoError(t, err)
	defer ch.Close()
	cq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	cq2, err := c.CreateCQ(64, ch)
	require.NoError(t, err)
	buf, err := c.Alloc(3*4096, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteRead)
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
	var qps []admin.QPInfo
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
	assert.Regexp(t, `data_path\s+packets_sent=0 packets_received=0 retransmits=0 .*recv_cqes=0 qkey_violations=0 no_recv_wqe=0 invalid_request_naks_sent=0 remote_access_naks_sent=0 remote_operational_naks_sent=0 invalid_request_naks_received=0 remote_access_naks_received=0 remote_operational_naks_received=0 ce_received=0 cnps_sent=0 cnps_received=0\n`, out)
	assert.Regexp(t, `held\s+host_mem_bytes=[1-9]\d* pinned_bytes=[1-9]\d* locked_bytes=\d+ lock_failures=\d+ mr_pages=[1-9]\d* fds=[1-9]\d*\n`, out,
		"what the daemon holds for the client: its memory, the MR's pages, descriptors")
	rc, out, _ = ctl("-s", s.SocketPath, "counters")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `resources\.qp\s+1\n`, out)
	assert.Regexp(t, `commands\s+\d+`, out)
	assert.Regexp(t, `data_path\.packets_sent\s+0\n`, out)
	assert.Regexp(t, `data_path\.retransmits\s+0\n`, out)
	rc, out, _ = ctl("-s", s.SocketPath, "--json", "counters")
	require.Equal(t, 0, rc)
	var counters map[string]int64
	require.NoError(t, json.Unmarshal([]byte(out), &counters))
	assert.Equal(t, int64(2), counters["resources.cq"])
	assert.Positive(t, counters["contexts_opened"])
	assert.Positive(t, counters["held.fds"])
	assert.Positive(t, counters["held.host_mem_bytes"])
	// The data-path totals (this device has no data path: all zero).
	for _, k := range []string{"packets_sent", "packets_received", "retransmits", "timeouts", "rnr_naks_received",
		"rnr_naks_sent", "seq_naks_received", "seq_naks_sent", "duplicates", "dropped", "send_cqes", "recv_cqes"} {
		v, ok := counters["data_path."+k]
		assert.True(t, ok, "data_path.%s", k)
		assert.Zero(t, v)
	}
	for _, k := range []string{"rx_frames", "tx_frames", "parse_errors", "icrc_errors", "unknown_qp", "bad_peer",
		"cq_overflows", "build_errors", "link_send_errors", "link_recv_errors"} {
		v, ok := counters["wire."+k]
		assert.True(t, ok, "wire.%s", k)
		assert.Zero(t, v)
	}
	// PDs, MRs and CQs, as tables and as JSON.
	rc, out, _ = ctl("-s", s.SocketPath, "pds")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `CTX\s+HANDLE\s+USERS\n`, out)
	assert.Regexp(t, fmt.Sprintf(`\n\d+\s+%d\s+2\n`, pd.Handle), out, "the PD has the MR and the QP")
	rc, out, _ = ctl("-s", s.SocketPath, "-json", "pds")
	require.Equal(t, 0, rc)
	var pds []admin.PDInfo
	require.NoError(t, json.Unmarshal([]byte(out), &pds))
	require.Len(t, pds, 1)
	assert.Equal(t, admin.PDInfo{Ctx: c.Handle(), Handle: pd.Handle, Users: 2}, pds[0])

	rc, out, _ = ctl("-s", s.SocketPath, "mrs")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `CTX\s+HANDLE\s+PD\s+IOVA\s+LENGTH\s+ACCESS\s+LKEY\s+RKEY\s+PAGES\s+PAGE_SHIFT\n`, out)
	assert.Regexp(t, fmt.Sprintf(`\n\d+\s+%d\s+%d\s+%d\s+12288\s+%d\s+%d\s+%d\s+3\s+12\n`,
		mr.Handle, pd.Handle, mr.Addr, abi.AccessLocalWrite|abi.AccessRemoteRead, mr.LKey, mr.RKey), out)
	rc, out, _ = ctl("-s", s.SocketPath, "-json", "mrs")
	require.Equal(t, 0, rc)
	var mrs []admin.MRInfo
	require.NoError(t, json.Unmarshal([]byte(out), &mrs))
	require.Len(t, mrs, 1)
	assert.Equal(t, admin.MRInfo{Ctx: c.Handle(), Handle: mr.Handle, PD: pd.Handle, IOVA: mr.Addr, Length: 3 * 4096,
		Access: abi.AccessLocalWrite | abi.AccessRemoteRead, LKey: mr.LKey, RKey: mr.RKey, Pages: 3, PageShift: 12}, mrs[0])

	rc, out, _ = ctl("-s", s.SocketPath, "cqs")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `CTX\s+HANDLE\s+CQES\s+RING_PA\s+DB_INDEX\s+CHANNEL\s+USERS\n`, out)
	assert.Regexp(t, fmt.Sprintf(`\n\d+\s+%d\s+8\s+\d+\s+\d+\s+false\s+2\n`, cq.Handle), out, "send and receive CQ of the QP")
	assert.Regexp(t, fmt.Sprintf(`\n\d+\s+%d\s+64\s+\d+\s+\d+\s+true\s+0\n`, cq2.Handle), out)
	rc, out, _ = ctl("-s", s.SocketPath, "-json", "cqs")
	require.Equal(t, 0, rc)
	var cqs []admin.CQInfo
	require.NoError(t, json.Unmarshal([]byte(out), &cqs))
	require.Len(t, cqs, 2)
	byHandle := map[uint32]admin.CQInfo{}
	for _, q := range cqs {
		assert.Equal(t, c.Handle(), q.Ctx)
		assert.NotZero(t, q.RingPA)
		byHandle[q.Handle] = q
	}
	assert.Equal(t, uint32(8), byHandle[cq.Handle].CQEs)
	assert.False(t, byHandle[cq.Handle].Channel)
	assert.Equal(t, 2, byHandle[cq.Handle].Users)
	assert.Equal(t, uint32(64), byHandle[cq2.Handle].CQEs)
	assert.True(t, byHandle[cq2.Handle].Channel)
	assert.Zero(t, byHandle[cq2.Handle].Users)
	assert.NotEqual(t, byHandle[cq.Handle].DBIndex, byHandle[cq2.Handle].DBIndex)

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

// TestAccounts: vrnicctl accounts shows, per uid, the connections, the
// contexts and what they hold, as a table and as JSON.
func TestAccounts(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{Name: "acct0"})
	require.NoError(t, err)
	defer s.Close()
	rc, out, _ := ctl("-s", s.SocketPath, "accounts")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `UID\s+USER\s+CONNECTIONS\s+CONTEXTS\s+HOSTMEM\s+HOSTMEM_BYTES\s+MRS\s+MR_PAGES`, out)
	for range 2 {
		c, err := verbs.Open(s.SocketPath)
		require.NoError(t, err)
		defer c.Close()
		pd, err := c.AllocPD()
		require.NoError(t, err)
		buf, err := c.Alloc(3*4096, 4096)
		require.NoError(t, err)
		_, err = pd.RegMR(buf, abi.AccessLocalWrite)
		require.NoError(t, err)
	}
	uid := os.Geteuid()
	var accts []admin.AccountInfo
	require.Eventually(t, func() bool {
		rc, out, _ = ctl("-s", s.SocketPath, "-json", "accounts")
		require.Equal(t, 0, rc)
		require.NoError(t, json.Unmarshal([]byte(out), &accts))
		return len(accts) == 1 && accts[0].Connections == 3
	}, 10*time.Second, 10*time.Millisecond, "two clients and vrnicctl: %s", out)
	a := accts[0]
	assert.Equal(t, uint32(uid), a.UID)
	assert.Equal(t, admin.ResourceCounts{Contexts: 2, HostMem: a.Resources.HostMem, PD: 2, MR: 2}, a.Resources)
	assert.Positive(t, a.Resources.HostMem)
	assert.GreaterOrEqual(t, a.HostMemBytes, uint64(2*3*4096))
	assert.Equal(t, uint64(6), a.MRPages)
	assert.Equal(t, 3+2*2+a.Resources.HostMem, a.FDs, "three connections, two per context, one per host memory region")
	rc, out, _ = ctl("-s", s.SocketPath, "accounts")
	require.Equal(t, 0, rc)
	name := "-"
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		name = u.Username
	}
	assert.Regexp(t, fmt.Sprintf(`\n%d\s+%s\s+\d+\s+2\s+%d\s+%d\s+2\s+6\s+2\s+0\s+0\s+0\s+0\s+0\s+\d+\s+0\n`, uid, regexp.QuoteMeta(name),
		a.Resources.HostMem, a.HostMemBytes), out)
}
