package device_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
)

func TestAdminListings(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := mustOpenFull(t, s)
	defer c.Close()
	path := s.SocketPath

	ctxs := adminList[admin.ContextInfo](t, path, admin.ContextsCmd)
	require.Len(t, ctxs, 1)
	assert.NotZero(t, ctxs[0].PID, "SO_PEERCRED")
	assert.Equal(t, 2, ctxs[0].Resources.QP)
	assert.Len(t, adminList[admin.PDInfo](t, path, admin.PDsCmd), 1)
	mrs := adminList[admin.MRInfo](t, path, admin.MRsCmd)
	require.Len(t, mrs, 1)
	assert.Equal(t, uint64(1<<20), mrs[0].Length)
	assert.Equal(t, uint32(256), mrs[0].Pages)
	cqs := adminList[admin.CQInfo](t, path, admin.CQsCmd)
	require.Len(t, cqs, 1)
	assert.True(t, cqs[0].Channel)
	assert.Equal(t, 4, cqs[0].Users, "two QPs, each as send and receive CQ")
	qps := adminList[admin.QPInfo](t, path, admin.QPsCmd)
	require.Len(t, qps, 2)
	assert.Less(t, qps[0].QPN, qps[1].QPN, "listed by QPN")
	if qps[0].Type == "UD" { // QPNs are random: the UD QP may come first
		qps[0], qps[1] = qps[1], qps[0]
	}
	assert.Equal(t, "INIT", qps[0].State)
	assert.Equal(t, "RESET", qps[1].State)
	assert.Equal(t, "UD", qps[1].Type)
	require.NotNil(t, qps[1].SRQ)
	assert.Len(t, adminList[admin.SRQInfo](t, path, admin.SRQsCmd), 1)
	assert.Len(t, adminList[admin.AHInfo](t, path, admin.AHsCmd), 1)
	assert.Len(t, adminList[admin.HostMemInfo](t, path, admin.HostMemCmd), 1)

	a, err := admin.Dial(path)
	require.NoError(t, err)
	defer a.Close()
	info, err := a.Info()
	require.NoError(t, err)
	assert.Equal(t, "test0", info.Device)
	assert.Equal(t, fmt.Sprintf("%d.%d", abi.VersionMajor, abi.VersionMinor), info.ABIVersion)
	assert.Equal(t, 2, info.Resources.QP)
	// The client and this operator (earlier operator connections may take
	// a moment to be noticed as closed).
	assert.Eventually(t, func() bool {
		i, err := a.Info()
		return err == nil && i.Connections == 2
	}, timeout, tick)
	assert.Positive(t, info.Counters["commands"])
}

// TestAdminPaging lists more AHs than fit one datagram: the list comes in
// pages and nothing is lost or repeated.
func TestAdminPaging(t *testing.T) {
	s := startServer(t, device.Limits{})
	c := open(t, s)
	pd, err := c.AllocPD()
	require.NoError(t, err)
	const n = 1200
	for range n {
		_, err := pd.CreateAH(testAV())
		require.NoError(t, err)
	}
	a, err := admin.Dial(s.SocketPath)
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Call(admin.AHsCmd, &admin.Request{})
	require.NoError(t, err)
	var first admin.ListReply
	require.NoError(t, json.Unmarshal(b, &first))
	assert.Equal(t, n, first.Total)
	require.NotZero(t, first.Next, "one page cannot hold %d AHs", n)
	assert.Less(t, len(b), abi.MaxMsgSize)
	all := adminList[admin.AHInfo](t, s.SocketPath, admin.AHsCmd)
	require.Len(t, all, n)
	seen := map[uint32]bool{}
	for _, ah := range all {
		assert.False(t, seen[ah.Handle])
		seen[ah.Handle] = true
	}
}
