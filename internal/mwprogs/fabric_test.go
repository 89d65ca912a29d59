package mwprogs

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFIPingpong(t *testing.T) {
	out := "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n" +
		"64      100     =100     12k         0.01s      1.16      55.06       0.02\n" +
		"64k     10      =10      1.2m        0.02s     66.12     991.20       0.00\n" +
		"64      2k      =2k      250k        0.12s      2.06      31.10       0.03\n"
	rows := ParseFIPingpong(out)
	require.Len(t, rows, 3)
	assert.Equal(t, FIRow{Bytes: 64, Sent: 2000, Ack: 2000, MBps: 2.06, Usec: 31.10}, rows[2])
	assert.Equal(t, FIRow{Bytes: 64, Sent: 100, Ack: 100, MBps: 1.16, Usec: 55.06}, rows[0])
	assert.Equal(t, FIRow{Bytes: 65536, Sent: 10, Ack: 10, MBps: 66.12, Usec: 991.20}, rows[1])
	assert.Empty(t, ParseFIPingpong("64x     10      =10      1.2m        0.02s     66.12     991.20       0.00\n"))
}

func TestParseFIInfo(t *testing.T) {
	out := "provider: verbs\n    fabric: IB-0x0\n    domain: a\n    version: 117.0\n    type: FI_EP_MSG\n    protocol: FI_PROTO_RDMA_CM_IB_RC\n" +
		"provider: verbs;ofi_rxd\n    fabric: IB-0x0\n    domain: a-dgram\n    version: 1.0\n    type: FI_EP_RDM\n    protocol: FI_PROTO_RXD\n"
	es := ParseFIInfo(out)
	assert.Equal(t, []FIInfoEntry{{"verbs", "a", "FI_EP_MSG"}, {"verbs;ofi_rxd", "a-dgram", "FI_EP_RDM"}}, es)
	assert.True(t, HasFIEntry(es, "verbs;ofi_rxd", "a-dgram", "FI_EP_RDM"))
	assert.False(t, HasFIEntry(es, "verbs", "a-dgram", "FI_EP_MSG"))
}

func TestFinalRow(t *testing.T) {
	for _, line := range []string{
		"Final:                  2000    315.273   329.241   307.539        0.02       0.02        3037        3252",
		"Final:                  2000   3695.817       inf  3523.446        0.00       1.11           0         284",
	} {
		m := finalRow.FindStringSubmatch(line)
		require.NotNil(t, m, line)
		assert.Equal(t, "2000", m[1])
	}
	assert.Nil(t, finalRow.FindStringSubmatch("[thread 0]              2000   3695.817  3020.524  3522.555        1.29       1.11         331         284"))
}
