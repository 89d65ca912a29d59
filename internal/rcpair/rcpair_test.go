package rcpair

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

func TestMTU(t *testing.T) {
	for _, c := range []struct {
		bytes int
		want  abi.MTU
	}{
		{256, abi.MTU256}, {512, abi.MTU512}, {1024, abi.MTU1024}, {2048, abi.MTU2048}, {4096, abi.MTU4096},
		{0, 0}, {-256, 0}, {255, 0}, {1000, 0}, {1500, 0}, {8192, 0},
	} {
		t.Run(strconv.Itoa(c.bytes), func(t *testing.T) { assert.Equal(t, c.want, MTU(c.bytes)) })
	}
}

// TestInfoJSON: the field names are the wire form vrnic-demo and
// vrnic-perf exchange; a round trip keeps every field.
func TestInfoJSON(t *testing.T) {
	in := Info{QPN: 0x12, PSN: 0xabcdef, GID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}, RKey: 0x301, Addr: 1 << 40, Len: 8192}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var fields map[string]any
	require.NoError(t, json.Unmarshal(b, &fields))
	for _, k := range []string{"qpn", "psn", "gid", "rkey", "addr", "len"} {
		assert.Contains(t, fields, k)
	}
	assert.Len(t, fields, 6)
	var out Info
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in, out)
}

// side is one QP with an MR, on a device without a data path (the
// device still validates every state change and keeps the attributes).
type side struct {
	qp  *verbs.QP
	mr  *verbs.MR
	gid [16]byte
}

func newSide(t *testing.T, c *verbs.Context) *side {
	t.Helper()
	pd, err := c.AllocPD()
	require.NoError(t, err)
	cq, err := c.CreateCQ(8, nil)
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq,
		Cap: abi.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	buf, err := c.Alloc(8192, 4096)
	require.NoError(t, err)
	mr, err := pd.RegMR(buf, abi.AccessAll)
	require.NoError(t, err)
	gid, err := c.QueryGID(1, 0)
	require.NoError(t, err)
	return &side{qp: qp, mr: mr, gid: gid.GID}
}

func TestConnect(t *testing.T) {
	s, err := devicetest.Start(devicetest.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	c, err := verbs.Open(s.SocketPath, verbs.WithClientName("rcpair-test"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	a, b := newSide(t, c), newSide(t, c)
	ia, ib := Local(a.qp, 0x100, a.gid, a.mr), Local(b.qp, 0xfffff0, b.gid, b.mr)
	assert.Equal(t, Info{QPN: a.qp.QPN, PSN: 0x100, GID: a.gid, RKey: a.mr.RKey, Addr: a.mr.Addr, Len: a.mr.Length}, ia)
	assert.EqualValues(t, 8192, ia.Len)

	attr := Attr{MTU: abi.MTU1024, MaxRdAtomic: 4}
	require.NoError(t, Connect(a.qp, ia.PSN, ib, attr))
	require.NoError(t, Connect(b.qp, ib.PSN, ia, attr))
	for _, x := range []struct {
		name     string
		s        *side
		me, peer Info
	}{{"a", a, ia, ib}, {"b", b, ib, ia}} {
		t.Run(x.name, func(t *testing.T) {
			r, err := x.s.qp.Query()
			require.NoError(t, err)
			q := r.Attr
			assert.Equal(t, abi.QPSRTS, q.QPState)
			assert.Equal(t, abi.MTU1024, q.PathMTU)
			assert.Equal(t, x.peer.QPN, q.DestQPNum)
			assert.Equal(t, x.peer.PSN, q.RQPSN)
			assert.Equal(t, x.me.PSN, q.SQPSN)
			assert.Equal(t, x.peer.GID, q.AHAttr.DGID)
			assert.EqualValues(t, 64, q.AHAttr.HopLimit)
			assert.EqualValues(t, abi.AccessAll, q.QPAccessFlags)
			assert.EqualValues(t, 4, q.MaxRdAtomic)
			assert.EqualValues(t, 4, q.MaxDestRdAtomic)
			assert.EqualValues(t, 1, q.MinRNRTimer)
			assert.EqualValues(t, 14, q.Timeout)
			assert.EqualValues(t, 7, q.RetryCnt)
			assert.EqualValues(t, 7, q.RNRRetry)
		})
	}

	t.Run("not in RESET", func(t *testing.T) {
		err := Connect(a.qp, ia.PSN, ib, attr)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "QP "+"0x"+strconv.FormatUint(uint64(a.qp.QPN), 16)+" to INIT")
	})
	t.Run("bad path MTU", func(t *testing.T) {
		n := newSide(t, c)
		err := Connect(n.qp, 1, ib, Attr{MTU: MTU(1500), MaxRdAtomic: 4})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "to RTR")
	})
	t.Run("too many READs outstanding", func(t *testing.T) {
		n := newSide(t, c)
		err := Connect(n.qp, 1, ib, Attr{MTU: abi.MTU4096, MaxRdAtomic: abi.MaxRdAtomic + 1})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "to RTR", "max_dest_rd_atomic is checked first")
	})
}
