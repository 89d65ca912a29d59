package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

// TestQPsECE: vrnicctl qps shows each QP's ECE options in a last column
// (ECE: "sr,rto", "-" for none; JSON "ece"), the columns before it as
// they were; vrnicctl info the options the device supports.
func TestQPsECE(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{Name: "ece0"})
	require.NoError(t, err)
	defer s.Close()
	c, err := verbs.Open(s.SocketPath)
	require.NoError(t, err)
	defer c.Close()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	var qps [2]*verbs.QP
	for i := range qps {
		qps[i], err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		require.NoError(t, err)
	}
	a := abi.QPAttr{QPState: abi.QPSInit, PortNum: 1}
	require.NoError(t, qps[0].ModifyECE(&a, abi.QPAttrState|abi.QPAttrPKeyIndex|abi.QPAttrPort|abi.QPAttrAccessFlags|abi.QPAttrECE, abi.ECEOptions))
	require.NoError(t, qps[1].ToInit(0, 0))

	// The listing is in QPN order, which need not be the order of
	// creation: what each row should show is looked up by its QPN.
	want := map[uint32]string{qps[0].QPN: "sr,rto", qps[1].QPN: ""}
	rc, out, _ := ctl("-s", s.SocketPath, "-json", "qps")
	require.Equal(t, 0, rc)
	var infos []admin.QPInfo
	require.NoError(t, json.Unmarshal([]byte(out), &infos))
	require.Len(t, infos, 2)
	for _, qi := range infos {
		w, ok := want[qi.QPN]
		require.True(t, ok, "QP %#x listed", qi.QPN)
		assert.Equal(t, w, qi.ECE, "QP %#x", qi.QPN)
	}

	rc, out, _ = ctl("-s", s.SocketPath, "qps")
	require.Equal(t, 0, rc)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3)
	head := strings.Fields(lines[0])
	assert.Equal(t, "ECE", head[len(head)-1], "the last column")
	assert.Equal(t, []string{"CTX", "QPN", "TYPE", "STATE"}, head[:4], "the columns before it")
	assert.Equal(t, "CC_RATE_BPS", head[len(head)-2])
	for i, qi := range infos { // the same order as the JSON's
		w := want[qi.QPN]
		if w == "" {
			w = "-"
		}
		f := strings.Fields(lines[1+i])
		assert.Equal(t, w, f[len(f)-1], "QP %#x", qi.QPN)
	}

	rc, out, _ = ctl("-s", s.SocketPath, "info")
	require.Equal(t, 0, rc)
	assert.Regexp(t, `(?m)^ece\s+sr,rto$`, out)
}
